"""Partition a Relax model into tuning tasks (TVM paper §3: operator fusion into subgraphs).

Each task is a fused PrimFunc with a weight (how often the model calls it), a kernel class
(its operator sequence without shapes, the unit Transfer-Tuning reuses schedules across) and
its FLOPs. The same fused module feeds extraction and compilation so database keys always match.

Every classification of a kernel lives here: its kernel class from the task name (or, for a
workload stored without one, from its block names) and the coarser operator family of a
kernel class, which the dataset balances its sampling over and the cost model reports by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import GradtuneError

_SUFFIX = re.compile(r"\d+$")


@dataclass
class TuningTask:
    name: str
    mod: Any  # IRModule with one PrimFunc "main"
    weight: int
    kernel_class: str
    flops: float
    untuned_us: float = float("nan")  # measured default-schedule latency of one call

    @property
    def untuned_total_us(self) -> float:
        return self.weight * self.untuned_us


def kernel_class(task_name: str) -> str:
    """``fused_conv2d2_subtract1_add4_relu1`` → ``conv2d+subtract+add+relu``.

    Relax appends counters to make global names unique; they carry no meaning, so drop them.
    """
    name = task_name.removeprefix("fused_")
    ops = [_SUFFIX.sub("", op) or op for op in name.split("_") if op]
    # Op names such as conv2d_transpose contain "_": keep known multi-word ops together.
    joined = "+".join(ops)
    compounds = ("conv2d+transpose", "conv1d+transpose", "conv3d+transpose", "batch+matmul")
    for compound in (*compounds, "conv2d+NCHWc"):
        joined = joined.replace(compound, compound.replace("+", "_"))
    return joined


def module_kernel_class(mod: Any) -> str:
    """Kernel class of a workload module from its block names (``conv2d_nchw+T_subtract+...``).

    A database workload keeps its PrimFunc but not the task name ``kernel_class`` reads, so
    the blocks' names stand in for it: counters and suffixes stripped, padding blocks dropped.
    """
    names = []

    def visit(stmt: Any) -> None:
        kind = type(stmt).__name__
        if kind == "SBlockRealize":
            visit(stmt.block)
        elif kind == "SBlock":
            if stmt.name_hint != "root":
                names.append(re.sub(r"(_\d+)+$|\d+$", "", stmt.name_hint))
            visit(stmt.body)
        elif kind == "SeqStmt":
            for s in stmt.seq:
                visit(s)
        elif hasattr(stmt, "body"):
            visit(stmt.body)

    for _, func in mod.functions.items():
        visit(func.body)
    core = [n for n in names if not re.match(r"^(T_)?(pad|PadInput|pad_temp|compile_engine)", n)]
    return "+".join(dict.fromkeys(core or names)) or "unknown"


# The compute families, in the order the dataset's collection visits them.
OPERATOR_FAMILIES = ("conv2d", "conv2d_transpose", "conv3d", "matmul", "softmax", "norm", "mean")
OTHER_FAMILY = "elementwise / data movement"


def operator_family(kernel_class: str) -> str:
    """Operator family of a kernel class (``conv2d+subtract+...+relu`` → ``conv2d``): one of
    ``OPERATOR_FAMILIES``, or ``OTHER_FAMILY``."""
    # conv2d_transpose before conv2d: the shorter name is a substring of it.
    for name in ("conv3d", "conv2d_transpose", "conv2d", "matmul", "softmax"):
        if name in kernel_class:
            return name
    if "norm" in kernel_class or "rsqrt" in kernel_class:  # layer norm, RMS norm
        return "norm"
    if "mean" in kernel_class:
        return "mean"
    return OTHER_FAMILY


# Data layout → the kernel layout ``ConvertLayout`` gives 2-D convolutions' weights in it.
CONV_LAYOUTS = {"NCHW": "OIHW", "NHWC": "HWIO"}
# NCHWc's block is the target's register lanes, so its layouts come from the target
# (``nchwc.layouts``), not from a table.
CONV_LAYOUT_CHOICES = (*CONV_LAYOUTS, "NCHWc")


@dataclass(frozen=True)
class Lowering:
    """Options of the lowering to fused TIR that change what is tuned. Each changes the
    workload of every task it touches, so records tuned with and without it never mix.

    Parameters
    ----------
    weight_prepack : bool, default False
        CPU targets: every PrimFunc argument that is a weight (a bound constant) is marked
        layout-free (``AttachAttrLayoutFreeBuffers``). MetaSchedule's ``RewriteLayout``
        postprocessor may then store each weight in the order the tuned loop nest reads it, as
        Ansor does, and ``compilation.build`` folds that reordering into the constants at
        compile time: TVM's ``cpu_weight_prepack``, without its change of the module's
        interface, because gradtune's weights are constants rather than inputs.
    fast_math : bool, default True
        Exp, softmax, sigmoid (and so SiLU), erf (exact GELU) and tanh computed by vectorizable
        polynomial approximations (``topi.fast_exp``, ``fast_erf``, ``fast_tanh``) instead of a
        scalar libm call per element (``fast_math.py`` says why and what it costs). On by
        default, as in ONNX Runtime, whose MLAS approximates these functions too: on mbconv_se's
        two largest SiLU convolutions it took evolutionary search from 228-270 µs and 97-123 µs
        (no better than their default schedules) to under 50 µs and 20 µs at the same 64 trials
        (``bench/results/lowering.md``).
    conv_layout : {"NCHW", "NHWC", "NCHWc"}, default "NCHW"
        The data layout 2-D convolutions are tuned in. ``"NHWC"`` runs Relax's
        ``ConvertLayout`` (weights HWIO) before legalization: the output channels become the
        innermost, contiguous axis of the output and of the weights, so a vectorized loop
        over them loads and stores whole vectors whatever the stride, where NCHW vectorizes
        over output columns (strided loads at stride 2, short rows late in a network). The
        elementwise operators after a convolution follow its layout; a transpose is left
        only where an NCHW tensor enters or leaves that region (the model's input). The
        weights' transposition is folded into the constants. ``"NCHWc"`` (CPU targets) blocks
        the channels by one vector register's lanes, each chunk innermost (``nchwc``): a
        convolution whose channel counts do not divide by the block stays NCHW. Off: on
        resnet18_like's three largest convolutions (Zen 3, 64 evolutionary trials, 3 repeats)
        0.84× of NCHW per kernel (``bench/results/lowering_nchwc_znver3.md``).
    fold_batchnorm : bool, default False
        A BatchNorm after a 2-D convolution is folded into its weights and a bias (Relax's
        ``FoldBatchnormToConv2D``, then ``FoldConstant``), as ONNX Runtime folds it. Unfolded,
        it is decomposed into ``subtract``, ``divide``, ``multiply`` and ``add`` by per-channel
        constants, fused into the convolution's kernel: a division per output element, which
        costs a depthwise 3×3 convolution (9 multiply-adds per element) about as much again.
    subpixel_conv_transpose : bool, default True
        A 2-D transposed convolution (constant weights, one group, NCHW) is computed as one
        dense convolution over its output phases, interleaved into the output in the same
        kernel (``subpixel``), instead of TOPI's dense convolution over its input spread out
        with zeros: at stride 2 three of four of TOPI's multiply-adds are by zeros, at a
        one-pixel input 15 of 16, and no schedule skips them.
    """

    weight_prepack: bool = False
    fast_math: bool = True
    conv_layout: str = "NCHW"
    fold_batchnorm: bool = False
    subpixel_conv_transpose: bool = True

    def __post_init__(self) -> None:
        if self.conv_layout not in CONV_LAYOUT_CHOICES:
            raise GradtuneError(
                f"unknown convolution layout {self.conv_layout!r} (choose from "
                f"{', '.join(CONV_LAYOUT_CHOICES)})"
            )

    def check_target(self, kind: str) -> None:
        """Refuse, in one line naming the option, what a target of this ``kind`` cannot take:
        prepacked weights and blocked channels are CPU (llvm) schedules. The CLI checks before
        anything starts, ``prepare`` for a library caller."""
        if kind == "llvm":
            return
        cpu_only = {"--weight-prepack": self.weight_prepack,
                    "--conv-layout NCHWc": self.conv_layout == "NCHWc"}  # fmt: skip
        for flag, on in cpu_only.items():
            if on:
                raise GradtuneError(f"{flag} is for CPU targets (llvm), not {kind}")


DEFAULT_LOWERING = Lowering()
# The lowering of the bundled dataset's measurements (libm's functions, as TVM lowers them).
EXACT_LOWERING = Lowering(
    weight_prepack=False,
    fast_math=False,
    conv_layout="NCHW",
    fold_batchnorm=False,
    subpixel_conv_transpose=False,
)


def recorded_lowering(record: dict[str, Any] | None) -> dict[str, Any]:
    """Every ``Lowering`` field of a recorded lowering (run.json, a benchmark's record). A
    field the record lacks did not exist when it was written: its value is the one the code
    had then, ``EXACT_LOWERING``'s."""
    from dataclasses import asdict

    return {**asdict(EXACT_LOWERING), **(record or {})}


# The lowering options that change the loop nest of a family's kernels, not only the arithmetic
# of an epilogue MetaSchedule inlines: a schedule tuned under one value fits no sketch under
# the other. Sub-pixel lowering makes a transposed convolution a dense convolution and a
# gather; a data layout reorders a convolution's loops and those of the pooling, concatenation
# and elementwise kernels the layout spreads to. Prepacked weights, fast math and a folded
# BatchNorm leave every sketch's loops as they were.
SHAPING_OPTIONS = {
    "subpixel_conv_transpose": ("conv2d_transpose",),
    "conv_layout": ("conv2d", OTHER_FAMILY),
}


def shaping_lowering(lowering: dict[str, Any], kernel_class: str) -> dict[str, Any]:
    """The options of ``lowering`` (``recorded_lowering``'s fields) that shape the loop nest
    of a ``kernel_class`` kernel: what a schedule must share with a kernel to transfer to it."""
    family = operator_family(kernel_class)
    return {name: lowering[name] for name, shaped in SHAPING_OPTIONS.items() if family in shaped}


def prepare(
    mod: Any, params: dict[str, Any], target: Any, lowering: Lowering = DEFAULT_LOWERING
) -> Any:
    """Bind weights, lower to fused TIR (the form both task extraction and compile consume).

    ``extract_tasks`` on a freshly imported module finds nothing; it needs the decomposition
    and legalization first (``DecomposeOpsForInference``, ``CanonicalizeBindings``, then the
    target's library-dispatch and legalize passes, which fuse operators into PrimFuncs).

    ``lowering``: the options that change what is tuned (``Lowering``).
    """
    import tvm
    from tvm import relax
    from tvm.relax import pipeline

    lowering.check_target(target.kind.name)
    if params:
        mod = relax.transform.BindParams("main", params)(mod)
    seq = []
    if lowering.fold_batchnorm:
        # Before ConvertLayout: the fold handles OIHW convolution weights only.
        seq += [relax.transform.FoldBatchnormToConv2D(), relax.transform.FoldConstant()]
    decompose = [relax.transform.DecomposeOpsForInference(), relax.transform.CanonicalizeBindings()]
    custom = {}
    if lowering.conv_layout == "NCHWc":
        from . import nchwc
        from .search.structural import register_lanes

        # Decomposed first: ConvertLayout gives batch_norm no blocked layout, while its
        # per-channel arithmetic follows the convolution's and fuses into its kernel.
        seq += decompose
        blocked = {"relax.nn.conv2d": nchwc.layouts(register_lanes(target))}
        # ConvertLayout converts an activation once per consumer (a residual's skip and its
        # convolution each get their own copy): one is enough.
        seq += [relax.transform.ConvertLayout(blocked), relax.transform.EliminateCommonSubexpr()]
        custom["relax.nn.conv2d"] = nchwc.legalize_conv2d
    else:
        if lowering.conv_layout != "NCHW":
            layouts = [lowering.conv_layout, CONV_LAYOUTS[lowering.conv_layout]]
            seq.append(relax.transform.ConvertLayout({"relax.nn.conv2d": layouts}))
        seq += decompose
    if lowering.fast_math:
        from .fast_math import APPROXIMATIONS

        custom.update(APPROXIMATIONS)
    if lowering.subpixel_conv_transpose:
        from . import subpixel

        custom["relax.nn.conv2d_transpose"] = subpixel.legalize
    with target:
        seq += pipeline.library_dispatch_passes(target)
        if custom:
            # Before the target's legalize passes, whose own LegalizeOps then has nothing
            # left to do for these operators.
            seq.append(relax.transform.LegalizeOps(customize_legalize_map=custom))
        seq += pipeline.legalize_passes(target)
        if lowering.conv_layout != "NCHW":
            # The weights' transposes are now kernels of constants: computed once, here,
            # rather than tuned as tasks and run at every inference.
            seq.append(relax.transform.FoldConstant())
        if lowering.weight_prepack:
            seq.append(relax.transform.AttachAttrLayoutFreeBuffers())
        return tvm.transform.Sequential(seq)(mod)


def extract(fused_mod: Any, target: Any) -> list[TuningTask]:
    from tvm.s_tir import analysis
    from tvm.s_tir import meta_schedule as ms

    tasks = []
    for ext in ms.relax_integration.extract_tasks(fused_mod, target):
        task_mod = ext.dispatched[0]
        try:
            flops = float(analysis.estimate_tir_flops(task_mod))
        except Exception:  # data-movement-only kernels have no countable FLOPs
            flops = 0.0
        tasks.append(
            TuningTask(
                name=ext.task_name,
                mod=task_mod,
                weight=int(ext.weight),
                kernel_class=kernel_class(ext.task_name),
                flops=flops,
            )
        )
    return tasks


def device_of(target: Any) -> Any:
    import tvm

    return tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)


def measure_untuned(tasks: list[TuningTask], target: Any, repeat: int = 5) -> None:
    """Time each task's default (unscheduled) program locally, to weigh tasks by cost share."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    dev = device_of(target)
    if not dev.exist:
        return  # e.g. a CUDA target on a machine without a GPU: shares stay unknown
    for task in tasks:
        lib = tvm.compile(task.mod, target=target)
        args = [
            tvm.runtime.tensor(np.zeros([int(d) for d in info.shape], dtype=info.dtype), dev)
            for info in ArgInfo.from_prim_func(task.mod["main"])
        ]
        timer = lib.jit().time_evaluator("main", dev, number=3, repeat=repeat, min_repeat_ms=10)
        task.untuned_us = float(np.median(timer(*args).results)) * 1e6


def partition(
    mod: Any, params: dict[str, Any], target: Any, lowering: Lowering = DEFAULT_LOWERING
) -> tuple[Any, list[TuningTask]]:
    """Fused module + its tuning tasks, with untuned per-call latencies measured."""
    fused = prepare(mod, params, target, lowering)
    tasks = extract(fused, target)
    measure_untuned(tasks, target)
    return fused, tasks
