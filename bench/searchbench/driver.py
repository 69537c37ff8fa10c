"""The orchestrator: runs every step in a fresh subprocess, resumes, stops cleanly.

Each run, preparation and timing is a subprocess of ``bench/search_efficiency.py`` itself
(``--one``, ``--prepare``, ``--time``): TVM keeps global state and memory between tunings, and
a crash must cost one run, not the benchmark. The orchestrator never imports TVM.

Stopping: Ctrl-C or ``kill PID`` on the orchestrator forwards SIGINT to the running child
(each child runs in its own session), which stops tuning between batches and shuts its RPC
fleet down; the half-finished run is deleted and restarted on the next invocation. A child
that hangs past a generous watchdog is stopped the same way and recorded as failed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from searchbench import api, timing
from searchbench.layout import Layout, RunSpec, write_json
from searchbench.models import MODELS, ROOT
from searchbench.prepare import features_path, file_sha1, pretrain_params

SCRIPT = ROOT / "bench" / "search_efficiency.py"
STOP_GRACE_S = 180  # a child finishing its batch after SIGINT; then SIGKILL


class Interrupted(Exception):
    """The user stopped the benchmark (or a child died by a signal)."""


class Children:
    """The one child running at a time, and the user's request to stop."""

    def __init__(self, script: Path = SCRIPT) -> None:
        self.script = script  # the benchmark whose --one / --prepare / --time the child runs
        self.current: subprocess.Popen | None = None
        self.stopping = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True
        if self.current is not None and self.current.poll() is None:
            _interrupt(self.current.pid)

    def run(self, args: list[str], log: Path, timeout: float) -> int:
        """Run ``SCRIPT args`` to the end (or the watchdog); returns its exit code."""
        if self.stopping:
            raise Interrupted
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(args)}\n")
            out.flush()
            self.current = subprocess.Popen(
                [sys.executable, str(self.script), *args], stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=ROOT,
            )  # fmt: skip
            try:
                code = self.current.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _stop_process(self.current.pid)
                code = self.current.wait()
                out.write(f"\n=== watchdog: stopped after {timeout:.0f} s\n")
                code = code if code > 0 else 124
            finally:
                self.current = None
        if self.stopping or code < 0:
            raise Interrupted
        return code


def _interrupt(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        pass


def _stop_process(pid: int) -> None:
    """SIGINT (a clean stop between batches), then SIGKILL of its process group."""
    _interrupt(pid)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is not running anything.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def child(layout: Layout, spec: RunSpec, run: Callable[[], dict[str, Any]]) -> int:
    """In a ``--one`` child: ``run()`` one run and write its result, or its error (the run
    failed; the benchmark goes on), to result.json. The pid file lets a resume stop a leftover."""
    run_dir = layout.run_dir(spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pid").write_text(str(os.getpid()))
    try:
        result = run()
    except Exception:
        result = {"model": spec.model, "searcher": spec.searcher, "repeat": spec.repeat,
                  "run_id": spec.run_id, "error": traceback.format_exc()}  # fmt: skip
        print(result["error"], file=sys.stderr)
    write_json(layout.result(spec), result)
    return 0


def clean_half_finished(layout: Layout, spec: RunSpec) -> None:
    """Delete an unfinished run's directory, first stopping its process if it still runs
    (an orchestrator killed with SIGKILL leaves its child running)."""
    run_dir = layout.run_dir(spec)
    if not run_dir.exists():
        return
    pid_file = run_dir / "pid"
    if pid_file.is_file():
        pid = int(pid_file.read_text() or 0)
        cmdline = Path(f"/proc/{pid}/cmdline")
        if pid and _alive(pid) and cmdline.is_file():
            args = cmdline.read_bytes().split(b"\0")
            if b"--one" in args and spec.model.encode() in args:
                print(f"stopping the leftover process {pid} of {spec.run_id}", flush=True)
                _stop_process(pid)
    print(f"{spec.model} {spec.run_id}: half-finished, restarting it", flush=True)
    shutil.rmtree(run_dir)


def common_args(layout: Layout) -> list[str]:
    return layout.child_args()


def ensure_features(children: Children, layout: Layout) -> None:
    """The featurized dataset pretraining reads (built once, ~5 min, if missing)."""
    if features_path().is_file():
        return
    if not (ROOT / "data" / "manifest.json").is_file():
        raise SystemExit(
            "search_efficiency: data/ is missing: run `dvc pull` (or link a checkout's data/)"
        )
    print(f"building {features_path()} (python -m costmodel_training.featurize)", flush=True)
    log = layout.root / "logs" / "featurize.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        code = subprocess.run(
            [sys.executable, "-m", "costmodel_training.featurize"], cwd=ROOT, stdout=out,
            stderr=subprocess.STDOUT, check=False,
        ).returncode  # fmt: skip
    if code != 0:
        raise SystemExit(f"search_efficiency: featurize failed (exit {code}); see {log}")


def stale_pretraining(recorded: dict[str, Any]) -> bool:
    """Whether a preparation's recorded pretraining differs from params.yaml's in loss,
    epochs, learning rate or seed (settings it did not record count as unchanged)."""
    params = pretrain_params()
    return any(k in recorded and recorded[k] != params[k] for k in ("loss", "epochs", "lr", "seed"))


def prepared_ok(layout: Layout, model: str) -> dict[str, Any] | None:
    """The model's preparation, if done and still for the same model file."""
    path = layout.prepared(model)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    # Failed or not, a preparation is redone once the model's source changed; a successful
    # one also when the training features did (its cost model would be stale).
    if record.get("source_sha1") != MODELS[model].source_sha1():
        return None
    if "error" not in record and record.get("features_sha1") != file_sha1(features_path()):
        return None
    # So is one whose cost model was pretrained with other settings than params.yaml's now
    # (a longer pretraining, say): its weights are cached under another key and would go
    # unused.
    if "error" not in record and stale_pretraining(record.get("pretraining") or {}):
        return None
    # Another lowering tunes other tasks (fast math renames and rehashes every SiLU kernel);
    # preparations from before an option was recorded were made without it.
    before = api.recorded_lowering(record.get("lowering"))
    if "error" not in record and before != api.default_lowering():
        return None
    return record


def ensure_prepared(children: Children, layout: Layout, model: str) -> dict[str, Any]:
    record = prepared_ok(layout, model)
    if record is not None:
        return record
    log = layout.root / "logs" / f"{model}-prepare.log"
    code = children.run(["--prepare", model, *common_args(layout)], log, timeout=3600)
    record = prepared_ok(layout, model)
    if record is None:
        record = {
            "model": model,
            "source_sha1": MODELS[model].source_sha1(),
            "error": f"preparation exited {code} without a result; {log}",
        }
        write_json(layout.prepared(model), record)
    if "error" in record:
        print(f"{model}: skipped, preparation failed: {record['error'].splitlines()[-1]}",
              flush=True)  # fmt: skip
    return record


def run_job(children: Children, layout: Layout, spec: RunSpec) -> None:
    clean_half_finished(layout, spec)
    start = time.time()
    print(f"{spec.model} {spec.run_id}: tuning ({layout.budget:g} s budget)", flush=True)
    code = children.run(
        [*spec.args(), *common_args(layout)], layout.log(spec), timeout=2 * layout.budget + 1200
    )
    if not layout.finished(spec):
        # Crashed before it could write its own result: recorded so the resume skips it.
        error = f"run exited {code} without a result (log: {layout.log(spec)})"
        write_json(layout.result(spec), {"model": spec.model, "searcher": spec.searcher,
                                         "repeat": spec.repeat, "run_id": spec.run_id,
                                         "error": error})  # fmt: skip
    result = json.loads(layout.result(spec).read_text())
    status = result.get("error", "").splitlines()[-1:] or [
        f"{result['trials_in_budget']} trials in budget, wall {result['wall_s']} s "
        f"({result['overrun_pct']:+.1f}%)"
    ]
    print(f"{spec.model} {spec.run_id}: {status[0]} [{time.time() - start:.0f} s]", flush=True)


def time_stale_models(children: Children, layout: Layout, models: list[str]) -> None:
    for model in models:
        if timing.up_to_date(layout, model):
            continue
        log = layout.root / "logs" / f"{model}-timing.log"
        code = children.run(["--time", model, *common_args(layout)], log, timeout=1800)
        if code != 0:
            print(f"{model}: end-to-end timing failed (exit {code}); see {log}", flush=True)


def run_all(layout: Layout, specs: list[RunSpec], on_progress, script: Path = SCRIPT) -> bool:
    """Run every unfinished spec in order, each a child ``script --one ...``; ``on_progress()``
    after each (it writes the report). Returns False if interrupted."""
    children = Children(script)
    children.install()
    models = list(dict.fromkeys(s.model for s in specs))
    try:
        ensure_features(children, layout)
        repeat = None
        for spec in specs:
            if repeat is not None and spec.repeat != repeat:
                time_stale_models(children, layout, models)
                on_progress()
            repeat = spec.repeat
            if source := layout.adopt(spec):
                print(f"{spec.model} {spec.run_id}: adopted from {source}", flush=True)
                on_progress()
            if layout.finished(spec):
                continue
            if "error" in ensure_prepared(children, layout, spec.model):
                continue
            run_job(children, layout, spec)
            on_progress()
        time_stale_models(children, layout, models)
    except Interrupted:
        print("search_efficiency: interrupted; rerun the same command to resume", flush=True)
        return False
    return True
