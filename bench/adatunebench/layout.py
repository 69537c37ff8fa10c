"""The ablation's configurations, where their runs live, and the order they run in.

A configuration is a ``GradientConfig`` ablation plus a measurement mode, added one at a time
as in AdaTune's Fig. 10–11, and the adaptive evaluator alone::

    baseline        Felix's score, explore 1/8           fixed measurement
    ensemble_ei     + deep ensemble, log EI              fixed
    contextual      + contextual ε (Eq. 3)               fixed
    full            + adaptive evaluator                 adaptive
    adaptive_only   Felix's score, explore 1/8           adaptive

It shares the search-efficiency benchmark's work dir, models and run machinery
(``searchbench``); its own runs live under ``<budget>s-adatune/``::

    work/<budget>s-adatune/prepared/<model>.json            leave-out model and ensemble
    work/<budget>s-adatune/<config>/runs/<model>/gradient-r<i>/
    work/<budget>s-adatune/timing/<model>.json              every config's libraries, interleaved
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from searchbench.layout import Layout, RunSpec

# name → (GradientConfig fields, measurement mode)
CONFIGS: dict[str, tuple[str, str]] = {
    "baseline": ("", "fixed"),
    "ensemble_ei": ("acquisition=ei", "fixed"),
    "contextual": ("acquisition=ei,contextual_explore=True", "fixed"),
    "full": ("acquisition=ei,contextual_explore=True", "adaptive"),
    "adaptive_only": ("", "adaptive"),
}
BASELINE, FULL, ADAPTIVE_ONLY = "baseline", "full", "adaptive_only"
SEARCHER = "gradient"  # every configuration is the gradient search


@dataclass(frozen=True)
class AdaLayout(Layout):
    """``Layout`` of one configuration (``config``): its runs under
    ``<budget>s-adatune/<config>``; preparation and timing shared by all of them."""

    config: str = BASELINE

    @property
    def base(self) -> Path:
        return self.work / f"{self.budget:g}s-adatune"

    @property
    def root(self) -> Path:
        return self.base / self.config

    def prepared(self, model: str) -> Path:
        return self.base / "prepared" / f"{model}.json"

    def timing(self, model: str) -> Path:
        return self.base / "timing" / f"{model}.json"

    def prepares_ensemble(self) -> bool:
        return True  # one preparation serves every configuration, the ensemble ones included

    def child_args(self) -> list[str]:
        return ["--budget", f"{self.budget:g}", "--work", str(self.work), "--config", self.config]


def layout_of(work: Path, budget: float, config: str) -> AdaLayout:
    gradient, measure = CONFIGS[config]
    return AdaLayout(work, budget, gradient, measure, config)


def plan(models: list[str], repeats: int, configs: list[str]) -> list[tuple[str, RunSpec]]:
    """(configuration, run) in execution order: repeat-major, models round-robin, and the
    configurations rotated one place per model and repeat, so that none always runs first or
    last and slow drift of the shared machine hits every configuration alike."""
    runs = []
    for repeat in range(repeats):
        for i, model in enumerate(models):
            shift = (i + repeat) % len(configs)
            for config in configs[shift:] + configs[:shift]:
                runs.append((config, RunSpec(model, SEARCHER, repeat)))
    return runs
