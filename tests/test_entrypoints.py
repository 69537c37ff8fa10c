"""Flows load by path, from any working directory, as Prefect's entrypoint loader loads them;
their parameters are typed, so Prefect's UI renders each as a form field."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

LOAD = """
import json, sys
from prefect.flows import load_flow_from_entrypoint
from gradtune.entrypoints import load_flow
out = {}
for name in ("tune_model", "pretrain_cost_model", "collect_dataset"):
    ours = load_flow(name)
    prefects = load_flow_from_entrypoint(f"{sys.argv[1]}/flows/{name}.py:{name}",
                                         use_placeholder_flow=False)
    assert prefects.name == ours.name, (prefects.name, ours.name)
    out[ours.name] = ours.parameters.model_dump()
out["modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("flows", "tasks"))
print(json.dumps(out))
"""


def test_flows_load_from_any_directory_with_typed_parameters(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", LOAD, str(ROOT)], cwd=tmp_path, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded.pop("modules") == [], "flows/ and tasks/ must not become top-level packages"

    tune = loaded["tune-model"]["properties"]
    assert tune["trials"]["type"] == "integer" and tune["trials"]["default"] == 128
    assert tune["target"]["type"] == "string" and tune["model"]["type"] == "string"
    assert {"type": "number"} in tune["time_budget"]["anyOf"]
    assert loaded["tune-model"]["required"] == ["model"]

    pretrain = loaded["pretrain-cost-model"]["properties"]
    assert pretrain["epochs"]["type"] == "integer" and pretrain["lr"]["type"] == "number"

    collect = loaded["collect-dataset"]
    settings = collect["definitions"]["CollectSettings"]["properties"]
    assert settings["batch_size"]["type"] == "integer"
    assert collect["properties"]["settings"]["$ref"] == "#/definitions/CollectSettings"
    assert "Tracker" in collect["definitions"]
