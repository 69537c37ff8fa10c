"""Scale-out on Dask: how many models a local cluster tunes at once, bad addresses, and (slow)
``gradtune retune`` tuning two models at once on a ``LocalCluster``."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from gradtune.errors import GradtuneError
from gradtune.retune import ModelSpec
from gradtune.scaleout import check_address, local_workers, remote_devices, target_cores


def test_local_cluster_never_shares_the_measuring_cores() -> None:
    cores = os.cpu_count() or 1
    # Each tuning measuring on every core of this machine: one at a time, however many models.
    assert local_workers(models=5, cores_per_tuning=cores, remote_devices=None) == 1
    assert local_workers(models=5, cores_per_tuning=None, remote_devices=None) == 1
    # One core per tuning: as many as there are cores, never more than models.
    assert local_workers(models=1, cores_per_tuning=1, remote_devices=None) == 1
    assert local_workers(models=64, cores_per_tuning=1, remote_devices=None) == cores


def test_remote_devices_bound_the_concurrency() -> None:
    assert local_workers(models=3, cores_per_tuning=None, remote_devices=2) == 2
    assert local_workers(models=3, cores_per_tuning=None, remote_devices=8) == 3
    assert local_workers(models=3, cores_per_tuning=None, remote_devices=0) == 1


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:8786", "127.0.0.1:8786", "tls://h:1"])
def test_scheduler_addresses_accepted(address: str) -> None:
    check_address(address)


@pytest.mark.parametrize(
    "address, fragment",
    [
        ("http://127.0.0.1:8786", "unknown protocol 'http'"),
        ("tcp://127.0.0.1", "missing port"),
        ("tcp://host:port", "not host:port"),
    ],
)
def test_bad_scheduler_address_is_one_line(address: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as info:
        check_address(address)
    assert "\n" not in str(info.value)


def test_cores_per_tuning_come_from_the_target() -> None:
    assert target_cores('{"kind": "llvm", "num-cores": 1}') == 1
    assert target_cores('{"kind": "llvm"}') is None
    assert target_cores("llvm") is None and target_cores(None) is None
    # Behind a tracker the devices are queued per session: concurrency is bounded by the CPU.
    assert remote_devices(None, 3) is None
    assert remote_devices("127.0.0.1:9190", 1) == 1


@pytest.mark.parametrize(
    "option, fragment",
    [
        (["--dask-address", "udp://h:1"], "unknown protocol"),
        (["--dask-workers", "0"], "at least 1"),
    ],
)
def test_cli_rejects_bad_dask_options_in_one_line(tmp_path, option, fragment) -> None:
    result = run_cli(
        "retune", "--mlflow-uri", f"sqlite:///{tmp_path}/m.db", "--out", str(tmp_path / "o"),
        *option,
    )  # fmt: skip
    assert result.returncode == 2 and fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / "m.db").exists()


ONE_CORE = json.dumps({"kind": "llvm", "num-cores": 1})


def _tuning_span(run_dir: Path) -> tuple[float, float]:
    """When a run's tuning started (MetaSchedule's first log line) and last measured (the
    database's last write)."""
    log = run_dir / "logs" / "tvm.s_tir.meta_schedule.logging.task_scheduler.log"
    start = datetime.strptime(log.read_text()[:19], "%Y-%m-%d %H:%M:%S").timestamp()
    return start, (run_dir / "database_tuning_record.json").stat().st_mtime


@pytest.mark.slow
def test_retune_tunes_two_models_at_once_on_a_local_dask_cluster(tmp_path) -> None:
    """Two models, one core each, two workers: both are tuned, registered and promoted, and
    their tunings overlap in time; each run's summary times only its own stages."""
    (tmp_path / "models").mkdir()
    source = (ROOT / "models" / "mlp_block.py").read_text()
    (tmp_path / "models" / "a.py").write_text(source)
    (tmp_path / "models" / "b.py").write_text(source.replace("manual_seed(0)", "manual_seed(1)"))
    config = tmp_path / "models.yaml"
    config.write_text("models:\n  - path: models/a.py\n  - path: models/b.py\n")
    result = run_cli(
        "retune", "--config", str(config), "--mlflow-uri", f"sqlite:///{tmp_path}/mlflow.db",
        "--trials", "5", "--target", ONE_CORE, "--dask-workers", "2", "--out",
        str(tmp_path / "runs"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "retune-models-on-dask" in result.stderr  # the Dask path ran, not the loop
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["outcome"] for r in results] == ["promoted", "promoted"]
    (a_start, a_end), (b_start, b_end) = (_tuning_span(Path(r["out"])) for r in results)
    assert a_start < b_end and b_start < a_end, "the two tunings ran one after the other"
    for r in results:
        stages = json.loads((Path(r["out"]) / "summary.json").read_text())["stage_seconds"]
        assert sum(name.startswith("tune") for name in stages) == 1, stages


@pytest.mark.slow
def test_a_model_that_fails_on_a_worker_is_named(tmp_path, monkeypatch) -> None:
    """Each model's task is retried once (declared on the task), then the run says which
    models failed."""
    from prefect.testing.utilities import prefect_test_harness

    from gradtune import scaleout
    from gradtune.entrypoints import load_flow

    retune_flow = load_flow("retune", "retune_concurrently")
    remote = retune_flow.fn.__globals__["retune_remote"]
    assert remote.retries == 1
    # The declared retry without its wait (10 s, for a worker that died), which tells nothing.
    monkeypatch.setitem(
        retune_flow.fn.__globals__, "retune_remote", remote.with_options(retry_delay_seconds=0)
    )

    specs = [ModelSpec(path=str(tmp_path / f"gone{i}.py")) for i in range(2)]
    settings = dict(trials=8, mlflow_uri=f"sqlite:///{tmp_path}/m.db", alias="challenger")
    with prefect_test_harness():
        runner = scaleout.dask_task_runner(None, 2, scaleout.current_api_url())
        with pytest.raises(GradtuneError, match="could not finish 2 model") as info:
            retune_flow.with_options(task_runner=runner)(specs, ONE_CORE, str(tmp_path), settings)
    assert "gone0.py" in str(info.value) and "gone1.py" in str(info.value)
