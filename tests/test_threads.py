"""TVM's runtime runs kernels on the target's cores: importing gradtune sets TVM_NUM_THREADS
before any kernel runs (TVM alone takes half the cores of a machine without hyper-threads), a
target's num-cores sets its own count, and a count the user set wins."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from gradtune import threads
from tests.conftest import ROOT

PROBE = """
import sys
import gradtune  # noqa: F401
from gradtune.threads import runtime_threads, use_target_threads
if len(sys.argv) > 1:
    print(use_target_threads({"kind": "llvm", "num-cores": int(sys.argv[1])}), end=" ")
print(runtime_threads())
"""


def _probe(*args: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in threads.USER_ENVS}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True,
        env={**clean, **env}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_gradtune_runs_kernels_on_the_physical_cores():
    assert _probe() == str(psutil.cpu_count(logical=False) or psutil.cpu_count())


@pytest.mark.parametrize("name", threads.USER_ENVS)
def test_a_count_the_user_set_wins(name):
    assert _probe(**{name: "1"}) == "1"
    assert _probe("3", **{name: "1"}) == "1 1"


def test_a_targets_num_cores_sets_the_count_before_kernels_run():
    assert _probe("1") == "1 1"


def test_target_threads_reads_the_user_then_the_target_then_the_host(monkeypatch):
    for name in threads.USER_ENVS:
        monkeypatch.delenv(name, raising=False)
    assert threads.target_threads({"kind": "llvm", "num-cores": 3}) == 3
    assert threads.target_threads({"kind": "cuda"}) == threads.host_cores()
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert threads.target_threads({"kind": "llvm", "num-cores": 3}) == 5
    monkeypatch.setenv("TVM_NUM_THREADS", "junk")  # TVM reads it with atoi: one thread
    assert threads.target_threads({"kind": "llvm", "num-cores": 3}) == 1
