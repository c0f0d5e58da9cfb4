"""Every example runs at a tiny size and agrees with its own independent check."""
import importlib.util
import pathlib

import numpy as np

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


def test_dp_sgd_digits_runs_and_accounts(capsys):
    acc, eps = load("dp_sgd_digits").main(["--device", "cpu", "--limit", "256", "--epochs", "1", "--quiet"])
    assert 0.0 <= acc <= 1.0 and np.isfinite(eps) and eps > 0
    out = capsys.readouterr().out
    assert "test accuracy" in out and "ε =" in out


def test_dp_sgd_digits_without_dp():
    acc, eps = load("dp_sgd_digits").main(["--device", "cpu", "--no-dp", "--epochs", "4", "--limit", "256", "--quiet"])
    assert eps is None and acc > 0.3  # four epochs of ordinary training already learn something


def test_ensemble_vmapped_training_equals_one_by_one():
    accs, ens_acc, worst = load("ensemble").main(["--device", "cpu", "--members", "3", "--steps", "3", "--batch", "8",
                                                  "--quiet"])
    assert len(accs) == 3 and worst < 1e-5
