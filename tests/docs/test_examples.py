"""Every example runs at a tiny size and agrees with its own independent check; as a
command (a subprocess, stderr a pipe) each one shows its defaults in ``--help``, rejects
non-positive sizes with an argparse error (exit status 2, no traceback), and writes no
carriage returns to a non-terminal."""
import importlib.util
import io
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/<area>/this file
EXAMPLES = ROOT / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(name, *args, timeout=300):
    """``python examples/<name>.py args...`` with stdout and stderr pipes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=timeout)


def test_quickstart(capsys):
    worst = load("quickstart").main(["--device", "cpu", "--steps", "4", "--batch", "16", "--dim", "8", "--hidden", "8"])
    assert worst < 1e-5
    assert "vmap(grad)" in capsys.readouterr().out


def test_per_example_grads():
    assert load("per_example_grads").main(["--device", "cpu", "--batch", "4"]) < 1e-4


def test_jacobians():
    assert load("jacobians").main(["--device", "cpu", "--inputs", "4", "--hidden", "5", "--outputs", "2"]) < 1e-6


# The main job (dp_sgd_digits) is slow: scikit-learn and its digits take a second to load.
@pytest.mark.slow
def test_dp_sgd_digits_runs_and_accounts(capsys):
    acc, eps = load("dp_sgd_digits").main(["--device", "cpu", "--limit", "256", "--epochs", "1", "--progress", "off"])
    assert 0.0 <= acc <= 1.0 and np.isfinite(eps) and eps > 0
    out = capsys.readouterr().out
    assert "test accuracy" in out and "ε =" in out
    # both accountants: the PLD's ε (tight) below the RDP's (an upper bound)
    eps_rdp, eps_pld = (float(v) for v in re.search(r"ε = ([0-9.]+), δ = .*?ε = ([0-9.]+) by its privacy loss", out).groups())
    assert eps_rdp == pytest.approx(eps, abs=0.006) and 0 < eps_pld < eps_rdp


@pytest.mark.slow
def test_dp_sgd_digits_jit_and_eager_agree(capsys):
    """The main job's step under jit (the default: Poisson batches padded to a few sizes,
    masked) and with --eager (unpadded batches, op by op) reaches the same test accuracy and
    ε (seeded); ε is TF Privacy's compute_dp_sgd_privacy of (N, batch, epochs, σ, δ) alone,
    whatever the padding; the jitted step traced once per padded size."""
    from cuvmap import dp

    args = ["--device", "cpu", "--limit", "256", "--batch", "48", "--epochs", "5", "--noise", "1.0",
            "--progress", "off"]
    example = load("dp_sgd_digits")
    acc_jit, eps_jit = example.main(args)
    out = capsys.readouterr().out
    acc_eager, eps_eager = example.main(args + ["--eager"])
    eager_out = capsys.readouterr().out
    assert acc_jit == acc_eager and acc_jit > 0.2  # 27 steps already learn something
    assert eps_jit == eps_eager == pytest.approx(dp.epsilon(256, 48, 5, 1.0, 1e-5), rel=1e-12)
    match = re.search(r"jit: (\d+) traces?, batches of (\d+)-(\d+) examples padded to ([\d, ]+)\n", out)
    assert match, out
    traces, low, high = (int(g) for g in match.groups()[:3])
    padded = [int(v) for v in match.group(4).split(", ")]
    assert traces == len(padded) and low < high  # the batch size changed; the traces did not follow it
    assert padded == [dp.bucket_for(b, dp.batch_buckets(48, 256)) for b in padded]  # sizes of the ladder
    assert padded[0] <= high <= padded[-1]
    assert "[eager]" in eager_out and "jit:" not in eager_out


@pytest.mark.slow
def test_dp_sgd_digits_ghost_and_per_example_clipping_agree(capsys):
    """The default clipping (dp.clipped_grad: ghost norms and book-keeping) and --clipping
    per_example (every example's vmap(grad) gradient, clipped) compute the same clipped sums,
    so the runs reach the same test accuracy (their float32 roundings differ) and the same ε."""
    args = ["--device", "cpu", "--limit", "256", "--batch", "48", "--epochs", "5", "--noise", "1.0",
            "--progress", "off"]
    example = load("dp_sgd_digits")
    acc_ghost, eps_ghost = example.main(args)
    assert "ghost clipping" in capsys.readouterr().out
    acc_per_example, eps_per_example = example.main(args + ["--clipping", "per_example"])
    assert "per_example clipping" in capsys.readouterr().out
    assert abs(acc_ghost - acc_per_example) <= 0.02 and acc_ghost > 0.2
    assert eps_ghost == eps_per_example


@pytest.mark.slow
def test_dp_sgd_digits_without_dp():
    acc, eps = load("dp_sgd_digits").main(["--device", "cpu", "--no-dp", "--epochs", "4", "--limit", "256",
                                           "--progress", "off"])
    assert eps is None and acc > 0.3  # four epochs of ordinary training already learn something


@pytest.mark.slow
def test_dp_logistic_regression_bandmf_runs_and_audits(capsys):
    """The BandMF example at a tiny size: both mechanisms at the same ε (by PLD), the table
    printed, and the canary audit below the accounted ε."""
    result = load("dp_logistic_regression_bandmf").main(
        ["--device", "cpu", "--limit", "400", "--steps", "24", "--batch", "10", "--seeds", "2", "--audit-runs", "2000"])
    out = capsys.readouterr().out
    assert "| DP-SGD | 1 |" in out and "| BandMF | 4 |" in out and "canary audit" in out
    eps = [float(v) for v in re.findall(r"\| \d+ \| ([0-9.]+) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ ±", out)]
    assert len(eps) == 2 and all(0.99 <= e <= 1.0 for e in eps)      # both calibrated to ε = 1 (PLD)
    for losses, accs in (result["dpsgd"], result["bandmf"]):
        assert len(losses) == 2 and np.all(np.isfinite(losses)) and np.all((0 <= accs) & (accs <= 1))
    lower, accounted = result["audit"]
    assert 0 <= lower < accounted


@pytest.mark.slow
def test_ensemble_vmapped_training_equals_one_by_one():
    accs, ens_acc, worst = load("ensemble").main(["--device", "cpu", "--members", "3", "--steps", "3", "--batch", "8",
                                                  "--progress", "off"])
    assert len(accs) == 3 and worst < 1e-5


@pytest.mark.slow
def test_ensemble_in_float64_matches_one_by_one_to_rounding(capsys):
    accs, ens_acc, worst = load("ensemble").main(["--device", "cpu", "--members", "8", "--steps", "20", "--batch", "8",
                                                  "--dtype", "float64", "--progress", "off"])
    assert worst < 1e-12
    assert "max |vmapped - one by one| in float64: first step's gradients" in capsys.readouterr().out


@pytest.mark.slow
def test_resnet_per_example_dropout_grads_equal_a_loop(capsys):
    acc, worst = load("resnet_per_example").main(["--device", "cpu", "--steps", "3", "--batch", "4", "--width", "4",
                                                  "--progress", "off"])
    assert 0.0 <= acc <= 1.0 and worst < 1e-4
    assert "test accuracy" in capsys.readouterr().out


@pytest.mark.slow
def test_rnn_per_example_grads_equal_a_loop_and_dp_training_runs(capsys):
    worst, acc, eps = load("rnn_per_example").main(["--device", "cpu", "--batch", "8", "--length", "5",
                                                    "--train", "64", "--steps", "4"])
    assert worst < 1e-5 and 0.0 <= acc <= 1.0 and eps > 0
    out = capsys.readouterr().out
    assert "per-example gradients by jit(vmap(grad)) over a scan" in out and "privacy: (ε =" in out


# (name, arguments, check of what main returns): the examples on the GPU at tiny sizes (on
# the strict CuPy stand-in without one: every array they make stays on the device)
GPU_RUNS = [
    ("quickstart", ["--steps", "2", "--batch", "8", "--dim", "8", "--hidden", "8"], lambda worst: worst < 1e-5),
    ("per_example_grads", ["--batch", "4"], lambda worst: worst < 1e-4),
    pytest.param("jacobians", ["--inputs", "4", "--hidden", "5", "--outputs", "2"], lambda worst: worst < 1e-6,
                 marks=pytest.mark.slow),
    pytest.param("dp_sgd_digits", ["--limit", "128", "--epochs", "1", "--progress", "off"],
                 lambda r: 0.0 <= r[0] <= 1.0 and np.isfinite(r[1]), marks=pytest.mark.slow),
    pytest.param("ensemble", ["--members", "2", "--steps", "2", "--batch", "8", "--progress", "off"],
                 lambda r: r[2] < 1e-5, marks=pytest.mark.slow),
    pytest.param("resnet_per_example", ["--steps", "2", "--batch", "4", "--width", "4", "--progress", "off"],
                 lambda r: r[1] < 1e-4, marks=pytest.mark.slow),
    pytest.param("rnn_per_example", ["--batch", "8", "--length", "5", "--train", "64", "--steps", "2"],
                 lambda r: r[0] < 1e-5 and r[2] > 0, marks=pytest.mark.slow),
    pytest.param("dp_logistic_regression_bandmf", ["--limit", "200", "--steps", "8", "--batch", "10", "--seeds", "1"],
                 lambda r: all(np.all(np.isfinite(v[0])) for v in r.values()), marks=pytest.mark.slow),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name, args, check", GPU_RUNS, ids=[getattr(r, "values", r)[0] for r in GPU_RUNS])
def test_examples_on_the_gpu(name, args, check):
    import cuvmap as cv

    if not cv.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    assert check(load(name).main(["--device", "gpu", *args]))


# ---------------------------------------------------------------------------------------
# As commands
# ---------------------------------------------------------------------------------------

# (example, its size options, a default that --help must show)
COMMAND_CASES = [
    ("quickstart", ["--steps", "--batch", "--dim", "--hidden"], "(default: 128)"),
    ("per_example_grads", ["--batch"], "(default: 64)"),
    ("jacobians", ["--inputs", "--hidden", "--outputs"], "(default: 16)"),
    ("dp_sgd_digits", ["--batch", "--epochs", "--limit", "--lr", "--max-norm", "--noise"], "(default: 256)"),
    ("ensemble", ["--members", "--steps", "--batch", "--lr"], "(default: 150)"),
    ("resnet_per_example", ["--steps", "--batch", "--width", "--lr", "--max-norm"], "(default: 200)"),
    ("rnn_per_example", ["--batch", "--length", "--train", "--steps", "--lr", "--max-norm", "--noise"], "(default: 24)"),
    ("dp_logistic_regression_bandmf", ["--epsilon", "--bands", "--steps", "--batch", "--lr", "--max-norm", "--seeds",
                                       "--limit"], "(default: 500)"),
    ("dp_fashion_mnist", ["--batch", "--epochs", "--limit", "--lr", "--max-norm", "--noise"], "(default: 2048)"),
]


def option_help(help_text):
    """``{option: its help text}`` from ``--help``'s options section."""
    blocks, current = {}, None
    for line in help_text.split("\n\n", 1)[1].splitlines():
        match = re.match(r"  (-\S+|--\S+)", line)
        if match:
            current = match.group(1).split(",")[0]
            blocks[current] = line
        elif current and line.startswith("    "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


def _main_exits(name, argv, capsys, monkeypatch):
    """``examples/<name>.py``'s ``main(argv)`` in this process, which must exit (argparse's
    ``--help`` or its error): ``(exit code, stdout, stderr)``. argparse exits before the
    example does any work, so no fresh interpreter is needed (one took a second each)."""
    monkeypatch.setenv("COLUMNS", "100")        # argparse wraps its help at the terminal's width
    module = load(name)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        module.main(list(argv))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.mark.parametrize("name,sizes,default", COMMAND_CASES, ids=[c[0] for c in COMMAND_CASES])
def test_help_shows_defaults(name, sizes, default, capsys, monkeypatch):
    code, out, _ = _main_exits(name, ["--help"], capsys, monkeypatch)
    assert code == 0
    blocks = option_help(out)
    assert default in out
    for option in sizes + ["--device"]:
        assert "(default: " in blocks[option], f"{option} shows no default in:\n{out}"


# every size option at 0, and a few other bad values
BAD_VALUES = [(c[0], option, "0") for c in COMMAND_CASES for option in c[1]] + [
    ("dp_sgd_digits", "--batch", "-3"), ("dp_sgd_digits", "--delta", "1"), ("dp_sgd_digits", "--epochs", "inf"),
    ("ensemble", "--members", "-1"), ("quickstart", "--batch", "x"), ("jacobians", "--hidden", "2.5"),
    ("resnet_per_example", "--dropout", "1"),
    ("dp_logistic_regression_bandmf", "--audit-runs", "-1"), ("dp_logistic_regression_bandmf", "--delta", "0"),
]


@pytest.mark.parametrize("name,option,value", BAD_VALUES)
def test_bad_sizes_are_argparse_errors(name, option, value, capsys, monkeypatch):
    code, _, err = _main_exits(name, [option, value], capsys, monkeypatch)
    assert code == 2, err
    assert "Traceback" not in err, err
    assert f"error: argument {option}:" in err and value in err, err


def test_a_bad_size_from_the_command_line_is_argparse_s_error():
    """The same through a fresh interpreter, as a user types it: exit status 2, the
    message, no traceback."""
    result = run_example("dp_sgd_digits", "--batch", "0")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "error: argument --batch:" in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "on"])
def test_progress_to_a_pipe_has_no_carriage_returns(mode):
    result = run_example("dp_sgd_digits", "--device", "cpu", "--limit", "128", "--epochs", "1", "--batch", "16",
                         "--progress", mode)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr and "\r" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("train ")]
    if mode == "auto":
        assert lines == [], result.stderr        # silent when stderr is not a terminal
    else:
        assert 2 <= len(lines) <= 21, result.stderr  # a few plain lines, the last one at the end
        assert lines[-1].startswith("train 8/8 ")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_in_place_only_on_a_terminal():
    sys.path.insert(0, str(EXAMPLES))
    try:
        from cli import Progress
    finally:
        sys.path.remove(str(EXAMPLES))
    outputs = {}
    for name, stream, mode in [("tty", _Terminal(), "auto"), ("pipe_auto", io.StringIO(), "auto"),
                               ("pipe_on", io.StringIO(), "on"), ("off", _Terminal(), "off")]:
        with Progress(100, "train", mode, stream=stream) as bar:
            for _ in range(100):
                bar.update(info="loss 0.1")
        outputs[name] = stream.getvalue()
    assert outputs["tty"].count("\r") == 100 and outputs["tty"].endswith("\n")
    assert outputs["pipe_auto"] == "" and outputs["off"] == ""
    lines = outputs["pipe_on"].splitlines()
    assert "\r" not in outputs["pipe_on"] and len(lines) == Progress.LINES
    assert lines[-1].startswith("train 100/100 ") and lines[-1].endswith("loss 0.1")
