"""What a user would deploy instead of the tuned model: ONNX Runtime, torch.compile, PyTorch eager.

A tuned model is worth deploying only if it beats these on the same machine, so every run
times them beside the tuned module, interleaved in one process (``compilation.time_rounds``),
all on one thread count: the target's ``num-cores``, set with ``torch.set_num_threads`` and
ONNX Runtime's ``intra_op_num_threads`` (TVM's parallel loops are compiled for the same count).

Each peer starts from the model the user gave. A PyTorch model is exported to ONNX (the
TorchScript exporter, ``dynamo=False``: it needs no onnxscript) for ONNX Runtime. An ONNX model
reaches PyTorch only through onnx2torch, where that is installed: it is no dependency, because
it requires torchvision, whose PyPI wheels load only against the CUDA build of torch. A peer
that cannot be built or run, or whose outputs differ from the reference beyond the compiled
model's tolerance, keeps the reason in place of a runner, and the run goes on without it.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import json
import statistics
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .compilation import verify
from .errors import GradtuneError
from .frontend import ImportedModel

ORT = "ONNX Runtime"
TORCH_COMPILE = "torch.compile"
EAGER = "PyTorch eager"
PEER_NAMES = (ORT, TORCH_COMPILE, EAGER)
# The thread pool each peer runs on (``compilation.time_rounds``' ``pools``): inductor's
# CPU code and PyTorch's operators share OpenMP's.
POOLS = {ORT: "onnxruntime", TORCH_COMPILE: "openmp", EAGER: "openmp"}


@dataclass
class Peer:
    """One alternative runtime: ``run()`` is one inference, or ``error`` says why there is none."""

    name: str
    run: Callable[[], Any] | None = None
    error: str | None = None


@dataclass
class Peers:
    """The peers of one model, built on ``threads`` threads, with what profiling ORT takes."""

    peers: list[Peer]
    threads: int
    onnx: bytes | None = None  # the model as ONNX Runtime runs it; None where it cannot
    feed: dict[str, np.ndarray] = field(default_factory=dict)

    def runnable(self) -> dict[str, Callable[[], Any]]:
        return {p.name: p.run for p in self.peers if p.run is not None}

    def errors(self) -> dict[str, str]:
        return {p.name: p.error for p in self.peers if p.error is not None}

    def ort_op_us(self, runs: int = 30, warmup: int = 3) -> dict[str, float]:
        """Median µs per inference that ONNX Runtime spends in each operator type (as it runs
        them, after its own fusions: ``FusedConv``, ``FusedGemm``...), from its profiler.

        A separate session with profiling on: the timed one stays unperturbed. Empty when
        ONNX Runtime does not run the model.
        """
        if self.onnx is None:
            return {}
        import onnxruntime as ort

        with tempfile.TemporaryDirectory() as tmp:
            options = session_options(self.threads)
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(tmp) / "ort")
            session = ort.InferenceSession(self.onnx, options, providers=["CPUExecutionProvider"])
            for _ in range(warmup + runs):
                session.run(None, self.feed)
            events = json.loads(Path(session.end_profiling()).read_text())
        return op_times(events, skip_runs=warmup)


def op_times(events: list[dict], skip_runs: int = 0) -> dict[str, float]:
    """µs per inference by operator type from ONNX Runtime's profile (Chrome trace events):
    for each type the median over the inferences, leaving out the first ``skip_runs`` (warm-up:
    allocation, weight pre-packing). Medians, as in the timing: a shared machine's bursts hit
    single inferences."""
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )[skip_runs:]
    per_run: list[dict[str, float]] = [{} for _ in runs]
    starts = [r["ts"] for r in runs]
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1  # the inference this node ran in
        if i >= 0 and e["ts"] <= runs[i]["ts"] + runs[i]["dur"]:
            op = e.get("args", {}).get("op_name", "?")
            per_run[i][op] = per_run[i].get(op, 0.0) + float(e["dur"])
    ops = sorted({op for times in per_run for op in times})
    return {op: statistics.median(times.get(op, 0.0) for times in per_run) for op in ops}


def session_options(threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """PyTorch's intra-op thread count, restored on exit. Set before ``torch.compile`` runs:
    inductor writes the count into the code it generates."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reason(err: BaseException) -> str:
    """One line of an exception: its type and first non-empty line, with the next one where
    the first only introduces it (torch.compile's "backend='inductor' raised:")."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return f"{type(err).__name__}: {text}"


def build_peers(model: ImportedModel, threads: int, torch_module: Any | None = None) -> Peers:
    """ONNX Runtime, torch.compile and PyTorch eager for ``model``, each run once and checked
    against its reference outputs. Call inside :func:`torch_threads` (``threads``).

    ``torch_module``: the same network in PyTorch for an ONNX model, where the caller has it
    (a benchmark that exported its ONNX file from a PyTorch source); by default a PyTorch
    model is its own, and an ONNX model's comes from onnx2torch.
    """
    feed = dict(zip(model.input_names, model.inputs, strict=True))
    onnx_bytes, onnx_error = onnx_of(model)
    peers = [checked(ORT, lambda: ort_runner(onnx_bytes, feed, threads), model, onnx_error)]
    if onnx_error is not None:
        onnx_bytes = None
    elif peers[0].error is not None:
        onnx_bytes = None  # nothing to profile

    module, module_error = torch_module, None
    if module is None:
        module, module_error = torch_module_of(model)
    peers.append(
        checked(TORCH_COMPILE, lambda: compiled_runner(module, model), model, module_error)
    )
    peers.append(checked(EAGER, lambda: eager_runner(module, model), model, module_error))
    return Peers(peers=peers, threads=threads, onnx=onnx_bytes, feed=feed)


def checked(
    name: str, make: Callable[[], Callable[[], Any]], model: ImportedModel, error: str | None
) -> Peer:
    """A peer whose runner ``make()`` builds, ran once and verified; or the reason it has none."""
    if error is not None:
        return Peer(name, error=error)
    try:
        run = make()
        verify(flatten(run()), model.reference_outputs, name)
    except GradtuneError as err:
        return Peer(name, error=str(err))
    except Exception as err:  # a peer's failure, whatever it is, must not end the run
        return Peer(name, error=reason(err))
    return Peer(name, run=run)


def flatten(out: Any) -> list[np.ndarray]:
    """Outputs of ONNX Runtime (a list of arrays) or PyTorch (tensor, tuple, list) as arrays."""
    if isinstance(out, np.ndarray):
        return [out]
    if hasattr(out, "detach"):
        return [out.detach().numpy()]
    result: list[np.ndarray] = []
    for item in out:
        result.extend(flatten(item))
    return result


# --------------------------------------------------------------------------- ONNX Runtime


def onnx_of(model: ImportedModel) -> tuple[bytes | None, str | None]:
    """The model as ONNX (serialized), or why there is none."""
    if model.framework == "onnx":
        return model.source.SerializeToString(), None
    import torch

    buffer = io.BytesIO()
    example = tuple(torch.from_numpy(x) for x in model.inputs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                model.source, example, buffer, input_names=model.input_names, dynamo=False
            )
    except Exception as err:
        return None, f"torch.onnx.export failed: {reason(err)}"
    return buffer.getvalue(), None


def ort_runner(onnx_bytes: bytes, feed: dict[str, np.ndarray], threads: int) -> Callable:
    import onnxruntime as ort

    session = ort.InferenceSession(
        onnx_bytes, session_options(threads), providers=["CPUExecutionProvider"]
    )
    return lambda: session.run(None, feed)


# --------------------------------------------------------------------------- PyTorch


def torch_module_of(model: ImportedModel) -> tuple[Any | None, str | None]:
    """The model as a ``torch.nn.Module``, or why there is none."""
    if model.framework == "pytorch":
        return model.source, None
    try:
        import onnx2torch
    except ImportError:
        return (
            None,
            "the model is ONNX and onnx2torch, which converts it to PyTorch, is not installed",
        )
    try:
        return onnx2torch.convert(model.source).eval(), None
    except Exception as err:
        return None, f"onnx2torch cannot convert the model: {reason(err)}"


def torch_inputs(model: ImportedModel) -> tuple:
    import torch

    return tuple(torch.from_numpy(x) for x in model.inputs)


def eager_runner(module: Any, model: ImportedModel) -> Callable:
    import torch

    args = torch_inputs(model)

    def run():
        with torch.no_grad():
            return module(*args)

    return run


def compiled_runner(module: Any, model: ImportedModel) -> Callable:
    """``torch.compile`` with its defaults (inductor: C++ code built by the system compiler);
    compiled on the first call, which :func:`checked` makes."""
    import torch

    compiled = torch.compile(module)
    args = torch_inputs(model)

    def run():
        with torch.no_grad():
            return compiled(*args)

    return run
