"""DVC stage ``pretrain``: gradtune's cost model on the featurized dataset.

    python -m costmodel_training.pretrain [--params params.yaml] [--mlflow-uri URI]
                                          [--machines target|all|ID,ID]
    python -m costmodel_training.pretrain --ensemble [--params params.yaml]

Trains the cost model on every workload of the features file (``gradtune.costmodel.pretrain``)
measured by the machines ``pretrain.machines`` of params.yaml selects (``--machines`` overrides:
``target``, the default, keeps the machines that measured for the data's target and refuses
ones whose ISA flags differ; ``all`` mixes every machine; or a list of machine ids),
writes the weights the package bundles with a provenance file beside them, and, given a
tracking URI (flag or ``MLFLOW_TRACKING_URI``), logs the run and registers the weights as
``gradtune-costmodel-<target>@champion``. Prints the provenance as JSON.

With ``--ensemble`` (DVC stage ``pretrain_ensemble``) it writes the deep ensemble the gradient
search's AdaTune acquisition scores with (``gradtune.costmodel.ensemble``): the bundled weights
as the first member and ``ensemble.members - 1`` more trained like them with the next seeds.
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
    parser.add_argument(
        "--ensemble", action="store_true",
        help="write the deep ensemble (params.yaml ensemble.members) beside the weights",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.ensemble:
        return write_ensemble(yaml.safe_load(Path(args.params).read_text()), args.machines)
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


def write_ensemble(params: dict, machines: str | None) -> int:
    """The ``pretrain_ensemble`` stage: members beyond the bundled weights, then the file."""
    import time

    from gradtune.costmodel import ensemble
    from gradtune.costmodel.model import load
    from gradtune.costmodel.pretrain import load_groups

    p, members = params["pretrain"], int(params["ensemble"]["members"])
    weights = ROOT / p["weights"]
    out = ROOT / params["ensemble"]["out"]
    try:
        if not weights.is_file():
            raise GradtuneError(f"{weights} not found: run the pretrain stage first")
        groups, _meta = load_groups(ROOT / p["features"], machines or str(p.get("machines")))
    except GradtuneError as err:
        print(f"gradtune: error: {err}", file=sys.stderr)
        return err.exit_code
    start = time.perf_counter()
    others, losses = ensemble.pretrain_members(
        groups, members - 1, p["loss"], int(p["epochs"]), float(p["lr"]), int(p["seed"]) + 1
    )
    ensemble.save_members([load(weights), *others], out)
    info = {
        "members": members,
        "first": str(p["weights"]),
        "seeds": [int(p["seed"]) + k for k in range(members)],
        "final_losses_of_added": [round(x, 5) for x in losses],
        "train_seconds": round(time.perf_counter() - start, 1),
    }
    out.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
