"""Retune on change: which models to retune (``configs/models.yaml``), and whether each changed.

A model is retuned when its *fingerprint* differs from the one tagged on its registered
``champion``. The fingerprint covers what determines a tuning result and nothing else:

- the imported Relax graph (its TVMScript text) and every weight's bytes, so a comment, a
  reformatting or a renamed local variable in the model's file changes nothing, while a new
  layer or new weights do;
- the resolved target (the host CPU's ``mcpu`` included: a champion tuned on another CPU is
  no champion here);
- TVM's version, and gradtune's: its package version plus a digest of the package's files
  (the search, the cost model's weights). The package version alone stays 0.1.0 across every
  change of the code that makes the schedules, and the git commit would change on every
  commit of the repository, a README edit included, retuning every model for nothing. The
  commit is recorded too, as provenance (``gradtune.provenance``), not as part of the key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from .errors import GradtuneError

PACKAGE = Path(__file__).resolve().parent


@dataclass
class ModelSpec:
    """One model of the retune config.

    Parameters
    ----------
    path : str
        A ``.py`` file defining ``entry``, or a ``.onnx`` file; relative to the config file.
    entry : str, default "get_model"
        Function of the ``.py`` file returning ``(nn.Module, example inputs)``.
    name : str | None, default None
        Registered model name; None: ``gradtune-<file stem>`` as ``gradtune tune`` names it.
    input_shapes : dict[str, list[int]], default {}
        Shapes of an ONNX model's dynamic inputs.
    rtol : float | None, default None
        Relative tolerance of the output check; None: ``compilation.RTOL``.
    atol_scale : float | None, default None
        Absolute tolerance as a fraction of the output's scale; None: ``compilation.ATOL_SCALE``.
    """

    path: str
    entry: str = "get_model"
    name: str | None = None
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    rtol: float | None = None
    atol_scale: float | None = None


_SPEC_KEYS = frozenset(ModelSpec.__dataclass_fields__)


def load_config(config: str | Path) -> list[ModelSpec]:
    """The models of a retune config (``models: [{path: ..., ...}, ...]``), paths resolved
    against the config's directory's parent when they name a repository path (``models/x.py``
    in ``configs/models.yaml``), else against the config's own directory."""
    config = Path(config)
    if not config.is_file():
        raise GradtuneError(f"retune config not found: {config}")
    import yaml

    try:
        data = yaml.safe_load(config.read_text()) or {}
    except yaml.YAMLError as err:
        raise GradtuneError(f"{config} is not valid YAML: {err}".splitlines()[0]) from None
    entries = data.get("models") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise GradtuneError(f"{config} lists no models (expected 'models: [{{path: ...}}, ...]')")
    specs = []
    for i, entry in enumerate(entries):
        entry = {"path": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or "path" not in entry:
            raise GradtuneError(f"{config}: models[{i}] has no 'path'")
        unknown = set(entry) - _SPEC_KEYS
        if unknown:
            raise GradtuneError(
                f"{config}: models[{i}] has unknown key(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(_SPEC_KEYS))}"
            )
        spec = ModelSpec(**entry)
        spec.path = str(resolve_model_path(spec.path, config))
        specs.append(spec)
    return specs


def resolve_model_path(path: str, config: Path) -> Path:
    """``path`` as written in ``config``: relative to the checkout holding ``configs/`` (the
    config's parent directory) or, failing that, to the config itself."""
    p = Path(path)
    if p.is_absolute():
        return p
    for base in (config.resolve().parent.parent, config.resolve().parent):
        if (base / p).exists():
            return base / p
    return config.resolve().parent.parent / p  # missing: check_model_file says so


def select(specs: list[ModelSpec], wanted: list[str]) -> list[ModelSpec]:
    """The specs named by ``wanted`` (paths or registered names); all when empty. A path the
    config does not list is retuned with the defaults."""
    if not wanted:
        return specs
    chosen = []
    for item in wanted:
        hits = [
            s
            for s in specs
            if item in (registered_name(s), Path(s.path).stem)
            or Path(item).resolve() == Path(s.path).resolve()
        ]
        chosen.extend(hits or [ModelSpec(path=item)])
    return chosen


def registered_name(spec: ModelSpec) -> str:
    """The name ``gradtune tune`` would register the model under."""
    if spec.name:
        return spec.name
    stem = Path(spec.path).stem + ("" if spec.entry == "get_model" else f"-{spec.entry}")
    return f"gradtune-{stem}".replace("_", "-")


@cache
def gradtune_version() -> str:
    """``<package version>+src.<digest of the package's files>`` (code and bundled weights)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("gradtune")
    except PackageNotFoundError:
        release = "0+unknown"
    return f"{release}+src.{source_digest(PACKAGE)}"


def source_digest(root: Path) -> str:
    """12 hex digits over every file under ``root`` (names and contents), bytecode aside."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


def fingerprint_parts(model: Any, target: dict[str, Any]) -> dict[str, str]:
    """What the fingerprint digests, each part readable or a digest: graph, weights, target,
    TVM and gradtune versions. ``model`` is a ``frontend.ImportedModel``."""
    import tvm

    weights = hashlib.sha256()
    for name in sorted(model.params):
        array = model.params[name].numpy()
        weights.update(f"{name}:{array.dtype}:{list(array.shape)}\0".encode())
        weights.update(array.tobytes())
    return {
        "graph": hashlib.sha256(model.mod.script().encode()).hexdigest(),
        "weights": weights.hexdigest(),
        "target": json.dumps(target, sort_keys=True),
        "tvm": tvm.__version__,
        "gradtune": gradtune_version(),
    }


def fingerprint(parts: dict[str, str]) -> str:
    """The fingerprint of ``fingerprint_parts``: 16 hex digits."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint_stage(model: Any, target: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(fingerprint, its parts) of an imported model for ``target``."""
    parts = fingerprint_parts(model, target)
    return fingerprint(parts), parts


class ChallengerRejected(GradtuneError):
    """A retuned model failed verification: registered as ``challenger``, never promoted.

    Its own exit code tells CI that the retune ran but produced nothing deployable."""

    exit_code = 4
