"""Where the transfer benchmark keeps its runs, and the order it runs them in.

It shares the search-efficiency benchmark's work dir, models, preparation (leave-out cost
models, ``prepared/<model>.json``) and run machinery; its own runs live apart, under
``<budget>s-transfer/``::

    work/<budget>s/prepared/<model>.json                  shared with search_efficiency
    work/<budget>s-transfer/runs/<model>/<kind>-r<i>/     one run: db/, db_at_100/, result.json
    work/<budget>s-transfer/timing/<model>.json           its libraries timed interleaved
    work/<budget>s-transfer/logs/
    work/<budget>s-transfer-<config>/                     --gradient-config: full and warm
                                                          runs of that gradient search
    work/<budget>s-transfer-warmup-<warmup>/              --warmup: warm runs with that
                                                          warm-up; the other kinds copied in
    work/<budget>s-transfer-from-auto/                    --warm-from auto: likewise, warm
                                                          runs from Eq. 1's source alone
    work/<budget>s-transfer-warm-<config>/                --warm-config: likewise, warm runs
                                                          whose gradient search has <config>
                                                          (its commas as +)

A run is a ``searchbench.layout.RunSpec`` whose "searcher" is its kind:

- ``untuned``: nothing measured; the model built with its default schedules;
- ``full``: ``gradtune tune`` with budget B, from an empty database (also the cold run);
- ``transfer``: ``gradtune transfer``, no search, from a library of the *other* models'
  ``full-r0`` databases (``db/``, with its partition table), the source chosen by Eq. 1;
- ``warm``: ``gradtune tune --warm-start`` with the same library and budget B.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from searchbench.layout import Layout, RunSpec, config_kwargs, config_moved, unknown_fields

from gradtune.transfer.run import ALL, AUTO

UNTUNED, FULL, TRANSFER, WARM = "untuned", "full", "transfer", "warm"
KINDS = (UNTUNED, FULL, TRANSFER, WARM)
LIBRARY_REPEAT = 0  # the full run of each model that the others' library holds
FINAL = "100"  # the build label: the model as tuned by the whole budget


WARM_DEFAULT = "stake"  # ``gradtune tune``'s warm-up after a warm start (``skip`` before bb2b638)
FROM_DEFAULT = "all"  # ``gradtune tune --from`` with a warm start (``auto``, Eq. 1's, before)


@dataclass(frozen=True)
class TransferLayout(Layout):
    """``Layout`` with the runs under ``<budget>s-transfer`` (a name of its own, so that
    ``searchbench.archive`` keeps budgets apart); preparation stays shared.

    ``warmup``: the task scheduler's warm-up in the warm runs (``gradtune tune --warmup``);
    ``warm_from``: the library's source they transfer from (``gradtune tune --from``, "auto"
    or "all"). Another than tune's default is an ablation of the warm start alone: its layout
    makes only warm runs, and copies the untuned, full and transfer runs in from the
    default's (``adopt``), so that every warm start is weighed against the same cold runs.
    ``warm_config``: ``GradientConfig`` fields for the warm runs' search alone, over
    ``gradient_config`` (a lever that only acts on tasks with programs before the run, such as
    ``warm_warmup``); likewise an ablation of the warm start."""

    WARMUP_DEFAULT: ClassVar[str] = WARM_DEFAULT

    warmup: str = WARM_DEFAULT
    warm_from: str = FROM_DEFAULT
    warm_config: str = ""

    @property
    def warm_ablation(self) -> bool:
        default = (WARM_DEFAULT, FROM_DEFAULT, "")
        return (self.warmup, self.warm_from, self.warm_config) != default

    @property
    def root(self) -> Path:
        warm_from = f"-from-{self.warm_from}" if self.warm_from != FROM_DEFAULT else ""
        warm_config = f"-warm-{self.warm_config}" if self.warm_config else ""
        name = f"{self.budget:g}s-transfer{self.suffix}{warm_from}{warm_config}"
        # The warm runs' library is this layout's full runs, and a library SPEC separates its
        # sources by commas: a configuration of two fields (a=1,b=2) must not put one in a path.
        return self.work / name.replace(",", "+")

    def child_args(self) -> list[str]:
        warm_from = ["--warm-from", self.warm_from] if self.warm_from != FROM_DEFAULT else []
        warm_config = ["--warm-config", self.warm_config] if self.warm_config else []
        return [*super().child_args(), *warm_from, *warm_config]

    def warm_kwargs(self) -> dict[str, Any]:
        """``GradientConfig`` keyword arguments of the warm runs: ``warm_config`` over
        ``gradient_config``."""
        return {**self.gradient_kwargs(), **config_kwargs(self.warm_config)}

    def kwargs_of(self, kind: str) -> dict[str, Any]:
        """The ``GradientConfig`` keyword arguments a run of ``kind`` searches with."""
        return self.warm_kwargs() if kind == WARM else self.gradient_kwargs()

    def effective_of(self, kind: str) -> dict[str, Any]:
        """Every ``GradientConfig`` field a run of ``kind`` searches with."""
        from gradtune.search.gradient_search import GradientConfig

        return GradientConfig(**self.kwargs_of(kind)).as_json()

    def config_problem(self) -> str | None:
        """Also what is wrong with ``warm_config``."""
        return super().config_problem() or unknown_fields(
            "--warm-config", config_kwargs(self.warm_config)
        )

    def config_moved(self, result: dict[str, Any]) -> str | None:
        """As ``Layout.config_moved``, a warm run against the warm runs' configuration."""
        kind = WARM if result.get("searcher") == WARM else FULL
        return config_moved(result.get("gradient_config_effective"), self.effective_of(kind))

    def mixed_config(self, specs: list[RunSpec], searches: tuple[str, ...]) -> str | None:
        """Also why the warm runs still to make would not be of the warm-up and source the
        layout's finished ones ran (a run without a record of its warm-up ran ``skip``,
        before 157689f; one whose transfer names a source other than ``all`` took Eq. 1's)."""
        if moved := super().mixed_config(specs, searches):
            return moved
        pending = {s.model for s in specs if s.searcher == WARM and not self.finished(s)}
        for model in sorted(pending):
            for result in self.results(model):
                if result.get("searcher") != WARM:
                    continue
                where = f"{self.root} holds {model} warm runs"
                ran = result.get("warmup", "skip")
                if ran != self.warmup:
                    return f"{where} of warm-up {ran}, not {self.warmup}"
                source = (result.get("transfer") or {}).get("source")
                took = ALL if source == ALL else AUTO
                if source and took != self.warm_from:
                    return f"{where} from source {took}, not {self.warm_from}"
        return None

    def adopt(self, spec: RunSpec) -> Path | None:
        """Copy in the default warm start's finished untuned, full or transfer run ``spec``
        (none of them warm-starts); returns where it came from, or None."""
        if not self.warm_ablation or spec.searcher == WARM or self.finished(spec):
            return None
        default = TransferLayout(self.work, self.budget, self.gradient_config)
        return self.copy_in(spec, default.run_dir(spec))

    def prepared(self, model: str) -> Path:
        return Layout(self.work, self.budget).prepared(model)

    def library_dirs(self, model: str) -> list[Path]:
        """The databases the library of ``model`` is read from: every other model's finished,
        successful ``full`` run in this work dir, never its own. The whole database, as a
        user's ``runs/`` holds it (the search's last batch may end after B). The plan runs
        every model's before any transfer, so it is all the other models'."""
        import json

        from searchbench.models import MODELS

        dirs = []
        for other in MODELS:
            spec = RunSpec(other, FULL, LIBRARY_REPEAT)
            if other == model or not self.finished(spec):
                continue
            if "error" not in json.loads(self.result(spec).read_text()):
                whole = self.run_dir(spec) / "db"
                # A restored run (searchbench.archive) keeps only what was measured by B.
                dirs.append(whole if whole.is_dir() else self.run_dir(spec) / f"db_at_{FINAL}")
        return dirs


def plan(models: list[str], repeats: int) -> list[RunSpec]:
    """Every model untuned and fully tuned first (they are the libraries), then each model's
    transfer and first warm start; then the other repeats, full and warm alternating which
    goes first (and between neighbouring models), so drift of the shared machine hits both."""
    runs = [RunSpec(m, kind, 0) for m in models for kind in (UNTUNED, FULL)]
    runs += [RunSpec(m, kind, 0) for m in models for kind in (TRANSFER, WARM)]
    for repeat in range(1, repeats):
        for i, model in enumerate(models):
            order = (FULL, WARM) if (i + repeat) % 2 == 0 else (WARM, FULL)
            runs += [RunSpec(model, kind, repeat) for kind in order]
    return runs
