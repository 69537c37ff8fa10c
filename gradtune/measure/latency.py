"""A measured program's latency, defined once for every part of a run.

TVM's runner reports a candidate's ``run_secs``: ``repeat`` means of ``number`` back-to-back
runs each (the adaptive evaluator: one mean per micro-batch, as many as it took). gradtune's
latency of a program is their median, as numpy takes it (the mean of the middle two for an even
count), so one outlying repeat on a shared machine does not move it. The search, its task
scheduler, the cost model's fine-tuning and pretraining, the progress report and the transfer
library all read a record through here, so they agree on which program is the fastest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np


def median_seconds(run_secs: Iterable[Any] | None) -> float:
    """The median of ``run_secs`` in seconds; inf when there is none."""
    values = [float(s) for s in (run_secs or [])]
    return float(np.median(values)) if values else math.inf


def result_seconds(result: Any) -> float:
    """A ``RunnerResult``'s latency in seconds; inf for a candidate that failed to build or
    run."""
    return median_seconds(result.run_secs) if result.error_msg is None else math.inf
