"""Regenerates the TVMScript operator set the symbolic tests verify (run from the repo root:
``python tests/ops/make_ops.py``). Shapes are small so that each replay stays cheap."""

from pathlib import Path

import tvm
from tvm import te, topi


def ops() -> dict:
    out = {}
    x = te.placeholder((16, 64), name="X")
    w = te.placeholder((48, 64), name="W")
    b = te.placeholder((48,), name="B")
    out["dense_bias_relu"] = [x, w, b, topi.nn.relu(topi.add(topi.nn.dense(x, w), b))]
    a = te.placeholder((4, 32, 48), name="A")
    bb = te.placeholder((4, 64, 48), name="B")
    out["batch_matmul"] = [a, bb, topi.nn.batch_matmul(a, bb)]
    x = te.placeholder((1, 16, 30, 30), name="X")
    w = te.placeholder((32, 16, 3, 3), name="W")
    out["conv2d_nchw_s2"] = [x, w, topi.nn.conv2d_nchw(x, w, 2, 1, 1)]
    x = te.placeholder((1, 30, 30, 16), name="X")
    w = te.placeholder((3, 3, 16, 32), name="W")
    out["conv2d_nhwc_s2"] = [x, w, topi.nn.conv2d_nhwc(x, w, 2, 1, 1)]
    x = te.placeholder((1, 32, 28, 28), name="X")
    w = te.placeholder((32, 1, 3, 3), name="W")
    out["depthwise_conv2d"] = [x, w, topi.nn.depthwise_conv2d_nchw(x, w, 1, 1, 1)]
    x = te.placeholder((1, 32, 8, 8), name="X")
    w = te.placeholder((32, 16, 4, 4), name="W")
    out["conv2d_transpose"] = [
        x,
        w,
        topi.nn.conv2d_transpose_nchw(x, w, (2, 2), (1, 1), "float32", (0, 0)),
    ]
    x = te.placeholder((1, 8, 8, 14, 14), name="X")
    w = te.placeholder((16, 8, 3, 3, 3), name="W")
    out["conv3d"] = [x, w, topi.nn.conv3d_ncdhw(x, w, 1, 1, 1, 1)]
    x = te.placeholder((8, 256), name="X")
    out["softmax"] = [x, topi.nn.softmax(x)]
    x = te.placeholder((16, 128), name="X")
    g = te.placeholder((128,), name="G")
    bt = te.placeholder((128,), name="Beta")
    out["layer_norm"] = [x, g, bt, topi.nn.layer_norm(x, g, bt, axis=[1])]
    x = te.placeholder((1, 32, 28, 28), name="X")
    out["max_pool2d"] = [x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max")]
    # Shapes and operators the region derivations were not developed on: no transposed operand,
    # odd sizes with stride 3 and dilation 2, a softmax over a broadcast sum (attention scores).
    a = te.placeholder((12, 50, 64), name="A")
    bb = te.placeholder((12, 64, 50), name="B")
    out["batch_matmul_nn"] = [a, bb, topi.nn.batch_matmul(a, bb, transpose_b=False)]
    x = te.placeholder((1, 12, 29, 31), name="X")
    w = te.placeholder((20, 12, 3, 3), name="W")
    out["conv2d_nchw_s3_d2"] = [x, w, topi.nn.conv2d_nchw(x, w, 3, 2, 2)]
    s = te.placeholder((1, 3, 50, 50), name="S")
    m = te.placeholder((1, 1, 50, 50), name="M")
    out["softmax_broadcast"] = [s, m, topi.nn.softmax(topi.add(s, m), axis=-1)]
    return out


if __name__ == "__main__":
    here = Path(__file__).parent
    for name, tensors in ops().items():
        mod = tvm.IRModule({"main": te.create_prim_func(tensors)})
        (here / f"{name}.tvmscript").write_text(mod.script())
        print(name)
