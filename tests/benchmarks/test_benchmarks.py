"""Smoke tests of the benchmark harness: each suite at tiny sizes (a few seconds in all).

torch and JAX are optional: their parts run when they are installed and skip otherwise;
matplotlib and threadpoolctl are optional too. Nothing here checks a speed.
"""
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/this file
if ROOT not in sys.path:  # `pytest` run from elsewhere: the benchmarks package lives at the root
    sys.path.insert(0, ROOT)

from benchmarks import models  # noqa: E402
from benchmarks.cli import main as cli_main  # noqa: E402
from benchmarks.machine import background, settings as machine_settings  # noqa: E402
from benchmarks.machine.load import LoadMonitor  # noqa: E402
from benchmarks.methods import Method  # noqa: E402
from benchmarks.report import plots, tables  # noqa: E402
from benchmarks.report.progress import Progress  # noqa: E402
from benchmarks.rounds import runner  # noqa: E402
from cuvmap import backend as cv_backend  # noqa: E402

TINY_PER_EXAMPLE = ["--batch", "2", "3", "--repeats", "1", "--max-repeats", "1", "--warmup", "1",
                    "--loop-examples", "2", "--chunk-size", "2", "--gemm-size", "64", "--progress", "off"]


def _run(capsys, tmp_path, argv, name="out"):
    path = tmp_path / f"{name}.json"
    assert cli_main(argv + ["--json", str(path)]) == 0
    out = capsys.readouterr().out
    with open(path) as fh:
        return json.load(fh), out


def _rows(results, framework=None):
    return [r for r in results["rows"] if framework is None or r["framework"] == framework]


# ---------------------------------------------------------------------------------------
# per_example
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_per_example_cuvmap(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")  # reported as given, never changed
    res, out = _run(capsys, tmp_path, ["per_example"] + TINY_PER_EXAMPLE + ["--no-torch", "--no-jax"])
    assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"
    assert res["argv"][:2] == ["per_example", "--batch"]
    assert res["settings"]["OPENBLAS_CORETYPE"] == "Haswell"
    assert "| OPENBLAS_CORETYPE | Haswell |" in out
    for key in ("python", "numpy", "BLAS", "device"):
        assert key in res["settings"]
    keys = [(r["batch"], r["key"]) for r in res["rows"]]
    assert keys == [(b, k) for b in (2, 3) for k in ("loop", "vmap", "chunked", "batched", "jit_vmap",
                                                            "jit_batched")]
    for r in res["rows"]:
        assert r["diff_vs_cuvmap_vmap"] < 1e-4, r
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["repeats"] == 1 and r["timer"] == "perf_counter, interleaved"
        assert r["minor_faults_per_call"] is not None and r["minor_faults_per_call"] >= 0
    jit3 = next(r for r in res["rows"] if r["batch"] == 3 and r["key"] == "jit_vmap")
    assert jit3["method"] == "cuvmap: jit(vmap(grad))" and jit3["examples_off"] == 0 and jit3["examples_compared"] == 3
    assert "first call includes the tracing" in jit3["note"]
    jit_batched = next(r for r in res["rows"] if r["batch"] == 3 and r["key"] == "jit_batched")
    assert jit_batched["method"] == "cuvmap: jit(grad of the mean loss)" and jit_batched["kind"] == "batched"
    assert "| host memory | " in out
    assert "jit(vmap(grad)) " in out and "page faults per call" in out and "| page faults / call |" in out
    loop3 = next(r for r in res["rows"] if r["batch"] == 3 and r["key"] == "loop")
    assert loop3["scale"] == pytest.approx(1.5) and "2 of 3 examples timed" in loop3["note"]
    assert "2 chunks" in next(r for r in res["rows"] if r["batch"] == 3 and r["key"] == "chunked")["note"]
    ratios = {(r["batch"], r["ratio"]): r for r in res["ratios"]}
    assert ratios[(2, "vmap(grad) / batched gradient")]["value"] > 0
    assert ratios[(2, "loop / vmap(grad)")]["value"] > 0
    assert ratios[(2, "vmap(grad) / torch.func vmap(grad)")]["value"] is None  # --no-torch
    jit_ratio = ratios[(3, "cuvmap jit(vmap(grad)) / cuvmap vmap(grad)")]
    assert jit_ratio["value"] == pytest.approx(jit3["median_ms"] / next(
        r for r in res["rows"] if r["batch"] == 3 and r["key"] == "vmap")["median_ms"])
    assert (3, "cuvmap jit(vmap(grad)) / JAX jit(vmap(grad))") not in ratios  # --no-jax: not measured
    assert res["flops"]["train"] == 6 * res["flops"]["macs"]
    assert res["floor_ms_per_example"] > 0 and res["gemm"]["gflops_used"] > 0
    assert "## Ratios against the project's targets" in out and "## Compute floor" in out
    assert "| batch | method | median ms |" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out and "plot_path" not in res
    else:
        assert os.path.exists(res["plot_path"]) and res["plot_path"].endswith(".png")


@pytest.mark.slow
@pytest.mark.parametrize("suite, extra, label", [
    ("per_example", TINY_PER_EXAMPLE + ["--no-torch", "--no-jax"], "cuvmap jit(vmap(grad)) at batch 3"),
    ("dp", ["--batch", "3", "--models", "cnn", "--repeats", "1", "--max-repeats", "1", "--warmup", "1",
            "--progress", "off", "--no-torch"], "cuvmap jit(dp.clipped_grad), cnn at batch 3"),
])
def test_scopes_report_the_time_per_layer(suite, extra, label, capsys, tmp_path, monkeypatch):
    """``--scopes``: the benchmark networks' named scopes, forward and transpose(...), each
    with its steps and time (cuvmap.profiler), the background loops paused meanwhile (each
    pause and resume settling for a tenth of the suites' second)."""
    monkeypatch.setattr(background, "SETTLE", 0.1)
    res, out = _run(capsys, tmp_path, [suite] + extra + ["--scopes", "--background-load", "1", "--alternate-load"])
    table = next(t for t in res["scopes"] if t["label"].startswith(label))
    assert table["label"].endswith(", the background loops paused")
    scopes = {r["scope"]: r for r in table["rows"]}
    assert {"conv1", "conv2", "dense", "transpose(conv1)", "transpose(conv2)"} <= set(scopes)
    assert all(r["steps"] >= 1 and r["ms"] >= 0 for r in table["rows"])
    assert sum(r["share"] for r in table["rows"]) == pytest.approx(1.0)
    assert f"## Time per named scope: {label}" in out
    layers = {r["scope"]: r for r in table["layers"]}  # the backward folded into each layer's row
    assert {"conv1", "conv2", "dense"} <= set(layers) and not any("transpose" in k for k in layers)
    assert layers["conv2"]["backward_ms"] > 0 and layers["conv2"]["forward_ms"] > 0


@pytest.mark.slow
def test_per_example_interleaved(capsys, tmp_path):
    """Every method's repeats come from rounds that time each method once (--interleave, now
    the default, is still accepted); each ratio carries its interval and verdict from the
    paired rounds."""
    res, out = _run(capsys, tmp_path, ["per_example", "--batch", "2", "--repeats", "6", "--max-spread", "0",
                                       "--warmup", "1", "--loop-examples", "1", "--gemm-size", "64", "--progress",
                                       "off", "--no-torch", "--no-jax", "--no-plot", "--interleave"])
    assert [r["key"] for r in res["rows"]] == ["loop", "vmap", "chunked", "batched", "jit_vmap", "jit_batched"]
    for r in res["rows"]:
        assert r["repeats"] == 6 and r["timer"] == "perf_counter, interleaved" and r["diff_vs_cuvmap_vmap"] < 1e-4
        assert len(r["times_ms"]) == 6 and r["spread"] is not None and isinstance(r["noisy"], bool)
    assert "| rounds | 6 round(s), each case once per round in rotating order |" in out
    assert "| import order | cuvmap's oneDNN loaded before torch is imported |" in out
    ratio = next(r for r in res["ratios"] if r["ratio"] == "vmap(grad) / batched gradient")
    c = ratio["comparison"]
    assert c["paired"] and c["n"] == 6 and c["ci_low"] <= c["ratio"] <= c["ci_high"]
    assert c["verdict"] in ("FAST", "SLOW", "SAME") and ratio["met_beyond_noise"]
    assert "| batch | ratio | value (medians) | 95% CI | verdict | target | met |" in out


@pytest.mark.slow
def test_per_example_torch(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.func")
    res, out = _run(capsys, tmp_path, ["per_example"] + TINY_PER_EXAMPLE + ["--no-jax", "--no-plot"])
    rows = _rows(res, "torch")
    assert {r["key"] for r in rows} == {"torch_vmap", "torch_batched"}
    for r in rows:
        assert r["diff_vs_cuvmap_vmap"] < 1e-4, r
    assert torch.get_num_threads() == machine_settings.blas_threads()[0]
    assert "torch.set_num_threads" in res["frameworks"]["torch"]
    ratio = next(r for r in res["ratios"] if r["ratio"] == "vmap(grad) / torch.func vmap(grad)")
    assert ratio["value"] > 0
    for name in ("jit(vmap(grad)) / torch.func vmap(grad)", "jit(grad) batched / torch batched gradient"):
        jit_ratio = next(r for r in res["ratios"] if r["ratio"] == name)
        assert jit_ratio["value"] > 0 and jit_ratio["target"] == "≤ 1"


@pytest.mark.slow
def test_per_example_jax(capsys, tmp_path):
    pytest.importorskip("jax")
    res, out = _run(capsys, tmp_path, ["per_example", "--batch", "2", "--repeats", "1", "--max-repeats", "1",
                                       "--warmup", "1", "--loop-examples", "1", "--gemm-size", "64", "--no-torch",
                                       "--no-plot"])
    rows = _rows(res, "jax")
    assert {r["key"] for r in rows} == {"jax_vmap", "jax_batched"}
    for r in rows:
        assert r["diff_vs_cuvmap_vmap"] < 1e-4, r
    jit_ratio = next(r for r in res["ratios"] if r["ratio"] == "cuvmap jit(vmap(grad)) / JAX jit(vmap(grad))")
    assert jit_ratio["value"] > 0


@pytest.mark.slow
def test_per_example_absent_frameworks_are_skipped(capsys, tmp_path, monkeypatch):
    # as if torch and jax were not installed
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "jax", None)
    res, out = _run(capsys, tmp_path, ["per_example", "--batch", "2", "--repeats", "1", "--max-repeats", "1",
                                       "--loop-examples", "1", "--gemm-size", "32", "--no-plot"])
    assert {r["framework"] for r in res["rows"]} == {"cuvmap"}
    assert "torch.func: skipped (torch is not installed)" in out
    assert "JAX: skipped (jax is not installed)" in out


def test_models_agree_with_the_spec():
    params = models.cnn_params()
    assert {k: v.shape for k, v in params.items()} == {
        "w1": (16, 1, 5, 5), "b1": (16,), "w2": (32, 16, 5, 5), "b2": (32,), "w3": (12800, 10), "b3": (10,)}
    assert all(v.dtype == np.float32 for v in params.values())
    f = models.cnn_flops()
    assert f["per_layer"] == {"conv1": 16 * 25 * 24 * 24, "conv2": 32 * 16 * 25 * 20 * 20, "dense": 12800 * 10}
    assert f["train"] == 3 * f["forward"] == 6 * f["macs"]


# ---------------------------------------------------------------------------------------
# conv and dispatch, and the standalone entry points
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_conv_suite(capsys, tmp_path):
    res, out = _run(capsys, tmp_path, ["conv", "--batch", "1", "2", "--repeats", "1", "--loop-examples", "1",
                                       "--no-plot", "--progress", "off", "--max-spread", "0"])
    assert set(res["tables"]) == {"gflops", "vmap_vs_loop", "grouped_vs_unfold"}
    assert len(res["tables"]["gflops"]) == 2 * 2 * 3
    assert "## 1. Convolution GFLOP/s" in out and "## 3." in out
    from cuvmap.cpu import onednn

    if onednn.available():   # both activation layouts, side by side (NOTE [activation layouts])
        for label in ("oneDNN", "oneDNN channels-last"):
            assert all(row[label]["ms"] > 0 for row in res["tables"]["gflops"])
            assert f" {label} ms |" in out


@pytest.mark.slow
def test_conv_suite_im2col_variants(capsys, tmp_path):
    """--im2col-variants times the im2col kernels forced to each column layout and to one
    piece (the measurements behind NOTEs [column layouts] and [cache blocking]), and leaves
    conv_gemm's settings as they were."""
    from cuvmap.lax import conv_gemm

    before = (conv_gemm.COLUMN_LAYOUT, conv_gemm.BLOCK_BYTES)
    res, out = _run(capsys, tmp_path, ["conv", "--batch", "2", "--repeats", "1", "--loop-examples", "1",
                                       "--im2col-variants", "--no-plot", "--progress", "off", "--max-spread", "0"])
    assert (conv_gemm.COLUMN_LAYOUT, conv_gemm.BLOCK_BYTES) == before
    for label in ("im2col", "im2col channel-major", "im2col pixel-major", "im2col one piece"):
        assert all(row[label]["ms"] > 0 for row in res["tables"]["gflops"])
        assert f" {label} ms |" in out
        assert any(r["method"] == f"{label} grouped conv (groups·B)" for r in res["tables"]["grouped_vs_unfold"])


@pytest.mark.slow
def test_dp_suite(capsys, tmp_path):
    """The DP suite at tiny sizes: every cuvmap row, eager and jitted, agrees with vmap(grad)
    + dp.clipped_sum; the targets' ratios are reported (not measured at these sizes); torch
    and Opacus rows run where they are installed."""
    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False
    res, out = _run(capsys, tmp_path, ["dp", "--batch", "2", "3", "--mlp-widths", "784", "8", "6", "10",
                                       "--repeats", "2", "--warmup", "1", "--progress", "off", "--slow-seconds", "0",
                                       "--max-repeats", "4"])
    keys = {(r["network"], r["batch"], r["key"]) for r in res["rows"]}
    cuvmap_keys = ("batched", "vmap_clip", "ghost", "jit_batched", "jit_vmap_clip", "jit_ghost")
    assert {(n, b, k) for n in ("mlp", "cnn") for b in (2, 3) for k in cuvmap_keys} <= keys
    for r in res["rows"]:
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["repeats"] == 2  # --slow-seconds 0: every method is "slow", timed in two rounds
        if "rel_diff" in r:
            assert r["rel_diff"] < 1e-4, r
        if r["framework"] == "cuvmap":
            assert r["peak_mib"] > 0
    assert has_torch == any(r["framework"] == "torch" for r in res["rows"])
    assert res["layer_methods"]["mlp"] == {"w1": "ghost", "b1": "per_example", "w2": "ghost", "b2": "per_example",
                                           "w3": "ghost", "b3": "per_example"}
    ratios = {r["ratio"]: r for r in res["ratios"]}
    assert ratios["ghost / batched (mlp, batch 128)"]["value"] is None
    assert ratios["ghost peak memory / batched peak memory (cnn, batch 3)"]["value"] > 0
    assert "## Ratios against the targets" in out and "| network | batch | method |" in out


@pytest.mark.slow
def test_accounting_suite(capsys, tmp_path):
    """The accountants' suite on its cheapest recipe: ε by PLD matches the stored
    dp_accounting value, PLD below RDP, calibrate_noise's σ reproduces ε_PLD."""
    res, out = _run(capsys, tmp_path, ["accounting", "--recipes", "small_q", "--repeats", "1", "--warmup", "0",
                                       "--no-dp-accounting", "--progress", "off"])
    (row,) = res["rows"]
    assert row["recipe"] == "small_q" and abs(row["rel_vs_dp_accounting"]) < 1e-6
    assert row["eps_pld"] < row["eps_rdp"] and row["eps_pld"] <= row["eps_pld_coarse"]
    assert row["calibrate"]["pld"]["sigma"] == pytest.approx(2.0, rel=2e-3)
    assert row["calibrate"]["pld"]["sigma"] < row["calibrate"]["rdp"]["sigma"]
    assert all(v > 0 for v in row["get_epsilon_ms"].values())
    assert {t["check"] for t in res["targets"]} >= {"|ε_PLD / dp_accounting − 1| (small_q)"}
    assert "## ε" in out and "## targets" in out


@pytest.mark.slow
def test_dispatch_suite(capsys, tmp_path):
    path = tmp_path / "d.json"
    assert cli_main(["dispatch", "--ops", "5", "--repeats", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    res = json.loads(path.read_text())
    assert [r["case"] for r in res["rows"]][:2] == ["numpy (reference)", "cuvmap eval"]
    assert "× numpy" in out and "no plot" in out


@pytest.mark.slow
@pytest.mark.parametrize("no_torch", [False, True])
def test_eager_suite(capsys, tmp_path, monkeypatch, no_torch):
    """The eager split at tiny batches: per batch and transform a row whose kernels and
    dispatch add up to the split calls' time, the primitives that ran, the GEMM rows;
    ``--both-orders`` without torch says so and keeps the rows it has."""
    if no_torch:
        import importlib.util

        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    from cuvmap.lax import conv_strategy
    from cuvmap.measured_choices import MeasuredChoices

    # the suite's kernel table lists the keys measured in its process: a table of its own here,
    # not the keys earlier tests measured (whose plans oneDNN's cache may have dropped)
    monkeypatch.setattr(conv_strategy, "_measured", MeasuredChoices())
    path = tmp_path / "eager.json"
    assert cli_main(["eager", "--batch", "2", "--split-calls", "2", "--repeats", "1", "--max-repeats", "1",
                     "--progress", "off", "--json", str(path)] + (["--both-orders"] if no_torch else [])) == 0
    out = capsys.readouterr().out
    res = json.loads(path.read_text())
    assert [(r["order"], r["batch"], r["transform"]) for r in res["rows"]] == [
        ("not imported", 2, "vmap(grad)"), ("not imported", 2, "batched grad")]
    assert ("--both-orders: torch is not installed" in out) == no_torch
    for r in res["rows"]:
        assert r["binds"] > r["kernel_calls"] > 0 and r["kernels_ms"] > 0 and r["dispatch_ms"] > 0
        assert r["eager_ms"] > 0 and r["jit_ms"] > 0 and len(r["comparison"]) > 0
    prims = {(p["transform"], p["primitive"]) for p in res["primitives"]}
    assert ("vmap(grad)", "conv") in prims or ("vmap(grad)", "conv_backward_weight") in prims, prims
    assert len(res["gemm"]) == 6 and all(g["ms"] > 0 for g in res["gemm"])
    from benchmarks.report import compare
    cases = compare.timed_cases(res)  # what `benchmarks compare` judges: eager, jit and the GEMMs
    assert len(cases) == 2 * 2 + 6, list(cases)
    assert "dispatch µs per bind" in out and "oneDNN's convolutions:" in out
    # the kernels the conv strategy chose, per convolution key, with oneDNN's implementation
    kernels = res["conv_kernels"]
    assert {k["op"] for k in kernels} == {"forward", "backward_input", "backward_weight"}, kernels
    # (oneDNN in either activation layout: NOTE [activation layouts] in cuvmap/cpu/onednn.py)
    assert all(k["chosen"] in ("onednn", "onednn:channels_last", "unfold") and k["unfold_ms"] > 0 for k in kernels)
    # (channels-last is left out only where oneDNN refused it: its reference kernels alone)
    assert all(k["onednn_ms"] > 0 and (k["onednn_cl_ms"] is None or k["onednn_cl_ms"] > 0) for k in kernels)
    assert any(k["onednn_cl_ms"] for k in kernels), kernels
    assert all(k["impl"] != "–" for k in kernels if k["chosen"].startswith("onednn"))
    assert all(("(channels_last)" in k["impl"]) == (k["chosen"] == "onednn:channels_last")
               for k in kernels if k["chosen"].startswith("onednn"))
    # torch's own profile of the same network, where torch is installed
    import importlib.util

    if no_torch or importlib.util.find_spec("torch") is None:
        assert res["torch_profile"] == []
    else:
        ops = {(t["transform"], t["op"]) for t in res["torch_profile"]}
        assert {t for t, _ in ops} == {"torch: vmap(grad)", "torch: batched grad"}
        assert any("convolution" in op for _, op in ops), ops   # the five largest hold the convolutions
        assert all(t["ms"] >= 0 and t["calls"] >= 0 and t["batch"] == 2 for t in res["torch_profile"])


@pytest.mark.slow
def test_control_flow_suite(capsys, tmp_path):
    path = tmp_path / "cf.json"
    assert cli_main(["control_flow", "--length", "6", "--hidden", "4", "--batch", "2", "--repeats", "2",
                                    "--max-repeats", "8", "--no-jax", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    res = json.loads(path.read_text())
    assert [r["case"] for r in res["rows"]] == ["cuvmap jit(grad(scan))", "cuvmap jit(grad(unrolled loop))",
                                                "NumPy loop (forward and backward by hand)",
                                                "cuvmap jit(grad(scan)), carry of 8", "NumPy loop, carry of 8 (by hand)"]
    assert set(res["targets"]) == {"scan trace, full length / length 1", "scan trace / one-step (unrolled) trace",
                                   "scan per-step run / unrolled per-step run",
                                   "tiny-carry scan per-step run / its NumPy loop"}
    assert "scan and unrolled gradients agree" in out and "JAX: skipped (--no-jax)" in out
    # the hand-written NumPy loops compute the same gradients (float32, a few steps)
    for note in ("scan and the NumPy loop to", "tiny-carry scan and its NumPy loop agree to"):
        assert float(out.split(note)[1].split()[0]) < 1e-5, out


@pytest.mark.slow
def test_memory_suite(capsys, tmp_path):
    path = tmp_path / "memory.json"
    assert cli_main(["memory", "--batch", "24", "--chunks", "4", "8", "--cases", "mlp_dp", "mlp_norms",
                              "--mlp-widths", "16", "32", "4", "--fraction", "0.5", "--repeats", "1",
                              "--max-repeats", "1", "--progress", "off", "--no-plot", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    res = json.loads(path.read_text())
    assert {r["run"] for r in res["rows"]} == {"unchunked", "auto", "chunk 4", "chunk 8"}
    assert sorted(t.split(" (")[0] for t in res["targets"]) == [
        "mlp_dp: peak / budget", "mlp_dp: time / best in-budget chunk", "mlp_norms: peak / budget",
        "mlp_norms: time / best in-budget chunk"]
    for name in ("mlp_dp", "mlp_norms"):
        fig = res["figures"][name]
        assert fig["budget"] < fig["unchunked_peak"] and fig["chunk"] < 24
    assert "memory_budget** → chunk" in out and "results differ from the unchunked call's" in out


@pytest.mark.slow
def test_python_dash_m_entry_point(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "dispatch", "--ops", "3", "--repeats", "1", "--no-json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| cuvmap eval |" in proc.stdout


# ---------------------------------------------------------------------------------------
# GPU: runs where CuPy sees a device, a clean message where not
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.gpu
def test_per_example_gpu(capsys, tmp_path):
    if not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    res, out = _run(capsys, tmp_path, ["per_example", "--device", "gpu", "--batch", "2", "--repeats", "2",
                                       "--loop-examples", "1", "--gemm-size", "256", "--no-plot"])
    for r in res["rows"]:
        assert r["diff_vs_cuvmap_vmap"] < 1e-3, r
        if r["framework"] in ("cuvmap", "torch"):
            assert r["device_peak_mib"] is not None and r["device_peak_mib"] >= 0
    assert next(r for r in res["rows"] if r["key"] == "vmap")["timer"] == "CUDA events (CuPy), L2 flushed, interleaved"
    assert "| GPU timing | CUDA events after a device synchronisation, the L2 cache flushed before each call |" in out
    assert "| device peak MiB |" in out


@pytest.mark.slow
@pytest.mark.gpu
def test_gpu_timers_graph_replay_peak_memory_and_injection(capsys):
    """The GPU parts of benchmarks/rounds/ on a real device: CUDA events after an L2
    flush, a CUDA graph of an elementwise call replayed, CuPy's pool growth as the peak,
    a spinning kernel of 2 ms seen by the events; then the self-check on the GPU."""
    if not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    if conftest.STRICT_CUPY:
        pytest.skip("times a real device's kernels (events, a spinning RawKernel): the CPU stand-in has no clock")
    from benchmarks.rounds import peaks, timers

    cp = cv_backend.cupy_module()
    a = cp.ones((1024, 1024), cp.float32)
    timer = timers.cupy_event_timer(cp, l2_flush=True)
    assert timer.name == "CUDA events (CuPy), L2 flushed"
    assert 0 < timer.time_one(lambda: a * 2 + 1) < 1
    replay, note = timers.cupy_graph(lambda: a * 2 + 1, cp)
    assert replay is not None, note
    assert 0 < timer.time_one(replay) < 1
    assert timer.time_one(lambda: timers.spin_gpu(cp, 0.002)) >= 0.0019
    assert peaks.cupy_pool_peak(lambda: cp.empty(1 << 24, cp.uint8), cp) >= 1 << 24
    slow = timers.slowed(lambda: a * 2, 0.002, timer)
    assert timer.time_one(slow) >= 0.0019
    status = cli_main(["selfcheck", "--device", "gpu", "--progress", "off", "--no-json", "--no-plot"])
    out = capsys.readouterr().out
    assert status in (0, 1) and "self-check" in out and "| GPU timing |" in out


@pytest.mark.slow
@pytest.mark.gpu
def test_conv_dp_and_dispatch_suites_on_the_gpu(capsys, tmp_path):
    """The suites tools/gpu_checks.sh runs, on the GPU at tiny sizes: each exits 0 (the conv
    suite's "auto picks" column once overwrote its own timings) and its cuvmap rows agree
    with their references."""
    if not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    res, out = _run(capsys, tmp_path, ["conv", "--device", "gpu", "--batch", "1", "--repeats", "1",
                                       "--loop-examples", "1", "--no-plot", "--progress", "off"], "conv")
    assert all(row["auto"]["ms"] > 0 and "auto_picks" in row for row in res["tables"]["gflops"])
    res, out = _run(capsys, tmp_path, ["dp", "--device", "gpu", "--batch", "2", "--models", "mlp", "--mlp-widths",
                                       "784", "8", "10", "--repeats", "1", "--warmup", "1", "--progress", "off",
                                       "--no-plot", "--no-torch"], "dp")
    assert all(r["rel_diff"] < 1e-4 for r in res["rows"] if "rel_diff" in r)
    res, out = _run(capsys, tmp_path, ["dispatch", "--device", "gpu", "--ops", "5", "--repeats", "1", "--no-plot"],
                    "dispatch")
    assert any(r["case"].startswith("jit") for r in res["rows"])


def test_gpu_requested_without_one(capsys, tmp_path, monkeypatch):
    # as if CuPy saw no device (a GPU, or the strict CuPy stand-in, may be present)
    monkeypatch.setattr(cv_backend, "_cupy", None)
    monkeypatch.setattr(cv_backend, "_cupy_probed", True)
    assert cli_main(["dispatch", "--device", "gpu", "--json", str(tmp_path / "x.json")]) == 2
    assert "sees no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------------------------------
# harness pieces
# ---------------------------------------------------------------------------------------


def test_measure_counts_calls_and_scales():
    calls = []
    ticks = iter(range(100))

    def fake_timer(fn):
        fn()
        return float(next(ticks) + 1)

    stats = runner.measure(lambda: calls.append(1), repeats=3, warmup=2, timer=("fake", fake_timer), scale=2.0)
    assert len(calls) == 1 + 1 + 3  # first (timed alone), one more warm-up, three timed
    assert stats.first == 2.0 and stats.times == [4.0, 6.0, 8.0]
    assert (stats.median, stats.min, stats.max) == (6.0, 4.0, 8.0)
    d = stats.as_dict(per=2)
    assert d["median_ms"] == 3000.0 and d["repeats"] == 3 and d["timer"] == "fake"


def test_markdown_table_and_fmt():
    t = tables.markdown_table(["a", "b"], [("x", 1.23456), ("y", None)])
    assert t.splitlines() == ["| a | b |", "|---|---:|", "| x | 1.23 |", "| y | – |"]
    assert tables.markdown_table(["check"], [("|x − 1|",)], "l").splitlines()[2] == "| \\|x − 1\\| |"
    assert tables.fmt(12345.6) == "12346" and tables.fmt(0.000123) == "1.23e-04" and tables.fmt(3) == "3"


def test_progress_lines_and_silence():
    buf = io.StringIO()  # not a terminal
    with Progress(2, "on", stream=buf) as p:
        p.set("a")
        p.step("a done")
        p.step("b done")
    assert buf.getvalue().splitlines()[0].startswith("[1/2 ") and "b done" in buf.getvalue()
    quiet = io.StringIO()
    with Progress(2, "auto", stream=quiet) as p:
        p.step("x")
    assert quiet.getvalue() == ""


def test_plot_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path, note = plots.plot_lines(str(tmp_path / "p.png"), {"m": [(1, 1.0), (2, 0.5)]}, title="t")
    assert path is None and "matplotlib is not installed" in note


def test_settings_without_threadpoolctl(monkeypatch):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    s = machine_settings.settings("cpu")
    assert "threadpoolctl not installed" in s["BLAS"]
    assert machine_settings.blas_threads()[0] == (os.cpu_count() or 1)
    assert machine_settings.machine_record("cpu")["blas"] is None


def test_diff_counts_examples_off():
    from benchmarks.suites import per_example as pe

    ref = {k: np.zeros((4, 2), np.float32) for k in models.PARAM_NAMES}
    got = {k: v.copy() for k, v in ref.items()}
    got["w2"][3, 1] = 0.5
    m = Method("x", "x", "cuvmap", None, None, "per_example")
    assert pe._diff(m, got, ref, tol=1e-3) == (0.5, 1, 4)
    loop = Method("l", "l", "cuvmap", None, None, "loop")
    assert pe._diff(loop, [{k: v[i] for k, v in got.items()} for i in range(2)], ref, tol=1e-3) == (0.0, 0, 2)
    batched = Method("b", "b", "cuvmap", None, None, "batched")
    assert pe._diff(batched, {k: v.mean(0) for k, v in got.items()}, ref, tol=1e-3) == (0.125, None, None)


def test_load_monitor():
    mon = LoadMonitor()
    sum(i * i for i in range(200000))  # our own CPU time is not "others"
    load = mon.stop()
    assert set(load) >= {"others_cores", "steal_cores", "loadavg_start", "loadavg_end", "cores", "wall_s", "warning"}
    assert load["wall_s"] > 0 and isinstance(LoadMonitor.describe(load), str)


# ---------------------------------------------------------------------------------------
# distributed (a job of 2 under mpiexec)
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_distributed_suite(capsys, tmp_path):
    from cuvmap import distributed

    if distributed.find_mpiexec() is None:
        pytest.skip("no mpiexec next to this Python or on PATH (pip install mpi4py mpich)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    res, out = _run(capsys, tmp_path, ["distributed", "--sizes", "4096", "65536", "--repeats", "2", "--warmup", "1",
                                       "--dp-epochs", "0.1", "--dp-repeats", "1", "--check-steps", "2", "--progress",
                                       "off", "--scaling-rounds", "2", "--scaling-networks", "tanh_cnn",
                                       "--scaling-batch", "16", "--scaling-steps", "3"])
    methods = [r["method"] for r in res["allreduce"]]
    assert len(methods) == 12 and methods[0].startswith("mpi4py Allreduce (preallocated")
    assert len(res["check_per_collective"]) == 4  # 2 sizes, eager and jit
    steps = res["check_steps"]
    assert steps["steps"] == 2 and [v["collectives"] for v in steps["variants"]] == [1, 1, 6, 6]
    for r in res["allreduce"]:
        assert r["median_us"] > 0 and r["gb_per_s"] > 0 and r["rounds"] == 2
        assert r["x_ceiling"] == 1 or not r["method"].startswith("mpi4py Allreduce (pre")
    assert set(res["dp_step"]["ms_per_step"]) == {"1", "2"} and res["dp_step"]["speedup"] > 0
    assert "| 64 KiB | cuvmap psum (data_parallel) |" in out and "DP-SGD step of the main job" in out
    (scaling,) = res["weak_scaling"]
    assert (scaling["network"], scaling["batch"], scaling["processes"], scaling["rounds"]) == ("tanh_cnn", 16, 2, 2)
    assert len(scaling["ms_1"]) == len(scaling["ms_p"]) == 2 and scaling["efficiency_estimate"] > 0
    assert scaling["gradient_bytes"] == 4 * 26010 and "Weak scaling of the data-parallel DP-SGD step" in out


def test_the_weak_scaling_model():
    """NOTE [weak scaling]: E = t_c / (t_c + 2(P−1)/P · n/B + 2(P−1)α); no communication, E = 1."""
    from benchmarks.suites import weak_scaling

    assert weak_scaling.predicted_efficiency(0.01, 0, 64, 1e9, 0.0) == 1.0
    # 8 processes, 1 MB over 1 GB/s, 10 µs: 2·7/8·1e-3 + 14e-5 = 1.89e-3 s against 10 ms
    assert weak_scaling.predicted_efficiency(0.01, 1e6, 8, 1e9, 1e-5) == pytest.approx(0.01 / (0.01 + 1.89e-3))
    rows = [dict(network="mlp", batch=128, ms_1=[10.0, 12.0, 11.0], gradient_bytes=4e6)]
    preds = weak_scaling.predictions(rows)
    assert len(preds) == len(weak_scaling.LINKS)
    assert all(1 >= p["e8"] >= p["e64"] >= p["e512"] > 0 for p in preds)
