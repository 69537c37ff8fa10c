"""A ``gradtune tune`` out directory's compiled library, as the inference-timing benchmarks
(``vm_call.py``, ``vm_breakdown.py``) take it: the shared arguments, their checks, and the
inputs every call is timed on."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def timing_parser(description: str, rounds: int) -> argparse.ArgumentParser:
    """Run directories, ``--passes`` (fresh processes), ``--rounds`` (interleaved rounds in
    each) and the child's hidden ``--one-pass``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", nargs="+", type=Path, help="gradtune tune out directories")
    parser.add_argument("--passes", type=int, default=3, help="timing processes (≥ 3)")
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds per pass")
    parser.add_argument("--one-pass", action="store_true", help=argparse.SUPPRESS)
    return parser


def check_timing_args(parser: argparse.ArgumentParser, args: argparse.Namespace, prog: str) -> None:
    """Exit 2 with one line naming the first of ``timing_parser``'s arguments that cannot be
    timed."""
    for run in args.runs:
        for name in ("model.so", "io.json"):
            if not (run / name).is_file():
                parser.exit(2, f"{prog}: {run} has no {name} (not a gradtune tune out dir)\n")
    if args.passes < 3 and not args.one_pass:
        parser.exit(2, f"{prog}: --passes must be at least 3\n")
    if args.rounds < 3:
        parser.exit(2, f"{prog}: --rounds must be at least 3\n")


def input_tensors(run: Path, dev: Any) -> list[Any]:
    """Seeded random arrays of ``io.json``'s input shapes, resident on ``dev``."""
    import numpy as np
    import tvm

    rng = np.random.default_rng(0)
    specs = json.loads((run / "io.json").read_text())["inputs"]
    return [
        tvm.runtime.tensor(rng.standard_normal(s["shape"]).astype(s["dtype"]), dev) for s in specs
    ]


def interpreted(library: Path) -> bool:
    """Whether the library's VM interprets ``main`` from bytecode (``exec_mode="bytecode"``):
    only then does each call pass through ``VirtualMachine.set_instrument``."""
    import tvm

    return "vm_tir_func" not in tvm.runtime.load_module(str(library))["as_text"]()


def rebuild(run: Path, exec_modes: tuple[str, ...]) -> tuple[dict[str, Any], list[Any], Any]:
    """({exec_mode: executable}, inputs, target): the run's model built again as ``gradtune
    tune`` built it (the model, entry, target and lowering its ``run.json`` records; its
    database's schedules), once per ``relax.build`` ``exec_mode``, from one lowering."""
    from gradtune import compilation
    from gradtune.frontend import load_model
    from gradtune.partition import Lowering, prepare
    from gradtune.target import make_target
    from gradtune.tune import compile_database

    record = json.loads((run / "run.json").read_text())
    target = make_target(record["target"])
    model = load_model(record["model"], record["entry"])
    fused = prepare(model.mod, model.params, target, Lowering(**record["lowering"]))
    database = compile_database(run)
    executables = {
        mode: compilation.build(fused, target, database, exec_mode=mode) for mode in exec_modes
    }
    return executables, model.inputs, target
