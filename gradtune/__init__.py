"""gradtune."""

from .threads import use_target_threads

# Before any TVM kernel runs in this process: TVM's runtime would otherwise use half the cores
# of a machine without hyper-threads (gradtune/threads.py).
use_target_threads({})  # this machine's physical cores
