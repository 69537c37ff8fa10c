import numpy as np
import pytest

from gradtune import compilation
from gradtune.errors import GradtuneError
from gradtune.partition import prepare


def test_untuned_build_matches_reference_and_exports(tiny_model, llvm_target, tmp_path):
    fused = prepare(tiny_model.mod, tiny_model.params, llvm_target)
    executable = compilation.build(fused, llvm_target)
    runner = compilation.Runner(executable, llvm_target, tiny_model.inputs)
    err = compilation.verify(runner.outputs(), tiny_model.reference_outputs, "untuned")
    assert err < 1e-4
    lib = compilation.export(executable, tmp_path / "m.so")
    vm, dev = compilation.load_exported(lib)
    import tvm

    out = compilation.flatten_outputs(vm["main"](tvm.runtime.tensor(tiny_model.inputs[0], dev)))
    np.testing.assert_allclose(out[0], tiny_model.reference_outputs[0], rtol=1e-4, atol=1e-5)


def test_verify_rejects_wrong_outputs():
    ref = [np.ones((2, 3), dtype="float32")]
    with pytest.raises(GradtuneError, match="differ from the reference"):
        compilation.verify([ref[0] + 0.5], ref, "tuned TVM")
    with pytest.raises(GradtuneError, match="returns 2 outputs"):
        compilation.verify([ref[0], ref[0]], ref, "tuned TVM")


def test_time_interleaved_reports_each_contender():
    import time

    result = compilation.time_interleaved(
        {"fast": lambda: None, "slow": lambda: time.sleep(0.002)}, repeats=3, min_seconds=0.01
    )
    assert set(result) == {"fast", "slow"}
    assert result["slow"] >= 2.0 > result["fast"]
