"""Which tuned model to transfer from: the paper's Eq. 1.

For a target model M with kernel classes C, P_c the share of M's untuned kernel time in class
c, and W_T,c the kernels of class c that a candidate source T has a schedule for, choose the T
maximizing Σ_c P_c² · √|W_T,c|. Squaring P_c favours the classes that dominate M's time; the
square root keeps a source with very many schedules from winning on numbers alone (§4.4).
The paper found it a reasonable, not an optimal, choice; the ranking is printed so that a user
can pick another source with ``--from``. Here c ranges over transfer classes
(``library.transfer_class``: a compute kernel's operator family), the classes a schedule can
be applied within.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..partition import TuningTask
from .library import Source, classes_of, transfer_class


def eq1_score(shares: dict[str, float], counts: dict[str, int]) -> float:
    """Σ_c P_c² · √|W_T,c| over the target's classes ``shares`` (c → P_c); ``counts`` (c →
    |W_T,c|) may name classes the target lacks, which count nothing."""
    return sum(p * p * math.sqrt(counts.get(c, 0)) for c, p in shares.items())


def class_shares(tasks: list[TuningTask]) -> dict[str, float]:
    """P_c: each transfer class's share of the model's untuned kernel time (weight × untuned µs
    per call, as the partition table measures it). Without untuned timings (a target with no
    device here), shares of FLOPs stand in, and failing those, of calls."""
    for cost in (
        lambda t: t.weight * t.untuned_us,
        lambda t: t.weight * t.flops,
        lambda t: float(t.weight),
    ):
        values = [cost(t) for t in tasks]
        if values and all(math.isfinite(v) for v in values) and sum(values) > 0:
            total = sum(values)
            shares: dict[str, float] = {}
            for t, v in zip(tasks, values, strict=True):
                c = transfer_class(t.kernel_class)
                shares[c] = shares.get(c, 0.0) + v / total
            return shares
    return {}


def class_counts(tasks: list[TuningTask], source: Source) -> dict[str, int]:
    """|W_T,c| for each of the target's transfer classes c: the distinct source workloads with
    a schedule of c (by the kernel class, or block-name class, it is filed under)."""
    keys: dict[str, set[str]] = {}
    for t in tasks:
        keys.setdefault(transfer_class(t.kernel_class), set()).update(
            transfer_class(k) for k in classes_of(t)
        )
    return {
        c: len({s.workload for s in source.schedules if transfer_class(s.kernel_class) in wanted})
        for c, wanted in keys.items()
    }


@dataclass
class Ranked:
    source: Source
    score: float
    counts: dict[str, int]  # target class → |W_T,c|


def rank_sources(tasks: list[TuningTask], sources: list[Source]) -> list[Ranked]:
    """The sources by Eq. 1, best first (ties: more schedules, then name)."""
    shares = class_shares(tasks)
    ranked = []
    for source in sources:
        counts = class_counts(tasks, source)
        ranked.append(Ranked(source, eq1_score(shares, counts), counts))
    ranked.sort(key=lambda r: (-r.score, -sum(r.counts.values()), r.source.name))
    return ranked


def ranking_lines(tasks: list[TuningTask], ranked: list[Ranked]) -> list[str]:
    """The ranking as printed: score, then the matching schedules per class with its P_c."""
    shares = class_shares(tasks)
    lines = ["Eq. 1 ranking (Σ_c P_c² · √|W_T,c|):"]
    for i, r in enumerate(ranked, start=1):
        parts = [f"{c} {r.counts[c]} (P {shares.get(c, 0):.2f})" for c in shares if r.counts.get(c)]
        detail = ", ".join(parts) if parts else "no matching kernel class"
        lines.append(f"  {i}. {r.source.name}: {r.score:.4f}  [{detail}]")
    return lines
