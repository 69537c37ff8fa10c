"""Which model ranks the descent's candidates: the one that has lately ranked measured batches
better (``GradientConfig.ranker="auto"``).

The descent follows the pretrained MLP's gradient, and by default the same MLP picks which of
its rounded iterates to measure. On a model the MLP never saw, its ranking stays weak after
fine-tuning (median per-batch Spearman 0.30–0.48 on the search benchmark's held-out models, a
quarter of the batches below 0.1), and the XGBoost MetaSchedule's task scheduler trains from
nothing on every measured program may rank the same run's programs better once it has enough
of them. Each measured batch of the descent's
picks was scored by both before either learned from it, so it is a fair held-out comparison
of the two; the picks of the next batch are ranked by whichever did better over the last
``window`` comparisons. The descent still climbs the MLP (the trees have no gradient); only the
choice among what it reached changes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class RankerChoice:
    """Shared by every task's clone of one run's gradient search.

    Parameters
    ----------
    window : int, default 6
        Comparisons (measured batches) the choice averages over; recent ones only, as both
        models keep learning.
    trees_warmup : int, default 100
        Programs the run must have measured before the trees are compared at all:
        MetaSchedule's ``XGBModel`` scores at random until it has seen ``num_warmup_samples``
        (100 by default), and a random ranking can beat a weak one by chance.
    """

    window: int = 6
    trees_warmup: int = 100
    measured: int = 0
    comparisons: deque = field(default_factory=deque)  # (own ρ, trees ρ), newest last

    @property
    def trees_trained(self) -> bool:
        return self.measured >= self.trees_warmup

    def count(self, programs: int) -> None:
        """``programs`` more measured in the run (what the trees have been trained on)."""
        self.measured += programs

    def record(self, own: float, trees: float) -> None:
        """One batch's Spearman of each model's scores against its measured speeds."""
        if not (math.isfinite(own) and math.isfinite(trees)):
            return
        self.comparisons.append((own, trees))
        while len(self.comparisons) > self.window:
            self.comparisons.popleft()

    def prefer_trees(self) -> bool:
        """Whether the trees ranked the recent batches better on average (two at least)."""
        if len(self.comparisons) < 2:
            return False
        own = sum(c[0] for c in self.comparisons) / len(self.comparisons)
        trees = sum(c[1] for c in self.comparisons) / len(self.comparisons)
        return trees > own
