"""``settle``: waiting for the other thread pools of the process to stop spinning."""

from __future__ import annotations

import hashlib
import threading
import time

from gradtune import settle

BLOCK = bytes(1 << 20)


def spin(until: threading.Event | float) -> None:
    """Busy without the GIL, as a native pool's worker is: hashlib releases it while hashing,
    so the test's own thread can read the states meanwhile."""

    def done() -> bool:
        if isinstance(until, threading.Event):
            return until.is_set()
        return time.perf_counter() > until

    while not done():
        hashlib.sha256(BLOCK).digest()


def test_a_spinning_thread_is_counted_and_a_sleeping_one_is_not():
    stop = threading.Event()
    sleeper = threading.Thread(target=stop.wait)
    sleeper.start()
    time.sleep(0.05)
    before = settle.running_threads()
    spinner = threading.Thread(target=spin, args=(stop,))
    spinner.start()
    try:
        time.sleep(0.05)
        assert settle.running_threads() == before + 1
    finally:
        stop.set()
        spinner.join()
        sleeper.join()


def test_settle_waits_for_a_spinning_thread_and_no_longer():
    assert settle.settle() < 0.1  # nothing spins: two polls
    spinner = threading.Thread(target=spin, args=(time.perf_counter() + 0.2,))
    spinner.start()
    waited = settle.settle()
    spinner.join()
    assert 0.15 < waited < 0.5


def test_a_thread_that_never_sleeps_holds_the_wait_only_to_its_cap():
    stop = threading.Event()
    spinner = threading.Thread(target=spin, args=(stop,))
    spinner.start()
    try:
        assert 0.2 <= settle.settle(cap=0.2) < 0.4
    finally:
        stop.set()
        spinner.join()
