"""Whether the cores a timing runs on pass data between them at their usual speed right now.

A model's inference on several threads hands data from core to core: each kernel leaves its
output in the caches of the cores that wrote it, and the next kernel, split another way, reads
it on others. How fast a cache line crosses between cores depends on where they sit, and a
virtual machine's host may move its vCPUs. On a 2-vCPU KVM guest (AMD EPYC Zen 4) the host
moved them apart and back, for tens of seconds to minutes at a time: a cache line's one-way
trip between the two took ~170 ns instead of ~38 ns (a C ping-pong), an empty parallel launch
of TVM's thread pool ~1.6 µs instead of ~0.8 µs, and a tuned 4-convolution CNN's inference on
2 threads ~165 µs instead of ~100 µs, while its kernels timed alone each in a loop (their data
staying on their own cores) slowed by only ~15%. A timing that mixes the two states compares
contenders measured on two different machines, and the state, not the contender, decides who
wins: two timings of one campaign's libraries disagreed by up to 1.7x per library before this
was found.

``LinkProbe`` times that empty parallel launch in TVM's C++ loop (``time_evaluator``, ~2 ms
per probe), so it measures the very pool the contenders run on. ``round_states`` sorts the
rounds of an interleaved timing by the probes before and after each: ``NEAR`` when both read
the fastest state seen, ``APART`` when both read slower, ``MOVED`` when the state changed
during the round. A timing compares contenders within one state and says which. On a machine
whose cores stay put (bare metal, a VM pinned by its host) every probe reads alike and every
round is ``NEAR``. On one thread nothing crosses cores: nothing is probed.

The fastest state is the machine's, not one process's: on a 2-vCPU KVM guest on a Zen 2 host
the probe read ~0.47 µs in 2 of 35 timings the benchmarks recorded and 1.3-1.9 µs throughout
the 33 others, so a timing judged by its own fastest probe called itself ``NEAR`` while its
cores sat apart all along. A probe given a cache (``reference_path``, per CPU and thread
count) starts from the fastest reading any process kept there, and keeps a faster one. A
probe cannot read faster than the cores allow, so the fastest reading is a floor, not an
outlier. Delete the file when the machine changed under the same CPU name and numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from . import machine

# The two states above differ 2x in the probe. Within a state the readings stayed within 1.4x
# of its fastest, but for rare outliers (one in ~150 at 1.55x, a round then dropped as MOVED;
# a 120 s trace, a probe every 0.5 s).
TOLERANCE = 1.5
LAUNCHES = 2000  # per probe: ~2 ms at ~1 µs each, long against the timer, short against a state
# The first probe after another runtime's pool ran (ONNX Runtime's, OpenMP's) read 3-20 µs in
# either state, however long it waited (0-2 s), and the second or third, 2 ms apart, read the
# state again (Zen 4, 2 vCPUs): the other pool's workers, not the cores, held it back. So a reading
# beyond TOLERANCE of the fastest is taken again, up to this many times in all, and the fastest
# counts: an APART state lasts tens of seconds and reads APART every time.
READINGS = 3


class LinkProbe:
    """ns per empty parallel launch on this thread's TVM pool; ``None`` on a one-thread pool.

    The kernel is built on the first call that needs it, for this host's CPU (``llvm``): the
    pool it probes is the host's, whatever device the contenders run on.
    """

    def __init__(self, cache: Path | None = None) -> None:
        self.fastest: float | None = None  # the fastest reading yet: what NEAR means
        self.cache = cache  # where the machine's fastest reading is kept between processes
        self._evaluator: Any = None
        self._args: list[Any] = []
        self._threads: int | None = None
        self._cache_read = False

    def __call__(self) -> float | None:
        from .threads import runtime_threads

        if self._threads is None:
            self._threads = runtime_threads()
        if self._threads < 2:
            return None
        if self._evaluator is None:
            self._build()
        if not self._cache_read:  # once the thread count, part of the key, is known
            self._cache_read = True
            self.fastest = self._cached()
        reading = self._read()
        # Without a fastest to judge by (the machine's first probe) all readings are taken.
        for _ in range(READINGS - 1):
            if self.fastest is not None and reading <= TOLERANCE * self.fastest:
                break
            reading = min(reading, self._read())
        if self.fastest is None or reading < self.fastest:
            self.fastest = reading
            if self.cache is not None:
                machine.write_cache(self.cache, self._key(), round(reading, 1))
        return reading

    def _key(self) -> str:
        return machine.machine_key(self._threads or 0)

    def _cached(self) -> float | None:
        if self.cache is None:
            return None
        value = machine.read_cache(self.cache).get(self._key())
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def _read(self) -> float:
        return float(self._evaluator(*self._args).mean * 1e9)

    def _build(self) -> None:
        import numpy as np
        import tvm
        from tvm import s_tir, te

        threads = self._threads or 2
        a = te.placeholder((threads, 16), name="a")
        b = te.compute((threads, 16), lambda i, j: a[i, j] + 1.0, name="b")
        sch = s_tir.Schedule(te.create_prim_func([a, b]))
        rows, _ = sch.get_loops(sch.get_sblock("b"))
        sch.parallel(rows)  # one row per worker: each touches one cache line, nothing else
        lib = tvm.compile(sch.mod, target="llvm").mod
        dev = tvm.cpu(0)
        self._args = [tvm.runtime.tensor(np.zeros((threads, 16), "float32"), dev) for _ in "ab"]
        self._evaluator = lib.time_evaluator("main", dev, number=LAUNCHES, repeat=1)
        self._evaluator(*self._args)  # the first launches start the pool's workers: not a reading


NEAR, APART, MOVED = "near", "apart", "moved"


def reference_path() -> Path:
    """Where the machine's fastest probe is kept (per CPU and thread count)."""
    return machine.cache_dir() / "crosscore.json"


def fastest(link_ns: Iterable[Sequence[float | None]]) -> float | None:
    """The fastest probe over several timings' probes: what ``NEAR`` means for all of them (a
    timing spent wholly apart has no ``NEAR`` round of its own to compare with)."""
    readings = [x for probes in link_ns for x in probes if x is not None]
    return min(readings) if readings else None


def round_states(
    link_ns: Sequence[float | None], reference: float | None = None, tolerance: float = TOLERANCE
) -> list[str]:
    """The state of each round bounded by consecutive probes (``link_ns[k]`` before round
    ``k``, ``link_ns[k + 1]`` after it): ``NEAR`` when both read within ``tolerance`` of
    ``reference`` (default: the fastest of ``link_ns``), ``APART`` when both read beyond it,
    ``MOVED`` otherwise. All ``NEAR`` when a probe is missing (nothing was probed)."""
    rounds = max(len(link_ns) - 1, 0)
    readings = [x for x in link_ns if x is not None]
    if len(readings) < len(link_ns) or not readings:
        return [NEAR] * rounds
    limit = tolerance * (reference if reference is not None else min(readings))
    near = [x <= limit for x in readings]
    return [
        NEAR if near[k] and near[k + 1] else APART if not (near[k] or near[k + 1]) else MOVED
        for k in range(rounds)
    ]
