"""Every example runs at a tiny size and agrees with its own independent check."""
import importlib.util
import pathlib

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart(capsys):
    worst = load("quickstart").main(["--device", "cpu", "--steps", "4", "--batch", "16", "--dim", "8", "--hidden", "8"])
    assert worst < 1e-5
    assert "vmap(grad)" in capsys.readouterr().out


def test_per_example_grads():
    assert load("per_example_grads").main(["--device", "cpu", "--batch", "4"]) < 1e-4


def test_jacobians():
    assert load("jacobians").main(["--device", "cpu", "--inputs", "4", "--hidden", "5", "--outputs", "2"]) < 1e-6
