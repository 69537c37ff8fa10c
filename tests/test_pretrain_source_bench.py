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


@pytest.mark.parametrize(
    "train, extra",
    [
        (["one=data"], []),
        (["one=data"], ["--epochs", "40"]),
        (["one=data"], ["--epochs", "40", "40"]),
    ],
)
def test_one_row_is_nothing_to_compare(capsys, train, extra):
    from pretrain_source import main

    assert main(["--train", *train, "--test", "one", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to compare" in err[0]


def test_one_training_run_stands_for_every_shorter_length(tmp_path):
    """The snapshots at 2 and 5 epochs of one 5-epoch run are the nets that 2- and 5-epoch
    runs end in, so one run per fold weighs several training lengths."""
    import torch
    from pretrain_source import cut, fold_weights

    from gradtune.costmodel.pretrain import train
    from gradtune.costmodel.train import Group, predict
    from gradtune.symbolic.features import FEATURES

    rng = np.random.default_rng(0)
    programs = [torch.as_tensor(rng.normal(size=(2, FEATURES)), dtype=torch.float32)
                for _ in range(12)]  # fmt: skip
    entry = {"family": "conv2d", "models": {"m"}, "programs": programs,
             "latencies": list(1.0 + rng.random(12))}  # fmt: skip
    params = {"loss": "rank", "lr": 1e-3}
    paths = {2: tmp_path / "e2.pt", 5: tmp_path / "e5.pt"}
    nets = fold_weights("one", "m", 0, {"w": entry}, {"w": 12}, params, paths)
    assert sorted(nets) == [2, 5] and all(p.is_file() for p in paths.values())
    chosen, latencies = cut(entry, 12, 0)
    for epochs in (2, 5):
        alone, _ = train([Group("w", "conv2d", chosen, latencies)], "rank", epochs, 1e-3, 0)
        assert np.allclose(predict(nets[epochs], programs), predict(alone, programs))
    # Cached: a second call trains nothing and loads the same nets.
    again = fold_weights("one", "m", 0, {}, {}, params, paths)
    assert np.allclose(predict(again[5], programs), predict(nets[5], programs))
