"""Cost-model pretraining on real measured records: a slice of the repo's DVC dataset;
featurize → pretrain → MLflow champion on a real tracking server → the tuner loads it; the eval
command; bad input skipped with a count, an empty dataset a clear error; which machines' records
pretraining takes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gradtune.costmodel import online
from gradtune.costmodel.model import load
from gradtune.costmodel.pretrain import load_groups, pretrain
from gradtune.dataset import hardware
from gradtune.errors import GradtuneError
from tests.conftest import ROOT, run_cli

DATA = ROOT / "data"


def _gz_lines(path: Path) -> list[bytes]:
    return [line for line in gzip.decompress(path.read_bytes()).split(b"\n") if line.strip()]


def _write_gz(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines)))


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    """The four cheapest compute workloads of the real dataset (two models at least), twelve
    measured records each, in the dataset's own format."""
    if not (DATA / "manifest.json").is_file():
        pytest.fail("data/ is missing: `./run setup` pulls it from the in-repo DVC remote")
    manifest = json.loads((DATA / "manifest.json").read_text())
    complete = {k: w for k, w in manifest["workloads"].items() if w["records"] >= 12}
    chosen: list[str] = []
    for key, w in sorted(complete.items(), key=lambda kv: kv[1]["flops"]):
        if w["flops"] > 0 and len(chosen) < 4:
            chosen.append(key)
    models = {m for k in chosen for m in complete[k]["models"]}
    assert len(chosen) == 4 and len(models) >= 2, "the dataset is too small for this test"
    workloads = [line for line in _gz_lines(DATA / "database_workload.json.gz")]
    index = {json.loads(line)[0]: i for i, line in enumerate(workloads)}
    new_index = {index[k]: j for j, k in enumerate(chosen)}
    records, per = [], dict.fromkeys(new_index, 0)
    for line in _gz_lines(DATA / "database_tuning_record.json.gz"):
        wid, body = json.loads(line)
        if wid in new_index and per[wid] < 12:
            per[wid] += 1
            records.append(json.dumps([new_index[wid], body]).encode())
    out = tmp_path_factory.mktemp("small") / "data"
    out.mkdir()
    _write_gz(out / "database_workload.json.gz", [workloads[index[k]] for k in chosen])
    _write_gz(out / "database_tuning_record.json.gz", records)
    manifest["workloads"] = {k: manifest["workloads"][k] for k in chosen}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_bundled_weights_load_and_score():
    model, source = online.load_pretrained("llvm")
    assert source == str(online.bundled_path("llvm")), "pretrained weights must ship"
    info = json.loads(online.bundled_path("llvm").with_suffix(".json").read_text())
    assert info["records"] >= 1000 and info["workloads"] >= 40
    scores = model.score([torch.rand(3, 164), torch.rand(5, 164)])
    assert scores.shape == (2,) and torch.isfinite(scores).all()


@pytest.mark.slow
def test_pretrain_flow_registers_champion_that_tuning_loads(small_dataset, mlflow_server, tmp_path):
    import mlflow

    features, weights = tmp_path / "features.pt", tmp_path / "weights" / "llvm.pt"
    result = run_cli(
        "costmodel", "pretrain", "--dataset", str(small_dataset), "--features", str(features),
        "--weights", str(weights), "--epochs", "3", "--mlflow-uri", mlflow_server, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["registered"] == "gradtune-costmodel-llvm@champion"
    assert summary["records"] == 48 and summary["workloads"] == 4
    assert summary["featurize"]["skipped"]["replay"] == 0
    info = json.loads(weights.with_suffix(".json").read_text())
    assert info["loss"] == "rank" and info["epochs"] == 3

    # What the tuner starts from when a tracking server is configured: the champion's weights.
    cost_model = online.OnlineCostModel.default("llvm", tracking_uri=mlflow_server)
    assert "gradtune-costmodel-llvm@champion" in cost_model.source
    ours = load(weights)
    for a, b in zip(
        ours.state_dict().values(), cost_model.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)

    # Any MLflow client can score features with it.
    mlflow.set_tracking_uri(mlflow_server)
    pyfunc = mlflow.pyfunc.load_model("models:/gradtune-costmodel-llvm@champion")
    programs = torch.load(features, weights_only=False)["workloads"][0]["programs"][:5]
    served = pyfunc.predict([p.numpy() for p in programs])
    np.testing.assert_allclose(served, ours.score(programs).detach().numpy(), rtol=1e-5)


def test_no_champion_falls_back_to_bundled(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    cost_model = online.OnlineCostModel.default("llvm", tracking_uri=uri)
    assert cost_model.source == str(online.bundled_path("llvm"))
    assert "no registered cost model gradtune-costmodel-llvm@champion" in caplog.text


@pytest.mark.slow
def test_eval_command_prints_table_and_json(small_dataset, tmp_path):
    result = run_cli(
        "costmodel", "eval", "--dataset", str(small_dataset), "--split", "model",
        "--epochs", "2", "--loss", "rank", "--out", str(tmp_path), timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(last) == {"split", "ours", "xgb", "ms_mlp"} and last["split"] == "model"
    for name in ("ours", "xgb", "ms_mlp"):
        assert 0.0 <= last[name]["pairwise"] <= 1.0 and last[name]["workloads"] >= 1
    assert "pairwise" in result.stderr  # the table
    table = (tmp_path / "costmodel_eval_model.md").read_text()
    assert "| **overall** | ours |" in table


def test_bad_records_are_skipped_with_a_count(small_dataset, tmp_path):
    from gradtune.costmodel.featurize import featurize_dataset

    bad = tmp_path / "data"
    bad.mkdir()
    for name in ("database_workload.json.gz", "manifest.json"):
        (bad / name).write_bytes((small_dataset / name).read_bytes())
    lines = _gz_lines(small_dataset / "database_tuning_record.json.gz")
    wid, body = json.loads(lines[0])
    other_target = json.dumps([wid, [body[0], body[1], {"kind": "cuda"}, body[3]]]).encode()
    missing_workload = json.dumps([99, body]).encode()
    _write_gz(
        bad / "database_tuning_record.json.gz",
        lines[:20] + [b'[0, [[[["GetSBlock"', other_target, missing_workload],
    )
    result = featurize_dataset(bad, tmp_path / "features.pt")
    assert result["records"] == 20
    assert result["skipped"]["load"] == 3
    assert result["skipped"]["first_reason"]


def test_empty_or_missing_dataset_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "manifest.json").write_text(json.dumps({"target": {"kind": "llvm"}}))
    _write_gz(empty / "database_workload.json.gz", [])
    _write_gz(empty / "database_tuning_record.json.gz", [])
    for path in (empty, tmp_path / "missing"):
        result = run_cli("costmodel", "pretrain", "--dataset", str(path), "--features",
                         str(tmp_path / "f.pt"), "--weights", str(tmp_path / "w.pt"))  # fmt: skip
        assert result.returncode == 2
        err = result.stderr.strip().splitlines()
        assert err[-1].startswith("gradtune: error:"), result.stderr[-2000:]
        assert not (tmp_path / "w.pt").exists()


# --------------------------------------------------------------------------- machines

TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}


def _machine(
    name: str, isa: list[str] | None, target: dict = TARGET, threads: int | None = None
) -> dict:
    d = {"cpu_model": name, "vendor": "AuthenticAMD", "machine": "x86_64", "isa": isa,
         "caches": {"l1d_kb": 32, "l2_kb": 1024, "l3_kb": 32768}, "physical_cores": 2,
         "logical_cores": 2, "max_mhz": None, "target": target, "devices": None,
         "tvm_threads": threads}  # fmt: skip
    return {**d, "id": hardware.machine_id(d)}


def _features(path: Path, machines: list[dict], per_machine: int = 2) -> Path:
    """A features file as featurize_dataset writes it: groups of one workload per machine."""
    gen = torch.Generator().manual_seed(0)
    workloads = [
        {
            "key": f"w{i}",
            "family": "matmul",
            "models": ["m"],
            "machine": m["id"],
            "latencies": [1e-3 * (j + 1) for j in range(4)],
            "programs": [torch.rand(3, 164, generator=gen) for _ in range(4)],
        }  # fmt: skip
        for m in machines
        for i in range(per_machine)
    ]
    blob = {
        "target": TARGET,
        "records": 4 * len(workloads),
        "machines": {m["id"]: m for m in machines},
        "workloads": workloads,
    }
    torch.save(blob, path)
    return path


def test_pretraining_takes_the_targets_machines_and_refuses_mixed_isa(tmp_path):
    avx2 = _machine("Zen 2", ["avx", "avx2", "fma"])
    avx2_again = _machine("Zen 2 in another VM", ["avx", "avx2", "fma"])
    avx512 = _machine("Zen 4", ["avx", "avx2", "avx512f", "fma"])
    legacy = hardware.from_manifest({"cpu_model": "old", "physical_cores": 2}, TARGET)
    other_target = _machine("Skylake", ["avx", "avx2", "fma"], {**TARGET, "mcpu": "skylake"})
    two_threads = _machine("Zen 2, TVM on both cores", ["avx", "avx2", "fma"], threads=2)
    one_thread = _machine("Zen 2, TVM on one core", ["avx", "avx2", "fma"], threads=1)

    # Same ISA (and a machine whose flags were never recorded): the default takes them all,
    # but not a machine that measured for another target, nor on another thread count than
    # the target's num-cores (2).
    machines = [avx2, avx2_again, legacy, other_target, two_threads, one_thread]
    same = _features(tmp_path / "same.pt", machines)
    groups, meta = load_groups(same)
    assert len(groups) == 8
    assert set(meta["machines"]) == {avx2["id"], avx2_again["id"], legacy["id"], two_threads["id"]}
    groups, meta = load_groups(same, "all")
    assert len(groups) == 12 and len(meta["machines"]) == 6

    # Different ISA flags for the same target: refused unless asked, naming both machines.
    mixed = _features(tmp_path / "mixed.pt", [avx2, avx512])
    with pytest.raises(GradtuneError, match="different ISA flags") as err:
        load_groups(mixed)
    assert avx2["id"] in str(err.value) and avx512["id"] in str(err.value)
    assert len(load_groups(mixed, "all")[0]) == 4
    groups, meta = load_groups(mixed, avx512["id"])
    assert len(groups) == 2 and list(meta["machines"]) == [avx512["id"]]
    assert len(load_groups(mixed, f"{avx2['id']}, {avx512['id']}")[0]) == 4
    with pytest.raises(GradtuneError, match="unknown machine"):
        load_groups(mixed, "0123456789ab")

    # The weights' provenance names the machines they were trained on.
    info, _ = pretrain(mixed, tmp_path / "w.pt", epochs=1, machines=avx2["id"])
    assert list(info["machines"]) == [avx2["id"]] and info["records"] == 8
    saved = json.loads((tmp_path / "w.json").read_text())
    assert saved["machines"][avx2["id"]]["isa"] == ["avx", "avx2", "fma"]
    with pytest.raises(GradtuneError, match="different ISA flags"):
        pretrain(mixed, tmp_path / "w2.pt", epochs=1)
    assert not (tmp_path / "w2.pt").exists()


def test_features_without_machines_train_as_one_machine(tmp_path):
    path = _features(tmp_path / "old.pt", [_machine("a", ["avx2"])])
    blob = torch.load(path, weights_only=False)
    del blob["machines"]
    for w in blob["workloads"]:
        del w["machine"]
    torch.save(blob, path)
    assert len(load_groups(path)[0]) == 2 and len(load_groups(path, "all")[0]) == 2
    with pytest.raises(GradtuneError, match="featurize again"):
        load_groups(path, "abc")


def test_dvc_stage_takes_machines_from_params_or_flag(tmp_path, capsys):
    import yaml

    from costmodel_training.pretrain import main

    mixed = _features(tmp_path / "mixed.pt", [_machine("a", ["avx2"]), _machine("b", ["avx512f"])])
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert params["pretrain"]["machines"] == "target"
    params["pretrain"].update(features=str(mixed), weights=str(tmp_path / "w.pt"), epochs=1)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    assert main(["--params", str(path)]) == 2
    assert "different ISA flags" in capsys.readouterr().err
    assert not (tmp_path / "w.pt").exists()
    assert main(["--params", str(path), "--machines", "all"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(out["machines"]) == 2 and out["workloads"] == 4


def test_rank_top_loss_weighs_a_misorder_near_the_best_above_one_far_from_it():
    from gradtune.costmodel.train import LOSSES, _group_loss

    class Scores(torch.nn.Module):
        """The scores are the inputs: the loss alone is under test."""

        def forward(self, features, mask):
            return features

    labels = torch.tensor([1.0, 0.9, 0.2, 0.1])  # throughput over the best's
    near = torch.tensor([3.0, 4.0, 1.0, 0.0])  # the two fastest swapped
    far = torch.tensor([4.0, 3.0, 0.0, 1.0])  # the two slowest swapped
    assert "rank_top" in LOSSES
    plain = [float(_group_loss(Scores(), s, None, labels, "rank")) for s in (near, far)]
    top = [float(_group_loss(Scores(), s, None, labels, "rank_top")) for s in (near, far)]
    assert plain[0] == pytest.approx(plain[1]), "the plain loss counts every pair alike"
    assert top[0] > 2 * top[1], "rank_top charges the misorder near the best more"
