import math

import pytest

from gradtune.partition import kernel_class, partition


@pytest.mark.parametrize(
    "name, expected",
    [
        (
            "fused_conv2d2_subtract1_divide1_multiply1_add4_relu1",
            "conv2d+subtract+divide+multiply+add+relu",
        ),
        ("fused_matmul_add5", "matmul+add"),
        ("mean", "mean"),
        ("fused_conv3d1_add", "conv3d+add"),
        ("fused_conv2d_transpose1_add2", "conv2d_transpose+add"),
    ],
)
def test_kernel_class_drops_counters(name, expected):
    assert kernel_class(name) == expected


def test_partition_tiny_mlp(tiny_model, llvm_target):
    fused, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    assert "main" in [gv.name_hint for gv in fused.functions]
    classes = sorted(t.kernel_class for t in tasks)
    assert "matmul+add+relu" in classes and "matmul+add" in classes
    for task in tasks:
        assert task.weight == 1
        assert task.flops > 0
        assert math.isfinite(task.untuned_us) and task.untuned_us > 0
        assert task.mod["main"] is not None


def test_repeated_layers_share_one_task_with_weight(llvm_target):
    import torch
    from torch import nn
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU()).eval()
    x = torch.randn(2, 32)
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    names = [v.name for v in mod["main"].params[1:]]
    _, tasks = partition(mod, dict(zip(names, params["main"], strict=True)), llvm_target)
    assert [t.weight for t in tasks] == [2]
