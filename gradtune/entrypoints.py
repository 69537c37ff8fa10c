"""Prefect flows and tasks, loaded by file path from the checkout's ``flows/`` and ``tasks/``.

Those directories sit beside the ``gradtune`` package, where a ``prefect.yaml`` entrypoint
names them (``flows/tune_model.py:tune_model``). They are not installed: as top-level packages
``flows`` and ``tasks`` would clash with a user's modules of the same names. So the CLI loads
a flow by path, and a flow loads its tasks by a path relative to its own file, which works from
any working directory and under Prefect's own entrypoint loader alike. Each file becomes a
module named ``gradtune_<directory>_<stem>``, loaded once per process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import GradtuneError

ROOT = Path(__file__).resolve().parents[1]  # the checkout: gradtune/, flows/, tasks/


def load_module(path: str | Path) -> ModuleType:
    """The Python file ``path`` as a module (loaded on the first call, then reused)."""
    path = Path(path).resolve()
    name = f"gradtune_{path.parent.name}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise GradtuneError(
            f"{path} not found: gradtune runs its Prefect flows from a source checkout "
            "(pip install -e .)"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: Prefect resolves the flows' annotations through sys.modules.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_tasks(name: str, flow_file: str) -> ModuleType:
    """``tasks/<name>.py`` of the checkout holding ``flow_file`` (a flow's ``__file__``)."""
    return load_module(Path(flow_file).resolve().parents[1] / "tasks" / f"{name}.py")


def load_flow(name: str, function: str | None = None) -> Any:
    """The flow ``function`` (default: ``name``) defined in ``flows/<name>.py``."""
    return getattr(load_module(ROOT / "flows" / f"{name}.py"), function or name)


def call_in_module(path: str, function: str, *args: Any, **kwargs: Any) -> Any:
    """``function`` of the file ``path``, called: how another process (a Dask worker) runs a
    function of a flow file, which it cannot unpickle by reference."""
    return getattr(load_module(path), function)(*args, **kwargs)
