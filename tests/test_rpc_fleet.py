import psutil
import pytest

from gradtune.errors import GradtuneError
from gradtune.measure.rpc_fleet import LocalFleet, check_tracker, parse_tracker, query_free_servers


def _children_alive(pids):
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_local_fleet_registers_and_stops_everything():
    fleet = LocalFleet(num_servers=2)
    with fleet as tracker:
        assert tracker.host == "127.0.0.1"
        assert query_free_servers(tracker) == 2
        check_tracker(tracker)  # a user-supplied tracker goes through the same check
        pids = [p.pid for p in fleet._procs]
        tree = [c.pid for pid in pids for c in psutil.Process(pid).children(recursive=True)]
    assert not _children_alive(pids + tree)


def test_fleet_stops_on_error_inside():
    fleet = LocalFleet()
    with pytest.raises(RuntimeError, match="boom"):
        with fleet:
            pids = [p.pid for p in fleet._procs]
            raise RuntimeError("boom")
    assert not _children_alive(pids)


@pytest.mark.parametrize(
    "spec, key, message", [("nohost", "k", "not HOST:PORT"), ("h:1", None, "needs --key")]
)
def test_parse_tracker_errors(spec, key, message):
    with pytest.raises(GradtuneError, match=message):
        parse_tracker(spec, key)
