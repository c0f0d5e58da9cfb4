"""``python -m benchmarks report``: the docs' performance pages and the README's table are a
function of the runs' JSON files (benchmarks/report/pages.py).

The committed pages are regenerated from the committed JSON and must be identical (no
figure typed by hand), and every committed JSON carries what it was measured on; the
report itself is checked on a small synthetic run whose ratios are known exactly.
"""
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "benchmarks" / "cli.py").is_file())
if str(ROOT) not in sys.path:  # `pytest` run from elsewhere: the benchmarks package lives at the root
    sys.path.insert(0, str(ROOT))

from benchmarks.cli import main as cli_main  # noqa: E402
from benchmarks.report import pages  # noqa: E402

DOCS = ROOT / "docs" / "performance"
DATA = DOCS / "data"


# ---------------------------------------------------------------------------------------
# The committed pages and JSON
# ---------------------------------------------------------------------------------------


def test_the_committed_pages_are_what_the_committed_json_gives(tmp_path):
    names = sorted(p.name for p in DATA.glob("*.json"))
    assert {"per_example-cpu.json", "dp-cpu.json"} <= set(names), names
    made = pages.pages(str(DATA), str(tmp_path), readme=str(ROOT / "README.md"))
    readme = made.pop(str(ROOT / "README.md"))
    assert readme == (ROOT / "README.md").read_text(), \
        "the README's performance table is stale: run `python -m benchmarks report`"
    generated = {Path(p).name: text for p, text in made.items()}
    committed = {p.name: p.read_text() for p in DOCS.glob("*.md")}
    assert set(committed) == set(generated), "docs/performance/ holds pages no JSON file gives, or lacks some"
    for name, text in generated.items():
        assert committed[name] == text, f"docs/performance/{name} is stale: run `python -m benchmarks report`"


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json")))
def test_every_committed_run_says_what_it_ran_on(name):
    run = json.loads((DATA / name).read_text())
    # SUITE-DEVICE.json, or a variant's file: SUITE-DEVICE-torch-first.json from a --torch-first run
    variant = "-torch-first" if "--torch-first" in run["argv"] else ""
    assert name == f"{run['suite']}-{run['device']}{variant}.json"
    machine = run["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and machine["blas"], machine
    assert all(lib["api"] and lib["version"] and lib["threads"] for lib in machine["blas"])
    assert set(run["environment"]) >= {"OPENBLAS_CORETYPE", "OMP_NUM_THREADS"}
    assert run["machine_load"]["wall_s"] > 0 and run["machine_load"]["cores"] == machine["cores"]
    assert len(run["git"]["commit"]) == 40
    assert run["command"].endswith("python -m benchmarks " + " ".join(run["argv"]))
    assert "--save-to-docs" in run["argv"] and "json_path" not in run
    assert run["versions"]["cuvmap"] and run["versions"]["numpy"]
    frameworks = {r["framework"] for r in run.get("rows", [])}   # (fashion_mnist: whole runs, no rows)
    for peer in frameworks - {"cuvmap"}:
        assert run["versions"][peer], f"{name}: rows of {peer} but no version of it"
    assert {"rounds", "BLAS", "device"} <= set(run["settings"])


# ---------------------------------------------------------------------------------------
# The report on a synthetic run
# ---------------------------------------------------------------------------------------

ROUNDS = [1.0, 1.1, 0.9, 1.3, 1.0, 1.2, 0.95, 1.05]  # the machine's speed, round by round


def _row(batch, key, framework, ms, **extra):
    times = [ms * s for s in ROUNDS]
    return dict(batch=batch, key=key, method=f"{framework}: {key}", framework=framework, median_ms=ms,
                ms_per_example=ms / batch, times_ms=times, spread=0.1, noisy=False, repeats=len(times),
                first_call_ms=2 * ms, diff_vs_cuvmap_vmap=0.0, **extra)


def _run(warning=None, commit="0123456789abcdef0123456789abcdef01234567"):
    """A per_example run at batch 128: cuvmap's vmap(grad) takes half torch.func's time in
    every round, jit(vmap(grad)) twice it; the batched gradient is the reference."""
    rows = [_row(128, "vmap", "cuvmap", 50.0), _row(128, "jit_vmap", "cuvmap", 200.0),
            _row(128, "batched", "cuvmap", 40.0), _row(128, "torch_vmap", "torch", 100.0)]
    argv = ["per_example", "--batch", "128", "--save-to-docs"]
    return dict(
        suite="per_example", device="cpu", argv=argv, settings={"rounds": "8 round(s)", "numpy": "2.0"},
        rows=rows, ratios=[dict(batch=128, ratio="vmap(grad) / torch.func vmap(grad)", value=0.5, target="≤ 1",
                                met=True, met_beyond_noise="yes",
                                comparison=dict(ratio=0.5, ci_low=0.5, ci_high=0.5, verdict="FAST", resolved=True))],
        flops=dict(train=6e6), gemm=dict(gflops_used=100.0), floor_ms_per_example=0.06, notes=["a note"],
        machine=dict(cpu="Test CPU 9000", cores=2, platform="Linux-test",
                     blas=[dict(api="openblas", version="0.3.99", kernel="Haswell", threads=2,
                                threading_layer="pthreads")],
                     cuvmap_cpu_threads="adaptive", device="CPU: Test CPU 9000, 2 logical cores"),
        machine_load=dict(cores=2, wall_s=60.0, loadavg_start=1.5, loadavg_end=1.25, others_cores=0.75,
                          steal_cores=0.0, warning=warning),
        environment={"OPENBLAS_CORETYPE": None, "OMP_NUM_THREADS": "2"},
        versions=dict(python="3.11", numpy="2.0", cuvmap="0.1.0", torch="2.13.0", opacus=None),
        command="env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=2 python -m benchmarks " + " ".join(argv),
        git=dict(commit=commit, short=commit[:7], dirty=False))


README_TEXT = "# project\n\n## Performance\n\n<!-- performance-table:begin -->\nold\n<!-- performance-table:end -->\n\nkept\n"


@pytest.fixture
def synthetic(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "per_example-cpu.json").write_text(json.dumps(_run(warning="other processes used 0.75 of the 2 cores")))
    readme = tmp_path / "README.md"
    readme.write_text(README_TEXT)
    return tmp_path, data, readme


def test_report_writes_the_pages_and_the_readme_table(synthetic, capsys):
    tmp, data, readme = synthetic
    out = tmp / "out"
    argv = ["report", "--data", str(data), "--out", str(out), "--readme", str(readme)]
    assert cli_main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.md", "per_example.md"]
    text = readme.read_text()
    # the README outside its block is kept; inside, cuvmap / peer from the paired rounds
    assert text.startswith("# project\n\n## Performance\n\n<!-- performance-table:begin -->\n")
    assert text.endswith("<!-- performance-table:end -->\n\nkept\n") and "\nold\n" not in text
    assert ("| per-example gradients, benchmark CNN: `vmap(grad)` / torch.func `vmap(grad)` | 50 | 100 | 0.5 | "
            "[0.5, 0.5] | **FAST** |") in text
    assert ("| per-example gradients, benchmark CNN: `jit(vmap(grad))` / torch.func `vmap(grad)` | 200 | 100 | 2 | "
            "[2, 2] | **SLOW** |") in text
    assert "DP clipped gradient" not in text  # no dp run: no such row
    assert "Test CPU 9000, 2 logical cores, openblas 0.3.99, kernel Haswell, 2 threads, pthreads" in text
    assert "commit `0123456`" in text and "**not a quiet machine**" in text
    page = (out / "per_example.md").read_text()
    assert page.startswith(pages.GENERATED)
    assert "> **Not a quiet machine.** The load measured during this run: other processes used 0.75 of the 2 " \
           "cores on average" in page
    assert ("| command | `env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=2 python -m benchmarks per_example --batch 128 "
            "--save-to-docs` |") in page
    assert "| threading environment | `OMP_NUM_THREADS=2`; the others unset |" in page
    assert "| versions | python 3.11, numpy 2.0, cuvmap 0.1.0, torch 2.13.0 |" in page
    assert "| 128 | torch: torch_vmap | 100 | 0.781 | 2.5 | 10.0% | 8 | 200 | 0 |" in page  # ms / example, × batched
    assert "| 128 | vmap(grad) / torch.func vmap(grad) | 0.5 | [0.5, 0.5] | **FAST** | ≤ 1 | yes |" in page
    assert "| 6 | 100 | 60 |" in page  # the compute floor: MFLOP, GFLOP/s, µs per example
    assert "- a note" in page and "| numpy | 2.0 |" in page
    index = (out / "index.md").read_text()
    assert "[per_example](per_example.md)" in index and "| 0.5 | [0.5, 0.5] | **FAST** |" in index
    # a second report finds nothing to change; --check agrees
    capsys.readouterr()
    assert cli_main(argv + ["--check"]) == 0
    assert "3 pages, all as the JSON files give them" in capsys.readouterr().out


def test_a_torch_first_run_is_a_second_section_and_the_headline_keeps_the_main_run(synthetic, capsys):
    """``--torch-first --save-to-docs`` writes SUITE-DEVICE-torch-first.json: its page
    section follows the main run's, each headed by its import order, and the README's
    table still comes from the main run."""
    from benchmarks.report import results

    tmp, data, readme = synthetic
    main = _run()
    main["settings"]["import order"] = "cuvmap's oneDNN loaded before torch is imported"
    (data / "per_example-cpu.json").write_text(json.dumps(main))
    first = _run(commit="e" * 40)
    first["settings"]["import order"] = "torch before NumPy and cuvmap (--torch-first)"
    first["rows"][0] = _row(128, "vmap", "cuvmap", 150.0)     # slower: the headline must not take it
    variant = results.docs_json_path("per_example", "cpu", str(data), variant="torch-first")
    assert variant.endswith("per_example-cpu-torch-first.json")
    with open(variant, "w") as fh:
        json.dump(first, fh)
    out = tmp / "out"
    assert cli_main(["report", "--data", str(data), "--out", str(out), "--readme", str(readme)]) == 0
    page = (out / "per_example.md").read_text()
    a = page.index("## On the CPU, cuvmap's oneDNN loaded before torch is imported")
    b = page.index("## On the CPU, torch before NumPy and cuvmap (--torch-first)")
    assert a < b and "`eeeeeee`" in page[b:] and "`eeeeeee`" not in page[:b]
    assert "| per-example gradients, benchmark CNN: `vmap(grad)` / torch.func `vmap(grad)` | 50 | 100 | 0.5 |" \
        in readme.read_text()


def test_report_check_finds_a_stale_page_and_a_quiet_run_has_no_warning(synthetic, capsys):
    tmp, data, readme = synthetic
    out = tmp / "out"
    argv = ["report", "--data", str(data), "--out", str(out), "--readme", str(readme)]
    assert cli_main(argv) == 0
    (data / "per_example-cpu.json").write_text(json.dumps(_run(warning=None, commit="f" * 40)))
    before = (out / "per_example.md").read_text()
    assert cli_main(argv + ["--check"]) == 1
    assert "differs" in capsys.readouterr().out and (out / "per_example.md").read_text() == before
    assert cli_main(argv) == 0
    page = (out / "per_example.md").read_text()
    assert "Not a quiet machine" not in page and "`fffffff`" in page
    assert "not a quiet machine" not in readme.read_text()


def test_report_without_the_readme_markers_says_so(synthetic, capsys):
    tmp, data, readme = synthetic
    readme.write_text("# project\n")
    assert cli_main(["report", "--data", str(data), "--out", str(tmp / "out"), "--readme", str(readme)]) == 2
    assert "performance-table:begin" in capsys.readouterr().out and readme.read_text() == "# project\n"
    assert cli_main(["report", "--data", str(data), "--out", str(tmp / "out"), "--no-readme"]) == 0


def test_report_of_a_real_tiny_run(tmp_path, capsys):
    """A suite's own JSON (dispatch, tiny) goes through the report: its DOC_TABLES hold."""
    data = tmp_path / "data"
    data.mkdir()
    path = data / "dispatch-cpu.json"
    assert cli_main(["dispatch", "--ops", "3", "--repeats", "2", "--json", str(path), "--no-plot"]) == 0
    run = json.loads(path.read_text())
    run["argv"].append("--save-to-docs")  # as a run for the docs would have
    path.write_text(json.dumps(run))
    assert cli_main(["report", "--data", str(data), "--out", str(tmp_path / "out"), "--no-readme"]) == 0
    page = (tmp_path / "out" / "dispatch.md").read_text()
    assert "### Overhead per op of the chain" in page and "| cuvmap eval |" in page
    assert run["machine"]["cpu"] in page and run["git"]["short"] in page
    index = (tmp_path / "out" / "index.md").read_text()
    assert "No run for the docs yet" in index  # no per_example nor dp run: no headline table


def test_save_to_docs_writes_the_committed_path(tmp_path, monkeypatch, capsys):
    """--save-to-docs writes SUITE-DEVICE.json into the docs' data folder, without this
    machine's paths."""
    from benchmarks.report import results

    monkeypatch.setattr(results, "DOCS_DATA_DIR", str(tmp_path))
    assert cli_main(["dispatch", "--ops", "3", "--repeats", "1", "--save-to-docs", "--no-plot"]) == 0
    assert "JSON for the docs:" in capsys.readouterr().out
    run = json.loads((tmp_path / "dispatch-cpu.json").read_text())
    assert run["argv"][-2:] == ["--save-to-docs", "--no-plot"] and "json_path" not in run
    assert run["command"].endswith("python -m benchmarks dispatch --ops 3 --repeats 1 --save-to-docs --no-plot")


def test_committed_data_folder_holds_only_runs():
    """Nothing but the runs' JSON files in docs/performance/data/."""
    assert DATA.is_dir()
    assert all(p.suffix == ".json" for p in DATA.iterdir()), sorted(os.listdir(DATA))
