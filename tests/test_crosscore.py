"""The cross-core probe and the rounds of an interleaved timing it keeps."""

from __future__ import annotations

from gradtune import compilation, crosscore
from gradtune.threads import runtime_threads


def test_rounds_spanning_a_slow_probe_are_not_steady():
    # Probes before round 0 and after each of 5 rounds; the cores sat apart around probe 2.
    link = [800.0, 810.0, 1600.0, 820.0, 790.0, 805.0]
    assert crosscore.steady_rounds(link) == [True, False, False, True, True]


def test_every_round_is_steady_when_nothing_was_probed_or_nothing_moved():
    assert crosscore.steady_rounds([None, None, None]) == [True, True]
    assert crosscore.steady_rounds([1000.0, 1400.0, 1100.0]) == [True, True]
    assert crosscore.steady_rounds([]) == []


def test_a_timing_keeps_its_steady_rounds_unless_too_few():
    samples = {"a": [1.0, 2.0, 2.1, 1.1, 1.0], "b": [3.0, 5.0, 5.2, 3.1, 3.0]}
    timing = compilation.Timing(samples, [800.0, 810.0, 1600.0, 820.0, 790.0, 805.0])
    assert timing.kept() == {"a": [1.0, 1.1, 1.0], "b": [3.0, 3.1, 3.0]}
    assert timing.conditions() == {"rounds": 5, "steady_rounds": 3, "link_ns": [790, 1600]}
    # Two steady rounds of five: fewer than MIN_STEADY_ROUNDS, so all five stand.
    unsteady = compilation.Timing(samples, [800.0, 810.0, 1600.0, 1700.0, 790.0, 805.0])
    assert unsteady.kept() == samples


def test_the_probe_times_tvms_own_pool():
    """A positive reading in ns on a pool of two or more threads, none on one thread."""
    reading = crosscore.LinkProbe()()
    if runtime_threads() < 2:
        assert reading is None
    else:
        assert reading is not None and 50.0 < reading < 1e6


def test_a_timing_probes_before_and_after_every_round():
    timing = compilation.time_rounds({"f": lambda: None}, repeats=3, min_seconds=0.001)
    assert len(timing.samples["f"]) == 3 and len(timing.link_ns) == 4
