"""Work-arounds for TVM 0.27 costs that are not ours to pay.

``TuneContext.__init__`` imports ``tvm.s_tir.tensor_intrin``, whose package ``__init__``
parses the TVMScript of every backend's tensor intrinsics: 63 s on this 2-core machine, 40 s
of it CUDA's, paid by every process that tunes. A CPU target needs only the x86 ones (VNNI /
AVX-512 dot products, ~4 s). Registering the package lazily — the x86 submodule loaded, the
others still importable on demand through the package path — makes the first TuneContext of
an llvm job cheap without changing which schedules exist for it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from pathlib import Path

_PKG = "tvm.s_tir.tensor_intrin"


def register_tensor_intrinsics(target_kind: str) -> None:
    """Import the tensor intrinsics ``target_kind`` can use, before MetaSchedule asks for all."""
    if target_kind != "llvm":
        # GPU targets: everything, as TVM does; if an llvm job registered the package lazily
        # earlier in this process, its CUDA intrinsics still have to be imported.
        importlib.import_module(_PKG)
        importlib.import_module(f"{_PKG}.cuda")
        return
    if _PKG in sys.modules:
        return
    import tvm.s_tir

    pkg = types.ModuleType(_PKG)
    pkg.__path__ = [str(Path(tvm.s_tir.__file__).parent / "tensor_intrin")]
    pkg.__package__ = _PKG
    sys.modules[_PKG] = pkg
    tvm.s_tir.tensor_intrin = pkg
    try:
        importlib.import_module(f"{_PKG}.x86")
    except BaseException:
        del sys.modules[_PKG]
        raise


@contextlib.contextmanager
def steplr_accepts_verbose():
    """TVM 0.27's ``SegmentSumMLPTrainer.train_full`` passes ``verbose=`` to torch's
    ``StepLR``, which torch 2.13 no longer accepts: MetaSchedule's MLPModel cannot train at all
    beside our torch pin. Within this block ``StepLR`` drops that one argument."""
    import torch

    original = torch.optim.lr_scheduler.StepLR

    class StepLR(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args, verbose=None, **kwargs):
            super().__init__(*args, **kwargs)

    torch.optim.lr_scheduler.StepLR = StepLR
    try:
        yield
    finally:
        torch.optim.lr_scheduler.StepLR = original
