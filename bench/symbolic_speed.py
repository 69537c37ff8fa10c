"""How fast the symbolic layer is (bars: a sketch built in under 5 s, 8 points with gradients
in under 20 ms), on this machine, after TVM import.

For every task (the TVMScript operator set in tests/ops, plus the tasks of the example CNN):
- build: seconds to build the symbolic model of all the task's sketches (probing + fits);
- eval: milliseconds for smooth features + gradients of a batch of 8 points of one sketch,
  (a) 8 points sharing a case (jitter that rounds to the same decisions) and (b) 8 random
  points (8 cases), both warm (cases already replayed) on the search's fast path;
- ref: the same two timings through the reference path (``leaves`` + ``features.evaluate``
  per case, what ``SymbolicSketch.features`` ran before ``compiled.py``), on the same points
  right after, so that the two compare under the same load.

    .venv/bin/python bench/symbolic_speed.py [--ops-only]

Prints a table and, as its last line, a JSON summary. Times are medians of 5 repeats; the
machine is shared, so compare within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent


def tasks(ops_only: bool) -> list[tuple[str, object]]:
    from gradtune.symbolic.verify import load_tvmscript

    out = [
        (p.stem, load_tvmscript(p)) for p in sorted((ROOT / "tests" / "ops").glob("*.tvmscript"))
    ]
    if not ops_only:
        import tvm

        from gradtune.frontend import load_model
        from gradtune.partition import partition
        from gradtune.target import make_target, parse_target

        target = make_target(parse_target("llvm"))
        model = load_model(ROOT / "examples" / "small_cnn.py")
        _, found = partition(model.mod, model.params, target)
        for task in found:
            out.append((f"small_cnn/{task.name}", tvm.IRModule({"main": task.mod["main"]})))
    return out


def reference_features(sym, x: torch.Tensor) -> list[torch.Tensor | None]:
    """``sym.features(x, "smooth", refit=False)`` through ``features.evaluate``, one case at a
    time: the path ``compiled.evaluate_cases`` replaced, kept here as the speed baseline."""
    from gradtune.symbolic.features import evaluate

    log_f, cats = sym.continuous_columns(x)
    groups: dict[int, tuple[object, list[int]]] = {}
    for i, row in enumerate(x.detach().numpy()):
        probe = sym.replay(sym.variables.round(row))
        if probe is not None:
            groups.setdefault(id(probe.program), (probe, []))[1].append(i)
    out: list[torch.Tensor | None] = [None] * x.shape[0]
    for probe, idx in groups.values():
        sel = torch.tensor(idx)
        leaves = sym.leaves(probe.program, log_f[sel], cats[sel], point_values=True, mode="smooth")
        values = evaluate(probe.program, leaves, "smooth")
        for j, i in enumerate(idx):
            out[i] = values[j]
    return out


def timed(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    from gradtune.symbolic.sketch import SymbolicSketch
    from gradtune.symbolic.verify import design_space
    from gradtune.target import make_target, parse_target

    parser = argparse.ArgumentParser()
    parser.add_argument("--ops-only", action="store_true")
    args = parser.parse_args()
    target = make_target(parse_target("llvm"))
    rng = np.random.default_rng(0)
    table = Table(title="symbolic layer speed (llvm, this machine)")
    columns = ("task", "sketches", "build s", "eval same-case ms", "eval 8-cases ms")
    for col in (*columns, "ref same-case ms", "ref 8-cases ms"):
        table.add_column(col, justify="right")
    rows = []
    for name, mod in tasks(args.ops_only):
        _, sketches, postprocs = design_space(mod, target)
        start = time.perf_counter()
        syms = [SymbolicSketch.build(mod, s.trace, postprocs, rng=rng) for s in sketches]
        build = time.perf_counter() - start
        same, spread, ref_same, ref_spread = [], [], [], []
        for sym in syms:
            centre = sym.variables.encode(sym.variables.sketch_decisions())
            jitter = np.clip(rng.uniform(-0.2, 0.2, (8, sym.variables.dim)), -0.2, 0.2)
            batches = {
                "same": torch.tensor(centre[None] + jitter),
                "spread": torch.tensor(
                    np.stack([sym.variables.random_point(rng) for _ in range(8)])
                ),
            }
            for kind, points in batches.items():
                sym.features(points, refit=False)  # replay the cases once: warm

                def step(points=points, sym=sym, reference=False):
                    x = points.clone().requires_grad_(True)
                    if reference:
                        feats = reference_features(sym, x)
                    else:
                        feats = sym.features(x, refit=False)
                    feats = [f for f in feats if f is not None]
                    if feats:
                        (sum(f.sum() for f in feats) + sym.penalties(x).sum()).backward()

                (same if kind == "same" else spread).append(1000 * timed(step))
                ref = 1000 * timed(lambda step=step: step(reference=True))
                (ref_same if kind == "same" else ref_spread).append(ref)
        row = {
            "task": name,
            "sketches": len(syms),
            "build_s": round(build, 3),
            "same_case_ms": round(max(same), 2),
            "eight_cases_ms": round(max(spread), 2),
            "ref_same_case_ms": round(max(ref_same), 2),
            "ref_eight_cases_ms": round(max(ref_spread), 2),
        }
        rows.append(row)
        table.add_row(
            name,
            str(len(syms)),
            f"{build:.2f}",
            f"{max(same):.1f}",
            f"{max(spread):.1f}",
            f"{max(ref_same):.1f}",
            f"{max(ref_spread):.1f}",
        )
    Console().print(table)
    print(
        json.dumps(
            {
                "tasks": len(rows),
                "max_build_s": max(r["build_s"] for r in rows),
                "median_same_case_ms": statistics.median(r["same_case_ms"] for r in rows),
                "median_eight_cases_ms": statistics.median(r["eight_cases_ms"] for r in rows),
                "median_ref_same_case_ms": statistics.median(r["ref_same_case_ms"] for r in rows),
                "median_ref_eight_cases_ms": statistics.median(
                    r["ref_eight_cases_ms"] for r in rows
                ),
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
