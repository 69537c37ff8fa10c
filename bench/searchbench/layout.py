"""Where the benchmark keeps its state, and the order of its runs.

Everything lives under one work dir (default ``bench/work/``, git-ignored), runs under the
budget they were tuned with so that different budgets never mix::

    work/costmodels/<hash>.pt              leave-out pretrained weights, per excluded set
    work/costmodels/<hash>-ensemble<K>.pt  and their deep ensemble (configurations that use one)
    work/models/<name>.onnx                ONNX exports of the ONNX benchmark models
    work/<budget>s/prepared/<model>.json   tasks, task hashes, leakage counts, weights path
    work/<budget>s/runs/<model>/<run id>/  one run: db/ (JSONDatabase), result.json, .so files
    work/<budget>s/timing/<model>.json     the interleaved end-to-end timing of those .so files
    work/<budget>s/logs/<model>-<run id>.log

A run directory with ``result.json`` is finished (successfully or with an ``error``); one
without is half-finished and is deleted and rerun on resume.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

SEARCHERS = ("gradient", "evolutionary")
COMMITTED_RESULTS = Path(__file__).resolve().parents[1] / "results"
FRACTIONS = (0.25, 0.5, 1.0)  # of the budget, where end-to-end latency is measured
# The first default of each ``GradientConfig`` field whose default has moved since it was
# added: a result recorded before the field existed searched with this value, not today's.
FIRST_DEFAULTS = {"ranked_warmup": 0, "structural_variants": 0, "warm_warmup": None}


def config_kwargs(text: str) -> dict[str, Any]:
    """``GradientConfig`` keyword arguments of an option's ``K=V,...`` (values as Python
    literals: ``0.5``, ``32``, ``True``)."""
    import ast

    def value(text: str) -> Any:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):  # a bare word: acquisition=ei
            return text

    pairs = [item.split("=", 1) for item in text.split(",") if item]
    return {key.strip(): value(text.strip()) for key, text in pairs}


def unknown_fields(option: str, kwargs: dict[str, Any]) -> str | None:
    """The one line saying which of ``kwargs`` (given by ``option``) ``GradientConfig`` lacks;
    None if it has them all."""
    from gradtune.search.gradient_search import GradientConfig

    unknown = sorted(set(kwargs) - set(GradientConfig._fields))
    return f"{option}: GradientConfig has no field {', '.join(unknown)}" if unknown else None


def today_defaults() -> dict[str, Any]:
    """Every ``GradientConfig`` field at today's default, as a result's JSON gives it back."""
    from gradtune.search.gradient_search import GradientConfig

    return GradientConfig().as_json()


def config_moved(then: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """How a recorded gradient configuration ``then`` differs from ``now`` (``a=1 (now 2),
    ...``); None if it does not, or if none was recorded (runs from before it was recorded
    cannot be told apart). A field the record lacks is newer than the run, which searched with
    its first default (``FIRST_DEFAULTS``, else today's)."""
    if then is None:
        return None
    default = today_defaults()
    then = {key: then.get(key, FIRST_DEFAULTS.get(key, default.get(key))) for key in now}
    moved = [f"{key}={then[key]!r} (now {now[key]!r})" for key in sorted(now)
             if then[key] != now[key]]  # fmt: skip
    return ", ".join(moved) or None


@dataclass(frozen=True)
class RunSpec:
    """One tuning run.

    Parameters
    ----------
    model : str
        Benchmark model name.
    searcher : str
        ``gradient`` or ``evolutionary``.
    repeat : int
        Repeat index, also the tuning seed.
    per_round : int or None, default None
        Trials per round; None is the CLI's default for the model (the main benchmark).
    """

    model: str
    searcher: str
    repeat: int
    per_round: int | None = None

    @property
    def run_id(self) -> str:
        batch = "" if self.per_round is None else f"-b{self.per_round}"
        return f"{self.searcher}{batch}-r{self.repeat}"

    def args(self) -> list[str]:
        """Command-line arguments of ``--one`` that name this run."""
        extra = [] if self.per_round is None else ["--per-round", str(self.per_round)]
        return ["--one", self.model, self.searcher, str(self.repeat), *extra]


@dataclass(frozen=True)
class Layout:
    """Paths of one benchmark configuration.

    Parameters
    ----------
    work : Path
        The work dir.
    budget : float
        Seconds per run.
    gradient_config : str, default ""
        An ablation of the gradient search (``GradientConfig`` fields, ``elite=0.5,steps=32``);
        its runs live apart from the default configuration's (``<budget>s-<config>``).
    measure : {"fixed", "adaptive", "handoff"}, default "fixed"
        How candidates are timed (``gradtune tune --measure``); runs not fixed live apart too.
    warmup : {"model", "stake", "fresh", "skip"}, default "model"
        The task scheduler's warm-up (``gradtune tune --warmup``), both searchers' runs; runs
        of another than a cold run's default live apart too (``<budget>s-warmup-<warmup>``).
    """

    WARMUP_DEFAULT: ClassVar[str] = "model"  # ``gradtune tune``'s, for a cold run

    work: Path
    budget: float
    gradient_config: str = ""
    measure: str = "fixed"
    warmup: str = "model"

    @property
    def suffix(self) -> str:
        """What sets this configuration's directory apart from the default's."""
        suffix = f"-{self.gradient_config}" if self.gradient_config else ""
        if self.measure != "fixed":
            suffix += f"-{self.measure}"
        if self.warmup != self.WARMUP_DEFAULT:
            suffix += f"-warmup-{self.warmup}"
        return suffix

    @property
    def root(self) -> Path:
        return self.work / f"{self.budget:g}s{self.suffix}"

    def child_args(self) -> list[str]:
        """The arguments that give a child process this layout."""
        config = ["--gradient-config", self.gradient_config] if self.gradient_config else []
        measure = ["--measure", self.measure] if self.measure != "fixed" else []
        warmup = ["--warmup", self.warmup] if self.warmup != self.WARMUP_DEFAULT else []
        return [
            "--budget", f"{self.budget:g}", "--work", str(self.work), *config, *measure, *warmup
        ]  # fmt: skip

    def gradient_kwargs(self) -> dict[str, Any]:
        """``GradientConfig`` keyword arguments of ``gradient_config``."""
        return config_kwargs(self.gradient_config)

    def config_problem(self) -> str | None:
        """What is wrong with ``gradient_config``, in one line; None if nothing."""
        return unknown_fields("--gradient-config", self.gradient_kwargs())

    def gradient_effective(self) -> dict[str, Any]:
        """Every ``GradientConfig`` field the layout's gradient runs search with: its
        overrides over today's defaults, which move (``ranked_warmup`` went from 0 to 256)."""
        from gradtune.search.gradient_search import GradientConfig

        return GradientConfig(**self.gradient_kwargs()).as_json()

    def config_moved(self, result: dict[str, Any]) -> str | None:
        """How the gradient configuration ``result`` recorded differs from the one this
        layout's new runs would search with (``config_moved``)."""
        return config_moved(result.get("gradient_config_effective"), self.gradient_effective())

    def mixed_config(self, specs: list[RunSpec], searches: tuple[str, ...]) -> str | None:
        """Why the runs of ``specs`` still to make whose searcher is one of ``searches`` (the
        gradient search's) would not be of the configuration the layout's finished ones ran (a
        default moved since), in one line; None if they would be. Finished runs are never
        made again, so a finished layout renders as it is."""
        pending = [s.model for s in specs if s.searcher in searches and not self.finished(s)]
        for model in dict.fromkeys(pending):
            for result in self.results(model):
                if moved := self.config_moved(result):
                    return (
                        f"{self.root} holds {model} gradient runs of another configuration: {moved}"
                    )
        return None

    def redundant_config(self, specs: list[RunSpec]) -> str | None:
        """Why a ``gradient_config`` equal to today's defaults (``steps=64`` once 64 became the
        default) must not make the gradient runs of ``specs`` still to make, in one line; None
        if it may. Its runs would repeat the default layout's under another name, and the
        side-by-side timing would weigh a configuration against itself. Finished runs of a
        configuration that was an ablation when it ran still render."""
        if not self.gradient_config or self.gradient_effective() != today_defaults():
            return None
        if all(s.searcher != "gradient" or self.finished(s) for s in specs):
            return None
        return (
            f"--gradient-config {self.gradient_config} is the gradient search's default "
            "configuration now; run without --gradient-config"
        )

    def needs_ensemble(self) -> bool:
        """Whether the configuration's gradient search scores with a deep ensemble."""
        from gradtune.search.gradient_search import GradientConfig

        return GradientConfig(**self.gradient_kwargs()).needs_ensemble

    def prepares_ensemble(self) -> bool:
        """Whether preparing a model pretrains its leave-out ensemble too."""
        return self.needs_ensemble()

    def scheduler_model(self) -> str:
        """The task scheduler's cost model (``api.scheduler_cost_model``): the CLI's XGBoost."""
        return "xgb"

    @property
    def costmodels(self) -> Path:
        return self.work / "costmodels"

    def prepared(self, model: str) -> Path:
        return self.root / "prepared" / f"{model}.json"

    def run_dir(self, spec: RunSpec) -> Path:
        return self.root / "runs" / spec.model / spec.run_id

    def result(self, spec: RunSpec) -> Path:
        return self.run_dir(spec) / "result.json"

    def timing(self, model: str) -> Path:
        return self.root / "timing" / f"{model}.json"

    def log(self, spec: RunSpec) -> Path:
        return self.root / "logs" / f"{spec.model}-{spec.run_id}.log"

    def finished(self, spec: RunSpec) -> bool:
        return self.result(spec).is_file()

    def adopt(self, spec: RunSpec) -> Path | None:
        """Copy in the default configuration's finished ``spec`` (same budget, measurement and
        warm-up) if this layout is a gradient ablation and ``spec`` an evolutionary run this
        layout lacks: an ablation changes only the gradient search, and tuning its peer again
        costs a whole budget per run for another sample of the same thing. The copied run keeps
        its commit in result.json. Returns where it came from, or None."""
        if not self.gradient_config or spec.searcher != "evolutionary" or self.finished(spec):
            return None
        default = Layout(self.work, self.budget, "", self.measure, self.warmup)
        return self.copy_in(spec, default.run_dir(spec))

    def copy_in(self, spec: RunSpec, source: Path) -> Path | None:
        """Copy the finished run at ``source`` in as this layout's ``spec``; returns
        ``source``, or None if it has not finished."""
        if not (source / "result.json").is_file():
            return None
        target = self.run_dir(spec)
        shutil.rmtree(target, ignore_errors=True)  # a half-finished run of this layout's
        # Beside the model folders, not in one: a copy cut short is never taken for a run.
        partial = self.root / "runs" / f".adopting-{spec.model}-{spec.run_id}"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.replace(target)
        return source

    def results(self, model: str) -> list[dict[str, Any]]:
        """Every finished run of ``model`` (failed ones included, with their ``error``)."""
        folder = self.root / "runs" / model
        found = sorted(folder.glob("*/result.json")) if folder.is_dir() else []
        return [json.loads(p.read_text()) for p in found]


def plan(models: list[str], repeats: int, per_rounds: tuple[int | None, ...] = (None,)):
    """The runs in execution order: repeat-major, models round-robin, searchers alternating.

    All models' repeat 0 comes first so that partial results cover every model early. For
    a model the searcher that goes first alternates between repeats (g e, e g, g e, ...) and
    between neighbouring models, so slow drift of the shared machine hits both searchers.
    """
    runs = []
    for repeat in range(repeats):
        for i, model in enumerate(models):
            for per_round in per_rounds:
                order = SEARCHERS if (i + repeat) % 2 == 0 else SEARCHERS[::-1]
                runs += [RunSpec(model, s, repeat, per_round) for s in order]
    return runs


def write_json(path: Path, data: Any) -> None:
    """Write whole or not at all: a reader (or a resume) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)


def add_work_and_out(parser: Any, default_work: Path) -> None:
    """A benchmark's ``--work`` and ``--out``; ``resolve_out`` fills ``--out`` in after parsing."""
    parser.add_argument("--work", type=Path, default=default_work,
                        help=f"state of the runs (default {default_work})")  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=None,
        help="where the results are written (default: bench/results/ with the default --work, "
        "WORK/results/ with another)",
    )  # fmt: skip


def resolve_out(args: Any, default_work: Path, runs: Path | None = None) -> None:
    """``--out`` when none was given: the committed results for the default work directory
    only. A trial in a work directory of its own (another machine, a probe) must not overwrite
    the results of the runs git holds. There they go in ``results/`` of ``runs``, the directory
    of the runs rendered, where a work directory holds several sets (the search benchmark's
    budgets), else of the work directory."""
    if args.out is None:
        same = args.work.resolve() == default_work.resolve()
        args.out = COMMITTED_RESULTS if same else (runs or args.work) / "results"
