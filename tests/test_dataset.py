"""The TenSet-style dataset: zoo, collection over RPC (resumable), the loader's bad-input rules,
the hardware descriptor and each record's machine, the CLI, and DVC (fresh-clone pull from the
in-repo remote; S3 round trip through moto)."""

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

from gradtune import threads, zoo
from gradtune.dataset import hardware
from gradtune.dataset.card import dataset_summary
from gradtune.dataset.collect import Collector, collect
from gradtune.dataset.machines import MACHINES, load_record_machines
from gradtune.dataset.settings import CollectSettings
from gradtune.dataset.store import (
    RECORDS,
    WORKLOADS,
    DatasetStore,
    Skipped,
    machine_counts,
    open_dataset,
    trace_key,
)
from gradtune.dataset.versioning import add_dataset, check_versioning
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
    and measured over the module's RPC fleet, into a DVC repository of its own, then versioned
    (``dvc add``) and pushed to that repository's remote (``--push``)."""
    tmp = tmp_path_factory.mktemp("mini")
    _dvc("init", "--no-scm", "-q", cwd=tmp)
    _dvc("remote", "add", "-d", "store", str(tmp / "store"), cwd=tmp)
    data = tmp / "data"
    result = run_cli(
        "dataset", "collect", "--out", str(data), "--zoo", str(_zoo_file(tmp)),
        "--max-workloads", "2", "--random", str(MINI.random_per_workload),
        "--evolutionary", str(MINI.evolutionary_per_workload),
        "--batch-size", str(MINI.batch_size), "--builder-workers", "1",
        "--tracker", f"{fleet.host}:{fleet.port}", "--key", fleet.key, "--push",
        env={"GRADTUNE_CACHE": str(tmp / "cache")}, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"versioned: {tmp / 'data.dvc'}" in result.stderr
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
    # Every record is this host's, measuring for the manifest's target.
    machine = manifest["hardware"]["id"]
    assert manifest["hardware"]["target"] == manifest["target"]
    assert load_record_machines(mini_dataset).per_line(8) == [machine] * 8
    assert manifest["measurement"]["repeat"] == MINI.repeat
    # The thread count the local fleet's server ran kernels on: the target's, as a tune's.
    ran_on = threads.target_threads(manifest["target"])
    assert manifest["hardware"]["tvm_threads"] == manifest["measurement"]["tvm_threads"] == ran_on
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
            "--zoo", str(_zoo_file(tmp_path)), "--max-workloads", "2", "--random", "6",
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
    assert 4 <= len(kept) < 12  # stopped short of the goal (2 workloads x 6)

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
def test_collection_ends_versioned_and_pushed(mini_dataset, tmp_path):
    """The collect flow's last steps: data.dvc beside data/, and the remote holds it all (a
    copy of the repository without data/ or cache pulls it back byte for byte)."""
    repo = mini_dataset.parent
    out = yaml.safe_load((repo / "data.dvc").read_text())["outs"][0]
    assert out["path"] == "data" and out["md5"].endswith(".dir")
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copytree(repo / ".dvc", clone / ".dvc", ignore=shutil.ignore_patterns("cache", "tmp"))
    shutil.copy(repo / "data.dvc", clone / "data.dvc")
    _dvc("pull", "-q", cwd=clone)
    assert _hashes(clone / "data") == _hashes(mini_dataset)


def test_versioning_refuses_a_push_it_could_not_do(tmp_path):
    with pytest.raises(GradtuneError, match="is not inside a DVC repository"):
        check_versioning(tmp_path / "data", push=True, remote=None)
    with pytest.raises(GradtuneError, match="pass it with --push"):
        check_versioning(tmp_path / "data", push=False, remote="store")
    _dvc("init", "--no-scm", "-q", cwd=tmp_path)
    _dvc("remote", "add", "store", str(tmp_path / "store"), cwd=tmp_path)
    with pytest.raises(GradtuneError, match="'s3' is not a DVC remote of .*; choose one of store"):
        check_versioning(tmp_path / "data", push=True, remote="s3")
    check_versioning(tmp_path / "data", push=True, remote="store")
    # Outside a repository a collection is not versioned, and says so without failing.
    assert add_dataset(tmp_path.parent / "elsewhere") is None


def test_cli_collect_push_outside_a_dvc_repo_is_one_line_before_anything_starts(tmp_path):
    result = run_cli("dataset", "collect", "--out", str(tmp_path / "data"), "--push", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gradtune: error: --push: {tmp_path / 'data'} is not inside a DVC repository"
    ]
    assert not (tmp_path / "data").exists()


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


# --------------------------------------------------------------------------- hardware


def _sysfs_caches(cache: Path) -> dict[str, int]:
    """L1d / L2 / L3 in KiB as this machine's sysfs states them (read independently)."""
    out = {}
    for index in cache.glob("index*"):
        level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
        size = (index / "size").read_text().strip()
        assert size.endswith("K"), size
        if kind != "Instruction":
            out[{"1": "l1d_kb", "2": "l2_kb", "3": "l3_kb"}[level]] = int(size[:-1])
    return out


def test_descriptor_of_this_machine_reads_cpuinfo_and_sysfs_caches():
    target = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
    d = hardware.describe(target)
    for name in (*hardware.ID_FIELDS, "memory_gb", "system", "id"):
        assert name in d, name
    cpuinfo = Path("/proc/cpuinfo").read_text()
    first = cpuinfo.split("\n\n")[0]
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if "model name" in fields:
        assert d["cpu_model"] == fields["model name"]
    if "vendor_id" in fields:
        assert d["vendor"] == fields["vendor_id"]
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    assert set(d["isa"]) == flags & hardware.CODEGEN_FLAGS
    assert d["logical_cores"] == cpuinfo.count("processor\t:")
    assert 1 <= d["physical_cores"] <= d["logical_cores"]
    cache = Path("/sys/devices/system/cpu/cpu0/cache")
    if cache.is_dir():
        expected = _sysfs_caches(cache)
        assert {k: v for k, v in d["caches"].items() if v is not None} == expected
    assert d["target"] == target and d["devices"] is None
    # Stable: the same machine and target, the same id; another target, another id.
    assert hardware.describe(target)["id"] == d["id"] == hardware.machine_id(d)
    assert len(d["id"]) == 12 and int(d["id"], 16) >= 0
    assert hardware.describe({**target, "num-cores": 1})["id"] != d["id"]
    # The runtime's thread count: recorded, and part of the id only when known, so the ids of
    # descriptors written before it was recorded stand.
    assert d["tvm_threads"] is None
    two, one = hardware.describe(target, threads=2), hardware.describe(target, threads=1)
    assert two["tvm_threads"] == 2 and len({d["id"], two["id"], one["id"]}) == 3
    assert hardware.machine_id({k: v for k, v in d.items() if k != "tvm_threads"}) == d["id"]
    assert "TVM on 2" in hardware.short(two) and "TVM on" not in hardware.short(d)
    json.dumps(d)  # it goes into JSON files


def test_a_tracker_on_this_host_is_asked_which_thread_count_its_server_runs_on(monkeypatch):
    from gradtune.dataset.collect import session_machine
    from gradtune.measure.rpc_fleet import LocalFleet

    target = {"kind": "llvm", "num-cores": 2}
    # A server the user started on loopback sizes its pool from the environment it was started
    # in (the fleet's servers inherit this process's), whatever this process runs on.
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    with LocalFleet() as tracker:
        monkeypatch.undo()  # this process back on its own count: only the server is on 1
        machine = session_machine(target, tracker)
    assert machine["tvm_threads"] == 1 and machine["devices"] is None
    # The local fleet (no tracker given) is started on the target's count.
    assert session_machine(target, None)["tvm_threads"] == threads.target_threads(target)


ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
lrcpc dcpop asimddp ssbs sve i8mm bf16
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1

processor\t: 1
Features\t: fp asimd
CPU implementer\t: 0x41
CPU part\t: 0xd40
CPU revision\t: 1
"""


def _fake_cpu(root: Path, cpuinfo: str, caches: dict[str, tuple[str, str]], max_khz: str) -> None:
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(cpuinfo)
    for i, (name, (kind, size)) in enumerate(caches.items()):
        index = root / "sys" / "cpu0" / "cache" / f"index{i}"
        index.mkdir(parents=True)
        (index / "level").write_text(name[1] + "\n")
        (index / "type").write_text(kind + "\n")
        (index / "size").write_text(size + "\n")
    if max_khz:
        (root / "sys" / "cpu0" / "cpufreq").mkdir(parents=True)
        (root / "sys" / "cpu0" / "cpufreq" / "cpuinfo_max_freq").write_text(max_khz + "\n")


def test_descriptor_of_an_arm_machine_and_of_missing_files(tmp_path):
    caches = {"L1i": ("Instruction", "64K"), "L1d": ("Data", "64K"), "L2": ("Unified", "1M"),
              "L3": ("Unified", "32768K")}  # fmt: skip
    _fake_cpu(tmp_path / "arm", ARM_CPUINFO, caches, "2600000")
    arm = hardware.describe(None, tmp_path / "arm" / "proc", tmp_path / "arm" / "sys")
    assert arm["vendor"] == "ARM" and arm["cpu_model"] == "Arm part 0xd40 rev 1"
    assert arm["isa"] == ["asimd", "asimddp", "asimdhp", "bf16", "fphp", "i8mm", "sve"]
    assert arm["caches"] == {"l1d_kb": 64, "l2_kb": 1024, "l3_kb": 32768}
    assert arm["max_mhz"] == 2600 and arm["logical_cores"] == 2
    assert "Arm part 0xd40" in hardware.short(arm) and "sve" in hardware.short(arm)

    # Nothing readable (a container hiding /proc and /sys): fields unknown, never an error.
    empty = hardware.describe(None, tmp_path / "nothing", tmp_path / "nothing")
    assert empty["isa"] is None and empty["max_mhz"] is None
    assert empty["caches"] == {"l1d_kb": None, "l2_kb": None, "l3_kb": None}
    assert empty["logical_cores"] >= 1 and len(empty["id"]) == 12
    # Garbage in the files reads as unknown too.
    _fake_cpu(tmp_path / "bad", "no colon here\n", {"L2": ("Unified", "lots")}, "fast")
    bad = hardware.describe(None, tmp_path / "bad" / "proc", tmp_path / "bad" / "sys")
    assert bad["caches"]["l2_kb"] is None and bad["max_mhz"] is None and bad["isa"] is None

    # The id follows what changes performance, not memory or the OS.
    assert hardware.machine_id({**arm, "memory_gb": 1.0, "system": "Other 1"}) == arm["id"]
    assert hardware.machine_id({**arm, "isa": ["asimd"]}) != arm["id"]
    assert hardware.machine_id({**arm, "caches": {**arm["caches"], "l2_kb": 512}}) != arm["id"]


def test_old_manifest_hardware_becomes_a_descriptor_with_unknown_isa():
    old = {"cpu_model": "AMD EPYC", "physical_cores": 2, "logical_cores": 2, "memory_gb": 23.5,
           "machine": "x86_64", "system": "Linux 6.1"}  # fmt: skip
    target = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
    legacy = hardware.from_manifest(old, target)
    assert legacy["isa"] is None and legacy["caches"] is None and legacy["target"] == target
    assert legacy["cpu_model"] == "AMD EPYC" and legacy["memory_gb"] == 23.5
    assert legacy["id"] == hardware.from_manifest(dict(old), dict(target))["id"]
    assert hardware.isa_signature(legacy) is None
    new = hardware.describe(target)
    assert hardware.from_manifest(new, target) == new  # a new descriptor comes back as it is


# --------------------------------------------------------------------------- each record's machine


@pytest.fixture(scope="module")
def matmul():
    """A real workload and three of its MetaSchedule sketches, as a collection samples them."""
    import tvm
    from tvm import te

    from gradtune.costmodel.featurize import make_context
    from gradtune.target import make_target, parse_target

    target_config = parse_target(None)
    target = make_target(target_config)
    a, b = te.placeholder((32, 32), name="A"), te.placeholder((32, 32), name="B")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((32, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    sketches = make_context(mod, target).space_generator.generate_design_space(mod)
    return mod, target_config, target, sketches


def _session(data: Path, matmul, machine: dict, latencies: list[float], scratch: Path) -> None:
    """One collection session: open the store as ``machine``, commit one record per latency."""
    from tvm.s_tir import meta_schedule as ms

    mod, target_config, target, sketches = matmul
    store = DatasetStore(data, target_config, scratch=scratch, machine=machine)
    workload = store.workload(mod)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    records = [
        ms.database.TuningRecord(sketches[i % len(sketches)].trace, workload, [t], target, args)
        for i, t in enumerate(latencies)
    ]
    store.commit("matmul", records)


def _machine(name: str, target: dict, isa: list[str]) -> dict:
    d = {**hardware.describe(target), "cpu_model": name, "isa": isa}
    return {**d, "id": hardware.machine_id(d)}


def test_each_record_knows_its_machine_across_sessions(matmul, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADTUNE_CACHE", str(tmp_path / "cache"))
    target_config = matmul[1]
    a = _machine("CPU A", target_config, ["avx2", "fma"])
    b = _machine("CPU B", target_config, ["avx2", "fma"])
    data = tmp_path / "data"
    _session(data, matmul, a, [1e-3, 2e-3, 3e-3], tmp_path / "s1")
    # A corrupt line in A's range and a torn tail: B's session drops both, renumbering lines.
    with open(data / f"{RECORDS}.gz", "ab") as f:
        f.write(gzip.compress(b"this is not a record\n"))
        f.write(gzip.compress(b'[0, [[["x"]]]]\n' * 50)[:40])
    _session(data, matmul, b, [4e-3, 5e-3], tmp_path / "s2")

    assert len(_lines(data / f"{RECORDS}.gz")) == 5
    attribution = load_record_machines(data)
    assert attribution.per_line(5) == [a["id"]] * 3 + [b["id"]] * 2
    raw = json.loads((data / MACHINES).read_text())
    assert raw["ranges"] == [[0, 2, a["id"]], [3, None, b["id"]]]
    assert raw["machines"][a["id"]]["cpu_model"] == "CPU A"

    def latencies(db) -> list[float]:
        return sorted(float(r.run_secs[0]) for r in db.get_all_tuning_records())

    assert machine_counts(data, target_config) == {a["id"]: 3, b["id"]: 2}
    assert latencies(open_dataset(data, target_config, machines=[a["id"]])) == [1e-3, 2e-3, 3e-3]
    assert latencies(open_dataset(data, target_config, machines=[b["id"]])) == [4e-3, 5e-3]
    assert len(latencies(open_dataset(data, target_config))) == 5
    summary = dataset_summary(data)["machines"]
    assert {m: e["records"] for m, e in summary.items()} == {a["id"]: 3, b["id"]: 2}

    # A third session by A again: the earlier lines keep their machines.
    _session(data, matmul, a, [6e-3], tmp_path / "s3")
    assert load_record_machines(data).per_line(6) == [a["id"]] * 3 + [b["id"]] * 2 + [a["id"]]

    # Collecting for another target into this directory is refused, and nothing is touched.
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    with pytest.raises(GradtuneError, match="another target.*another directory"):
        DatasetStore(data, {**target_config, "num-cores": 99}, scratch=tmp_path / "s4")
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before


def test_dataset_without_ranges_belongs_to_the_manifest_hardware(matmul, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADTUNE_CACHE", str(tmp_path / "cache"))
    target_config = matmul[1]
    data = tmp_path / "data"
    _session(data, matmul, hardware.describe(target_config), [1e-3, 2e-3], tmp_path / "s1")
    # What a dataset collected before per-record machines looks like: no sidecar, and the
    # manifest's hardware in its old form.
    (data / MACHINES).unlink()
    old = {"cpu_model": "Old CPU", "physical_cores": 2, "logical_cores": 2, "memory_gb": 8.0,
           "machine": "x86_64", "system": "Linux 5"}  # fmt: skip
    (data / "manifest.json").write_text(json.dumps({"target": target_config, "hardware": old}))
    legacy = hardware.from_manifest(old, target_config)
    assert load_record_machines(data).per_line(2) == [legacy["id"]] * 2
    assert machine_counts(data, target_config) == {legacy["id"]: 2}
    machines = dataset_summary(data)["machines"]
    assert machines[legacy["id"]]["descriptor"]["cpu_model"] == "Old CPU"

    # The next session keeps the old records' descriptor though the manifest moves on.
    new = hardware.describe(target_config)
    _session(data, matmul, new, [3e-3], tmp_path / "s2")
    (data / "manifest.json").write_text(json.dumps({"target": target_config, "hardware": new}))
    attribution = load_record_machines(data)
    assert attribution.per_line(3) == [legacy["id"]] * 2 + [new["id"]]
    assert attribution.descriptor(legacy["id"])["cpu_model"] == "Old CPU"


def test_a_malformed_record_machines_file_is_a_one_line_error(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    machine = hardware.describe(None)
    cases = {
        "not json": "{",
        "overlap": {"machines": {machine["id"]: machine}, "ranges": [[0, 5, machine["id"]],
                                                                    [3, None, machine["id"]]]},
        "unknown id": {"machines": {}, "ranges": [[0, None, "abc"]]},
        "open inside": {"machines": {machine["id"]: machine}, "ranges": [[0, None, machine["id"]],
                                                                        [4, 6, machine["id"]]]},
    }  # fmt: skip
    for name, body in cases.items():
        (data / MACHINES).write_text(body if isinstance(body, str) else json.dumps(body))
        with pytest.raises(GradtuneError, match=MACHINES) as err:
            load_record_machines(data)
        assert "\n" not in str(err.value), name


def test_featurize_writes_each_groups_machine(matmul, tmp_path, monkeypatch):
    import torch

    from gradtune.costmodel.featurize import featurize_dataset

    monkeypatch.setenv("GRADTUNE_CACHE", str(tmp_path / "cache"))
    target_config = matmul[1]
    a = _machine("CPU A", target_config, ["avx2", "fma"])
    b = _machine("CPU B", target_config, ["avx512f", "avx2", "fma"])
    data = tmp_path / "data"
    _session(data, matmul, a, [1e-3, 2e-3, 3e-3], tmp_path / "s1")
    _session(data, matmul, b, [4e-3, 5e-3], tmp_path / "s2")
    (data / "manifest.json").write_text(json.dumps({"target": target_config, "hardware": b}))
    summary = featurize_dataset(data, tmp_path / "features.pt")
    assert summary["machines"] == {a["id"]: 3, b["id"]: 2} and summary["workloads"] == 2
    blob = torch.load(tmp_path / "features.pt", weights_only=False)
    assert set(blob["machines"]) == {a["id"], b["id"]}
    assert blob["machines"][b["id"]]["isa"] == ["avx512f", "avx2", "fma"]
    groups = {w["machine"]: sorted(w["latencies"]) for w in blob["workloads"]}
    assert groups == {a["id"]: [1e-3, 2e-3, 3e-3], b["id"]: [4e-3, 5e-3]}


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
    out = yaml.safe_load((clone / "data.dvc").read_text())["outs"][0]
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
