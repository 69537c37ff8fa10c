"""bench/weight_prepack.py: bad input refused before anything starts; its plan and metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.conftest import assert_bench_refuses

pytestmark = pytest.mark.usefixtures("bench_on_path")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--models", "mbconv_se", "no_such_model"], "unknown model no_such_model"),
        (["--trials", "0"], "at least 1"),
    ],
)
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, says):
    assert_bench_refuses("weight_prepack.py", tmp_path, args, says)


def _args(tmp_path: Path, **overrides) -> argparse.Namespace:
    from weight_prepack import parse_args

    args = parse_args(["--work", str(tmp_path), "--models", "mbconv_se", "bert_block",
                       "--tasks", "2", "--repeats", "2"])  # fmt: skip
    return argparse.Namespace(**{**vars(args), **overrides})


def test_plan_alternates_which_variant_goes_first(tmp_path):
    from weight_prepack import plan

    runs = plan(_args(tmp_path))
    assert len(set(runs)) == len(runs) == 2 * 2 * 2
    firsts = [runs[i][1] for i in range(0, len(runs), 2)]
    assert firsts == ["plain", "prepack", "prepack", "plain"]


def test_ratios_are_plain_over_prepack_per_task_then_geomean(tmp_path):
    from searchbench.layout import write_json
    from weight_prepack import gather, markdown, run_dir, summary_line

    args = _args(tmp_path, models=["mbconv_se"], repeats=1)
    for variant, us in (("plain", [40.0, 10.0]), ("prepack", [20.0, 10.0])):
        write_json(run_dir(args, "mbconv_se", variant, 0) / "result.json", {
            "target": {"kind": "llvm"}, "commit": "abc1234", "tuning_seconds": 60.0,
            "tasks": [{"kernel_class": f"conv2d+relu{i}", "mflops": 1.0, "best_us": x}
                      for i, x in enumerate(us)],
        })  # fmt: skip
    data = gather(args)
    model = data["models"]["mbconv_se"]
    assert [t["ratio"] for t in model["tasks"]] == [2.0, 1.0]
    assert model["kernel_ratio"] == pytest.approx(2**0.5)
    assert model["e2e_ratio"] is None and not data["partial"]
    assert "| mbconv_se | 0: conv2d+relu0 | 1.00 | 40.0 | 20.0 | 2.00 |" in markdown(args, data)
    assert summary_line(data)["geomean_kernel_ratio"] == pytest.approx(2**0.5)
