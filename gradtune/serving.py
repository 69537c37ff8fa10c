"""The registered model's code (MLflow "models from code"): runs the compiled Relax VM.

Self-contained on purpose (TVM, NumPy, MLflow only): MLflow copies this file into the model
artifacts, so a deployment needs TVM but not gradtune. Input: an array, a list of arrays in
input order, or ``{input name: array}``; output: an array, or a list for several outputs.

Loading the library runs its code, so ``load_context`` first checks every artifact against
the SHA-256 recorded at registration (the ``checksums`` artifact). That file sits in the same
artifact store as the library: the check catches a swapped or corrupted library, not someone
who rewrites the whole model directory (this file included). ``gradtune pull`` checks every
file against the registry's tags instead, before MLflow loads anything.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np


def _flatten(out: Any) -> list:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [array for item in out for array in _flatten(item)]


class IntegrityError(RuntimeError):
    """An artifact differs from what was registered; nothing of it was loaded."""


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_artifacts(artifacts: dict[str, str]) -> None:
    """Raise IntegrityError unless every artifact matches its digest in ``checksums``."""
    if "checksums" not in artifacts:
        raise IntegrityError("the model has no checksums artifact; refusing to load its library")
    registered = json.loads(Path(artifacts["checksums"]).read_text())
    for key, path in sorted(artifacts.items()):
        if key != "checksums" and registered.get(key) != _sha256(path):
            raise IntegrityError(
                f"{Path(path).name} does not match its registered SHA-256; refusing to load it"
            )


class TVMRelaxModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        verify_artifacts(context.artifacts)  # before load_module runs the library's code
        import tvm
        from tvm import relax

        self.io = json.loads(Path(context.artifacts["io"]).read_text())
        self.dev = tvm.cpu(0) if self.io.get("device", "cpu") == "cpu" else tvm.cuda(0)
        lib = tvm.runtime.load_module(context.artifacts["lib"])
        self.vm = relax.VirtualMachine(lib, self.dev)
        self.main = self.vm["main"]  # each lookup makes a new function: once per load

    # The hint is for MLflow, which reads it when this class is defined: for an ndarray it
    # neither validates nor converts the input (a list or dict passes as it is), while no hint
    # at all prints a "type hints" warning on every registration and load that a warnings
    # filter cannot silence (MLflow re-enables UserWarnings around that check).
    def predict(self, context, model_input: np.ndarray, params=None):
        import tvm

        specs = self.io["inputs"]
        if isinstance(model_input, dict):
            arrays = [model_input[spec["name"]] for spec in specs]
        elif isinstance(model_input, list | tuple):
            arrays = list(model_input)
        else:
            arrays = [model_input]
        if len(arrays) != len(specs):
            raise ValueError(f"model takes {len(specs)} input(s), got {len(arrays)}")
        args = [
            tvm.runtime.tensor(
                np.asarray(array, dtype=spec["dtype"]).reshape(spec["shape"]), self.dev
            )
            for array, spec in zip(arrays, specs, strict=True)
        ]
        outputs = _flatten(self.main(*args))
        return outputs[0] if len(outputs) == 1 else outputs


mlflow.models.set_model(TVMRelaxModel())
