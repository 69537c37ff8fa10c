"""``settle``: waiting for the other thread pools of the process to stop spinning."""

from __future__ import annotations

import threading
import time

from gradtune import settle


def test_a_spinning_thread_is_counted_and_a_sleeping_one_is_not():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    sleeper = threading.Thread(target=stop.wait)
    sleeper.start()
    time.sleep(0.05)
    before = settle.running_threads()
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        # The spinner shares the GIL with this thread: it runs whenever this one waits.
        time.sleep(0.05)
        assert settle.running_threads() == before + 1
    finally:
        stop.set()
        spinner.join()
        sleeper.join()


def test_settle_waits_for_a_spinning_thread_and_no_longer():
    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    assert settle.settle() < 0.1  # nothing spins: two polls
    spinner = threading.Thread(target=spin, args=(0.2,))
    spinner.start()
    waited = settle.settle()
    spinner.join()
    assert 0.15 < waited < 0.5


def test_a_thread_that_never_sleeps_holds_the_wait_only_to_its_cap():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        assert 0.2 <= settle.settle(cap=0.2) < 0.4
    finally:
        stop.set()
        spinner.join()
