"""The stages of ``flows/pretrain_cost_model.py`` (code in ``costmodel_training/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from costmodel_training import featurize as featurize_stage
from costmodel_training import pretrain as pretrain_stage
from gradtune.costmodel import champion


@task(name="featurize", cache_policy=NO_CACHE)
def featurize(data: str, features: str) -> dict[str, Any]:
    """Records → smooth symbolic features, written whole to ``features``."""
    return featurize_stage.save(featurize_stage.featurize(Path(data)), Path(features))


@task(name="pretrain", cache_policy=NO_CACHE)
def pretrain(
    features: str, weights: str, loss: str, epochs: int, lr: float, seed: int
) -> tuple[dict[str, Any], list[float]]:
    model, info, history = pretrain_stage.pretrain(Path(features), loss, epochs, lr, seed)
    pretrain_stage.write(model, info, Path(weights))
    return info, history


# A tracking server can blip; registering twice is harmless (a new version, alias moved).
@task(name="register-champion", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def register(
    weights: str, tracking_uri: str, params: dict[str, Any], history: list[float]
) -> dict[str, str]:
    info = champion.describe(Path(weights))
    kind = (info.get("target") or {}).get("kind", "llvm")
    metrics = {"final_loss": history[-1], "records": info.get("records", 0)}
    return champion.register(Path(weights), tracking_uri, kind, params, history, metrics)
