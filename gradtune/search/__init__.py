"""Search strategies a job can name with ``--search``.

``gradient`` is gradtune's Felix search (``gradient_search.GradientSearch``); the others are
MetaSchedule's own, made stoppable by ``stoppable.Stoppable``. Either way the result is a
``session.ReportingStrategy``, the one kind of strategy the tuning loop takes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradtune.search.session import ReportingStrategy

SEARCH_STRATEGIES = ("gradient", "evolutionary", "replay-trace", "replay-func")
# How the task scheduler's first batches go round (``scheduler``'s docstring).
WARMUPS = ("model", "stake", "fresh", "skip")


def make_strategy(
    name: str, target_kind: str = "llvm", tracking_uri: str | None = None, **kwargs: Any
) -> ReportingStrategy:
    """The strategy ``tune`` runs for ``--search name``.

    ``tracking_uri``: an MLflow registry whose cost-model champion the gradient search starts
    from (the bundled weights otherwise). ``kwargs`` go to ``GradientSearch`` (``cost_model``,
    ``config``); MetaSchedule's strategies run with their defaults."""
    if name not in SEARCH_STRATEGIES:
        raise ValueError(f"unknown search strategy {name!r}")
    if name == "gradient":
        from gradtune.costmodel.online import OnlineCostModel
        from gradtune.search.gradient_search import GradientSearch

        cost_model = kwargs.pop("cost_model", None)
        if cost_model is None:
            cost_model = OnlineCostModel.default(target_kind, tracking_uri=tracking_uri)
        return GradientSearch(cost_model=cost_model, **kwargs)
    from gradtune.search.stoppable import Stoppable

    return Stoppable(name)
