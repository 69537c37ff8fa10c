"""bench/pretrain_source.py: what a fold trains on, and bad input before any work starts."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("bench_on_path")


def _entry(n: int, models: set[str]) -> dict:
    return {"family": "conv2d", "models": models, "programs": list(range(n)),
            "latencies": list(1.0 + np.arange(n))}  # fmt: skip


def test_sources_share_workloads_cut_to_the_smallest_count_and_folds_leave_a_model_out():
    from pretrain_source import cut, held_out, shared

    data = {
        "one": {"a": _entry(8, {"m1"}), "b": _entry(8, {"m1", "m2"}), "c": _entry(8, {"m2"})},
        "two": {"a": _entry(4, {"m1"}), "b": _entry(6, {"m1", "m2"}), "d": _entry(9, {"m3"})},
    }
    common, counts = shared(data)
    assert common == {"a", "b"} and counts == {"a": 4, "b": 6}
    # A workload that the held-out model shares with another model leaves its training too.
    assert held_out(common, data["two"], "m2") == {"b"}
    assert held_out(common, data["two"], "m1") == {"a", "b"}
    programs, latencies = cut(data["one"]["a"], counts["a"], seed=0)
    assert len(programs) == len(latencies) == 4
    assert [1.0 + p for p in programs] == list(latencies), "programs keep their own latencies"
    again, _ = cut(data["one"]["a"], 4, seed=0)
    assert again == programs, "the same seed cuts the same records"
    whole, _ = cut(data["two"]["a"], 4, seed=1)
    assert whole == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train", "one=data", "--test", "one"], "at least two sources"),
        (["--train", "one", "two=data", "--test", "one"], "NAME=DIR"),
        (["--train", "one=data", "two=no/such/dir", "--test", "one"], "is no dataset"),
        (["--train", "one=data", "one=data", "--test", "one"], "given twice"),
    ],
)
def test_bad_input_is_one_line_before_anything_starts(args, message):
    from pretrain_source import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    "extra, says", [(["--epochs", "0"], "--epochs"), (["--loss", "x"], "--loss")]
)
def test_a_bad_training_override_is_one_line_before_any_featurizing(capsys, extra, says):
    from pretrain_source import main

    assert main(["--train", "one=data", "two=data", "--test", "one", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
