import pytest

from gradtune.errors import GradtuneError
from gradtune.target import parse_target


def test_default_target_names_host_cpu_and_cores():
    config = parse_target(None)
    assert config["kind"] == "llvm"
    assert config["mcpu"] and config["mcpu"] != "generic"
    assert config["num-cores"] >= 1


def test_bare_llvm_gets_mcpu_too():
    assert "mcpu" in parse_target("llvm")
    assert parse_target('{"kind": "llvm", "num-cores": 1}')["num-cores"] == 1


def test_cuda_target_builds_without_gpu():
    config = parse_target("cuda")
    assert config["kind"] == "cuda" and config["max_threads_per_block"] == 1024
    # (tests/test_symbolic_gpu.py verifies an operator with a bare --target cuda.)
    custom = parse_target('{"kind": "cuda", "max_threads_per_block": 256}')
    assert custom["max_threads_per_block"] == 256 and custom["arch"] == "sm_80"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nosuchkind", "TVM does not know the target"),
        ('{"kind": "llvm", "bogus": 1}', "Unknown config option 'bogus'"),
        ("{not json", "not valid JSON"),
        ("c", "not supported by gradtune"),
    ],
)
def test_bad_targets_are_one_line_errors(spec, message):
    with pytest.raises(GradtuneError, match=message):
        parse_target(spec)
