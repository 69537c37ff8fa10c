"""The cross-core probe and the rounds of an interleaved timing it keeps."""

from __future__ import annotations

from pathlib import Path

from gradtune import compilation, crosscore, machine
from gradtune.crosscore import APART, MOVED, NEAR
from gradtune.threads import runtime_threads

# Probes before round 0 and after each of 6 rounds: the cores sat apart around probes 2 and 3.
LINK = [800.0, 810.0, 1600.0, 1650.0, 820.0, 790.0, 805.0]


def test_rounds_are_sorted_by_the_probes_around_them():
    assert crosscore.round_states(LINK) == [NEAR, MOVED, APART, MOVED, NEAR, NEAR]
    # Against a faster reference (another pass saw the cores nearer), nothing here is near.
    assert crosscore.round_states([1500.0, 1600.0], reference=700.0) == [APART]


def test_every_round_is_near_when_nothing_was_probed_or_nothing_moved():
    assert crosscore.round_states([None, None, None]) == [NEAR, NEAR]
    assert crosscore.round_states([1000.0, 1400.0, 1100.0]) == [NEAR, NEAR]
    assert crosscore.round_states([]) == []


def test_a_timing_keeps_the_rounds_of_one_state():
    samples = {"a": [1.0, 2.0, 2.1, 2.2, 1.1, 1.0], "b": [3.0, 5.0, 5.2, 5.1, 3.1, 3.0]}
    timing = compilation.Timing(samples, LINK)
    assert timing.state() == NEAR
    assert timing.kept() == {"a": [1.0, 1.1, 1.0], "b": [3.0, 3.1, 3.0]}
    assert timing.medians() == {"a": 1.0, "b": 3.0}
    assert timing.conditions() == {
        "state": NEAR, "rounds": 6, "kept_rounds": 3, "link_ns": [790, 1650], "near_ns": 790
    }  # fmt: skip
    # Wholly apart against another pass's reference: its rounds are all kept, as APART.
    apart = compilation.Timing({"a": [2.0, 2.1, 2.2]}, [1600.0, 1610.0, 1620.0, 1605.0], 700.0)
    assert apart.state() == APART and apart.kept() == {"a": [2.0, 2.1, 2.2]}


def test_a_timing_whose_state_kept_changing_keeps_every_round():
    samples = {"a": [1.0, 2.0, 1.1, 2.1]}
    timing = compilation.Timing(samples, [800.0, 1600.0, 810.0, 1650.0, 805.0])
    assert timing.state() == MOVED and timing.kept() == samples


def test_the_probe_times_tvms_own_pool():
    """A positive reading in ns on a pool of two or more threads, none on one thread."""
    probe = crosscore.LinkProbe()
    reading = probe()
    if runtime_threads() < 2:
        assert reading is None
    else:
        assert reading is not None and 50.0 < reading < 1e6
        assert probe.fastest == reading


class Scripted(crosscore.LinkProbe):
    """The probe's judgement over given readings (the real reading is tested above)."""

    def __init__(self, readings: list[float], cache: Path | None = None) -> None:
        super().__init__(cache)
        self._threads, self._evaluator, self.readings = 2, object(), list(readings)

    def _read(self) -> float:
        return self.readings.pop(0)


def test_a_high_reading_is_taken_again_and_a_lasting_one_stands():
    probe = Scripted([900.0, 800.0, 850.0])  # the first probe: every reading, the fastest counts
    assert probe() == 800.0 and not probe.readings
    probe.readings = [4000.0, 820.0, 9.0]  # another pool held the first back: the next reads
    assert probe() == 820.0 and probe.readings == [9.0]
    probe.readings = [1650.0, 1600.0, 1620.0, 9.0]  # apart: every reading says so, READINGS at most
    assert probe() == 1600.0 and probe.readings == [9.0]
    probe.readings = [1100.0, 9.0]  # within TOLERANCE: one reading
    assert probe() == 1100.0 and probe.fastest == 800.0


def test_a_probe_judges_by_the_machines_fastest_reading_kept_between_processes(tmp_path):
    """A process that only ever sees its cores apart still calls them apart."""
    cache = tmp_path / "crosscore.json"
    assert Scripted([480.0, 490.0, 485.0], cache)() == 480.0  # the machine's first probe
    assert machine.read_cache(cache) == {machine.machine_key(2): 480.0}
    later = Scripted([1450.0, 1400.0, 1420.0, 1500.0, 1480.0, 1490.0, 9.0], cache)  # apart
    link_ns = [later(), later()]
    assert later.fastest == 480.0 and later.readings == [9.0]
    assert crosscore.round_states(link_ns, later.fastest) == [APART]
    timing = compilation.Timing({"a": [2.0]}, link_ns, later.fastest)
    assert compilation.shared_reference([timing]) == 480.0
    # A faster reading is kept for the next process; another thread count has its own.
    assert Scripted([470.0], cache)() == 470.0
    three = Scripted([900.0, 950.0, 920.0], cache)
    three._threads = 3
    assert three() == 900.0 and three.fastest == 900.0
    assert machine.read_cache(cache) == {machine.machine_key(n): x for n, x in [(2, 470), (3, 900)]}
    cache.write_text("{not json")  # a damaged cache is read as none, then written over
    assert Scripted([500.0, 510.0, 505.0], cache)() == 500.0
    assert machine.read_cache(cache) == {machine.machine_key(2): 500.0}


def test_a_timing_probes_before_and_after_every_round():
    timing = compilation.time_rounds({"f": lambda: None}, repeats=3, min_seconds=0.001)
    assert len(timing.samples["f"]) == 3 and len(timing.link_ns) == 4


def test_the_report_says_which_rounds_its_medians_are_of():
    from gradtune.report import steady_line

    assert steady_line({}) == []  # a summary from before the probe
    assert steady_line({"state": NEAR, "rounds": 7, "kept_rounds": 7, "link_ns": [750, 820]}) == []
    [near] = steady_line({"state": NEAR, "rounds": 7, "kept_rounds": 5, "link_ns": [750, 1600]})
    assert near.startswith("The medians are of the 5 of 7 rounds") and "at their fastest" in near
    [apart] = steady_line({"state": APART, "rounds": 7, "kept_rounds": 7, "link_ns": [1500, 1650]})
    assert "slower than at their fastest" in apart
    apart_all_run = {"state": APART, "rounds": 7, "kept_rounds": 7, "link_ns": [1500, 1650]}
    [apart] = steady_line(apart_all_run | {"near_ns": 480})
    assert "1500 to 1650 ns, 480 ns at this machine's fastest)" in apart
    [moved] = steady_line({"state": MOVED, "rounds": 7, "kept_rounds": 7, "link_ns": [750, 1600]})
    assert "the medians mix both" in moved
