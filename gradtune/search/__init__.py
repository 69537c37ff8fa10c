"""Search strategies a job can name with ``--search``.

``gradient`` is gradtune's Felix search (``gradient_search.GradientSearch``, a MetaSchedule
``PySearchStrategy``); the others are MetaSchedule's own, passed by name.
"""

from __future__ import annotations

from typing import Any

SEARCH_STRATEGIES = ("gradient", "evolutionary", "replay-trace", "replay-func")


def make_strategy(
    name: str, target_kind: str = "llvm", tracking_uri: str | None = None, **kwargs: Any
):
    """The object (or MetaSchedule name) ``TuneContext(search_strategy=...)`` takes.

    ``tracking_uri``: an MLflow registry whose cost-model champion the gradient search starts
    from (the bundled weights otherwise)."""
    if name not in SEARCH_STRATEGIES:
        raise ValueError(f"unknown search strategy {name!r}")
    if name == "gradient":
        from gradtune.costmodel.online import OnlineCostModel
        from gradtune.search.gradient_search import GradientSearch

        cost_model = kwargs.pop("cost_model", None) or OnlineCostModel.default(
            target_kind, tracking_uri=tracking_uri
        )
        return GradientSearch(cost_model=cost_model, **kwargs)
    return name
