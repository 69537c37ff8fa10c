"""Which machine measured each record: ``record_machines.json`` beside the database.

TVM's JSONDatabase reads a record line as exactly ``[workload_index, [trace, run_secs,
target, args_info]]``; a line with another field fails its loader. So the records stay TVM's
format and the attribution lives in a sidecar file: the descriptor of every machine
(``hardware.describe``) by id, and runs of record lines per machine::

    {"format": "gradtune-record-machines/1",
     "machines": {"<id>": {descriptor}, ...},
     "ranges": [[first_line, last_line, "<id>"], ..., [first_line, null, "<id>"]]}

Lines are 0-based indices of the non-empty lines of the decompressed
``database_tuning_record.json``, in file order (the order TVM appends them). Ranges are
inclusive, sorted and disjoint; the last may be open (``null``): a collection session writes
its range, open, *before* it appends its first record, so a session killed mid-batch never
leaves a record outside a range, however many it appended.

Why a sidecar and not the manifest: the store rewrites the record file when it opens it
(``DatasetStore`` drops torn and corrupt lines, which renumbers the lines after them), and it
must renumber the ranges at the same moment; the manifest is rewritten from the collection's
state only after each workload. One writer for the lines and their attribution keeps them in
step.

Datasets collected before this file existed have none: every record line — and any line past
the last closed range, appended by an older gradtune — belongs to the dataset-level
``hardware`` entry of ``manifest.json`` (``hardware.from_manifest``), measuring for the
manifest's target.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GradtuneError
from . import hardware

MACHINES = "record_machines.json"
FORMAT = "gradtune-record-machines/1"
# The manifest (``card`` writes it) names the machine of lines no range covers; its name lives
# here because ``card`` imports the store, which imports this module.
MANIFEST = "manifest.json"


@dataclass
class RecordMachines:
    """Machine descriptors by id, runs of record lines per machine, and the machine of the
    lines no run covers (the manifest's dataset-level hardware)."""

    fallback: dict[str, Any]  # hardware.from_manifest of the manifest's ``hardware``
    machines: dict[str, dict[str, Any]] = field(default_factory=dict)
    ranges: list[list[Any]] = field(default_factory=list)  # [first, last | None, id]

    def per_line(self, n: int) -> list[str]:
        """The machine id of each of the first ``n`` record lines."""
        out = [self.fallback["id"]] * n
        for first, last, machine in self.ranges:
            end = n if last is None else min(n, last + 1)
            out[first:end] = [machine] * max(0, end - first)
        return out

    def descriptor(self, machine: str) -> dict[str, Any]:
        """The descriptor of the machine with id ``machine``."""
        if machine == self.fallback.get("id"):
            return self.fallback
        return self.machines[machine]

    def every(self) -> dict[str, dict[str, Any]]:
        """Every machine by id, the fallback included."""
        return {self.fallback["id"]: self.fallback, **self.machines}


def load_record_machines(data_dir: str | Path) -> RecordMachines:
    """The attribution of the dataset in ``data_dir`` (the fallback alone when it has no
    ``record_machines.json``); a malformed file is a one-line ``GradtuneError``."""
    data_dir = Path(data_dir)
    manifest: dict[str, Any] = {}
    try:
        manifest = json.loads((data_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        pass  # no manifest (or a bad one, which load_manifest reports): the fallback is unknown
    legacy = hardware.from_manifest(manifest.get("hardware"), manifest.get("target"))
    path = data_dir / MACHINES
    if not path.is_file():
        return RecordMachines(legacy)
    try:
        raw = json.loads(path.read_text())
        machines = {str(k): dict(v) for k, v in raw["machines"].items()}
        ranges = [[int(a), None if b is None else int(b), str(m)] for a, b, m in raw["ranges"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise GradtuneError(f"{path} is not a record-machines file: {err}") from None
    start = 0
    for first, last, machine in ranges:
        if machine not in machines:
            raise GradtuneError(f"{path}: range {first}..{last} names unknown machine {machine}")
        if first < start or (last is not None and last < first):
            raise GradtuneError(f"{path}: ranges overlap or are out of order at line {first}")
        start = first if last is None else last + 1
    if any(last is None for _, last, _ in ranges[:-1]):
        raise GradtuneError(f"{path}: only the last range may be open")
    return RecordMachines(legacy, machines, ranges)


def runs(ids: Iterable[str]) -> list[list[Any]]:
    """Consecutive equal ids → closed ``[first, last, id]`` ranges."""
    out: list[list[Any]] = []
    for i, machine in enumerate(ids):
        if out and out[-1][2] == machine and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i, machine])
    return out


def write_record_machines(
    data_dir: str | Path,
    line_machines: list[str],
    known: dict[str, dict[str, Any]],
    session: dict[str, Any] | None = None,
) -> RecordMachines:
    """Write ``record_machines.json`` (atomically) for record lines whose machines are
    ``line_machines``, plus an open range for ``session`` starting after them.

    ``known`` holds the descriptors of the ids (``RecordMachines.every()``); only machines
    that own a line or the session are kept. Lines the fallback owned get a range of their own
    here: the next collection rewrites the manifest's ``hardware``, and the records it
    described must keep their descriptor.
    """
    ranges = runs(line_machines)
    if session is not None:
        known = {**known, session["id"]: session}
        ranges.append([len(line_machines), None, session["id"]])
    used = {machine for _, _, machine in ranges}
    machines = {m: known[m] for m in sorted(used)}
    path = Path(data_dir) / MACHINES
    tmp = path.with_suffix(".json.tmp")
    body = {"format": FORMAT, "machines": machines, "ranges": ranges}
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(tmp, path)
    return load_record_machines(data_dir)


# --------------------------------------------------------------------------- choosing


def other_threads(descriptor: dict[str, Any], target: dict[str, Any] | None) -> bool:
    """Whether ``descriptor`` ran TVM's runtime on a known thread count other than ``target``'s
    ``num-cores`` (False when either is unknown)."""
    threads = descriptor.get("tvm_threads")
    cores = (target or {}).get("num-cores")
    return threads is not None and cores is not None and int(threads) != int(cores)


def select_machines(
    descriptors: dict[str, dict[str, Any]], spec: str, target: dict[str, Any] | None
) -> list[str]:
    """The ids of ``descriptors`` to train on for ``spec``.

    - ``all``: every machine, whatever its ISA.
    - ``ID,ID,...``: exactly those (an unknown id is an error naming the known ones).
    - ``target`` (the default): the machines that measured for ``target`` (same kind, ``mcpu``,
      ``num-cores`` and ``arch`` where ``target`` names them) — the target the weights are
      for, a fact of the data, so the result does not depend on the host pretraining runs on.
      When those machines disagree on their ISA flags the choice is refused: latencies of
      AVX2 and AVX-512 code for the same program are different facts, and a ranking loss fed
      both learns neither. A machine whose flags are unknown (described before they were
      recorded) is taken at its target's word: LLVM generates code for ``mcpu``, which its
      records share with the others. A machine that ran TVM's runtime on another thread count
      than the target's ``num-cores`` measured something else, and is left out too; one whose
      count is unknown (described before it was recorded) is taken at its target's word.
    """
    spec = (spec or "target").strip()
    if spec == "all":
        return sorted(descriptors)
    if spec != "target":
        wanted = [s.strip() for s in spec.split(",") if s.strip()]
        unknown = [m for m in wanted if m not in descriptors]
        if unknown or not wanted:
            raise GradtuneError(
                f"unknown machine(s) {', '.join(unknown) or spec!r}; the data holds "
                f"{', '.join(sorted(descriptors)) or 'none'} (or use 'all' / 'target')"
            )
        return wanted
    chosen = sorted(
        m
        for m, d in descriptors.items()
        # A machine with no recorded target (no manifest named one) cannot be told apart.
        if not (target and d.get("target")) or not hardware.target_mismatch(d["target"], target)
        if not other_threads(d, target)
    )
    if not chosen:
        raise GradtuneError(
            f"no machine of the data measured for target {json.dumps(target)}; the data holds "
            + "; ".join(f"{m}: {hardware.short(d)}" for m, d in sorted(descriptors.items()))
        )
    flags = {hardware.isa_signature(descriptors[m]) for m in chosen} - {None}
    if len(flags) > 1:
        listing = "; ".join(f"{m}: {hardware.short(descriptors[m])}" for m in chosen)
        raise GradtuneError(
            f"the records for this target come from machines with different ISA flags "
            f"({listing}); pass machines 'all' to mix them, or the ids to train on"
        )
    return chosen
