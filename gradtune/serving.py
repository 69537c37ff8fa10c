"""The registered model's code (MLflow "models from code"): runs the compiled Relax VM.

Self-contained on purpose (TVM, NumPy, MLflow only): MLflow copies this file into the model
artifacts, so a deployment needs TVM but not gradtune. Input: an array, a list of arrays in
input order, or ``{input name: array}``; output: an array, or a list for several outputs.
"""

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np


def _flatten(out: Any) -> list:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [array for item in out for array in _flatten(item)]


class TVMRelaxModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        import tvm
        from tvm import relax

        self.io = json.loads(Path(context.artifacts["io"]).read_text())
        self.dev = tvm.cpu(0) if self.io.get("device", "cpu") == "cpu" else tvm.cuda(0)
        lib = tvm.runtime.load_module(context.artifacts["lib"])
        self.vm = relax.VirtualMachine(lib, self.dev)

    def predict(self, context, model_input, params=None):
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
        outputs = _flatten(self.vm["main"](*args))
        return outputs[0] if len(outputs) == 1 else outputs


mlflow.models.set_model(TVMRelaxModel())
