"""DVC stage ``featurize``: the dataset's records → gradtune's smooth symbolic features.

    python -m costmodel_training.featurize [--params params.yaml]

Every record's trace is replayed on its workload and featurized at its integer decisions in
the *smooth* form the gradient search differentiates (``gradtune.costmodel.featurize``), so
pretraining and search see the same function. Output: one torch file of per-workload groups;
bad records are skipped with a count and the first reason. Prints the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from gradtune.costmodel.featurize import featurize_dataset
from gradtune.errors import GradtuneError

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = parser.parse_args(argv)
    try:
        params = yaml.safe_load(Path(args.params).read_text())["featurize"]
        summary = featurize_dataset(ROOT / params["dataset"], ROOT / params["out"])
    except GradtuneError as err:
        print(f"gradtune: error: {err}", file=sys.stderr)
        return err.exit_code
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
