"""bench/lowering.py: bad input refused before anything starts; its plan and metrics."""

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
        (["--variants", "fast_math", "turbo"], "unknown variant turbo"),
        (["--trials", "0"], "at least 1"),
        (["--stride", "0"], "--stride must be at least 1"),
    ],
)
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, says):
    assert_bench_refuses("lowering.py", tmp_path, args, says)


def _args(tmp_path: Path, **overrides) -> argparse.Namespace:
    from lowering import parse_args

    args = parse_args(["--work", str(tmp_path), "--models", "mbconv_se", "bert_block",
                       "--tasks", "2", "--repeats", "3"])  # fmt: skip
    return argparse.Namespace(**{**vars(args), **overrides})


def test_plan_runs_plain_and_rotates_which_variant_goes_first(tmp_path):
    from lowering import plan

    runs = plan(_args(tmp_path))
    assert len(set(runs)) == len(runs) == 3 * 2 * 3
    firsts = [runs[i][1] for i in range(0, len(runs), 3)]
    assert firsts == ["plain", "prepack", "prepack", "fast_math", "fast_math", "plain"]
    assert {v for _, v, _ in plan(_args(tmp_path, variants=["fast_math"]))} == {
        "plain",
        "fast_math",
    }


def test_ratios_are_plain_over_each_variant_per_task_then_geomean(tmp_path):
    from lowering import gather, markdown, run_dir, summary_line
    from searchbench.layout import write_json

    args = _args(tmp_path, models=["mbconv_se"], repeats=1)
    for variant, us in (("plain", [40.0, 10.0]), ("prepack", [20.0, 10.0]),
                        ("fast_math", [10.0, 5.0])):  # fmt: skip
        write_json(run_dir(args, "mbconv_se", variant, 0) / "result.json", {
            "target": {"kind": "llvm"}, "commit": "abc1234", "tuning_seconds": 60.0,
            "tasks": [{"kernel_class": f"conv2d+{variant}{i}", "mflops": 1.0, "best_us": x}
                      for i, x in enumerate(us)],
        })  # fmt: skip
    data = gather(args)
    model = data["models"]["mbconv_se"]
    assert [t["ratio"] for t in model["tasks"]] == [
        {"prepack": 2.0, "fast_math": 4.0},
        {"prepack": 1.0, "fast_math": 2.0},
    ]
    assert model["kernel_ratio"]["prepack"] == pytest.approx(2**0.5)
    assert model["kernel_ratio"]["fast_math"] == pytest.approx(8**0.5)
    assert model["e2e_ratio"] == {"prepack": None, "fast_math": None} and not data["partial"]
    # The plain run names the kernel; a variant may rename it.
    text = markdown(args, data)
    assert "| mbconv_se | 0: conv2d+plain0 | 1.00 | 40.0 | 20.0 | 10.0 | 2.00 | 4.00 |" in text
    line = summary_line(data)
    assert line["geomean_kernel_ratio"]["fast_math"] == pytest.approx(8**0.5)
    assert line["models"]["mbconv_se"]["prepack"]["kernel_ratio"] == pytest.approx(2**0.5)


def _lowerings(tmp_path: Path, target, shape: str, layers: str):
    """A function from a ``Lowering`` to the tasks of ``nn.Sequential(layers)`` on a random
    input of ``shape``, imported as a user's model file would be."""
    from gradtune.frontend import load_model
    from gradtune.partition import extract, prepare

    source = tmp_path / "net.py"
    source.write_text(
        "import torch\nfrom torch import nn\n\n\ndef get_model():\n    torch.manual_seed(0)\n"
        f"    model = nn.Sequential({layers})\n"
        f"    return model.eval(), (torch.randn({shape}),)\n"
    )
    model = load_model(source)
    return lambda lowering: extract(prepare(model.mod, model.params, target, lowering), target)


def test_a_variant_tunes_the_kernels_plain_ranked_first(tmp_path, llvm_target):
    """The chosen kernels are found again in the fast-math lowering by operators and argument
    shapes, though their names and the task order differ, and in NHWC, though the shapes are
    permuted; two SiLU convolutions of other shapes are not mistaken for each other.
    ``--operator`` picks kernels by an operator instead: the softmax, whatever its FLOPs."""
    from lowering import ranked, same_kernels

    from gradtune.partition import Lowering

    lower = _lowerings(
        tmp_path, llvm_target, "1, 3, 8, 8",
        "nn.Conv2d(3, 8, 3, padding=1), nn.SiLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 1), "
        "nn.SiLU(), nn.Flatten(), nn.Linear(256, 10), nn.Softmax(dim=1)",
    )  # fmt: skip
    plain = lower(Lowering(fast_math=False))
    fast = lower(Lowering(fast_math=True))
    chosen = ranked(plain, 3)
    found = same_kernels(plain, fast, chosen)
    assert [t.name for t in found] != [t.name for t in chosen]  # renamed: fast_sigmoid
    for old, new in zip(chosen, found, strict=True):
        assert new.name.split("_")[1] == old.name.split("_")[1]  # conv2d1 is conv2d1
        assert ("tir_sigmoid" in old.name) == ("fast_sigmoid" in new.name)
        assert old.flops <= new.flops  # the approximation's arithmetic, never fewer
    assert len({t.name for t in found}) == 3
    # In NHWC the convolutions' arguments are permuted (HWIO weights): found all the same.
    channels_last = lower(Lowering(fast_math=False, conv_layout="NHWC"))
    assert [t.name for t in same_kernels(plain, channels_last, chosen)] == [t.name for t in chosen]
    softmax = ranked(plain, 3, "softmax")
    assert [t.kernel_class for t in softmax] == ["softmax"]
    assert ["fast_softmax" in t.name for t in same_kernels(plain, fast, softmax)] == [True]


def test_stride_picks_the_downsampling_convolutions_in_every_layout(tmp_path, llvm_target):
    """``--stride 2`` picks the stride-2 convolutions (a 3×3 and a 1×1 shortcut, padded or
    not), never the stride-1 one of more FLOPs nor the pooling, and the same kernels are found
    again in NHWC and in blocked channels; their runs and results live apart."""
    from lowering import conv_stride, ranked, root, same_kernels, stem

    from gradtune.partition import Lowering

    lower = _lowerings(
        tmp_path, llvm_target, "1, 8, 32, 32",
        "nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), "
        "nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 1, stride=2)",
    )  # fmt: skip
    plain = lower(Lowering(fast_math=False))
    strides = sorted(s for s in map(conv_stride, plain) if s is not None)
    assert strides == [1, 2, 2]
    chosen = ranked(plain, 3, stride=2)
    assert len(chosen) == 2 and all(conv_stride(t) == 2 for t in chosen)
    assert [t.flops for t in chosen] == sorted((t.flops for t in chosen), reverse=True)
    for layout in ("NHWC", "NCHWc"):
        other = lower(Lowering(fast_math=False, conv_layout=layout))
        assert len(same_kernels(plain, other, chosen)) == 2, layout
    args = _args(tmp_path, stride=2, variants=["nhwc", "nchwc"])
    assert root(args).name == "evolutionary-stride2-2tasks-64trials"
    assert stem(args) == "lowering_stride2_nhwc_nchwc"
