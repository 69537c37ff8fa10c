"""The tuning's build: MetaSchedule's default build, minus TVM's tensor-intrinsic registry on
CPU targets, in worker processes that die with their owner.

The stock ``default_build`` imports ``tvm.s_tir.tensor_intrin`` in every fresh worker: ~29 s on
2 cores against a 30 s build timeout, so every trial fails and tuning silently does nothing
(``tune_relax`` then returns an untuned module, reporting "Total trials: 0"). CPU float
schedules never tensorize with those intrinsics; CUDA ones may, so
GPU builds still import them.

Each worker dies with the process that started it (``lifeline.watch_owner``): a worker in the
middle of a build would otherwise outlive a tuning run killed with -9 by up to the build
timeout.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ..lifeline import watch_owner


def fast_build(mod: Any, target: Any, _params: dict | None) -> Any:
    """Same steps as MetaSchedule's default build, minus the CPU-irrelevant import."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    if target.kind.name == "cuda":
        import tvm.s_tir.tensor_intrin.cuda  # noqa: F401  (registers the tensor-core intrinsics)
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def make_builder(max_workers: int, timeout_sec: float = 60.0) -> Any:
    """The tuning's builder: ``fast_build`` in a pool reused across batches
    (``pooled_builder``); call its ``shutdown()`` when done."""
    from .pooled_builder import metaschedule_builder

    return metaschedule_builder(max_workers, timeout_sec)


def worker_lifeline() -> functools.partial:
    """A worker pool's ``initializer`` that makes each worker die with this process."""
    return functools.partial(watch_owner, os.getpid())
