"""DVC stage ``pretrain``: gradtune's cost model on the featurized dataset.

    python -m costmodel_training.pretrain [--params params.yaml] [--mlflow-uri URI]
                                          [--machines target|all|ID,ID]

Trains the cost model on every workload of the features file (``gradtune.costmodel.pretrain``)
measured by the machines ``pretrain.machines`` of params.yaml selects (``--machines`` overrides:
``target``, the default, keeps the machines that measured for the data's target and refuses
ones whose ISA flags differ; ``all`` mixes every machine; or a list of machine ids),
writes the weights the package bundles with a provenance file beside them, and, given a
tracking URI (flag or ``MLFLOW_TRACKING_URI``), logs the run and registers the weights as
``gradtune-costmodel-<target>@champion``. Prints the provenance as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

from gradtune.costmodel.pretrain import pretrain, register_champion
from gradtune.errors import GradtuneError

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"))
    parser.add_argument("--machines", default=None, help="target (default), all, or ID,ID,...")
    args = parser.parse_args(argv)
    try:
        p = yaml.safe_load(Path(args.params).read_text())["pretrain"]
        weights = ROOT / p["weights"]
        p["machines"] = args.machines or str(p.get("machines", "target"))
        info, history = pretrain(
            ROOT / p["features"], weights, p["loss"], int(p["epochs"]), float(p["lr"]),
            int(p["seed"]), p["machines"],
        )  # fmt: skip
        if args.mlflow_uri:
            reference = register_champion(weights, args.mlflow_uri, p, history)["registered"]
            info["registered"] = reference
    except GradtuneError as err:
        print(f"gradtune: error: {err}", file=sys.stderr)
        return err.exit_code
    hidden = ("families", "target", "machines")
    print(
        json.dumps(
            {k: info[k] for k in info if k not in hidden} | {"machines": list(info["machines"])}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
