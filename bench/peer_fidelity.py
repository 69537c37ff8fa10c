"""Do the peers run at their own speed when gradtune times them beside a tuned model?

A user who deploys ONNX Runtime or torch.compile runs it in a process with no TVM in it. The
report times each peer beside the tuned library in one process (``compilation.time_rounds``,
the pipeline's own call), where every runtime's thread pool shares the same cores and the
pools' spinning workers can slow each other down (``gradtune.settle``). This times each peer of
one tuned model both ways, in fresh processes, pass by pass in alternating order:

- **alone**: the peers only, no TVM library loaded and TVM's thread pool never started; each
  peer's blocks run back to back after a 1 s pause, so no other pool is awake;
- **beside**: as the pipeline times them, with the tuned library in the same rounds.

Per peer it prints the median ms each way, beside / alone (1.00: the report's peer timing is
the peer's own speed), and how many of the beside blocks ran over 1.5x the alone median.

    .venv/bin/python bench/peer_fidelity.py RUN_DIR --model FILE [--entry get_model] [--passes 3]

RUN_DIR is a ``gradtune tune`` out directory (``model.so``, ``io.json``) of the model ``FILE``.
The last line printed is one JSON object: ``{"peers": {name: {"alone_ms", "beside_ms",
"beside_over_alone", "slow_blocks", "blocks"}}, "threads": n, "commit": c}``.
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

from searchbench.report import git_commit
from tuned_library import check_timing_args, input_tensors, timing_parser

MIN_SECONDS = 0.05  # per block, as the pipeline's timing
PAUSE_SECONDS = 1.0  # alone: before each peer's blocks, long past any pool's spinning
SLOW = 1.5  # a beside block this much over the alone median counts as slow


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = timing_parser(__doc__.splitlines()[0], rounds=7)
    parser.add_argument("--model", type=Path, required=True, help="the model file RUN_DIR tuned")
    parser.add_argument("--entry", default="get_model", help="a Python model file's function")
    parser.add_argument("--mode", choices=("alone", "beside"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_timing_args(parser, args, "peer_fidelity")
    if len(args.runs) != 1:
        parser.exit(2, "peer_fidelity: give one RUN_DIR (the peers are one model's)\n")
    if not args.model.is_file():
        parser.exit(2, f"peer_fidelity: --model {args.model} is not a file\n")
    return args


def peer_calls(model_file: Path, entry: str, threads: int) -> dict[str, Any]:
    from gradtune import frontend, peers

    built = peers.build_peers(frontend.load_model(model_file, entry), threads)
    for name, error in built.errors().items():
        print(f"{name} not timed: {error}", file=sys.stderr)
    return built.runnable()


def one_pass(args: argparse.Namespace) -> dict[str, list[float]]:
    """ms per call of each peer in each block, the way ``args.mode`` says."""
    from gradtune import compilation, peers
    from gradtune.threads import runtime_threads

    threads = runtime_threads()
    with peers.torch_threads(threads):
        calls = peer_calls(args.model, args.entry, threads)
        if args.mode == "beside":
            run = args.runs[0]
            vm, dev = compilation.load_exported(run / "model.so")
            tensors = input_tensors(run, dev)

            def tuned(main: Any = vm["main"]) -> None:
                main(*tensors)
                dev.sync()

            pools = {"tuned": compilation.TVM_POOL, **peers.POOLS}
            timing = compilation.time_rounds({"tuned": tuned, **calls}, args.rounds, pools=pools)
            return {name: timing.samples[name] for name in calls}
        samples: dict[str, list[float]] = {}
        for name, fn in calls.items():
            time.sleep(PAUSE_SECONDS)
            fn()
            n = max(1, round(MIN_SECONDS / timed(fn, 3) * 3))
            samples[name] = [timed(fn, n) / n * 1e3 for _ in range(args.rounds)]
        return samples


def timed(fn: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode:
        print(json.dumps(one_pass(args)))
        return 0
    from gradtune.threads import runtime_threads

    blocks: dict[str, dict[str, list[float]]] = {"alone": {}, "beside": {}}
    medians: dict[str, dict[str, list[float]]] = {"alone": {}, "beside": {}}
    for k in range(args.passes):
        for mode in ("alone", "beside") if k % 2 == 0 else ("beside", "alone"):
            out = subprocess.run(
                [sys.executable, __file__, str(args.runs[0]), "--model", str(args.model),
                 "--entry", args.entry, "--rounds", str(args.rounds), "--mode", mode],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            for name, ms in json.loads(out.strip().splitlines()[-1]).items():
                blocks[mode].setdefault(name, []).extend(ms)
                medians[mode].setdefault(name, []).append(statistics.median(ms))
        print(f"pass {k + 1}/{args.passes} done", file=sys.stderr)
    result: dict[str, Any] = {}
    print("| peer | alone ms | beside ms | beside / alone | beside blocks > 1.5x alone |")
    print("|---|---:|---:|---:|---:|")
    for name in medians["alone"]:
        alone = statistics.median(medians["alone"][name])
        beside = statistics.median(medians["beside"].get(name, [float("nan")]))
        slow = sum(ms > SLOW * alone for ms in blocks["beside"].get(name, []))
        total = len(blocks["beside"].get(name, []))
        result[name] = {"alone_ms": round(alone, 4), "beside_ms": round(beside, 4),
                        "beside_over_alone": round(beside / alone, 3),
                        "slow_blocks": slow, "blocks": total}  # fmt: skip
        print(f"| {name} | {alone:.3f} | {beside:.3f} | {beside / alone:.2f} | {slow}/{total} |")
    print(json.dumps({"peers": result, "threads": runtime_threads(), "commit": git_commit()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
