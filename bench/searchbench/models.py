"""The benchmark's models: the four examples (zoo models) and four held out of the zoo.

The examples are zoo models, so the gradient search's cost model is pretrained without every
workload the dataset attributes to them (``zoo_name``). The held-out models are in no zoo;
they still leave out any training workload that happens to hash like one of their tasks.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BenchModel:
    """One benchmark model.

    Parameters
    ----------
    name : str
        Row name in the results; also the run directories' name.
    source : Path
        The ``get_model()`` Python file (for an ONNX model: the file that exports it).
    zoo_name : str or None, default None
        The zoo model it is (the dataset manifest's ``models`` entry), None if held out.
    onnx : bool, default False
        Tune the ONNX export (written into the work dir by ``export_onnx(path)``).
    """

    name: str
    source: Path
    zoo_name: str | None = None
    onnx: bool = False

    def tuning_file(self, work: Path) -> Path:
        """The file ``gradtune tune`` is given; an ONNX model is exported on first use (named
        by its source's hash, so an edited source is exported afresh)."""
        if not self.onnx:
            return self.source
        path = work / "models" / f"{self.name}-{self.source_sha1()[:10]}.onnx"
        if not path.is_file():
            spec = importlib.util.spec_from_file_location(f"bench_model_{self.name}", self.source)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.export_onnx(path)
        return path

    def source_sha1(self) -> str:
        return hashlib.sha1(self.source.read_bytes()).hexdigest()


def _example(name: str) -> BenchModel:
    return BenchModel(name, ROOT / "examples" / f"{name}.py", zoo_name=name)


def _held_out(name: str, onnx: bool = False) -> BenchModel:
    return BenchModel(name, ROOT / "bench" / "models" / f"{name}.py", onnx=onnx)


MODELS: dict[str, BenchModel] = {
    m.name: m
    for m in (
        _example("resnet18_like"),
        _example("mobilenetv2_like"),
        _example("transformer_encoder"),
        _example("dcgan_like"),
        _held_out("mbconv_se"),
        _held_out("unet_small"),
        _held_out("bert_block", onnx=True),
        _held_out("squeeze_fire", onnx=True),
    )
}
