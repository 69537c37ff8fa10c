"""How well could any cost model rank a workload's fastest programs? The labels' own noise.

``bench/pretrain_source.py`` found that the pretrained MLP ranks each held-out workload's
fastest quarter of records at a Spearman of ~0.21, while its ranking over all records is
~0.67. This asks whether that is the measurements' fault: whether the fastest programs of a
workload lie so close together that timing noise decides their order, in which case no
model, data or loss could do much better.

Every record of a gradtune dataset keeps TVM's repeated timings of its program (``run_secs``:
the runner's ``repeat`` timings, each the mean of ``number`` runs), so the dataset itself
says how well two timings of the same programs agree. Per workload it takes the Spearman
between each record's first and second timing, over all its records and over the fastest
quarter by the median timing (the records and the label ``pretrain_source`` ranks:
``best_quarter``), and over the fastest 8. A model that predicted one timing exactly would
agree with the other about this well, and the label, a median of three timings, is less
noisy than one; so the noise leaves at least this much to rank. Back-to-back timings share
the machine's state of the moment: timings taken in other sessions agree less, which this
does not see.

``--against`` puts a ``pretrain_source`` result beside it (its file and commit named).

    .venv/bin/python bench/label_noise.py data-2threads data \\
        --against bench/results/pretrain_source_two_threads.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from searchbench.report import git_commit, labels  # noqa: E402  (bench/ is on the path from here)


def record_file(folder: Path) -> Path:
    """The dataset's JSONDatabase record file (gzip'd or plain); a missing one is one line."""
    for name in ("database_tuning_record.json.gz", "database_tuning_record.json"):
        if (folder / name).is_file():
            return folder / name
    raise SystemExit(f"label_noise: error: {folder} is no dataset (no database_tuning_record.json)")


def timings(path: Path) -> dict[tuple[int, str], list[list[float]]]:
    """Every valid record's timings, grouped by workload and by the target that measured them
    (two CPUs' timings of one program are two facts). A line that does not parse is skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    out: dict[tuple[int, str], list[list[float]]] = {}
    with opener(path, "rt") as lines:
        for line in lines:
            try:
                workload, (_trace, run_secs, target, *_rest) = json.loads(line)
                secs = [float(s) for s in run_secs or []]
            except (ValueError, TypeError):
                continue
            if len(secs) >= 2 and all(math.isfinite(s) and 0 < s < 1e9 for s in secs):
                out.setdefault((int(workload), json.dumps(target, sort_keys=True)), []).append(secs)
    return out


def agreement(secs: list[list[float]]) -> dict[str, float]:
    """One workload: Spearman of the first against the second timing, over all records, the
    fastest quarter and the fastest 8 (by the median timing); the quarter's spread; the
    median within-record coefficient of variation."""
    from pretrain_source import best_quarter

    from gradtune.costmodel.train import spearman

    first = np.array([s[0] for s in secs])
    second = np.array([s[1] for s in secs])
    label = np.array([float(np.median(s)) for s in secs])
    quarter = best_quarter(label)
    top8 = np.argsort(label, kind="stable")[:8]

    def rho(idx: np.ndarray) -> float:
        value = spearman(first[idx], second[idx])
        return 0.0 if math.isnan(value) else value

    return {
        "all": rho(np.arange(len(label))),
        "quarter": rho(quarter),
        "top8": rho(top8),
        "quarter_spread": float(label[quarter].max() / label[quarter].min()),
        "cv": float(np.median([np.std(s) / np.mean(s) for s in secs])),
    }


def summarize(folder: Path, min_records: int) -> dict[str, Any]:
    rows = [agreement(s) for s in timings(record_file(folder)).values() if len(s) >= min_records]
    if not rows:
        raise SystemExit(f"label_noise: error: {folder} has no workload of {min_records} records")
    out: dict[str, Any] = {"workloads": len(rows)}
    for key in ("all", "quarter", "top8", "quarter_spread", "cv"):
        out[f"{key}_median"] = round(float(np.median([r[key] for r in rows])), 4)
    return out


def against(path: Path) -> dict[str, Any]:
    """A ``pretrain_source`` result: per source its Spearman medians (all, fastest quarter)."""
    try:
        blob = json.loads(path.read_text())
        return {
            "file": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
            "commit": blob["commit"],
            "test": blob["test"],
            "sources": {
                name: {"all": r["spearman_median"], "quarter": r["spearman_best_quarter_median"]}
                for name, r in blob["results"].items()
            },
        }
    except (OSError, ValueError, KeyError) as err:
        why = f"{path} is no pretrain_source result ({err})"
        raise SystemExit(f"label_noise: error: {why}") from None


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        "# Label noise: how well two timings of the same programs agree",
        "",
        f"Commit {summary['commit']}. Per workload (of ≥ {summary['min_records']} records), "
        "the Spearman between every record's first and second timing (TVM's `repeat`), "
        "medians over workloads: over all records, the fastest quarter by the median timing "
        "(as `pretrain_source.py` ranks it) and the fastest 8. A model that predicted one "
        "timing exactly would agree with the other about this well.",
        "",
        "| dataset | workloads | all | fastest quarter | fastest 8 | quarter's spread | "
        "timing CV |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in summary["datasets"].items():
        lines.append(
            f"| `{name}` (two timings) | {r['workloads']} | {r['all_median']:.3f} | "
            f"{r['quarter_median']:.3f} | {r['top8_median']:.3f} | "
            f"{r['quarter_spread_median']:.2f}× | {100 * r['cv_median']:.1f}% |"
        )
    for ref in summary["against"]:
        for name, r in ref["sources"].items():
            lines.append(
                f"| MLP pretrained on `{name}`, ranking `{ref['test']}` (`{ref['file']}`, "
                f"{ref['commit']}) | | {r['all']:.3f} | {r['quarter']:.3f} | | | |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+", type=Path, help="dataset directories")
    parser.add_argument(
        "--against", nargs="*", type=Path, default=[], help="pretrain_source JSON results"
    )
    parser.add_argument("--min-records", type=int, default=32, help="records a workload needs")
    parser.add_argument("--out", type=Path, default=None, help="write label_noise.{md,json} here")
    args = parser.parse_args(argv)
    folders = [d if d.is_absolute() else Path.cwd() / d for d in args.datasets]
    for folder in folders:
        record_file(folder)  # every bad input is refused before any work
    refs = [against(p) for p in args.against]
    summary = {
        "commit": git_commit(),
        "min_records": args.min_records,
        "datasets": {
            name: summarize(f, args.min_records)
            for name, f in zip(labels(folders), folders, strict=True)
        },
        "against": refs,
    }
    publish(args.out, "label_noise", summary, markdown(summary))
    return 0


def publish(out: Path | None, stem: str, summary: dict[str, Any], table: str) -> None:
    """Print the table and, last, the summary as one JSON line; with ``out``, also write both
    there as ``stem``.{md,json}."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.json").write_text(json.dumps(summary, indent=1) + "\n")
        (out / f"{stem}.md").write_text(table)
    print(table)
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
