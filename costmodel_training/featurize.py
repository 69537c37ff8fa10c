"""DVC stage ``featurize``: the dataset's records → gradtune's smooth symbolic features.

    python -m costmodel_training.featurize [--params params.yaml]

Every record's trace is replayed on its workload and featurized at its integer decisions in
the *smooth* form the gradient search differentiates (``gradtune.costmodel.featurize``), so
pretraining and search see the same function. Output: one torch file of per-workload groups
(features, latencies, family, models). Bad records (corrupt lines, missing workloads, another
target, traces that no longer apply) are skipped with a count and the first reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from gradtune.errors import GradtuneError

ROOT = Path(__file__).resolve().parents[1]


def featurize(data_dir: Path, target_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Groups of one dataset: ``{"target", "workloads": [...], "records", "skipped", ...}``."""
    from rich.progress import Progress

    from gradtune.costmodel.featurize import from_records
    from gradtune.dataset.card import load_manifest
    from gradtune.dataset.store import Skipped, open_dataset
    from gradtune.target import make_target

    if not Path(data_dir).is_dir():
        raise GradtuneError(f"dataset directory not found: {data_dir}")
    manifest = load_manifest(data_dir)
    target_config = target_config or manifest.get("target")
    if not target_config:
        raise GradtuneError(f"{data_dir}: no manifest.json naming the dataset's target")
    load_skipped = Skipped()
    database = open_dataset(data_dir, target=target_config, skipped=load_skipped)
    records = list(database.get_all_tuning_records())
    target = make_target(target_config)
    entries = manifest.get("workloads", {})
    families = {k: v.get("kernel_class", "") for k, v in entries.items()}
    skipped = Skipped()
    start = time.perf_counter()
    with Progress(transient=True) as progress:
        bar = progress.add_task("featurizing records", total=len(records))
        groups = from_records(
            records, target, skipped, families, progress=lambda: progress.advance(bar)
        )
    if not groups:
        raise GradtuneError(f"{data_dir}: no workload with two or more usable records")
    return {
        "target": target_config,
        "records": sum(len(g.latencies) for g in groups),
        "seconds": round(time.perf_counter() - start, 1),
        "skipped": {
            "load": load_skipped.count,
            "replay": skipped.count,
            "first_reason": load_skipped.first_reason or skipped.first_reason,
        },
        "workloads": [
            {
                "key": g.key,
                "family": g.family,
                "models": entries.get(g.key, {}).get("models", []),
                "latencies": list(g.latencies),
                "programs": g.symbolic,
            }
            for g in groups
        ],
    }


def save(result: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write ``result`` whole (never a half-written file where the next stage reads); returns
    its one-line summary."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    torch.save(result, partial)
    partial.replace(out)
    summary = {k: result[k] for k in ("records", "seconds", "skipped")}
    return summary | {"workloads": len(result["workloads"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = parser.parse_args(argv)
    try:
        params = yaml.safe_load(Path(args.params).read_text())["featurize"]
        out = ROOT / params["out"]
        result = featurize(ROOT / params["dataset"])
    except GradtuneError as err:
        print(f"gradtune: error: {err}", file=sys.stderr)
        return err.exit_code
    print(json.dumps(save(result, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
