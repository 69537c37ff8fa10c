"""bench/near_best_fit.py: a one-workload fit learns what its features say, and bad input."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.usefixtures("bench_on_path")


def _dataset(tmp_path, latencies):
    """A dataset whose only workload's first feature is its program's log latency: a fit
    that can read its features ranks every half of it perfectly."""
    folder = tmp_path / "data"
    folder.mkdir()
    with gzip.open(folder / "database_tuning_record.json.gz", "wt") as out:
        for t in latencies:
            out.write(json.dumps([0, [[[], []], [t, t, t], {"kind": "llvm"}, []]]) + "\n")
    programs = []
    for t in latencies:
        row = torch.zeros(1, 164)
        row[0, 0] = float(np.log(t))
        programs.append(row)
    blob = {"workloads": [{"key": "w", "family": "conv2d", "models": ["m"],
                           "programs": programs, "latencies": list(latencies)}]}  # fmt: skip
    torch.save(blob, tmp_path / "features.pt")
    return folder, tmp_path / "features.pt"


def test_a_fresh_fit_on_features_that_carry_the_latency_ranks_the_other_half(tmp_path):
    from near_best_fit import main

    from gradtune.costmodel import model as mlp
    from gradtune.costmodel.pretrain import write_weights

    folder, features = _dataset(tmp_path, list(np.linspace(1e-4, 4e-4, 32)))
    torch.manual_seed(0)
    write_weights(mlp.FelixMLP(), tmp_path / "w.pt")
    weights = str(tmp_path / "w.pt")
    args = ["--data", str(folder), "--features", str(features), "--weights", weights]
    assert main([*args, "--epochs", "60", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "near_best_fit.json").read_text())
    assert summary["two_timings"] == {"all": 1.0, "quarter": 1.0}
    assert summary["one_workload_fresh"]["other_all"] > 0.9
    assert summary["one_workload_fresh"]["other_quarter"] > 0.5
    assert "ranking the other half" in (tmp_path / "near_best_fit.md").read_text()


def test_halves_split_every_record_once_and_repeat_with_the_seed():
    from near_best_fit import halves

    train, test = halves(9, seed=3)
    assert sorted([*train, *test]) == list(range(9)) and len(train) == 4
    assert [list(h) for h in halves(9, seed=3)] == [list(train), list(test)]


@pytest.mark.parametrize(
    "extra, says",
    [(["--features", "no/such.pt"], "--features"), (["--epochs", "0"], "at least 1")],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, extra, says):
    from near_best_fit import main

    folder, _ = _dataset(tmp_path, [1e-4, 2e-4])
    with pytest.raises(SystemExit) as exc:
        main(["--data", str(folder), *extra])
    assert says in str(exc.value)
    with pytest.raises(SystemExit) as exc:
        main(["--data", str(tmp_path / "none")])
    assert "is no dataset" in str(exc.value)
