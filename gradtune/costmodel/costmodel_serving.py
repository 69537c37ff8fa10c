"""The registered cost model's code (MLflow "models from code"): gradtune's pretrained MLP.

Input: one program's per-store features as a (stores, 164) array, or a list of them (features
as ``gradtune.symbolic`` computes them, smooth mode); output: one score per program, higher =
predicted faster (only the order within a workload is meaningful).
"""

import mlflow
import numpy as np


class CostModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        from gradtune.costmodel.model import load

        self.model = load(context.artifacts["weights"])

    # An ndarray hint is the one MLflow neither validates nor converts by (a list passes as
    # it is); without a hint it warns on every registration, past any warnings filter.
    def predict(self, context, model_input: np.ndarray, params=None):
        import torch

        programs = model_input if isinstance(model_input, list) else [model_input]
        tensors = [torch.as_tensor(np.asarray(p, dtype=np.float32)) for p in programs]
        with torch.no_grad():
            return self.model.score(tensors).numpy()


mlflow.models.set_model(CostModel())
