"""bench/label_noise.py: how well two timings of one program agree, read from a dataset."""

from __future__ import annotations

import gzip
import json

import pytest

pytestmark = pytest.mark.usefixtures("bench_on_path")

TARGET = {"kind": "llvm", "mcpu": "znver4"}


def _dataset(folder, rows):
    """A record file of (workload, run_secs) rows, in the JSONDatabase's line format."""
    folder.mkdir()
    with gzip.open(folder / "database_tuning_record.json.gz", "wt") as out:
        for workload, secs in rows:
            out.write(json.dumps([workload, [[[], []], secs, TARGET, []]]) + "\n")
    return folder


def test_timings_that_agree_score_one_and_a_reversed_fastest_quarter_scores_minus_one(tmp_path):
    from label_noise import summarize

    same = [(0, [t, t, t]) for t in range(1, 41)]
    # Workload 1: all agree on the order except the fastest 10, whose second timing reverses it.
    flipped = [(1, [t, (11 - t) if t <= 10 else t, t]) for t in range(1, 41)]
    noisy = summarize(_dataset(tmp_path / "d", same + flipped + [(2, [1.0, 1.0])]), 32)
    assert noisy["workloads"] == 2, "a workload of fewer records than --min-records is left out"
    one = summarize(_dataset(tmp_path / "s", same), 32)
    assert one["quarter_median"] == one["all_median"] == one["top8_median"] == 1.0
    assert one["quarter_spread_median"] == 10.0  # fastest quarter of 1..40: 1..10
    assert noisy["quarter_median"] == 0.0  # median of 1.0 and -1.0


def test_records_without_two_valid_timings_and_corrupt_lines_are_skipped(tmp_path):
    from label_noise import record_file, timings

    folder = _dataset(tmp_path / "d", [(0, [1.0, 2.0]), (0, [1.0]), (0, [1e10, 1e10])])
    with gzip.open(folder / "database_tuning_record.json.gz", "at") as out:
        out.write('[0, [[], [1.0, "x"\n')
    assert list(timings(record_file(folder)).values()) == [[[1.0, 2.0]]]


def test_bad_input_is_one_line_before_any_work(tmp_path):
    from label_noise import main

    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path)])
    assert "is no dataset" in str(exc.value)
    (tmp_path / "r.json").write_text("{}")
    folder = _dataset(tmp_path / "d", [(0, [1.0, 1.0])])
    with pytest.raises(SystemExit) as exc:
        main([str(folder), "--against", str(tmp_path / "r.json")])
    assert "is no pretrain_source result" in str(exc.value)


def test_two_datasets_of_one_name_keep_a_row_each(tmp_path, capsys):
    # Keyed by the folder's name alone, zen2/data's row overwrote zen4/data's.
    from label_noise import main

    rows = [(0, [t, t, t]) for t in range(1, 41)]
    for cpu in ("zen2", "zen4"):
        (tmp_path / cpu).mkdir()
        _dataset(tmp_path / cpu / "data", rows)
    assert main([str(tmp_path / "zen2" / "data"), str(tmp_path / "zen4" / "data")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(summary["datasets"]) == ["zen2/data", "zen4/data"]
