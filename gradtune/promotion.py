"""Champion and challenger: a retuned version replaces the registered one only when it is
correct and no slower.

A retune registers its version under the alias ``challenger`` (``gradtune.retune``). Here the
challenger and the current ``champion`` are downloaded from the registry (their files checked
against the versions' SHA-256 tags, ``registry.download_verified``), loaded into one process
and run on the same device: what is compared is what a deployment would pull.

1. The challenger's outputs on the model's example inputs must match the model's reference
   outputs (``compilation.verify``), else it is rejected whatever its speed.
2. Both are timed interleaved (``compilation.time_rounds``), and each round gives
   one ratio, challenger over champion: the two ran back to back, so a slow spell of the
   machine slows both and cancels. The challenger is promoted when the median ratio exceeds 1
   by no more than the noise, taken as the larger of ``REL_TOLERANCE`` and half the
   interquartile range of the ratios. A challenger that is truly as fast must not lose to
   noise, and a faster champion must not lose to a lucky burst. (Comparing the two medians
   instead let the same work differ by up to 18% on a 2-core VM, whose speed jumps between
   levels from one 50 ms block to the next.)

The decision and its reason are written to the challenger's version tags and its run;
versions are immutable and never deleted here, so a rejected challenger stays inspectable.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import compilation

CHAMPION = "champion"
CHALLENGER = "challenger"
REL_TOLERANCE = 0.05
REPEATS = 15  # interleaved rounds: enough samples for a quartile to mean something

PROMOTION = "promotion"  # version tag: "promoted" | "kept_champion" | "rejected"
REASON = "promotion_reason"


@dataclass
class Decision:
    """Whether the challenger replaces the champion, and why.

    Parameters
    ----------
    outcome : str
        "promoted", "kept_champion" (correct, but slower) or "rejected" (failed verification).
    reason : str
        One sentence, as tagged and logged.
    challenger_ms, champion_ms : float | None
        Interleaved medians (None: not timed).
    ratio : float | None
        Median over rounds of challenger over champion: what is decided on.
    tolerance : float | None
        How far above 1 the ratio could be and the challenger still count as no worse.
    """

    outcome: str
    reason: str
    challenger_ms: float | None = None
    champion_ms: float | None = None
    ratio: float | None = None
    tolerance: float | None = None

    @property
    def promoted(self) -> bool:
        return self.outcome == "promoted"

    def tags(self) -> dict[str, str]:
        tags = {PROMOTION: self.outcome, REASON: self.reason}
        for key in ("challenger_ms", "champion_ms", "ratio", "tolerance"):
            value = getattr(self, key)
            if value is not None:
                tags[f"interleaved_{key}"] = f"{value:.6g}"
        return tags


def iqr(values: list[float]) -> float:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def decide(
    challenger: list[float], champion: list[float], rel_tolerance: float = REL_TOLERANCE
) -> Decision:
    """The latency decision on interleaved samples (ms) of both, round by round."""
    if len(challenger) != len(champion) or len(challenger) < 2:
        raise ValueError("decide needs the same number (at least 2) of interleaved rounds of both")
    ratios = [ch / cp for ch, cp in zip(challenger, champion, strict=True)]
    ratio = statistics.median(ratios)
    tolerance = max(rel_tolerance, iqr(ratios) / 2)
    ch, cp = statistics.median(challenger), statistics.median(champion)
    if ratio <= 1 + tolerance:
        outcome = "promoted"
        reason = (
            f"challenger {ch:.4g} ms vs champion {cp:.4g} ms: {ratio:.3f}x the champion round "
            f"by round, no worse within {tolerance:.1%}"
        )
    else:
        outcome = "kept_champion"
        reason = (
            f"challenger {ch:.4g} ms vs champion {cp:.4g} ms: {ratio:.3f}x the champion round "
            f"by round, slower by more than the tolerance {tolerance:.1%} (max of "
            f"{rel_tolerance:.0%} and half the ratios' IQR)"
        )
    return Decision(outcome, reason, ch, cp, ratio, tolerance)


@dataclass
class LoadedVersion:
    """A registered version's compiled model, loaded on its device."""

    version: str
    io: dict[str, Any]
    vm: Any
    dev: Any

    def inputs_like(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """``inputs`` when they fit this version's inputs; else seeded random ones that do
        (a champion of an older graph may take other shapes)."""
        specs = self.io["inputs"]
        fits = len(specs) == len(inputs) and all(
            list(x.shape) == s["shape"] and str(x.dtype) == s["dtype"]
            for x, s in zip(inputs, specs, strict=True)
        )
        if fits:
            return inputs
        rng = np.random.default_rng(0)
        return [rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in specs]

    def bind(self, inputs: list[np.ndarray]) -> Callable[[], Any]:
        """One inference on ``inputs`` (or inputs like them), uploaded once: what is timed is
        the model, not host-to-device copies."""
        import tvm

        args = [tvm.runtime.tensor(x, self.dev) for x in self.inputs_like(inputs)]
        main = self.vm["main"]  # once, as a deployment would (compilation.Runner)

        def run() -> Any:
            out = main(*args)
            self.dev.sync()
            return out

        return run

    def outputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return compilation.flatten_outputs(self.bind(inputs)())


def load_version(name: str, version: str, expected: dict[str, str], into: Path) -> LoadedVersion:
    """Download ``name`` version ``version`` (checked against ``expected`` digests) into
    ``into`` and load its library on the device it was compiled for."""
    import tvm
    from tvm import relax

    from .registry import download_verified

    into.mkdir(parents=True, exist_ok=True)
    download_verified(f"{name}/{version}", into, expected)
    io = json.loads((into / "artifacts" / "io.json").read_text())
    dev = tvm.cpu(0) if io.get("device", "cpu") == "cpu" else tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(into / "artifacts" / "model.so")), dev)
    return LoadedVersion(str(version), io, vm, dev)


def judge(
    name: str,
    challenger: Any,
    champion: Any | None,
    model: Any,
    rtol: float = compilation.RTOL,
    atol_scale: float = compilation.ATOL_SCALE,
    tuned_error: str | None = None,
) -> Decision:
    """Verify the challenger (an MLflow ``ModelVersion``) against ``model``'s reference outputs,
    then time it interleaved with ``champion`` (None: there is none, a correct challenger
    wins). ``tuned_error``: the tune's own check already failed, with this message."""
    from .errors import GradtuneError
    from .integrity import tagged_manifest

    if tuned_error is not None:
        return Decision("rejected", f"outputs failed verification after tuning: {tuned_error}")
    with tempfile.TemporaryDirectory(prefix="gradtune-promotion-") as tmp:
        loaded = load_version(
            name, challenger.version, tagged_manifest(challenger.tags), Path(tmp) / "challenger"
        )
        try:
            outputs = loaded.outputs(model.inputs)
            compilation.verify(
                outputs, model.reference_outputs, "challenger", rtol=rtol, atol_scale=atol_scale
            )
        except GradtuneError as err:
            return Decision("rejected", f"registered challenger failed verification: {err}")
        if champion is None:
            return Decision("promoted", "no champion yet: the verified challenger becomes it")
        held = load_version(
            name, champion.version, tagged_manifest(champion.tags), Path(tmp) / "champion"
        )
        samples = compilation.time_rounds(
            {"challenger": loaded.bind(model.inputs), "champion": held.bind(model.inputs)},
            repeats=REPEATS,
        ).kept()
    return decide(samples["challenger"], samples["champion"])


def record(name: str, challenger: Any, decision: Decision) -> None:
    """Write the decision to the challenger's version tags and run, then move ``champion`` to
    it if promoted (last: a failure before leaves the champion where it was)."""
    import mlflow

    client = mlflow.MlflowClient()
    for key, value in decision.tags().items():
        client.set_model_version_tag(name, challenger.version, key, value)
    if challenger.run_id:
        client.set_tag(challenger.run_id, PROMOTION, decision.outcome)
        client.set_tag(challenger.run_id, REASON, decision.reason[:5000])
        metrics = {
            f"interleaved_{k}": v
            for k, v in asdict(decision).items()
            if k.endswith("_ms") and v is not None
        }
        if metrics:
            mlflow.log_metrics(metrics, run_id=challenger.run_id)
    if decision.promoted:
        client.set_registered_model_alias(name, CHAMPION, challenger.version)


def aliased(name: str, alias: str, tracking_uri: str) -> Any | None:
    """The version of ``name`` under ``alias`` (an MLflow ``ModelVersion``); None when the
    model or the alias does not exist. A registry that does not answer raises
    ``GradtuneError`` in one line (after MLflow's own HTTP retries)."""
    import mlflow

    from .errors import GradtuneError
    from .redact import redact_uri

    mlflow.set_tracking_uri(tracking_uri)
    try:
        return mlflow.MlflowClient().get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise GradtuneError(
            f"MLflow registry at {redact_uri(tracking_uri)} failed to answer for {name}@{alias}: "
            f"{err.message.splitlines()[0] if err.message else err.error_code}"
        ) from None


def version(name: str, number: str, tracking_uri: str) -> Any:
    """Version ``number`` of ``name`` (with its tags)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.MlflowClient().get_model_version(name, number)
