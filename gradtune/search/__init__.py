"""Search strategies a job can name with ``--search``.

MetaSchedule's own strategies plug in by name; gradtune's gradient search (Felix) will be added
here as a ``PySearchStrategy``.
"""

SEARCH_STRATEGIES = ("evolutionary", "replay-trace", "replay-func")


def make_strategy(name: str):
    """The object (or MetaSchedule name) ``TuneContext(search_strategy=...)`` takes."""
    if name not in SEARCH_STRATEGIES:
        raise ValueError(f"unknown search strategy {name!r}")
    return name
