"""The TenSet-style dataset: zoo, collection over RPC (resumable), the loader's bad-input rules,
the CLI, and DVC (fresh-clone pull from the in-repo remote; S3 round trip through moto)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gradtune import zoo
from gradtune.dataset.card import dataset_summary
from gradtune.dataset.collect import Collector, collect
from gradtune.dataset.settings import CollectSettings
from gradtune.dataset.store import (
    RECORDS,
    WORKLOADS,
    DatasetStore,
    Skipped,
    open_dataset,
    trace_key,
)
from gradtune.dataset.workloads import WorkloadProgress, extract_workloads, prioritize
from gradtune.errors import GradtuneError
from gradtune.partition import OTHER_FAMILY, operator_family
from gradtune.stop import StopSignal
from tests.conftest import ROOT, http_server, run_cli

# Two small workloads, four records each: enough to exercise sampling, both phases, the
# manifest, the card and resume, in about a minute on two cores.
MINI = CollectSettings(
    random_per_workload=4, evolutionary_per_workload=0, batch_size=4, builder_workers=1
)


def _zoo_file(tmp: Path) -> Path:
    path = tmp / "zoo.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "transformer_encoder", "batches": [1]}]}))
    return path


def _lines(path: Path) -> list[bytes]:
    return [line for line in gzip.decompress(path.read_bytes()).split(b"\n") if line]


@pytest.fixture(scope="module")
def fleet():
    from gradtune.measure.rpc_fleet import LocalFleet

    with LocalFleet(num_servers=1) as tracker:
        yield tracker


@pytest.fixture(scope="module")
def mini_dataset(tmp_path_factory, fleet):
    """A real collection through the CLI and its Prefect flow: transformer tasks sampled, built
    and measured over the module's RPC fleet."""
    tmp = tmp_path_factory.mktemp("mini")
    data = tmp / "data"
    result = run_cli(
        "dataset", "collect", "--out", str(data), "--zoo", str(_zoo_file(tmp)),
        "--max-workloads", "2", "--random", str(MINI.random_per_workload),
        "--evolutionary", str(MINI.evolutionary_per_workload),
        "--batch-size", str(MINI.batch_size), "--builder-workers", "1",
        "--tracker", f"{fleet.host}:{fleet.port}", "--key", fleet.key,
        env={"GRADTUNE_CACHE": str(tmp / "cache")}, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["records"] == 8 and summary["workloads_complete"] == 2
    return data


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- zoo


def test_zoo_builders_are_small_eval_models_that_import():
    import torch

    for name in zoo.BUILDERS:
        model, inputs = zoo.BUILDERS[name](2)
        assert not model.training, name
        assert isinstance(inputs, tuple) and inputs[0].shape[0] == 2, name
        params = sum(p.numel() for p in model.parameters())
        assert params < 500_000, f"{name} has {params} parameters: too big to tune on 2 cores"
        with torch.no_grad():
            assert torch.isfinite(model(*inputs)).all(), name


def test_zoo_config_lists_every_family_and_rejects_unknown_models(tmp_path):
    entries = zoo.load_config(ROOT / "configs" / "zoo.yaml")
    assert {e.model for e in entries} == set(zoo.BUILDERS)
    assert all(1 in e.batches and len(e.batches) >= 2 for e in entries)
    bad = tmp_path / "zoo.yaml"
    bad.write_text("models:\n  - {name: alexnet, batches: [1]}\n")
    with pytest.raises(GradtuneError, match="unknown model 'alexnet'"):
        zoo.load_config(bad)


def test_workloads_deduplicated_by_structural_hash(llvm_target):
    import tvm_ffi

    entries = [zoo.ZooEntry("transformer_encoder", [1]), zoo.ZooEntry("transformer_encoder", [1])]
    workloads = extract_workloads(entries, llvm_target)
    keys = [w.key for w in workloads]
    assert len(keys) == len(set(keys))
    # The encoder calls some kernels twice (two identical matmul+add, q/k/v slicing): one
    # workload, its weight counting both calls.
    assert sum(w.weights["transformer_encoder@b1"] for w in workloads) > len(workloads)
    assert all(str(tvm_ffi.structural_hash(w.mod)) == w.key for w in workloads)
    order = [operator_family(w.kernel_class) for w in prioritize(workloads)]
    assert order[:3] == ["matmul", "softmax", "norm"]
    # Data movement (tiny design spaces) only after every compute kernel.
    first_other = order.index(OTHER_FAMILY)
    assert OTHER_FAMILY in order and set(order[first_other:]) == {OTHER_FAMILY}


# --------------------------------------------------------------------------- collection


@pytest.mark.slow
def test_collect_writes_plain_jsondatabase_manifest_and_card(mini_dataset, tmp_path):
    from tvm.s_tir import meta_schedule as ms

    manifest = json.loads((mini_dataset / "manifest.json").read_text())
    assert len(manifest["workloads"]) == 2
    for entry in manifest["workloads"].values():
        assert entry["records"] == 4 and entry["models"] == ["transformer_encoder"]
        assert entry["kernel_class"] and entry["flops"] > 0
    assert manifest["target"]["mcpu"] and manifest["hardware"]["logical_cores"] >= 1
    assert manifest["measurement"]["repeat"] == MINI.repeat
    # Gunzipped, plain TVM reads the files: no gradtune in the loop.
    for name in (WORKLOADS, RECORDS):
        (tmp_path / name).write_bytes(gzip.decompress((mini_dataset / f"{name}.gz").read_bytes()))
    db = ms.database.JSONDatabase(str(tmp_path / WORKLOADS), str(tmp_path / RECORDS))
    records = db.get_all_tuning_records()
    assert len(records) == 8
    assert all(0 < min(float(s) for s in r.run_secs) < 1 for r in records)
    traces = {trace_key(r.trace) for r in records}
    assert len(traces) == 8, "a program was measured twice"
    card = (mini_dataset / "README.md").read_text()
    assert "8 measured records" in card and "matmul" in card


@pytest.mark.slow
def test_collect_resumes_measuring_only_what_is_missing(mini_dataset, fleet, tmp_path, monkeypatch):
    from gradtune.target import parse_target

    monkeypatch.setenv("GRADTUNE_CACHE", str(tmp_path / "cache"))

    data = _copy(mini_dataset, tmp_path)
    before = _lines(data / f"{RECORDS}.gz")
    # Simulate a kill in the middle of an append: a torn gzip member at the end of the file.
    with open(data / f"{RECORDS}.gz", "ab") as f:
        f.write(gzip.compress(b'[0, [[["x"]]]]\n' * 50)[:40])
    # A raised goal: one more per workload, from the evolutionary phase (seeded by the records).
    more = CollectSettings(**{**MINI.__dict__, "evolutionary_per_workload": 1})
    manifest = collect(
        data, _zoo_file(tmp_path), parse_target(None), more, tracker=fleet, max_workloads=2
    )
    after = _lines(data / f"{RECORDS}.gz")
    assert after[: len(before)] == before, "stored records were rewritten or dropped"
    assert len(after) == len(before) + 2  # nothing re-measured
    assert all(e["records"] == 5 for e in manifest["workloads"].values())
    assert len({trace_key(r.trace) for r in _records(data, tmp_path)}) == 10


def _records(data: Path, tmp_path: Path) -> list:
    return list(open_dataset(data, cache_dir=tmp_path / "c").get_all_tuning_records())


# --------------------------------------------------------------------------- stopping


def test_collect_stopped_before_it_starts_measures_nothing(fleet, tmp_path, monkeypatch):
    from gradtune.target import parse_target

    monkeypatch.setenv("GRADTUNE_CACHE", str(tmp_path / "cache"))
    stop = StopSignal()
    stop.set()
    data = tmp_path / "data"
    manifest = collect(
        data, _zoo_file(tmp_path), parse_target(None), MINI, tracker=fleet, max_workloads=2,
        stop=stop,
    )  # fmt: skip
    assert _lines(data / f"{RECORDS}.gz") == []
    assert [e["records"] for e in manifest["workloads"].values()] == [0, 0]
    assert (data / "README.md").is_file()  # the card is written on the way out all the same


def test_collection_stops_after_the_batch_that_saw_the_signal(fleet, tmp_path):
    from gradtune.target import make_target, parse_target

    target_config = parse_target(None)
    target = make_target(target_config)
    entries = [zoo.ZooEntry("transformer_encoder", [1])]
    info = prioritize(extract_workloads(entries, target))[0]  # the largest matmul
    store = DatasetStore(tmp_path / "data", target_config, scratch=tmp_path / "scratch")
    stop = StopSignal()
    batches = []

    def on_batch(n: int) -> None:  # the signal arrives while the collection runs
        batches.append(n)
        stop.set()

    collector = Collector(store, target, fleet, MINI, stop)
    try:
        goal = 3 * MINI.batch_size  # the design space holds far more programs than this
        collector.run_workload(info, "random", goal, WorkloadProgress(), on_batch=on_batch)
    finally:
        collector.close()
    assert batches == [MINI.batch_size]
    measured = store.counts.get(info.key, 0)
    assert 0 < measured <= MINI.batch_size
    assert len(_lines(tmp_path / "data" / f"{RECORDS}.gz")) == measured  # and it is stored


@pytest.mark.slow
def test_cli_collect_stops_cleanly_on_ctrl_c_and_resumes(tmp_path):
    """Ctrl-C in a terminal (SIGINT to the whole process group) during `gradtune dataset
    collect`: the batch in flight is stored, then every process of the run is gone (its RPC
    fleet, its build workers, Prefect's server), exit 130 with a one-line message; a rerun
    resumes."""
    import signal
    import time
    import uuid

    import psutil

    data = tmp_path / "data"
    mark = uuid.uuid4().hex  # inherited by every process the command starts
    env = {**os.environ, "GRADTUNE_CACHE": str(tmp_path / "cache"), "GRADTUNE_TEST_RUN": mark}
    argv = [sys.executable, "-m", "gradtune.cli", "dataset", "collect", "--out", str(data),
            "--zoo", str(_zoo_file(tmp_path)), "--max-workloads", "2", "--random", "8",
            "--evolutionary", "0", "--batch-size", "4", "--builder-workers", "1"]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    records = data / f"{RECORDS}.gz"
    deadline = time.monotonic() + 600
    while not (records.is_file() and _lines(records)):  # the first batch is stored
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no batch measured within 600 s"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    message = (
        "gradtune: collection stopped; rerun the same command to resume (measured records are kept)"
    )
    assert err.splitlines().count(message) == 1, err[-3000:]  # Prefect logs its exit after it
    kept = _lines(records)
    assert 4 <= len(kept) < 16  # stopped short of the goal (2 workloads x 8)

    def leftovers() -> list[str]:
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.environ().get("GRADTUNE_TEST_RUN") == mark:
                    found.append(" ".join(p.info["cmdline"] or []))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    deadline = time.monotonic() + 30
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers(), leftovers()

    rerun = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = _lines(records)
    assert after[: len(kept)] == kept and len(after) > len(kept)


# --------------------------------------------------------------------------- loader


@pytest.mark.slow
def test_open_dataset_skips_bad_lines_with_a_count(mini_dataset, tmp_path, capsys):
    data = _copy(mini_dataset, tmp_path)
    records = _lines(data / f"{RECORDS}.gz")
    index, body = json.loads(records[0])
    other = json.loads(records[1])
    other[1][2] = {**other[1][2], "mcpu": "cortex-a72"}
    bad = [
        b'[0, [[["broken"',  # truncated line
        b"this is not json",
        json.dumps([99, body]).encode(),  # names a workload that is not there
        json.dumps(other).encode(),  # measured on another CPU
        # Well-formed, but its trace no longer applies to the workload: TVM's own loader
        # would fail on it and take the whole database down.
        json.dumps([index, [[[["GetSBlock", [], ["no_such_block", "main"], ["b0"]]], []],
                            *body[1:]]]).encode(),
    ]  # fmt: skip
    with open(data / f"{RECORDS}.gz", "ab") as f:
        f.write(gzip.compress(b"\n".join(bad) + b"\n"))
    target = json.loads((data / "manifest.json").read_text())["target"]
    skipped = Skipped()
    db = open_dataset(data, target=target, skipped=skipped, cache_dir=tmp_path / "c")
    assert len(db.get_all_tuning_records()) == len(records)
    assert skipped.count == 5
    assert skipped.reasons == {"corrupt record": 3, "missing workload": 1, "other target": 1}
    err = capsys.readouterr().err
    assert "skipped 5 bad line(s)" in err and "does not parse" in err

    # A dataset measured elsewhere: nothing usable is a clear error, not an empty database.
    with pytest.raises(GradtuneError, match="another target"):
        open_dataset(
            mini_dataset, target={**target, "mcpu": "cortex-a72"}, cache_dir=tmp_path / "d"
        )


@pytest.mark.slow
def test_open_dataset_survives_a_truncated_file(mini_dataset, tmp_path):
    data = _copy(mini_dataset, tmp_path)
    path = data / f"{RECORDS}.gz"
    whole = len(_lines(path))
    # Append a second member and cut it in half: the first member's records must survive.
    member = gzip.compress(b"\n".join(_lines(path)) + b"\n")
    path.write_bytes(path.read_bytes() + member[: len(member) // 2])
    skipped = Skipped()
    db = open_dataset(data, skipped=skipped, cache_dir=tmp_path / "c")
    assert len(db.get_all_tuning_records()) >= whole
    assert skipped.reasons.get("truncated file") == 1


def test_empty_or_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(GradtuneError, match="not found"):
        open_dataset(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GradtuneError, match="no usable tuning records"):
        open_dataset(tmp_path / "empty", cache_dir=tmp_path / "c")


# --------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_cli_dataset_info_and_errors(mini_dataset, tmp_path):
    ok = run_cli("dataset", "info", str(mini_dataset), timeout=120)
    assert ok.returncode == 0, ok.stderr
    last = json.loads(ok.stdout.strip().splitlines()[-1])
    assert last["records"] == 8 and last["workloads"] == 2
    missing = run_cli("dataset", "info", str(tmp_path / "nope"), timeout=120)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"gradtune: error: dataset directory not found: {tmp_path / 'nope'}"
    ]
    bad_zoo = run_cli("dataset", "collect", "--zoo", str(tmp_path / "z.yaml"), timeout=120)
    assert bad_zoo.returncode == 2 and "zoo config not found" in bad_zoo.stderr


# --------------------------------------------------------------------------- DVC


def _dvc(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dvc"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DVC_NO_ANALYTICS": "1", **(env or {})},
    )
    assert result.returncode == 0, f"dvc {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_fresh_clone_dvc_pull_restores_the_dataset(tmp_path):
    """What CI and the README rely on: a clone + `dvc pull` (in-repo remote, offline)."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    assert not (clone / "data").exists()
    _dvc("pull", cwd=clone)
    lock = yaml.safe_load((clone / "dvc.lock").read_text())
    out = lock["stages"]["collect"]["outs"][0]
    assert out["path"] == "data"
    listing = json.loads(
        (clone / ".dvc" / "cache" / "files" / "md5" / out["md5"][:2] / out["md5"][2:]).read_text()
    )
    for entry in listing:
        content = (clone / "data" / entry["relpath"]).read_bytes()
        assert hashlib.md5(content).hexdigest() == entry["md5"], entry["relpath"]
    # Byte-identical to what was pushed (above); loading thousands of records into TVM is
    # the loader tests' business, the counts here come from the files themselves.
    summary = dataset_summary(clone / "data")
    assert summary["records"] > 0 and summary["workloads_with_records"] > 0


@pytest.mark.slow
def test_dvc_s3_remote_push_wipe_pull_round_trip(mini_dataset, tmp_path):
    """The repo's named S3 remote against a real S3-compatible server (moto) on 127.0.0.1."""
    import boto3

    from gradtune.measure.rpc_fleet import free_port

    config = (ROOT / ".dvc" / "config").read_text()
    assert 'remote "s3"' in config
    assert "secret" not in config.lower() and "access_key" not in config.lower()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    creds = {
        "AWS_ACCESS_KEY_ID": "gradtune-test",
        "AWS_SECRET_ACCESS_KEY": "gradtune-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    moto = [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    with http_server(moto, f"{endpoint}/moto-api/", env=creds):
        repo = tmp_path / "repo"
        repo.mkdir()
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        _dvc("init", "-q", cwd=repo)
        shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
        # The endpoint of this machine's S3 goes in the git-ignored config.local, as a user's.
        _dvc("remote", "modify", "--local", "s3", "endpointurl", endpoint, cwd=repo)
        bucket = config.split('remote "s3"')[1].split("url = s3://")[1].split("/")[0]
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
            region_name=creds["AWS_DEFAULT_REGION"],
        )
        s3.create_bucket(Bucket=bucket)
        shutil.copytree(mini_dataset, repo / "data")
        original = _hashes(repo / "data")
        _dvc("add", "data", cwd=repo)
        _dvc("push", "-r", "s3", cwd=repo, env=creds)
        stored = s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0)
        assert stored >= len(original)
        shutil.rmtree(repo / ".dvc" / "cache")
        shutil.rmtree(repo / "data")
        _dvc("pull", "-r", "s3", cwd=repo, env=creds)
        assert _hashes(repo / "data") == original
