"""DVC stage ``pretrain``: gradtune's cost model on the featurized dataset.

    python -m costmodel_training.pretrain [--params params.yaml] [--mlflow-uri URI]

Trains the Felix/TenSet MLP (``gradtune.costmodel.model``) on every workload of the features
file, writes the weights the package bundles (``gradtune/costmodel/weights/<target>.pt``, small
enough for git) with a provenance file beside them, and, given a tracking URI (flag or
``MLFLOW_TRACKING_URI``), logs the run and registers the weights as
``gradtune-costmodel-<target>@champion``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from gradtune.errors import GradtuneError

ROOT = Path(__file__).resolve().parents[1]


def load_groups(features: Path) -> tuple[list[Any], dict[str, Any]]:
    """Training groups of a ``featurize`` output, and the file's metadata."""
    from gradtune.costmodel.train import Group

    if not features.is_file():
        raise GradtuneError(f"{features} not found: run the featurize stage first (dvc repro)")
    blob = torch.load(features, map_location="cpu", weights_only=False)
    groups = [
        Group(w["key"], w["family"], w["programs"], np.asarray(w["latencies"]))
        for w in blob["workloads"]
        if len(w["latencies"]) >= 2
    ]
    if not groups:
        raise GradtuneError(f"{features}: no workload with two or more records")
    return groups, {k: v for k, v in blob.items() if k != "workloads"}


def pretrain(
    features: Path, loss: str, epochs: int, lr: float, seed: int
) -> tuple[Any, dict[str, Any], list[float]]:
    """(model, provenance, loss per epoch)."""
    from rich.progress import Progress

    from gradtune.costmodel.model import FelixMLP
    from gradtune.costmodel.train import fit

    groups, meta = load_groups(features)
    torch.manual_seed(seed)
    model = FelixMLP()
    start = time.perf_counter()
    with Progress(transient=True) as progress:
        bar = progress.add_task(f"pretraining ({loss} loss)", total=epochs)
        history = fit(
            model, groups, loss=loss, epochs=epochs, lr=lr, seed=seed,
            progress=lambda: progress.advance(bar),
        )  # fmt: skip
    info = {
        "target": meta.get("target"),
        "workloads": len(groups),
        "records": int(sum(len(g.latencies) for g in groups)),
        "families": sorted({g.family for g in groups}),
        "loss": loss,
        "epochs": epochs,
        "lr": lr,
        "seed": seed,
        "final_loss": round(history[-1], 5),
        "train_seconds": round(time.perf_counter() - start, 1),
        "features_sha1": hashlib.sha1(features.read_bytes()).hexdigest(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return model, info, history


def write(model: Any, info: dict[str, Any], weights: Path) -> None:
    """Weights + provenance, each written whole (a reader never sees half a file)."""
    from gradtune.costmodel.model import save

    weights.parent.mkdir(parents=True, exist_ok=True)
    partial = weights.with_suffix(".partial")
    save(model, partial)
    partial.replace(weights)
    weights.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"))
    args = parser.parse_args(argv)
    try:
        p = yaml.safe_load(Path(args.params).read_text())["pretrain"]
        model, info, history = pretrain(
            ROOT / p["features"], p["loss"], int(p["epochs"]), float(p["lr"]), int(p["seed"])
        )
        weights = ROOT / p["weights"]
        write(model, info, weights)
        if args.mlflow_uri:
            from gradtune.costmodel.champion import register

            kind = (info["target"] or {}).get("kind", "llvm")
            reg = register(weights, args.mlflow_uri, kind, p, history, {"final_loss": history[-1]})
            info["registered"] = reg["registered"]
    except GradtuneError as err:
        print(f"gradtune: error: {err}", file=sys.stderr)
        return err.exit_code
    print(json.dumps({k: info[k] for k in info if k not in ("families", "target")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
