"""DVC stage ``collect``: measure the model zoo's workloads into ``data/`` (resumable).

    python -m costmodel_training.collect [--params params.yaml] [--time-budget SECONDS]

Parameters come from the ``collect`` section of ``params.yaml``; the target is this machine's
CPU through LLVM. Killed and rerun, it measures only the records still missing (the stage's
output is ``persist: true``, so ``dvc repro`` does not delete what is there).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

from gradtune.dataset.collect import collect
from gradtune.dataset.settings import CollectSettings
from gradtune.errors import GradtuneError
from gradtune.stop import StopSignal, stop_on_signals
from gradtune.target import parse_target

ROOT = Path(__file__).resolve().parents[1]


def settings_from_params(params: dict) -> CollectSettings:
    fields = CollectSettings.__dataclass_fields__
    return CollectSettings(**{k: v for k, v in params.items() if k in fields})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--target", default=None, help="llvm (default: this CPU) or JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # MetaSchedule logs every search generation at INFO: keep the log about the collection.
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    # SIGINT / SIGTERM (a plain `kill`, DVC stopping the stage) stop after the current batch:
    # what was measured is on disk, the RPC fleet is stopped on the way out, a rerun resumes.
    # A second signal forces it.
    stop = StopSignal()
    try:
        with stop_on_signals(stop):
            params = yaml.safe_load(Path(args.params).read_text())["collect"]
            manifest = collect(
                data_dir=ROOT / params.get("out", "data"),
                zoo_config=ROOT / params.get("zoo", "configs/zoo.yaml"),
                target_config=parse_target(args.target),
                settings=settings_from_params(params),
                max_workloads=params.get("max_workloads"),
                time_budget=args.time_budget,
                stop=stop,
            )
    except GradtuneError as err:
        print(f"gradtune: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("collect: interrupted; rerun to resume (measured records are kept)", file=sys.stderr)
        return 130
    if stop.stopped:  # not complete: DVC must not record this output as the stage's result
        print("collect: stopped; rerun to resume (measured records are kept)", file=sys.stderr)
        return 130
    done = sum(1 for w in manifest["workloads"].values() if w["records"] > 0)
    print(f"collected: {done} workloads with records; manifest {params.get('out', 'data')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
