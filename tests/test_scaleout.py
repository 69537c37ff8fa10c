"""Scale-out on Dask: how many models a local cluster tunes at once, and bad addresses."""

from __future__ import annotations

import os

import pytest

from gradtune.scaleout import check_address, local_workers


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
