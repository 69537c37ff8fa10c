"""Compile the fused model (with or without tuned schedules), check numerics, time it.

Tuned and untuned builds start from the same fused module that tasks were extracted from,
so every database key matches and the two differ only in the schedules applied.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import crosscore
from .errors import GradtuneError
from .partition import device_of
from .settle import settle

# float32 models through different kernels and accumulation orders: relative 1e-3 of the output
# scale is tight enough to catch a wrong schedule (errors are then O(1)) without flagging
# reassociation noise.
RTOL = 1e-3
ATOL_SCALE = 1e-3


def build(
    fused_mod: Any, target: Any, database: Any | None = None, exec_mode: str | None = None
) -> Any:
    """``relax.build`` of the fused module; ``database`` supplies tuned PrimFuncs.

    ``exec_mode``: ``relax.build``'s; by default ``exec_mode_for(target)``."""
    import importlib

    import tvm
    from tvm import relax
    from tvm.relax.transform import MetaScheduleApplyDatabase

    with target, tvm.transform.PassContext(opt_level=3):
        mod = fused_mod
        if database is not None:
            with database:
                mod = MetaScheduleApplyDatabase(enable_warning=False)(mod)
        if has_layout_free_weights(mod):
            # A tuned kernel that reads a weight in a rewritten layout carries the rewrite as a
            # preprocessing block: split out, it runs once, here, on the bound weights.
            mod = relax.transform.SplitLayoutRewritePreproc()(mod)
            mod = relax.transform.FoldConstant()(mod)
        if target.kind.name == "cuda":
            # Untuned GPU kernels must still be bound to threads to run at all.
            from tvm.s_tir import dlight as dl

            mod = dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                dl.gpu.GeneralReduction(), dl.gpu.Fallback(),
            )(mod)  # fmt: skip
        # relax.pipeline's dispatchers miss dataflow_lower_passes for CPU in 0.27; the backend
        # modules have them all.
        backend = "cuda" if target.kind.name == "cuda" else "cpu_generic"
        passes = importlib.import_module(f"tvm.relax.backend.{backend}.pipeline")
        lower = passes.dataflow_lower_passes(target) + passes.finalize_passes(target)
        return relax.build(
            mod,
            target=target,
            relax_pipeline=tvm.transform.Sequential(lower),
            exec_mode=exec_mode or exec_mode_for(target),
        )


def exec_mode_for(target: Any) -> str:
    """How the VM runs the model's own function on ``target``.

    ``"bytecode"`` is interpreted: every call instruction looks its function up, converts its
    registers to arguments and dispatches. ``"compiled"`` makes that function a PrimFunc of
    the same calls, compiled into the library: the kernels are the same, the interpretation
    goes. On CPUs that is part of what a small model's inference spends between its kernels:
    5 tuned models ran 1.011-1.060x faster compiled, geomean 1.038, on a 2-core Zen 2
    (``bench/vm_exec.py``). GPU targets stay interpreted: unmeasured there, and their kernel
    launches dwarf the interpretation."""
    return "bytecode" if target.kind.name == "cuda" else "compiled"


def has_layout_free_weights(mod: Any) -> bool:
    """Whether ``partition.Lowering(weight_prepack=True)`` marked any PrimFunc's weights."""
    from tvm import tirx

    return any(
        isinstance(func, tirx.PrimFunc) and func.attrs and "layout_free_buffers" in func.attrs
        for func in mod.functions.values()
    )


class Runner:
    """A loaded VM with inputs resident on the device: ``run()`` is one inference."""

    def __init__(self, executable: Any, target: Any, inputs: list[np.ndarray]) -> None:
        import tvm
        from tvm import relax

        self.dev = device_of(target)
        self.vm = relax.VirtualMachine(executable, self.dev)
        # Looked up once: ``vm["main"]`` makes a new function object on every lookup, which a
        # deployment pays once, not per inference.
        self.main = self.vm["main"]
        self.args = [tvm.runtime.tensor(x, self.dev) for x in inputs]

    def run(self) -> Any:
        out = self.main(*self.args)
        self.dev.sync()
        return out

    def outputs(self) -> list[np.ndarray]:
        return flatten_outputs(self.run())


def flatten_outputs(out: Any) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    result: list[np.ndarray] = []
    for item in out:
        result.extend(flatten_outputs(item))
    return result


def max_abs_error(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    if len(outputs) != len(reference):
        raise GradtuneError(
            f"compiled model returns {len(outputs)} outputs, the reference {len(reference)}"
        )
    return max(
        float(np.max(np.abs(o.astype(np.float64) - r.astype(np.float64)))) if o.size else 0.0
        for o, r in zip(outputs, reference, strict=True)
    )


def verify(
    outputs: list[np.ndarray],
    reference: list[np.ndarray],
    label: str,
    rtol: float = RTOL,
    atol_scale: float = ATOL_SCALE,
) -> float:
    """Max abs error; raises when any output is off by more than the stated tolerance."""
    err = max_abs_error(outputs, reference)
    for o, r in zip(outputs, reference, strict=True):
        if o.shape != r.shape:
            raise GradtuneError(f"{label} output shape {o.shape} != reference {r.shape}")
        atol = atol_scale * max(1.0, float(np.max(np.abs(r))) if r.size else 1.0)
        if not np.allclose(o, r, rtol=rtol, atol=atol):
            raise GradtuneError(
                f"{label} outputs differ from the reference (max abs error {err:.3g}, "
                f"tolerance rtol={rtol:g} atol={atol:.3g})"
            )
    return err


# A state (``crosscore``) with fewer rounds than this has no median worth taking.
MIN_STATE_ROUNDS = 3
TVM_POOL = "tvm"  # ``pools``' name for TVM's thread pool, which the cross-core probe runs on


@dataclass
class Timing:
    """An interleaved timing: per-call ms of each function in every round, the cross-core
    probe (``crosscore``) before the first round and after each (``None``: not probed), and
    the reading that counts as ``NEAR`` (None: the fastest of ``link_ns``). Each method takes
    another ``reference``: a benchmark's fastest over all its timings."""

    samples: dict[str, list[float]]
    link_ns: list[float | None]
    reference: float | None = None

    def state(self, reference: float | None = None) -> str:
        """The state the kept rounds share: ``NEAR`` if at least ``MIN_STATE_ROUNDS`` rounds
        ran in it (cores as close as ``reference``, default the fastest probe here), else
        ``APART`` if as many ran in that, else ``MOVED`` (then every round is kept)."""
        return self._states(reference)[0]

    def _states(self, reference: float | None) -> tuple[str, list[str]]:
        """The state kept, and each round's."""
        states = crosscore.round_states(self.link_ns, reference or self.reference)
        kept = next(
            (s for s in (crosscore.NEAR, crosscore.APART) if states.count(s) >= MIN_STATE_ROUNDS),
            crosscore.MOVED,
        )
        return kept, states

    def kept(self, reference: float | None = None) -> dict[str, list[float]]:
        """The samples of the rounds in ``state(reference)``."""
        state, states = self._states(reference)
        keep = [state in (s, crosscore.MOVED) for s in states]
        return {name: [v for v, k in zip(vs, keep, strict=True) if k]
                for name, vs in self.samples.items()}  # fmt: skip

    def medians(self, reference: float | None = None) -> dict[str, float]:
        """Median ms per call of each function over the kept rounds."""
        return {name: statistics.median(vs) for name, vs in self.kept(reference).items()}

    def conditions(self, reference: float | None = None) -> dict[str, Any]:
        """What a result records of the timing: the state kept, its rounds of all, the probe's
        range and the reading ``NEAR`` was judged by (ns per empty parallel launch)."""
        readings = [x for x in self.link_ns if x is not None]
        state, states = self._states(reference)
        near = reference or self.reference or (min(readings) if readings else None)
        return {
            "state": state,
            "rounds": len(states),
            "kept_rounds": sum(state in (s, crosscore.MOVED) for s in states),
            "link_ns": [round(min(readings)), round(max(readings))] if readings else None,
            "near_ns": round(near) if readings and near else None,
        }

    def record(self) -> dict[str, Any]:
        """Everything measured, to classify again later against another reference."""
        return {"samples": self.samples, "link_ns": self.link_ns, "reference": self.reference}


def shared_reference(timings: Iterable[Timing]) -> float | None:
    """What ``NEAR`` means for several timings: the fastest probe any of them read, or the
    machine's fastest their probe knew before them (``crosscore.LinkProbe``'s cache). A timing
    spent wholly apart has no ``NEAR`` round of its own to compare with."""
    timings = list(timings)
    return crosscore.fastest([*(t.link_ns for t in timings), [t.reference for t in timings]])


# One per process, starting from the machine's fastest reading (crosscore): its fastest is NEAR.
_probe = crosscore.LinkProbe(crosscore.reference_path())


def time_rounds(
    fns: dict[str, Callable[[], Any]],
    repeats: int = 7,
    min_seconds: float = 0.05,
    pools: dict[str, str] | None = None,
) -> Timing:
    """Per-call latency (ms) of each function in each of ``repeats`` rounds, the functions
    timed in alternation within every round, and the cross-core probe around every round.

    ``pools`` names the thread pool each function runs on (its runtime: TVM modules share the
    calling thread's, named ``TVM_POOL``; torch.compile and PyTorch eager share OpenMP's): a
    block that follows another pool's first waits until that pool's workers stopped spinning
    (``settle.settle``). Without it every function shares TVM's.

    The machine is shared and noisy: interleaving exposes every contender to the same drift,
    and medians over repeats discard bursts; the spread of the samples says how far apart two
    medians must be to differ. Drift that moves the cores apart changes the machine itself
    (``crosscore``): the probe marks the rounds it spans.
    """

    last = TVM_POOL  # the pool that ran last: nothing yet, TVM's is the probe's

    def switch(pool: str) -> None:
        # Before the warm-up's and the calibration's calls too, not only the timed blocks':
        # a slow spell, once started, lasted through a whole timing. With a wait before the
        # timed blocks only, torch.compile beside a tuned TVM library still ran 2-3x slower
        # in 17 of 96 blocks (2-core Zen 2); with it before every switch, in none of 96.
        nonlocal last
        if pool != last:
            settle()
            last = pool

    def pool_of(name: str) -> str:
        return (pools or {}).get(name, TVM_POOL)

    for name, fn in fns.items():  # warm-up: allocation, first-call JIT, caches
        switch(pool_of(name))
        fn()
        fn()
    numbers = {}
    for name, fn in fns.items():
        switch(pool_of(name))
        n, elapsed = 1, 0.0
        while elapsed < min_seconds:
            start = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed = time.perf_counter() - start
            if elapsed < min_seconds:
                n *= 2
        numbers[name] = n
    samples: dict[str, list[float]] = {name: [] for name in fns}

    def probe() -> float | None:
        switch(TVM_POOL)
        return _probe()

    # Work on another thread pool than TVM's (NumPy's BLAS) ran ~6-10% slower when timed
    # first after the probe than an identical block after it (2-core EPYC; TVM modules
    # showed no such effect). Every other round runs in reverse, so each contender takes
    # each place equally often and no position effect lands on one of them.
    order = list(fns.items())
    link_ns = [probe()]
    for round_ in range(repeats):
        for name, fn in order if round_ % 2 == 0 else order[::-1]:
            switch(pool_of(name))
            n = numbers[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n * 1e3)
        link_ns.append(probe())
    return Timing(samples, link_ns, _probe.fastest)


def export(executable: Any, path: Path) -> Path:
    """Write the compiled model as a shared library loadable by ``tvm.runtime.load_module``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with without_stderr_lines(SCOPE_SAVING):
        executable.export_library(str(path))
    return path


# TVM 0.27's VM executable logs every memory scope it saves at WARNING level, once per
# constant of a model that has run (``executable.cc``: "Warning: Scope Saving:"): dozens of
# lines in every tune's output that say nothing to a user.
SCOPE_SAVING = "Warning: Scope Saving:"


@contextlib.contextmanager
def without_stderr_lines(fragment: str) -> Iterator[None]:
    """Drop the lines containing ``fragment`` that C++ (or anything) writes to file descriptor
    2 within the block; the others are written after it, in order."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().splitlines(keepends=True)
            kept = [line for line in lines if fragment.encode() not in line]
            if kept:
                os.write(2, b"".join(kept))


def load_exported(path: Path, target: Any | None = None):
    """(VirtualMachine, device) for a library written by :func:`export`."""
    import tvm
    from tvm import relax

    dev = device_of(target) if target is not None else tvm.cpu(0)
    lib = tvm.runtime.load_module(str(path))
    return relax.VirtualMachine(lib, dev), dev
