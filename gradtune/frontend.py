"""Import a PyTorch or ONNX model into TVM Relax, keeping reference outputs for the numerics check.

PyTorch goes through ``torch.export`` → ``from_exported_program``; ONNX through Relax's ONNX
frontend with ONNX Runtime as the reference. Weights become a separate ``params`` dict
(``detach_params``) so the tuning tasks and the compiled library agree on function signatures.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import GradtuneError


@dataclass
class ImportedModel:
    """A model in Relax plus what is needed to check and time it against its source framework."""

    name: str
    framework: str  # "pytorch" | "onnx"
    mod: Any  # tvm.IRModule with a Relax "main"
    params: dict[str, Any]  # name -> tvm.runtime.Tensor, bound into "main" before tuning
    inputs: list[np.ndarray]
    reference_outputs: list[np.ndarray]
    run_reference: Callable[[], Any] = field(repr=False)  # one inference in the source framework
    input_names: list[str] = field(default_factory=list)
    # The torch.nn.Module or onnx.ModelProto itself: what the peers (gradtune.peers) start from.
    source: Any = field(default=None, repr=False)


def load_model(
    path: str | Path, entry: str = "get_model", input_shapes: dict[str, list[int]] | None = None
) -> ImportedModel:
    """Load ``path`` (``.onnx`` or a Python file defining ``entry``) into Relax, after running it
    once on its example inputs in its own framework.

    The last import is kept: the CLI imports the model before anything starts, so that a model
    that cannot be imported is refused at once, and the flow's import stage, in the same
    process, then reuses that import rather than doing it again. The key holds the file's
    content, so an edited file is imported afresh.
    """
    path = Path(path)
    input_shapes = input_shapes or {}
    check_model_file(path, input_shapes)
    key = (str(path.resolve()), fingerprint(path, entry, input_shapes))
    if key in _last_import:
        return _last_import[key]
    if path.suffix == ".onnx":
        model = load_onnx(path, input_shapes)
    else:
        model = load_pytorch(path, entry)
    _last_import.clear()
    _last_import[key] = model
    return model


_last_import: dict[tuple[str, str], ImportedModel] = {}


def check_model_file(path: str | Path, input_shapes: dict[str, list[int]]) -> None:
    """Refuse, without importing anything, a model path ``load_model`` cannot read."""
    path = Path(path)
    if not path.exists():
        raise GradtuneError(f"model file not found: {path}")
    if not path.is_file():
        raise GradtuneError(f"model path is not a file: {path}")
    if path.suffix not in (".onnx", ".py"):
        raise GradtuneError(f"unsupported model file {path.name}: expected a .py or .onnx file")
    if path.suffix == ".py" and input_shapes:
        raise GradtuneError("--input-shape applies to ONNX models only")
    for name, dims in input_shapes.items():
        if not dims or not all(isinstance(d, int) and d > 0 for d in dims):
            raise GradtuneError(
                f"--input-shape {name}={','.join(map(str, dims))}: every dimension must be a "
                "positive integer"
            )


def fingerprint(path: str | Path, entry: str, input_shapes: dict[str, list[int]]) -> str:
    """Identifies a model (file content + entry + shapes) without importing it."""
    digest = hashlib.sha256(Path(path).read_bytes())
    digest.update(entry.encode() + repr(sorted(input_shapes.items())).encode())
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------- PyTorch


def _call_entry(path: Path, entry: str):
    spec = importlib.util.spec_from_file_location(f"gradtune_user_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.export resolves classes through sys.modules
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise GradtuneError(f"{path} failed to import: {type(err).__name__}: {err}") from None
    fn = getattr(module, entry, None)
    if fn is None or not callable(fn):
        raise GradtuneError(f"{path} has no function {entry!r} (choose one with --entry)")
    try:
        return fn()
    except Exception as err:
        raise GradtuneError(f"{path}:{entry}() raised {type(err).__name__}: {err}") from None


def load_pytorch(path: Path, entry: str = "get_model") -> ImportedModel:
    """``entry()`` must return ``(torch.nn.Module, example_inputs)``; inputs a tensor or tuple."""
    import torch

    result = _call_entry(path, entry)
    shape_msg = f"{path}:{entry}() must return (torch.nn.Module, example input tensor(s))"
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise GradtuneError(f"{shape_msg}, got {type(result).__name__}")
    model, example = result
    if not isinstance(model, torch.nn.Module):
        raise GradtuneError(f"{shape_msg}, got {type(model).__name__} as the model")
    example = (example,) if isinstance(example, torch.Tensor) else tuple(example)
    if not example or not all(isinstance(t, torch.Tensor) for t in example):
        raise GradtuneError(f"{shape_msg}; the inputs are not tensors")

    model = model.eval()
    try:
        with torch.no_grad():
            ref = model(*example)
    except Exception as err:
        raise GradtuneError(
            f"{path}:{entry}(): the model fails on its own example inputs: "
            f"{type(err).__name__}: {_first_line(err)}"
        ) from None
    ref_list = [ref] if isinstance(ref, torch.Tensor) else ref
    if not (
        isinstance(ref_list, tuple | list) and all(isinstance(t, torch.Tensor) for t in ref_list)
    ):
        raise GradtuneError(
            f"{path}:{entry}(): the model must return a tensor or a tuple of tensors, "
            f"got {type(ref).__name__}"
        )
    ref_list = list(ref_list)

    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    try:
        exported = torch.export.export(model, example)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise GradtuneError(f"torch.export could not trace {path}:{entry}: {first}") from None
    try:
        mod = from_exported_program(exported, keep_params_as_input=True)
    except AssertionError as err:
        # The translator asserts on ops it has no converter for and names them.
        raise GradtuneError(f"TVM cannot import operator(s) of {path.name}: {err}") from None
    except Exception as err:
        raise GradtuneError(
            f"TVM could not import {path.name}: {type(err).__name__}: {_first_line(err)}"
        ) from None
    mod, params = relax.frontend.detach_params(mod)
    params = named_params(mod, params.get("main", []))

    def run_reference():
        with torch.no_grad():
            return model(*example)

    return ImportedModel(
        name=path.stem if entry == "get_model" else f"{path.stem}-{entry}",
        framework="pytorch",
        mod=mod,
        params=params,
        inputs=[t.detach().numpy() for t in example],
        reference_outputs=[t.detach().numpy() for t in ref_list],
        run_reference=run_reference,
        input_names=[f"input{i}" for i in range(len(example))],
        source=model,
    )


def named_params(mod, param_values: list) -> dict[str, Any]:
    """Name the detached weights by the Relax parameters they belong to.

    ``main``'s signature is (inputs..., weights...); the weights are the trailing params.
    """
    main = mod["main"]
    weight_vars = main.params[len(main.params) - len(param_values) :]
    return {v.name: t for v, t in zip(weight_vars, param_values, strict=True)}


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# --------------------------------------------------------------------------- ONNX

_SHAPE_RE = re.compile(r"^[^=]+=\d+(,\d+)*$")


def parse_input_shapes(items: list[str] | None) -> dict[str, list[int]]:
    """``["x=1,3,224,224", ...]`` → ``{"x": [1, 3, 224, 224]}``."""
    shapes: dict[str, list[int]] = {}
    for item in items or []:
        if not _SHAPE_RE.match(item):
            raise GradtuneError(f"--input-shape {item!r} is not NAME=D1,D2,... with integer dims")
        name, dims = item.split("=", 1)
        shapes[name] = [int(d) for d in dims.split(",")]
    return shapes


_NP_DTYPES = {1: np.float32, 6: np.int32, 7: np.int64, 10: np.float16, 11: np.float64}


def load_onnx(path: Path, input_shapes: dict[str, list[int]]) -> ImportedModel:
    import onnx

    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:
        raise GradtuneError(f"{path} is not a valid ONNX model: {_first_line(err)}") from None

    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    unknown = set(input_shapes) - {i.name for i in graph_inputs}
    if unknown:
        raise GradtuneError(
            f"--input-shape names unknown input(s) {sorted(unknown)}; the model's inputs are "
            f"{[i.name for i in graph_inputs]}"
        )
    shapes: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    inputs: list[np.ndarray] = []
    rng = np.random.default_rng(0)
    for inp in graph_inputs:
        tensor_type = inp.type.tensor_type
        np_dtype = _NP_DTYPES.get(tensor_type.elem_type)
        if np_dtype is None:
            raise GradtuneError(f"ONNX input {inp.name!r} has an unsupported element type")
        if inp.name in input_shapes:
            shape = input_shapes[inp.name]
        else:
            dims = tensor_type.shape.dim
            if any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims):
                raise GradtuneError(
                    f"ONNX input {inp.name!r} has a dynamic shape; give it with "
                    f"--input-shape {inp.name}=D1,D2,..."
                )
            shape = [d.dim_value for d in dims]
        shapes[inp.name] = shape
        dtypes[inp.name] = np.dtype(np_dtype).name
        if np.issubdtype(np_dtype, np.floating):
            inputs.append(rng.standard_normal(shape).astype(np_dtype))
        else:
            inputs.append(rng.integers(0, 2, size=shape).astype(np_dtype))

    # The reference run first: it checks the model on its inputs without importing TVM.
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as err:
        raise GradtuneError(f"ONNX Runtime cannot load {path}: {_first_line(err)}") from None
    feed = dict(zip(shapes, inputs, strict=True))
    try:
        reference = session.run(None, feed)
    except Exception as err:
        raise GradtuneError(
            f"ONNX Runtime cannot run {path} on its inputs {shapes}: {_first_line(err)}"
        ) from None

    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = from_onnx(model, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=True)
    except Exception as err:
        raise GradtuneError(f"TVM could not import {path.name}: {_first_line(err)}") from None
    mod, params = relax.frontend.detach_params(mod)
    params = named_params(mod, params.get("main", []))

    return ImportedModel(
        name=path.stem,
        framework="onnx",
        mod=mod,
        params=params,
        inputs=inputs,
        reference_outputs=[np.asarray(r) for r in reference],
        run_reference=lambda: session.run(None, feed),
        input_names=list(shapes),
        source=model,
    )
