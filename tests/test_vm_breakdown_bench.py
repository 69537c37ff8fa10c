"""bench/vm_breakdown.py: a compiled model's inference against its kernels timed alone, and
bad input refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import BENCH, ROOT

sys.path.insert(0, str(BENCH))
import vm_breakdown  # noqa: E402


def test_every_kernel_the_inference_calls_is_timed_alone_on_the_inference_own_tensors(
    tiny_model, llvm_target, tmp_path
):
    from gradtune import compilation, registry
    from gradtune.partition import prepare

    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    executable = compilation.build(fused, llvm_target, exec_mode="bytecode")
    compilation.export(executable, tmp_path / "model.so")
    io = registry.io_description(tiny_model.input_names, tiny_model.inputs)
    (tmp_path / "io.json").write_text(json.dumps(io))
    record = vm_breakdown.time_library(tmp_path, rounds=3, with_perf=False)
    # The tiny MLP's matmuls and epilogues are kernels; allocation and checks are builtins.
    assert record["kernel_calls"] >= 2 and record["builtin_calls"] >= 1
    assert len(record["e2e_us"]) == len(record["kernels_us"]) == 3
    assert len(record["kernels_flushed_us"]) == 3 and min(record["kernels_flushed_us"]) > 0
    assert len(record["kernels_handoff_us"]) == 3 and min(record["kernels_handoff_us"]) > 0
    assert len(record["link_ns"]) == 4  # a probe before the first round and after each
    assert all(k > 0 for k in record["kernels_us"]) and all(e > 0 for e in record["e2e_us"])


def test_a_library_whose_vm_runs_compiled_is_built_again_or_refused_in_one_line(
    tiny_model, llvm_target, tmp_path
):
    # gradtune compiles a CPU model's VM function (compilation.exec_mode_for): no call passes
    # the instrument, and timed as it is every row read 0 kernels and 100% overhead.
    from gradtune import compilation, registry
    from gradtune.partition import prepare

    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    compilation.export(compilation.build(fused, llvm_target), tmp_path / "model.so")
    io = registry.io_description(tiny_model.input_names, tiny_model.inputs)
    (tmp_path / "io.json").write_text(json.dumps(io))
    with pytest.raises(SystemExit, match="runs its VM function compiled"):
        vm_breakdown.time_library(tmp_path, rounds=3, with_perf=False)
    done = subprocess.run(
        [sys.executable, str(BENCH / "vm_breakdown.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert "has no run.json to build it again as bytecode" in done.stderr.strip().splitlines()[-1]


def test_only_rounds_with_the_cores_near_count_and_the_row_says_where_each_pass_ran():
    def timed(e2e, kernels, link_ns):
        return {"e2e_us": e2e, "kernels_us": kernels, "link_ns": link_ns,
                "kernels_flushed_us": [k * 1.5 for k in kernels],
                "kernels_handoff_us": [k * 1.2 for k in kernels],
                "kernel_calls": 5, "builtin_calls": 9}  # fmt: skip

    per = [
        # Three rounds near, then the host moved the vCPUs apart: the inference slows more
        # than its kernels alone, and those rounds must not count.
        timed(
            [100, 100, 100, 130, 160, 160],
            [90, 90, 90, 95, 100, 100],
            [800, 800, 800, 800, 1700, 1700, 1700],
        ),
        timed([160] * 6, [100] * 6, [1700] * 7),  # apart throughout: kept, and said
        timed([102] * 6, [91] * 6, [790] * 7),
    ]
    row = vm_breakdown.summarize(per)
    assert row["states"] == ["near", "apart", "near"]
    assert (row["e2e_us"], row["kernels_us"], row["overhead_us"]) == (102, 91, 11)
    assert row["kernels_flushed_us"] == 136.5  # the same rounds' medians as the kernels
    assert row["kernels_handoff_us"] == 109.2
    assert row["overhead_share"] == round(11 / 102, 4)


def test_timing_orders_rank_each_way_of_timing_against_the_inference():
    def row(e2e, alone, flushed, handed):
        return {2: {"e2e_us": e2e, "kernels_us": alone, "kernels_flushed_us": flushed,
                    "kernels_handoff_us": handed}}  # fmt: skip

    summary = {"a": row(100, 60, 70, 80), "b": row(110, 50, 72, 90), "c": row(95, 55, 71, 75)}
    assert vm_breakdown.timing_orders(summary, 2) == {"alone": -0.5, "flushed": 0.5, "handoff": 1.0}
    assert vm_breakdown.timing_orders({"a": summary["a"], "b": summary["b"]}, 2) == {}


@pytest.mark.parametrize(
    "args, says",
    [
        (["no/such/run"], "no/such/run has no model.so"),
        (["RUN", "--passes", "2"], "--passes must be at least 3"),
        (["RUN", "--threads", "0"], "--threads must be positive"),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path, args, says):
    for name in ("model.so", "io.json"):  # names the checks look for; never loaded
        (tmp_path / name).write_text("")
    args = [str(tmp_path) if a == "RUN" else a for a in args]
    done = subprocess.run(
        [sys.executable, str(BENCH / "vm_breakdown.py"), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == ""


def test_libraries_in_directories_of_one_name_keep_a_row_each(tmp_path):
    # vs_runtimes leaves every model's library in runs/<model>/tune: keyed by the last part of
    # the path, one timing's libraries overwrote each other and the table repeated the last.
    from searchbench.report import labels

    runs = [tmp_path / "runs" / m / "tune" for m in ("resnet18_like", "squeeze_fire")]
    assert labels(runs) == ["resnet18_like/tune", "squeeze_fire/tune"]
    assert labels([tmp_path / "a", tmp_path / "b"]) == ["a", "b"]
