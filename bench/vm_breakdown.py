"""Where a compiled model's inference goes beyond its kernels: the sum of its kernels timed
alone against the whole inference, per thread count, and (with ``perf``) which code the
difference runs in.

The tuner times each kernel alone in a loop; the report's "kernels ≈" estimate sums those
times, and a tuned model's inference is slower than that sum. For each tune out directory
(``model.so``, ``io.json``) and each ``--threads`` count, in fresh processes, interleaved
round by round:

- **e2e**: the inference in TVM's C++ timing loop (``time_evaluator`` on a closure saved with
  its arguments: no Python between calls);
- **kernels**: every kernel the inference calls, timed alone in the same C++ loop on the very
  tensors the inference passes it (captured once by an instrument on the VM's call
  instructions, ``VirtualMachine.set_instrument``), summed over the inference's calls;
- **calls**: how many call instructions one inference runs, kernels and the VM's builtins
  (``vm.builtin.*``: storage and tensor allocation, shape checks, tuples);
- **flushed**: the same kernels, each run once after its arguments other than the first are
  evicted from the CPU caches (TVM's ``cache_flush_cpu_non_first_arg``, as MetaSchedule's
  ``enable_cpu_cache_flush`` times): weights, a residual's skip and the output come from
  memory, the input from the previous kernel warm. In a whole inference each kernel's weights
  were last touched one inference ago, so this bounds the cache's part from above.
- **handoff**: the same kernels, each run singly right after the thread pool rewrote its first
  argument (``gradtune tune --measure handoff``'s timing, ``gradtune.measure.handoff``): the
  input as the previous kernel leaves it, in other cores' caches, split the pool's way.

``e2e - kernels`` is what running them as one program adds: the VM's interpretation and
builtins, the thread pool's launch and join around each parallel kernel, and caches that a
kernel timed alone in a loop finds warm. That last part depends on where the VM's host has put
its vCPUs: an inference hands its data from core to core, a kernel timed alone does not, so
with the cores apart the difference grows. So the cross-core probe (``gradtune.crosscore``)
reads the thread pool before the first round and after each, and only the rounds with the
cores as near as the fastest probe of any pass count (every round of a pass that had none);
the table says in how many passes they did. An e2e nearer flushed than kernels is cache
state rather than the runtime. With three libraries or more, a last line per thread count
says how well each way of timing the kernels orders the libraries as their inference does
(Spearman): the order a search needs its timings to get right. With ``--perf`` (Linux
``perf`` with the software ``cpu-clock`` event; no hardware counters needed), each pass also
samples the e2e loop and splits its samples by where they ran: the library's kernels
(``model.so``), TVM's runtime and FFI (VM, allocators, thread pool), the OS kernel
(scheduling, a worker's yields, page faults), libc and the rest.

The instrument sees calls only when the VM interprets its function. ``gradtune tune``
compiles a CPU model's VM function into the library (``compilation.exec_mode_for``), so such a
run is built again from its ``run.json`` and database as bytecode, the same kernels, and
that build is timed; its e2e is the interpreted one (``bench/vm_exec.py`` weighs the two).

    .venv/bin/python bench/vm_breakdown.py RUN_DIR [RUN_DIR ...] [--threads 1 2] [--perf]

The last line printed is one JSON object: ``{"libraries": {name: {threads: {"e2e_us",
"kernels_us", "kernels_flushed_us", "overhead_us", "overhead_share", "kernel_calls",
"builtin_calls", "states",
"perf_shares"}}}, "commit": c}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from searchbench.report import git_commit, labels
from tuned_library import check_timing_args, input_tensors, interpreted, rebuild, timing_parser

from gradtune import crosscore
from gradtune.compilation import Timing
from gradtune.measure import handoff

MIN_SECONDS = 0.05  # per timed block: long enough that timer and scheduler noise are small
PERF_SECONDS = 3.0
# perf's shared objects, grouped by what runs there.
GROUPS = {
    "model.so": "kernels",
    "libtvm_runtime.so": "tvm runtime",
    "libtvm_ffi.so": "tvm runtime",
    "[kernel.kallsyms]": "os kernel",
    "libc.so.6": "libc",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = timing_parser(__doc__.splitlines()[0], rounds=9)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="TVM runtime thread counts to time at")  # fmt: skip
    parser.add_argument("--perf", action="store_true", help="split the e2e loop with perf")
    # The child's: the library to load for each run (a bytecode build of a compiled one).
    parser.add_argument("--libraries", type=Path, nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_timing_args(parser, args, "vm_breakdown")
    if min(args.threads) < 1:
        parser.exit(2, "vm_breakdown: --threads must be positive\n")
    if args.perf and not args.one_pass and shutil.which("perf") is None:
        parser.exit(2, "vm_breakdown: --perf needs Linux perf on PATH (Debian: linux-perf)\n")
    for run in [] if args.one_pass else args.runs:
        if not (run / "run.json").is_file() and not interpreted(run / "model.so"):
            parser.exit(
                2,
                f"vm_breakdown: {run}'s model.so runs its VM function compiled (no call to "
                f"instrument) and {run} has no run.json to build it again as bytecode from\n",
            )
    return args


def bytecode_libraries(runs: list[Path], into: Path) -> list[Path]:
    """Each run's library as the VM interprets it. ``gradtune tune`` compiles the VM's own
    function into a CPU library (``compilation.exec_mode_for``), which leaves no call
    instruction to instrument: such a run is built again from its run.json and database with
    ``exec_mode="bytecode"``, the same kernels."""
    libraries = []
    for k, run in enumerate(runs):
        library = run / "model.so"
        if not interpreted(library):
            from gradtune import compilation

            print(f"{run}: model.so runs compiled; timing its bytecode build", file=sys.stderr)
            executables, _, _ = rebuild(run, ("bytecode",))
            library = compilation.export(executables["bytecode"], into / str(k) / "model.so")
        libraries.append(library)
    return libraries


def repeats_for(timer: Any) -> int:
    """Runs per timed block: doubled until one block lasts ``MIN_SECONDS``."""
    n = 1
    while timer(n) * n < MIN_SECONDS:
        n *= 2
    return n


def perf_shares(seconds: float, loop: Any) -> dict[str, float]:
    """Share of this process's ``cpu-clock`` samples per code group while ``loop`` runs."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        proc = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-p", str(os.getpid()),
             "-o", str(data), "--", "sleep", str(seconds)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.3)  # perf attaches before the loop starts
        while proc.poll() is None:
            loop()
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--sort", "dso", "--stdio", "-q"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
    shares: dict[str, float] = {}
    for line in report.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith("%"):
            group = GROUPS.get(parts[1], "other")
            shares[group] = shares.get(group, 0.0) + float(parts[0][:-1]) / 100
    return {k: round(v, 4) for k, v in sorted(shares.items())}


def time_library(
    run: Path, rounds: int, with_perf: bool, library: Path | None = None
) -> dict[str, Any]:
    """One library's e2e and summed-kernel µs of each round, its call counts, perf's split.
    ``library``: the one to load (default ``run``'s ``model.so``); its VM must interpret."""
    import tvm
    import tvm_ffi
    from tvm import relax

    library = library or run / "model.so"
    if not interpreted(library):
        raise SystemExit(f"vm_breakdown: {library} runs its VM function compiled: nothing to time")
    lib = tvm.runtime.load_module(str(library))
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(lib, dev)
    kernels_mod = lib.imports[0]  # the kernels' library, beside the VM's bytecode
    args = input_tensors(run, dev)
    calls: list[tuple[str, list[Any]]] = []

    def capture(func: Any, symbol: str, before: bool, ret: Any, *call_args: Any) -> int:
        if before:
            calls.append((symbol, list(call_args)))
        return 0  # VMInstrumentReturnKind.NO_OP: run the call as usual

    vm["main"](*args)  # first-call allocations before the capture
    vm.set_instrument(tvm_ffi.convert(capture))
    vm["main"](*args)
    kernel_calls = [(s, a) for s, a in calls if not s.startswith("vm.builtin.")]
    vm = relax.VirtualMachine(lib, dev)  # the timed VM has no instrument
    vm.save_function("main", "gradtune_saved", *args)

    def e2e_timer(n: int) -> float:
        return vm.time_evaluator("gradtune_saved", dev, number=n, repeat=1)().mean

    def kernel_timer(symbol: str, call_args: list[Any]) -> Any:
        return lambda n: (
            kernels_mod.time_evaluator(symbol, dev, number=n, repeat=1)(*call_args).mean
        )

    def flushed_timer(symbol: str, call_args: list[Any]) -> Any:
        return lambda n: (
            kernels_mod.time_evaluator(
                symbol, dev, number=1, repeat=n, f_preproc="cache_flush_cpu_non_first_arg"
            )(*call_args).mean
        )

    def handoff_timer(symbol: str, call_args: list[Any]) -> Any:
        evaluator = kernels_mod.time_evaluator
        return lambda n: (
            evaluator(symbol, dev, number=1, repeat=n, f_preproc=handoff.PREPROC)(*call_args).mean
        )

    handoff.register()
    timers = [kernel_timer(s, a) for s, a in kernel_calls]
    counts = [repeats_for(t) for t in timers]
    flushed = [flushed_timer(s, a) for s, a in kernel_calls]
    flushed_counts = [repeats_for(t) for t in flushed]
    handed = [handoff_timer(s, a) for s, a in kernel_calls]
    handed_counts = [repeats_for(t) for t in handed]
    n_e2e = repeats_for(e2e_timer)
    probe = crosscore.LinkProbe(crosscore.reference_path())
    e2e, summed, summed_flushed, summed_handoff, link_ns = [], [], [], [], [probe()]
    for _ in range(rounds):
        e2e.append(e2e_timer(n_e2e) * 1e6)
        summed.append(sum(t(n) for t, n in zip(timers, counts, strict=True)) * 1e6)
        summed_flushed.append(sum(t(n) for t, n in zip(flushed, flushed_counts, strict=True)) * 1e6)
        summed_handoff.append(sum(t(n) for t, n in zip(handed, handed_counts, strict=True)) * 1e6)
        link_ns.append(probe())
    record: dict[str, Any] = {
        "e2e_us": e2e,
        "kernels_us": summed,
        "kernels_flushed_us": summed_flushed,
        "kernels_handoff_us": summed_handoff,
        "link_ns": link_ns,
        "reference_ns": probe.fastest,  # the machine's fastest probe yet (crosscore)
        "kernel_calls": len(kernel_calls),
        "builtin_calls": len(calls) - len(kernel_calls),
    }
    if with_perf:
        record["perf_shares"] = perf_shares(PERF_SECONDS, lambda: e2e_timer(n_e2e))
    return record


def summarize(per: list[dict[str, Any]]) -> dict[str, Any]:
    """One library's row at one thread count from its passes (``time_library``'s records):
    medians over each pass's rounds with the cores near, then over the passes. NEAR is the
    fastest probe of all the passes or of the machine before them, so a pass spent wholly
    apart keeps its APART rounds (``compilation.Timing``) and says so in ``states``."""
    known = [p.get("reference_ns") for p in per]  # absent from records before the cache
    reference = crosscore.fastest([*(p["link_ns"] for p in per), known])
    timings = [
        Timing(
            {
                "e2e_us": p["e2e_us"],
                "kernels_us": p["kernels_us"],
                "kernels_flushed_us": p["kernels_flushed_us"],
                "kernels_handoff_us": p["kernels_handoff_us"],
                # Round by round: the two are timed back to back, in the same state.
                "overhead_us": [a - b for a, b in zip(p["e2e_us"], p["kernels_us"], strict=True)],
            },
            p["link_ns"],
            reference,
        )
        for p in per
    ]
    medians = [t.medians() for t in timings]
    e2e, kernels, flushed, handed, over = (
        statistics.median(m[name] for m in medians)
        for name in (
            "e2e_us", "kernels_us", "kernels_flushed_us", "kernels_handoff_us", "overhead_us"
        )
    )  # fmt: skip
    return {
        "e2e_us": round(e2e, 2),
        "kernels_us": round(kernels, 2),
        "kernels_flushed_us": round(flushed, 2),
        "kernels_handoff_us": round(handed, 2),
        "overhead_us": round(over, 2),
        "overhead_share": round(over / e2e, 4),
        "kernel_calls": per[0]["kernel_calls"],
        "builtin_calls": per[0]["builtin_calls"],
        "states": [t.state() for t in timings],
    }


def timing_orders(summary: dict[str, dict[int, dict[str, Any]]], count: int) -> dict[str, float]:
    """Per way of timing the kernels (alone, flushed, handoff), the Spearman between the
    libraries' kernel sums and their e2e at ``count`` threads; {} below three libraries."""
    from scipy.stats import spearmanr

    rows = [threads[count] for threads in summary.values()]
    if len(rows) < 3:
        return {}
    e2e = [r["e2e_us"] for r in rows]
    return {
        name: round(float(spearmanr(e2e, [r[key] for r in rows])[0]), 3)
        for name, key in (
            ("alone", "kernels_us"), ("flushed", "kernels_flushed_us"),
            ("handoff", "kernels_handoff_us"),
        )
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one_pass:
        from gradtune import threads

        libraries = args.libraries or [run / "model.so" for run in args.runs]
        result = {
            name: time_library(run, args.rounds, args.perf, library)
            for name, run, library in zip(labels(args.runs), args.runs, libraries, strict=True)
        }
        print(json.dumps({"libraries": result, "tvm_threads": threads.runtime_threads()}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        return report(args, bytecode_libraries(args.runs, Path(tmp)))


def report(args: argparse.Namespace, libraries: list[Path]) -> int:
    passes: dict[int, list[dict[str, Any]]] = {t: [] for t in args.threads}
    for k in range(args.passes):  # thread counts alternate pass by pass: drift hits all alike
        for count in args.threads:
            env = {**os.environ, "TVM_NUM_THREADS": str(count)}
            proc = subprocess.run(
                [sys.executable, __file__, *map(str, args.runs), "--rounds", str(args.rounds),
                 "--one-pass", *(["--perf"] if args.perf else []),
                 "--libraries", *map(str, libraries)],
                capture_output=True, text=True, check=False, env=env,
            )  # fmt: skip
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            if result["tvm_threads"] != count:
                print(f"vm_breakdown: asked for {count} threads, TVM ran "
                      f"{result['tvm_threads']}", file=sys.stderr)  # fmt: skip
                return 1
            passes[count].append(result["libraries"])
        print(f"pass {k + 1}/{args.passes} done", file=sys.stderr)
    summary: dict[str, dict[int, dict[str, Any]]] = {}
    print(
        "| library | threads | e2e µs | kernels µs | flushed µs | handoff µs | e2e − kernels µs | "
        "share | calls "
        "kernels / builtins | passes near | perf: kernels / tvm runtime / os kernel / libc / "
        "other |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in labels(args.runs):
        for count in args.threads:
            per = [p[name] for p in passes[count]]
            row = summarize(per)
            e2e, kernels, over = row["e2e_us"], row["kernels_us"], row["overhead_us"]
            shares = ""
            if args.perf:
                groups = ("kernels", "tvm runtime", "os kernel", "libc", "other")
                row["perf_shares"] = {
                    g: round(statistics.median(p["perf_shares"].get(g, 0.0) for p in per), 4)
                    for g in groups
                }
                shares = " / ".join(f"{row['perf_shares'][g]:.0%}" for g in groups)
            summary.setdefault(name, {})[count] = row
            near = row["states"].count(crosscore.NEAR)
            print(f"| {name} | {count} | {e2e:.1f} | {kernels:.1f} | "
                  f"{row['kernels_flushed_us']:.1f} | {row['kernels_handoff_us']:.1f} | "
                  f"{over:.1f} | "
                  f"{over / e2e:.0%} | {row['kernel_calls']} / {row['builtin_calls']} | "
                  f"{near} of {len(row['states'])} | {shares} |")  # fmt: skip
    orders = {count: timing_orders(summary, count) for count in args.threads}
    for count, order in orders.items():
        if order:
            print(f"{count} thread(s): the kernels' sums order the {len(args.runs)} libraries as "
                  "their inference does, Spearman: "
                  + ", ".join(f"{name} {rho:.2f}" for name, rho in order.items()))  # fmt: skip
    print(json.dumps({"libraries": summary, "orders": orders, "commit": git_commit()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
