"""End-to-end latency of every library a model's runs exported, timed in one process.

All of a model's libraries (both searchers, every repeat, ¼ / ½ / all of the budget) are
loaded together and timed interleaved (``time_rounds``: alternating calls, median of the
repeats), so the shared machine's drift hits every contender alike. That is one pass; a
record holds ``PASSES`` of them, each loading the libraries afresh. On a 2-core VM one
library's latency moved by up to 30% between passes of one process while the ratios within a
pass held, so ratios are taken within each pass and their median reported
(``searchbench.analysis``), never between medians of different passes. Within a pass only the
rounds of one cross-core state count (``gradtune.crosscore``): the host moved the VM's two
vCPUs apart for tens of seconds to minutes at a time, slowing every library on 2 threads,
some more than others (squeeze_fire's by 1.5-1.9x each, bert_block's by 1.6x): a pass in that
state ranks them otherwise. So passes go on until ``PASSES`` of them ran with the cores near
(at most ``MAX_PASSES_FACTOR`` times as many), and the record's ``passes`` are of one state.

The result is saved with the libraries it covers, each by label, size and modification time;
it is redone when any of them changes (a run redone or moved in from another layout under the
same label is timed again), and when it is older than the probe or has fewer passes than
``PASSES``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from gradtune.compilation import shared_reference
from gradtune.crosscore import APART, MOVED, NEAR
from searchbench import api
from searchbench.analysis import paired_ratio
from searchbench.layout import Layout, write_json
from searchbench.models import MODELS

PASSES = 5
MAX_PASSES_FACTOR = 3  # passes at most, in PASSES, waiting for the cores to come near


def libraries(layout: Layout, model: str) -> dict[str, Path]:
    """``<run id>@<percent>`` → exported library, for every finished run of ``model``."""
    found = {}
    for result in layout.results(model):
        run_dir = layout.root / "runs" / model / result["run_id"]
        for label, build in result.get("builds", {}).items():
            if "library" in build:
                found[f"{result['run_id']}@{label}"] = run_dir / build["library"]
    return dict(sorted(found.items()))


def identities(found: dict[str, Path]) -> dict[str, list[int]]:
    """label → [size, modification time in ns] of each library: what a timing record covers."""
    return {label: [(st := path.stat()).st_size, st.st_mtime_ns] for label, path in found.items()}


def up_to_date(layout: Layout, model: str) -> bool:
    path = layout.timing(model)
    if not path.is_file():
        return not libraries(layout, model)
    record = json.loads(path.read_text())
    # A record without identities cannot vouch for the files (its labels alone say nothing);
    # one without a cross-core state predates the probe (its passes may mix both states).
    if "state" not in record or record.get("libraries") != identities(libraries(layout, model)):
        return False
    return (
        len(passes_of(record)) >= PASSES
        or len(record.get("pass_conditions", [])) >= MAX_PASSES_FACTOR * PASSES
    )


def passes_of(record: dict[str, Any]) -> list[dict[str, float]]:
    """A timing record's passes (label → ms each); a record from before passes is one."""
    return record.get("passes") or [record["ms"]]


def by_state(timings: list[Any]) -> dict[str, list[dict[str, float]]]:
    """Each pass's medians (label → ms), grouped by the cross-core state its kept rounds ran
    in, NEAR being the fastest probe of all passes or of the machine before them."""
    reference = shared_reference(timings)
    grouped: dict[str, list[dict[str, float]]] = {}
    for timing in timings:
        ms = {label: round(v, 5) for label, v in timing.medians(reference).items()}
        grouped.setdefault(timing.state(reference), []).append(ms)
    return grouped


def timed(model: str, found: dict[str, Path], work: Path, passes: int = PASSES) -> dict[str, Any]:
    """``found`` (label → library of ``model``) timed interleaved in this process, ``passes``
    times: the record the timing files hold (ms per pass and label, their median per label,
    seconds, load average, date)."""
    _config, target = api.host_target()
    imported = api.import_model(MODELS[model].tuning_file(work))
    load_before = os.getloadavg()
    start = time.perf_counter()
    timings: list[Any] = []
    # Passes go on until ``passes`` of them ran with the cores near, or a few times that many.
    while len(timings) < MAX_PASSES_FACTOR * passes:
        if len(by_state(timings).get(NEAR, [])) >= passes:
            break
        timings.append(api.time_libraries(found, imported.inputs, target))
    grouped = by_state(timings)
    state = next(s for s in (NEAR, APART, MOVED) if grouped.get(s))
    reference = shared_reference(timings)
    each = grouped[state]
    record = {
        "model": model,
        "ms": {label: round(statistics.median(p[label] for p in each), 5) for label in found},
        "state": state,  # the cross-core state of ``passes`` (gradtune.crosscore)
        "passes": each,
        "passes_by_state": grouped,
        "pass_conditions": [t.conditions(reference) for t in timings],
        "rounds": [t.record() for t in timings],
        "libraries": identities(found),
        "seconds": round(time.perf_counter() - start, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(f"{model}: timed {len(found)} libraries interleaved, {len(timings)} passes, in "
          f"{record['seconds']} s; cross-core state per pass: "
          f"{', '.join(c['state'] for c in record['pass_conditions'])}", flush=True)  # fmt: skip
    return record


def time_model(layout: Layout, model: str) -> dict[str, Any]:
    record = timed(model, libraries(layout, model), layout.work)
    write_json(layout.timing(model), record)
    return record


def final_libraries(layouts: dict[str, Layout], model: str) -> dict[str, Path]:
    """``<name>/<run id>@100`` → library of ``model`` as tuned by the whole budget, for every
    finished run of every layout (name → layout)."""
    return {
        f"{name}/{label}": path
        for name, layout in layouts.items()
        for label, path in libraries(layout, model).items()
        if label.endswith("@100")
    }


def time_versus(layouts: dict[str, Layout], model: str, out: Path) -> dict[str, Any]:
    """Every configuration's libraries of ``model`` as tuned by the whole budget, timed
    interleaved in one process: an ablation against the default configuration's gradient runs
    (and the shared evolutionary ones), side by side. ``layouts``: name → configuration."""
    found = final_libraries(layouts, model)
    if not found:
        raise SystemExit(f"search_efficiency: no finished runs of {model} to time")
    record = timed(model, found, next(iter(layouts.values())).work)
    groups: dict[str, list[str]] = {}
    for label in record["ms"]:
        name, run = label.split("/", 1)
        groups.setdefault(f"{name}/{run.split('-r')[0]}", []).append(label)
    groups = dict(sorted(groups.items()))
    record["median_ms"] = {
        k: round(statistics.median(record["ms"][label] for label in labels), 5)
        for k, labels in groups.items()
    }
    base = groups.get("default/gradient")
    if base:
        record["default_gradient_over"] = {
            k: round(paired_ratio(record["passes"], base, labels), 4)
            for k, labels in groups.items()
        }
    write_json(out, record)
    return record
