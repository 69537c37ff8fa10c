"""The cost model a tuning session uses: pretrained weights, fine-tuned on what it measures.

Weights come from, in order: an explicit path; the registered champion
(``gradtune-costmodel-<target>@champion``) when an MLflow tracking URI is configured; the copy
bundled with the package (``gradtune/costmodel/weights/<target>.pt``, written by
``costmodel_training.pretrain``); otherwise a fresh initialization (logged: the first rounds
then explore blindly until measurements arrive).
After every measured batch the model is fine-tuned for a few passes over this session's
measurements (ranking loss within each task), which is what keeps the descent honest: it
exploits the model's errors, and measuring its favourites corrects them.

It is a MetaSchedule ``PyCostModel``, so any strategy can use it: ``update`` and ``predict``
featurize candidates from their schedules through the symbolic layer. The gradient search
already holds each candidate's smooth symbolic features, so it calls ``observe`` with them and
scores through ``model`` directly, differentiably. Given ``members`` (a deep ensemble,
``costmodel.ensemble``), every member is fine-tuned the same way, and ``member_scores`` gives
all of their scores for the gradient search's acquisition.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from gradtune.costmodel import model as mlp
from gradtune.costmodel.featurize import symbolic_features
from gradtune.costmodel.train import Group, fit
from gradtune.measure.latency import result_seconds
from gradtune.symbolic.features import FEATURES
from gradtune.target import is_gpu as target_is_gpu

log = logging.getLogger("gradtune.costmodel")
BUNDLED = Path(__file__).parent / "weights"


def bundled_path(target_kind: str = "llvm") -> Path:
    return BUNDLED / f"{target_kind}.pt"


def load_pretrained(
    target_kind: str = "llvm", path: str | Path | None = None, tracking_uri: str | None = None
) -> tuple:
    """(model, where it came from)."""
    if path is not None:
        return mlp.load(path), str(path)
    if tracking_uri:
        import tempfile

        from gradtune.costmodel.champion import download_champion
        from gradtune.errors import GradtuneError
        from gradtune.redact import redact_uri

        try:
            with tempfile.TemporaryDirectory(prefix="gradtune-champion-") as tmp:
                weights = download_champion(tracking_uri, target_kind, Path(tmp))
                model = mlp.load(weights)
            # Logged, and stored in the run's MLflow params: never with the URI's credentials.
            source = (
                f"models:/gradtune-costmodel-{target_kind}@champion ({redact_uri(tracking_uri)})"
            )
            log.info("cost model: %s", source)
            return model, source
        except GradtuneError as err:
            # A registry without a champion yet is normal before the first pretraining run.
            log.warning("%s; using the bundled cost model", err)
    if bundled_path(target_kind).is_file():
        return mlp.load(bundled_path(target_kind)), str(bundled_path(target_kind))
    log.warning("no pretrained cost model for %s: starting from random weights", target_kind)
    torch.manual_seed(0)
    return mlp.FelixMLP(), "random init"


@derived_object
class OnlineCostModel(ms.cost_model.PyCostModel):
    """Felix's MLP over symbolic features, fine-tuned on the session's measurements.

    Parameters
    ----------
    model : FelixMLP
        The network; scored and fine-tuned in place.
    source : str, default "random init"
        Where its weights came from, reported as the run's ``search_cost_model``.
    epochs : int, default 4
        Fine-tuning passes over all of the session's measurements after each batch.
    lr : float, default 3e-4
        Adam's fine-tuning learning rate; lower than pretraining's 7e-4 (``train.fit``), as
        fine-tuning starts from trained weights.
    members : list of FelixMLP or None, default None
        A deep ensemble whose first member is ``model`` (``costmodel.ensemble``); None for the
        single model. Each member fine-tunes with its own seed, so they stay apart.
    """

    def __init__(
        self,
        model: mlp.FelixMLP,
        source: str = "random init",
        epochs: int = 4,
        lr: float = 3e-4,
        members: list[mlp.FelixMLP] | None = None,
    ) -> None:
        if members is not None and (len(members) < 2 or members[0] is not model):
            raise ValueError("an ensemble has two or more members, the first being ``model``")
        self.model = model
        self.members = members if members is not None else [model]
        self.source = source
        self.epochs = epochs
        self.lr = lr
        # Per task: the measured programs' features and median latencies (seconds).
        self.data: dict[str, tuple[list[torch.Tensor], list[float]]] = {}
        self.losses: list[float] = []

    @classmethod
    def default(
        cls,
        target_kind: str = "llvm",
        path: str | Path | None = None,
        tracking_uri: str | None = None,
        **hyperparameters: Any,
    ) -> OnlineCostModel:
        """The pretrained model ``load_pretrained`` finds; ``hyperparameters`` as in the class."""
        model, source = load_pretrained(target_kind, path, tracking_uri)
        return cls(model=model, source=source, **hyperparameters)

    @classmethod
    def ensemble(
        cls, target_kind: str = "llvm", path: str | Path | None = None, **hyperparameters: Any
    ) -> OnlineCostModel:
        """The deep ensemble at ``path`` (default: the one bundled for ``target_kind``)."""
        from gradtune.costmodel import ensemble
        from gradtune.errors import GradtuneError

        path = Path(path) if path is not None else ensemble.bundled_path(target_kind)
        if not path.is_file():
            raise GradtuneError(
                f"no cost-model ensemble at {path}: pretrain one with "
                "`python -m costmodel_training.pretrain --ensemble`"
            )
        members = ensemble.load_members(path)
        return cls(model=members[0], source=str(path), members=members, **hyperparameters)

    def member_scores(self, programs: list[torch.Tensor]) -> torch.Tensor:
        """Every member's raw score of ``programs``, (members, programs); differentiable."""
        from gradtune.costmodel.ensemble import member_scores

        return member_scores(self.members, programs)

    def observe(self, task: str, programs: list[torch.Tensor], latencies: list[float]) -> float:
        """Add a task's measurements (features, seconds) and fine-tune; the last epoch's loss."""
        if programs:
            seen = self.data.setdefault(task, ([], []))
            seen[0].extend(programs)
            seen[1].extend(float(x) for x in latencies)  # numpy floats do not load back
        groups = [
            Group(name, name, p, np.asarray(lat))
            for name, (p, lat) in self.data.items()
            if len(lat) >= 2
        ]
        if not groups:
            return float("nan")
        finals = [
            fit(member, groups, loss="rank", epochs=self.epochs, lr=self.lr, seed=k)[-1]
            for k, member in enumerate(self.members)
        ]
        loss = float(np.mean(finals))
        self.losses.append(loss)
        return loss

    # -- MetaSchedule interface ---------------------------------------------------------------
    def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
        """Fine-tune on a measured batch (failed and unmodelled candidates skipped)."""
        is_gpu = target_is_gpu(context.target)
        programs, latencies = [], []
        for candidate, result in zip(candidates, results, strict=True):
            secs = result_seconds(result)
            if not math.isfinite(secs):
                continue
            features = _features(candidate.sch, is_gpu)
            if features is not None:
                programs.append(features)
                latencies.append(secs)
        self.observe(str(context.task_name), programs, latencies)

    def predict(self, context: Any, candidates: list[Any]) -> np.ndarray:
        """Scores, higher = faster; 0 for a candidate the symbolic layer cannot featurize.

        MetaSchedule samples parents in proportion to the scores (negatives clipped to 0) and
        keeps the best across generations by comparing them, so the network's score (any sign)
        goes through softplus: positive, and in the same order from one call to the next. An
        ensemble scores by its members' mean raw score (members whose score is not finite left
        out): a per-call standardization would break that order between calls.
        """
        is_gpu = target_is_gpu(context.target)
        scores = np.zeros(len(candidates), dtype="float64")
        features = [_features(c.sch, is_gpu) for c in candidates]
        known = [i for i, f in enumerate(features) if f is not None]
        if known:
            with torch.no_grad():
                every = self.member_scores([features[i] for i in known]).to(torch.float64)
                finite = torch.isfinite(every)
                raw = torch.where(finite, every, 0.0).sum(0) / finite.sum(0)
                raw = torch.nn.functional.softplus(raw).numpy()
            scores[known] = np.where(np.isfinite(raw), raw, 0.0)
        return scores

    def save(self, path: str) -> None:
        """Weights (in the format ``model.load`` reads; an ensemble's other members beside
        them) plus the session's measurements."""
        torch.save(
            {
                "state_dict": self.model.state_dict(),
                "others": [m.state_dict() for m in self.members[1:]],
                "input_dim": FEATURES,
                "source": self.source,
                "data": {task: (list(p), list(lat)) for task, (p, lat) in self.data.items()},
            },
            path,
        )

    def load(self, path: str) -> None:
        """Weights and, when ``save`` wrote them, measurements; the hyper-parameters stay."""
        blob = torch.load(path, map_location="cpu", weights_only=True)
        self.model = mlp.load(path)
        self.members = [self.model]
        for state in blob.get("others", []):
            member = mlp.FelixMLP(blob["input_dim"])
            member.load_state_dict(state)
            member.eval()
            self.members.append(member)
        self.source = str(blob.get("source", path))
        self.data = {task: (list(p), list(lat)) for task, (p, lat) in blob.get("data", {}).items()}


def _features(sch: Any, is_gpu: bool) -> torch.Tensor | None:
    """A schedule's smooth symbolic features, or None where the symbolic layer has no model."""
    try:
        features = symbolic_features(sch, is_gpu)
    except Exception:  # an unmodelled construct: this candidate gets no score, never an abort
        return None
    return features if bool(torch.isfinite(features).all()) else None
