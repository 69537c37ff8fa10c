import os

import numpy as np
import pytest

from gradtune import compilation
from gradtune.errors import GradtuneError
from gradtune.partition import Lowering, prepare
from tests.conftest import EXAMPLES


def test_untuned_build_matches_reference_and_exports(tiny_model, llvm_target, tmp_path):
    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    executable = compilation.build(fused, llvm_target)
    runner = compilation.Runner(executable, llvm_target, tiny_model.inputs)
    err = compilation.verify(runner.outputs(), tiny_model.reference_outputs, "untuned")
    assert err < 1e-4
    lib = compilation.export(executable, tmp_path / "m.so")
    vm, dev = compilation.load_exported(lib)
    import tvm

    out = compilation.flatten_outputs(vm["main"](tvm.runtime.tensor(tiny_model.inputs[0], dev)))
    np.testing.assert_allclose(out[0], tiny_model.reference_outputs[0], rtol=1e-4, atol=1e-5)


def test_a_cpu_library_runs_its_vm_function_compiled_and_a_gpu_one_interpreted(
    tiny_model, llvm_target, tmp_path
):
    # Compiled, the VM's function cost tuned models 1-6% less on a 2-core Zen 2
    # (bench/vm_exec.py); on GPUs it is unmeasured, so they keep the interpreter.
    import tvm

    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    lib = compilation.export(compilation.build(fused, llvm_target), tmp_path / "m.so")
    assert "vm_tir_func" in tvm.runtime.load_module(str(lib))["as_text"]()
    assert compilation.exec_mode_for(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})) == (
        "bytecode"
    )


def test_export_drops_tvms_scope_saving_warnings_and_keeps_other_stderr(
    llvm_target, tmp_path, capfd
):
    from gradtune.frontend import load_model

    model = load_model(str(EXAMPLES / "small_cnn.py"))
    executable = compilation.build(prepare(model.mod, model.params, llvm_target), llvm_target)
    compilation.Runner(executable, llvm_target, model.inputs).run()  # a model that has run logs
    capfd.readouterr()
    with compilation.without_stderr_lines("Scope Saving"):
        executable.export_library(str(tmp_path / "probe.so"))
        os.write(2, b"a line of someone else\n")
    err = capfd.readouterr().err
    assert err == "a line of someone else\n"
    compilation.export(executable, tmp_path / "m.so")
    assert "Scope Saving" not in capfd.readouterr().err
    # Without the filter TVM says it: the test would notice TVM stopping.
    executable.export_library(str(tmp_path / "again.so"))
    assert compilation.SCOPE_SAVING in capfd.readouterr().err


def test_verify_rejects_wrong_outputs():
    ref = [np.ones((2, 3), dtype="float32")]
    with pytest.raises(GradtuneError, match="differ from the reference"):
        compilation.verify([ref[0] + 0.5], ref, "tuned TVM")
    with pytest.raises(GradtuneError, match="returns 2 outputs"):
        compilation.verify([ref[0], ref[0]], ref, "tuned TVM")


def test_time_rounds_reports_each_contender():
    import time

    result = compilation.time_rounds(
        {"fast": lambda: None, "slow": lambda: time.sleep(0.002)}, repeats=3, min_seconds=0.01
    ).medians()
    assert set(result) == {"fast", "slow"}
    assert result["slow"] >= 2.0 > result["fast"]


def test_every_other_round_runs_in_reverse():
    """The contender timed first after the probe runs slower, so no contender may always be
    first: round by round the order alternates."""
    import time

    calls = []
    fns = {n: (lambda n=n: (calls.append(n), time.sleep(0.002))) for n in "ab"}
    compilation.time_rounds(fns, repeats=4, min_seconds=0.001)
    assert "".join(calls[-8:]) == "abbaabba"


def test_a_block_after_another_runtimes_waits_for_its_threads_to_settle():
    """A block that follows another runtime's (pool ``ort``, whose every call leaves a worker
    spinning for 0.1 s) starts only once that worker stopped; between two modules of one
    runtime (``tvm``) no block waits."""
    import threading
    import time

    from tests.test_settle import spin  # busy without the GIL, as a native pool's worker is

    calls = []
    spinners: list[threading.Thread] = []

    def ort_call() -> None:
        calls.append(("c", time.perf_counter()))
        if not spinners or not spinners[-1].is_alive():
            spinners.append(threading.Thread(target=spin, args=(time.perf_counter() + 0.1,)))
            spinners[-1].start()

    fns = {
        "a": lambda: calls.append(("a", time.perf_counter())),
        "b": lambda: calls.append(("b", time.perf_counter())),
        "c": ort_call,
    }
    compilation.time_rounds(fns, repeats=3, min_seconds=0.001,
                            pools={"a": "tvm", "b": "tvm", "c": "ort"})  # fmt: skip
    gaps = {}
    for (was, earlier), (now, later) in zip(calls, calls[1:], strict=False):
        if now != was:
            gaps.setdefault((was, now), []).append(later - earlier)
    # The 3 timed rounds run a, b, c, then c, b, a (every other round reversed), then a, b, c:
    # after c's block its worker spins up to 0.1 s more, and b waits for it; a after b does not.
    assert all(gap >= 0.08 for gap in gaps[("c", "b")]), gaps
    assert all(gap < 0.05 for gap in gaps[("a", "b")][-2:] + gaps[("b", "a")]), gaps


def test_prepacked_weights_are_rewritten_by_tuned_kernels_and_folded_at_build(
    tiny_model, llvm_target, tmp_path
):
    """``weight_prepack``: the weights are layout-free, MetaSchedule's ``RewriteLayout`` stores
    them in the tuned loop nest's order, and the build folds that into the constants, with
    the same outputs."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.measure.rpc_fleet import LocalFleet
    from gradtune.partition import extract
    from gradtune.search.stoppable import Stoppable
    from gradtune.tune import run_database, tune

    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target, Lowering(weight_prepack=True))
    assert compilation.has_layout_free_weights(fused)
    assert not compilation.has_layout_free_weights(
        prepare(tiny_model.mod, tiny_model.params, llvm_target)
    )
    tasks = extract(fused, llvm_target)
    search = Stoppable(ms.search_strategy.EvolutionarySearch(
        population_size=16, init_min_unmeasured=8, genetic_num_iters=1
    ))  # fmt: skip
    with LocalFleet() as tracker:
        tune(tasks, llvm_target, tmp_path, tracker, max_trials=4 * len(tasks), search=search,
             trials_per_round=4)  # fmt: skip
    database = run_database(tmp_path)
    rewritten = [
        r for r in database.get_all_tuning_records()
        if "layout_rewrite_preproc" in r.as_measure_candidate().sch.mod.script()
    ]  # fmt: skip
    assert rewritten, "no tuned kernel rewrote a weight's layout"
    executable = compilation.build(fused, llvm_target, database)
    runner = compilation.Runner(executable, llvm_target, tiny_model.inputs)
    assert compilation.verify(runner.outputs(), tiny_model.reference_outputs, "prepacked") < 1e-4


def test_weight_prepack_is_refused_for_a_gpu_target(tiny_model):
    from gradtune.target import make_target, parse_target

    cuda = make_target(parse_target("cuda"))
    with pytest.raises(
        GradtuneError, match="--weight-prepack is for CPU targets \\(llvm\\), not cuda"
    ):
        prepare(tiny_model.mod, tiny_model.params, cuda, Lowering(weight_prepack=True))


def test_fast_math_legalizes_sigmoid_without_libm_and_keeps_the_outputs(llvm_target, tmp_path):
    """``fast_math``: a SiLU epilogue becomes ``x / (1 + fast_exp(-x))`` (no scalar ``expf``
    per element), exp and softmax take ``fast_exp``, GELU and tanh ``fast_erf`` and
    ``fast_tanh``, and the model still matches its reference outputs."""
    from gradtune.frontend import load_model
    from gradtune.partition import extract

    source = tmp_path / "silu_cnn.py"
    source.write_text(
        "import torch\n"
        "from torch import nn\n\n\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)\n"
        "    def forward(self, x):\n"
        "        x = torch.sigmoid(nn.functional.silu(self.a(x)))\n"
        "        x = torch.tanh(torch.erf(nn.functional.gelu(self.b(x))))\n"
        "        return torch.softmax(x, dim=1) + torch.exp(-x)\n\n\n"
        "def get_model():\n"
        "    torch.manual_seed(0)\n"
        "    return M().eval(), (3 * torch.randn(1, 3, 8, 8),)\n"
    )
    model = load_model(source)
    names = {
        fast: [t.name for t in extract(prepare(model.mod, model.params, llvm_target,
                                               Lowering(fast_math=fast)), llvm_target)]
        for fast in (False, True)
    }  # fmt: skip
    assert any("tir_sigmoid" in n for n in names[False])
    assert not any("tir_sigmoid" in n for n in names[True])
    assert any("fast_sigmoid" in n for n in names[True])
    for fast in ("fast_gelu", "fast_erf", "fast_tanh", "fast_softmax", "fast_exp"):
        assert any(fast in n for n in names[True]), (fast, names[True])
    for libm in ("erf", "tanh", "softmax", "exp"):  # no libm call left
        assert all(n.count(libm) == n.count(f"fast_{libm}") for n in names[True]), names[True]
    fused = prepare(model.mod, model.params, llvm_target, Lowering(fast_math=True))
    runner = compilation.Runner(compilation.build(fused, llvm_target), llvm_target, model.inputs)
    assert compilation.verify(runner.outputs(), model.reference_outputs, "fast math") < 1e-5


def test_folded_batchnorm_leaves_no_division_in_the_convolutions_and_keeps_the_outputs(
    llvm_target,
):
    """``fold_batchnorm``: every BatchNorm of small_cnn follows a convolution and is folded
    into its weights and a bias; unfolded, each convolution's kernel divides every output
    element by a per-channel constant."""
    from gradtune.frontend import load_model
    from gradtune.partition import extract

    model = load_model(EXAMPLES / "small_cnn.py")
    names = {}
    for fold in (False, True):
        fused = prepare(model.mod, model.params, llvm_target, Lowering(fold_batchnorm=fold))
        names[fold] = [t.name for t in extract(fused, llvm_target)]
        runner = compilation.Runner(compilation.build(fused, llvm_target), llvm_target,
                                    model.inputs)  # fmt: skip
        assert compilation.verify(runner.outputs(), model.reference_outputs, "folded") < 1e-4
    convs = {fold: [n for n in names[fold] if "conv2d" in n] for fold in names}
    assert len(convs[True]) == len(convs[False]) >= 4
    assert all("divide" in n for n in convs[False]), convs[False]
    assert not any("divide" in n or "subtract" in n for n in convs[True]), convs[True]


def test_nhwc_lowering_tunes_convolutions_channels_last_and_keeps_the_outputs(llvm_target):
    """``conv_layout="NHWC"``: every 2-D convolution's kernel takes NHWC data and HWIO weights
    (its output channels innermost), the weights' transposes are folded into constants rather
    than left as tasks, and the model still matches its reference outputs."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from gradtune.frontend import load_model
    from gradtune.partition import extract

    model = load_model(EXAMPLES / "small_cnn.py")
    fused = prepare(model.mod, model.params, llvm_target, Lowering(conv_layout="NHWC"))
    tasks = extract(fused, llvm_target)
    convs = [t for t in tasks if "conv2d" in t.kernel_class]
    assert len(convs) == 4
    for task in convs:
        data, weight = (
            tuple(int(d) for d in a.shape) for a in ArgInfo.from_prim_func(task.mod["main"])[:2]
        )
        assert data[3] == weight[2], (task.name, data, weight)  # NHWC's C is HWIO's I
    # The model's NCHW input is transposed once; no weight is transposed at run time.
    assert sum(t.kernel_class == "transpose" for t in tasks) == 1
    runner = compilation.Runner(compilation.build(fused, llvm_target), llvm_target, model.inputs)
    assert compilation.verify(runner.outputs(), model.reference_outputs, "NHWC") < 1e-4


def test_nchwc_lowering_blocks_convolutions_by_the_registers_lanes_and_keeps_the_outputs(
    llvm_target,
):
    """``conv_layout="NCHWc"``: every convolution whose channels divide by the target's
    register lanes runs blocked (``topi.nn.conv2d_NCHWc``), its BatchNorm arithmetic fused into
    its kernel; the stem's 3 input channels do not divide, so it stays NCHW; activations are
    converted only where the blocked chain begins and ends, weights never at run time; the
    model still matches its reference outputs."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from gradtune.frontend import load_model
    from gradtune.partition import extract
    from gradtune.search.structural import register_lanes

    lanes = register_lanes(llvm_target)
    model = load_model(EXAMPLES / "small_cnn.py")
    fused = prepare(model.mod, model.params, llvm_target, Lowering(conv_layout="NCHWc"))
    tasks = extract(fused, llvm_target)
    blocked = [t for t in tasks if t.kernel_class.startswith("conv2d_NCHWc+")]
    assert len(blocked) == 3 and all("divide" in t.kernel_class for t in blocked)
    for task in blocked:
        data, weight = (
            tuple(int(d) for d in a.shape) for a in ArgInfo.from_prim_func(task.mod["main"])[:2]
        )
        assert len(data) == 5 and data[-1] == lanes, (task.name, data)
        assert len(weight) == 6 and weight[-2:] == (lanes, lanes), (task.name, weight)
    assert [t.kernel_class for t in tasks if t.kernel_class.startswith("conv2d+")] == [
        "conv2d+subtract+divide+multiply+add+relu"
    ]
    # Into the blocked chain after the stem, out of it before the classifier: no weight.
    transforms = [t for t in tasks if "layout+transform" in t.kernel_class]
    assert 1 <= len(transforms) <= 3 and sum(t.weight for t in transforms) <= 3
    runner = compilation.Runner(compilation.build(fused, llvm_target), llvm_target, model.inputs)
    assert compilation.verify(runner.outputs(), model.reference_outputs, "NCHWc") < 1e-4


def test_nchwc_is_refused_for_a_gpu_target():
    import tvm

    from gradtune.frontend import load_model

    model = load_model(EXAMPLES / "small_cnn.py")
    with pytest.raises(
        GradtuneError, match="--conv-layout NCHWc is for CPU targets \\(llvm\\), not cuda"
    ):
        prepare(model.mod, model.params, tvm.target.Target("cuda"), Lowering(conv_layout="NCHWc"))


def test_an_unknown_convolution_layout_is_one_line():
    with pytest.raises(GradtuneError, match="unknown convolution layout 'NCHW16c'"):
        Lowering(conv_layout="NCHW16c")
