"""What a call into a compiled model costs beyond its kernels: the VM function's lookup and
Python's call, against TVM's own C++ timing loop.

``vm["main"]`` makes a new function object at every lookup (the VM's ``_LookupFunction``), and
each call from Python converts its arguments through TVM's FFI. A deployment looks the function
up once; what gradtune times and serves should too. For each tuned library (a ``gradtune tune``
out directory: ``model.so`` and ``io.json``) this times, interleaved in one process, round by
round:

- **lookup**: ``vm["main"](*args)``, the function looked up at every call;
- **once**: the function looked up once, then called from Python;
- **c++**: ``time_evaluator`` on a closure saved with its arguments (``save_function``): the
  same inference in TVM's C++ loop, no Python between calls.

Inputs are seeded random arrays of ``io.json``'s shapes, resident on the device. The ratios are
taken round by round (both sides ran back to back) and their medians printed; ``--passes``
processes repeat the whole timing, each loading the libraries afresh.

    .venv/bin/python bench/vm_call.py RUN_DIR [RUN_DIR ...] [--passes 3] [--rounds 15]

The last line printed is one JSON object: ``{"libraries": {name: {"lookup_us", "once_us",
"cxx_us", "lookup_over_once", "once_over_cxx"}}, "tvm_threads": n, "commit": c}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from searchbench.report import git_commit, labels
from tuned_library import check_timing_args, input_tensors, timing_parser

MIN_SECONDS = 0.05  # per block: long enough that timer and scheduler noise are small


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = timing_parser(__doc__.splitlines()[0], rounds=15)
    args = parser.parse_args(argv)
    check_timing_args(parser, args, "vm_call")
    return args


def loaded(run: Path) -> tuple[Any, Any, list[Any]]:
    """(vm, device, argument tensors) of a tune out directory's library."""
    from gradtune import compilation

    vm, dev = compilation.load_exported(run / "model.so")
    return vm, dev, input_tensors(run, dev)


def block(fn: Any, n: int) -> float:
    """µs per call of ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def one_pass(runs: list[Path], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per library, per way of calling, the µs per inference of each round."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, run in zip(labels(runs), runs, strict=True):
        vm, dev, args = loaded(run)
        main = vm["main"]

        def lookup(vm: Any = vm, dev: Any = dev, args: list[Any] = args) -> None:
            vm["main"](*args)
            dev.sync()

        def once(main: Any = main, dev: Any = dev, args: list[Any] = args) -> None:
            main(*args)
            dev.sync()

        vm.save_function("main", "gradtune_saved", *args)
        for _ in range(3):  # warm-up: first-call allocation and caches
            lookup()
            once()
        n = 1
        while block(once, n) * n < MIN_SECONDS * 1e6:
            n *= 2
        cxx = vm.time_evaluator("gradtune_saved", dev, number=n, repeat=1)
        cxx()
        samples: dict[str, list[float]] = {"lookup": [], "once": [], "cxx": []}
        for _ in range(rounds):
            samples["lookup"].append(block(lookup, n))
            samples["once"].append(block(once, n))
            samples["cxx"].append(cxx().mean * 1e6)
        out[name] = samples
    return out


def paired(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one_pass:
        from gradtune import threads

        result = one_pass(args.runs, args.rounds)
        print(json.dumps({"samples": result, "tvm_threads": threads.runtime_threads()}))
        return 0
    passes = []
    for k in range(args.passes):  # fresh processes: each loads the libraries afresh
        proc = subprocess.run(
            [sys.executable, __file__, *map(str, args.runs), "--rounds", str(args.rounds),
             "--one-pass"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return 1
        passes.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"pass {k + 1}/{args.passes} done", file=sys.stderr)
    summary: dict[str, Any] = {}
    print("| library | lookup µs | once µs | c++ µs | lookup / once | once / c++ |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in labels(args.runs):
        per = [p["samples"][name] for p in passes]
        row = {
            f"{way}_us": statistics.median(statistics.median(s[way]) for s in per)
            for way in ("lookup", "once", "cxx")
        }
        row["lookup_over_once"] = statistics.median(paired(s["lookup"], s["once"]) for s in per)
        row["once_over_cxx"] = statistics.median(paired(s["once"], s["cxx"]) for s in per)
        summary[name] = {k: round(v, 4) for k, v in row.items()}
        print(
            f"| {name} | {row['lookup_us']:.1f} | {row['once_us']:.1f} | {row['cxx_us']:.1f} "
            f"| {row['lookup_over_once']:.3f} | {row['once_over_cxx']:.3f} |"
        )
    pools = sorted({p["tvm_threads"] for p in passes})
    print(json.dumps({"libraries": summary, "tvm_threads": pools[0] if len(pools) == 1 else pools,
                      "commit": git_commit()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
