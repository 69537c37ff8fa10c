import numpy as np
import pytest

from gradtune.errors import GradtuneError
from gradtune.frontend import fingerprint, load_model, parse_input_shapes
from tests.conftest import EXAMPLES


def test_pytorch_import_keeps_reference_and_params(tiny_model):
    assert tiny_model.framework == "pytorch"
    assert [x.shape for x in tiny_model.inputs] == [(4, 64)]
    assert tiny_model.reference_outputs[0].shape == (4, 16)
    assert set(tiny_model.params) == {p.name for p in tiny_model.mod["main"].params[1:]}
    ref = tiny_model.run_reference()
    np.testing.assert_allclose(ref.numpy(), tiny_model.reference_outputs[0])


def test_onnx_import_uses_onnxruntime_reference(tiny_onnx):
    model = load_model(tiny_onnx)
    assert model.framework == "onnx"
    assert model.input_names == ["x"]
    assert model.reference_outputs[0].shape == (4, 16)


def test_onnx_dynamic_input_needs_shape(tmp_path, tiny_onnx):
    import onnx

    m = onnx.load(str(tiny_onnx))
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dyn.onnx"
    onnx.save(m, str(path))
    with pytest.raises(GradtuneError, match="dynamic shape; give it with --input-shape x="):
        load_model(path)
    model = load_model(path, input_shapes={"x": [2, 64]})
    assert model.inputs[0].shape == (2, 64)
    with pytest.raises(GradtuneError, match="unknown input"):
        load_model(path, input_shapes={"y": [2, 64]})


def test_fingerprint_tracks_content_entry_and_shapes(tmp_path):
    a = tmp_path / "m.py"
    a.write_text("x = 1\n")
    base = fingerprint(a, "get_model", {})
    assert fingerprint(a, "other", {}) != base
    assert fingerprint(a, "get_model", {"x": [1]}) != base
    a.write_text("x = 2\n")
    assert fingerprint(a, "get_model", {}) != base


@pytest.mark.parametrize(
    "items, message",
    [(["x=1,3"], None), (["x=1,a"], "not NAME=D1,D2"), (["=1"], "not NAME=D1,D2")],
)
def test_parse_input_shapes(items, message):
    if message is None:
        assert parse_input_shapes(items) == {"x": [1, 3]}
    else:
        with pytest.raises(GradtuneError, match=message):
            parse_input_shapes(items)


def test_missing_model_file(tmp_path):
    with pytest.raises(GradtuneError, match="model file not found"):
        load_model(tmp_path / "nope.py")


def test_example_entry_points_exist():
    assert (EXAMPLES / "small_cnn.py").exists()
