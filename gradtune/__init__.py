"""gradtune."""

from .threads import default_to_host_cores

# Before any TVM kernel runs in this process: TVM's runtime would otherwise use half the cores
# of a machine without hyper-threads (gradtune/threads.py).
default_to_host_cores()
