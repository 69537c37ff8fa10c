"""bench/online_finetune.py's pretraining-data rows: which workloads a share draws, and the
first-batch ranking that only the pretraining decides."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("bench_on_path")


def test_a_data_share_never_draws_a_left_out_workload_and_repeats_its_draw():
    from online_finetune import fraction_groups

    from gradtune.costmodel.train import Group

    groups = [Group(f"w{i}", "conv2d", [], np.zeros(2)) for i in range(10)]
    excluded = {"w0", "w1"}
    half = fraction_groups(groups, excluded, 0.5, seed=3)
    assert len(half) == 4 and not {g.name for g in half} & excluded
    assert [g.name for g in half] == [g.name for g in fraction_groups(groups, excluded, 0.5, 3)]
    assert {g.name for g in fraction_groups(groups, excluded, 1.0, 0)} == {
        f"w{i}" for i in range(2, 10)
    }
    assert fraction_groups(groups, excluded, 0.0, 0) == []
    assert len(fraction_groups(groups, excluded, 0.01, 0)) == 1, "a share above 0 draws one"


def test_the_first_batch_of_each_workload_is_summarized_apart():
    from online_finetune import _summary

    rows = [
        {"spearman": -0.5, "regret": 1.0, "first": True},
        {"spearman": 0.25, "regret": 1.0, "first": True},
        {"spearman": 0.75, "regret": 1.0, "first": False},
        {"spearman": 0.75, "regret": 1.0, "first": False},
    ]
    summary = _summary(rows)
    assert summary["spearman_median"] == 0.5 and summary["spearman_first_median"] == -0.125
    assert math.isnan(_summary(rows[2:])["spearman_first_median"])
