"""Flow: pretrain gradtune's cost model on the dataset (``gradtune costmodel pretrain``).

dataset → smooth symbolic features → MLP weights (bundled file + provenance) → MLflow run and
``gradtune-costmodel-<target>@champion`` when a tracking URI is given. The DVC stages
``featurize`` and ``pretrain`` run the same library functions without Prefect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from gradtune import flow_logging
from gradtune.entrypoints import load_tasks

costmodel = load_tasks("costmodel", __file__)
flow_logging.one_line_user_errors()


@flow(name="pretrain-cost-model", log_prints=False)
def pretrain_cost_model(
    data: str = "data",
    features: str = "features/llvm.pt",
    weights: str = "gradtune/costmodel/weights/llvm.pt",
    loss: str = "rank",
    epochs: int = 40,
    lr: float = 7e-4,
    seed: int = 0,
    tracking_uri: str | None = None,
    reuse_features: bool = False,
) -> dict[str, Any]:
    with flow_logging.to_run_logs():
        summary: dict[str, Any] = {}
        if not (reuse_features and Path(features).is_file()):
            summary["featurize"] = costmodel.featurize_dataset(data, features)
        info, history = costmodel.pretrain_weights(features, weights, loss, epochs, lr, seed)
        keys = ("workloads", "records", "final_loss", "train_seconds")
        summary.update({k: info[k] for k in keys})
        summary["weights"] = weights
        if tracking_uri:
            params = {"loss": loss, "epochs": epochs, "lr": lr, "seed": seed, "data": data}
            registered = costmodel.register_champion(weights, tracking_uri, params, history)
            summary["registered"] = registered["registered"]
    return summary
