"""The ablation's configurations, where their runs live, and the order they run in.

A configuration is a ``GradientConfig`` ablation plus a measurement mode, added one at a time
as in AdaTune's Fig. 10–11, and the adaptive evaluator alone; then MetaSchedule's
evolutionary search as it ships and scoring with the ensemble instead of its XGBoost::

    baseline               the default gradient search (hybrid)  fixed measurement
    ensemble_ei            + deep ensemble, log EI               fixed
    contextual             + contextual ε (Eq. 3)                fixed
    full                   + adaptive evaluator                  adaptive
    adaptive_only          the default gradient search           adaptive
    evolutionary           MetaSchedule's, its XGBoost           fixed
    evolutionary_ensemble  MetaSchedule's, the ensemble          fixed

It shares the search-efficiency benchmark's work dir, models and run machinery
(``searchbench``); its own runs live under ``<budget>s-adatune/``::

    work/<budget>s-adatune/prepared/<model>.json            leave-out model and ensemble
    work/<budget>s-adatune/<config>/runs/<model>/<searcher>-r<i>/
    work/<budget>s-adatune/timing/<model>.json              every config's libraries, interleaved
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from searchbench.layout import Layout, RunSpec


class Config(NamedTuple):
    gradient: str  # GradientConfig fields (``--gradient-config``)
    measure: str  # fixed | adaptive
    searcher: str = "gradient"
    scheduler: str = "xgb"  # the task scheduler's cost model (``api.scheduler_cost_model``)


CONFIGS: dict[str, Config] = {
    "baseline": Config("", "fixed"),
    "ensemble_ei": Config("acquisition=ei", "fixed"),
    "contextual": Config("acquisition=ei,contextual_explore=True", "fixed"),
    "full": Config("acquisition=ei,contextual_explore=True", "adaptive"),
    "adaptive_only": Config("", "adaptive"),
    "evolutionary": Config("", "fixed", "evolutionary"),
    "evolutionary_ensemble": Config("", "fixed", "evolutionary", "ensemble"),
}
BASELINE, FULL, ADAPTIVE_ONLY = "baseline", "full", "adaptive_only"


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

    def scheduler_model(self) -> str:
        return CONFIGS[self.config].scheduler

    def child_args(self) -> list[str]:
        return ["--budget", f"{self.budget:g}", "--work", str(self.work), "--config", self.config]


def layout_of(work: Path, budget: float, config: str) -> AdaLayout:
    # By keyword: ``Layout`` grows fields (``warmup``) that a positional ``config`` would fill.
    return AdaLayout(work, budget, CONFIGS[config].gradient, CONFIGS[config].measure, config=config)


def plan(models: list[str], repeats: int, configs: list[str]) -> list[tuple[str, RunSpec]]:
    """(configuration, run) in execution order: repeat-major, models round-robin, and the
    configurations rotated one place per model and repeat, so that none always runs first or
    last and slow drift of the shared machine hits every configuration alike."""
    runs = []
    for repeat in range(repeats):
        for i, model in enumerate(models):
            shift = (i + repeat) % len(configs)
            for config in configs[shift:] + configs[:shift]:
                runs.append((config, RunSpec(model, CONFIGS[config].searcher, repeat)))
    return runs
