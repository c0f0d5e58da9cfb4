"""The performance pages of the docs, made from the runs' JSON files.

    python -m benchmarks report [--data docs/performance/data] [--out docs/performance]
                                [--readme README.md | --no-readme] [--check]

A run meant for the docs is saved with ``--save-to-docs``
(``docs/performance/data/SUITE-DEVICE.json``, committed): its figures and what they were
measured on (the machine, its load during the run, the commit, the command line and the
settings, the peers' versions). ``report`` reads every such file and writes

- ``docs/performance/index.md``: the runs, one line each, and the headline table;
- ``docs/performance/SUITE.md``, one page per suite: a header per run (machine, commit,
  command, load, settings), then the suite's tables (its ``DOC_TABLES``) and its ratios
  with their intervals, verdicts and targets as the run judged them;
- the README's performance table, between the lines ``<!-- performance-table:begin -->``
  and ``<!-- performance-table:end -->``: per-example gradients against torch.func and
  ``dp.clipped_grad`` against Opacus at batch 128 on the CPU (:data:`HEADLINE`).

Every figure on these pages comes from a JSON file, none is typed by hand: the pages are
a function of the files (the tests regenerate them and compare). ``--check`` writes
nothing and exits with status 1 when a page differs from what the files give.
"""
import glob
import importlib
import os

from benchmarks.report import results as results_files
from benchmarks.report.tables import fmt, markdown_table
from benchmarks.rounds import stats as bstats
from benchmarks.rounds.ratios import interval_text, verdict_cell
from benchmarks.suites import SUITES

SUMMARY = "the docs' performance pages and the README's table, from the runs saved with --save-to-docs"
BEGIN, END = "<!-- performance-table:begin -->", "<!-- performance-table:end -->"
README = os.path.join(results_files.ROOT, "README.md")
GENERATED = "<!-- made by `python -m benchmarks report` from the JSON files in data/: do not edit -->"

# the README's table: (what, suite, where in its rows, cuvmap's key, the peer's key); each
# at batch 128 on the CPU, the ratio cuvmap / peer from the rounds the two shared
HEADLINE_BATCH = 128
HEADLINE = [
    ("per-example gradients, benchmark CNN: `vmap(grad)` / torch.func `vmap(grad)`", "per_example", {}, "vmap",
     "torch_vmap"),
    ("per-example gradients, benchmark CNN: `jit(vmap(grad))` / torch.func `vmap(grad)`", "per_example", {},
     "jit_vmap", "torch_vmap"),
    ("DP clipped gradient, benchmark CNN: `dp.clipped_grad` / Opacus ghost clipping", "dp", {"network": "cnn"},
     "ghost", "opacus_ghost"),
    ("DP clipped gradient, MLP: `dp.clipped_grad` / Opacus ghost clipping", "dp", {"network": "mlp"}, "ghost",
     "opacus_ghost"),
    ("DP clipped gradient, MLP: `jit(dp.clipped_grad)` / Opacus ghost clipping", "dp", {"network": "mlp"},
     "jit_ghost", "opacus_ghost"),
]


def add_arguments(parser):
    parser.add_argument("--data", default=results_files.DOCS_DATA_DIR,
                        help="the folder of the runs' JSON files (default docs/performance/data)")
    parser.add_argument("--out", default=results_files.DOCS_DIR, help="where the pages go (default docs/performance)")
    parser.add_argument("--readme", default=README, help="the README whose performance table is filled in")
    parser.add_argument("--no-readme", action="store_true", help="leave the README alone")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit with status 1 when a page differs from what the JSON files give")


# ---------------------------------------------------------------------------------------
# Reading the runs
# ---------------------------------------------------------------------------------------


def load_runs(data_dir):
    """The runs of ``data_dir``: ``{suite: [results, ...]}``, the suites in the CLI's order,
    each suite's runs by device (cpu first)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(data_dir, "*.json"))):
        results = results_files.load(path)
        results["_file"] = os.path.basename(path)
        runs.setdefault(results["suite"], []).append(results)
    order = list(SUITES)
    # per device the suite's main run (SUITE-DEVICE.json) first, then its variants
    # (SUITE-DEVICE-VARIANT.json: results.docs_json_path)
    return {s: sorted(runs[s], key=lambda r: (r["device"] != "cpu", r["device"],
                                              r["_file"] != f"{s}-{r['device']}.json", r["_file"]))
            for s in sorted(runs, key=lambda s: order.index(s) if s in order else len(order))}


def suite_module(suite):
    """The suite's module (its docstring, summary and ``DOC_TABLES``)."""
    return importlib.import_module(SUITES[suite])


# ---------------------------------------------------------------------------------------
# A run's header: what it ran on
# ---------------------------------------------------------------------------------------


def _blas(machine):
    libs = machine.get("blas")
    if not libs:
        return "unknown (threadpoolctl was not installed)"
    return "; ".join(f"{b['api']} {b['version']}, kernel {b['kernel']}, {b['threads']} threads"
                     + (f", {b['threading_layer']}" if b.get("threading_layer") else "") for b in libs)


def _environment(env):
    given = [f"`{k}={v}`" for k, v in env.items() if v is not None]
    return (", ".join(given) + "; the others unset") if given else "all unset: " + ", ".join(f"`{k}`" for k in env)


def _versions(versions):
    return ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None)


def _commit(git):
    if not git:
        return "unknown (not a git checkout)"
    return f"`{git['short']}`" + (" with uncommitted changes" if git["dirty"] else "")


def _load(load):
    parts = []
    if load.get("others_cores") is not None:
        parts.append(f"other processes used {load['others_cores']:.2f} of the {load['cores']} cores on average "
                     f"(steal {load['steal_cores']:.2f}) over the run's {load['wall_s']:.0f} s")
    if load.get("loadavg_start") is not None:
        parts.append(f"load average {load['loadavg_start']:.2f} at the start, {load['loadavg_end']:.2f} at the end")
    return "; ".join(parts) or "unknown"


def machine_line(run):
    """The machine and the commit of a run, in one sentence."""
    m = run["machine"]
    return (f"{m['cpu']}, {m['cores']} logical cores, {_blas(m)}; commit {_commit(run.get('git'))}"
            + ("; **not a quiet machine**" if run["machine_load"].get("warning") else ""))


def run_header(run):
    """The header of a run: a warning when the machine was busy, then what it ran on."""
    m, load = run["machine"], run["machine_load"]
    lines = []
    if load.get("warning"):
        lines += [f"> **Not a quiet machine.** The load measured during this run: {_load(load)}. These figures are "
                  "slower and noisier than this machine can do; the command below, run again on a quiet machine, "
                  "replaces them.", ""]
    rows = [("machine", f"{m['cpu']}, {m['cores']} logical cores; {m['platform']}"),
            ("device", m["device"]),
            ("BLAS", _blas(m)),
            ("threading environment", _environment(run["environment"])),
            ("cuvmap's CPU threads", m["cuvmap_cpu_threads"]),
            ("load during the run", _load(load)),
            ("commit", _commit(run.get("git"))),
            ("versions", _versions(run["versions"])),
            ("command", f"`{run['command']}`"),
            ("rounds", run["settings"].get("rounds", "–")),
            ("data", f"[data/{run['_file']}](data/{run['_file']})")]
    return lines + [markdown_table(["", ""], rows, "ll")]


# ---------------------------------------------------------------------------------------
# A suite's tables
# ---------------------------------------------------------------------------------------


def ratios_table(run):
    """The run's ratios between its methods, as it judged them: value (medians), interval
    and verdict from the rounds the two shared, target and whether it is met beyond the
    noise."""
    entries = run.get("ratios") or []
    if not entries:
        return []
    by_batch = any("batch" in e for e in entries)
    rows = []
    for e in entries:
        c = e.get("comparison")
        met = e.get("met_beyond_noise") or ("yes" if e.get("met") else "no" if e.get("met") is False else
                                            "not measured" if e["value"] is None else "")
        rows.append(((e["batch"],) if by_batch else ()) + (
            e["ratio"], e["value"], interval_text(c), verdict_cell(c), e.get("target") or "(for information)", met))
    headers = (["batch"] if by_batch else []) + ["ratio", "value (medians)", "95% CI", "verdict", "target", "met"]
    return ["### Ratios", "",
            markdown_table(headers, rows, ("r" if by_batch else "") + "lrllll"), "",
            "Verdict: **SLOW** / **FAST** when the numerator is slower / faster than the denominator beyond the noise "
            "(the interval above / below 1) by more than the run's factor; SAME otherwise (? when the interval is "
            "too wide to tell). Met: yes / no when the whole interval is on one side of the target."]


def suite_tables(run, tables):
    """The suite's tables (``DOC_TABLES``: :class:`~benchmarks.report.tables.DocTable`) on
    one run."""
    lines = []
    for table in tables:
        rows = table.rows(run)
        if not rows:
            continue
        lines += [f"### {table.title}", "", markdown_table(table.headers, [table.cells(r, run) for r in rows],
                                                            table.align), ""]
        if table.note:
            lines += [table.note, ""]
    return lines


def _title(mod):
    return mod.__doc__.strip().split("\n\n")[0].replace("\n", " ").rstrip(".")


def suite_page(suite, runs):
    """The page of one suite: its title, then per run the header, the tables and the ratios."""
    mod = suite_module(suite)
    lines = [GENERATED, "", f"# {suite}: {_title(mod)}", ""]
    for run in runs:
        if len(runs) > 1:
            same_device = sum(r["device"] == run["device"] for r in runs) > 1
            order = (run.get("settings") or {}).get("import order")
            lines += [f"## On the {run['device'].upper()}" + (f", {order}" if same_device and order else ""), ""]
        lines += run_header(run) + [""]
        lines += suite_tables(run, getattr(mod, "DOC_TABLES", []))
        ratios = ratios_table(run)
        if ratios:
            lines += ratios + [""]
        notes = run.get("notes") or []
        if isinstance(notes, list) and notes:
            lines += ["### Notes", ""] + [f"- {n}" for n in notes] + [""]
        lines += ["### Settings", "", markdown_table(["setting", "value"],
                                                     [(k, str(v)) for k, v in run["settings"].items()], "ll"), ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------
# The headline table (README and index)
# ---------------------------------------------------------------------------------------


def _headline_row(runs, what, suite, where, mine, peer):
    run = next((r for r in runs.get(suite, []) if r["device"] == "cpu"), None)
    if run is None:
        return None, None
    found = {r["key"]: r for r in run["rows"] if r.get("batch") == HEADLINE_BATCH
             and all(r.get(k) == v for k, v in where.items())}
    if mine not in found or peer not in found:
        return None, run
    a, b = found[mine], found[peer]
    c = bstats.compare_paired(a["times_ms"], b["times_ms"])
    return (what, a["median_ms"], b["median_ms"], c.ratio, c.interval(), verdict_cell(c.as_dict())), run


def headline(runs):
    """The README's table: cuvmap against torch.func and Opacus at batch 128 on the CPU, each
    ratio with its interval and verdict from the rounds the two methods shared; then the
    machine and commit of each run it comes from. Empty when no run holds its rows."""
    rows, sources = [], {}
    for what, suite, where, mine, peer in HEADLINE:
        row, run = _headline_row(runs, what, suite, where, mine, peer)
        if row is not None:
            rows.append(row)
            sources[run["_file"]] = run
    if not rows:
        return ["No run for the docs yet: `python -m benchmarks per_example --batch 32 128 --save-to-docs` and "
                "`python -m benchmarks dp --batch 32 128 --save-to-docs`, then `python -m benchmarks report`."]
    lines = [markdown_table([f"batch {HEADLINE_BATCH}, CPU, float32", "cuvmap ms", "peer ms", "cuvmap / peer",
                             "95% CI", "verdict"], rows, "lrrrll"), ""]
    lines.append("FAST: cuvmap faster than the peer beyond the noise of the rounds the two shared; SLOW: slower; "
                 "SAME: within it (? when the interval is too wide to tell). Measured on:")
    lines.append("")
    for run in sources.values():
        lines.append(f"- `{run['suite']}`: {machine_line(run)}")
    return lines


def index_page(runs):
    lines = [GENERATED, "", "# Performance", "",
             "Every figure here is a ratio between methods timed side by side in one run, in interleaved rounds, "
             "with a confidence interval from the rounds they shared; each page says which machine, commit and "
             "command made it, and how busy the machine was. Regenerate the pages with "
             "`python -m benchmarks report` after a run saved with `--save-to-docs`.", "",
             "## Against torch.func and Opacus", ""]
    lines += headline(runs) + ["", "## The suites", ""]
    table = []
    for suite, suite_runs in runs.items():
        for run in suite_runs:
            table.append((f"[{suite}]({suite}.md)", run["device"], _title(suite_module(suite)), machine_line(run)))
    lines.append(markdown_table(["suite", "device", "what it measures", "machine and commit"], table, "llll"))
    return "\n".join(lines).rstrip() + "\n"


def readme_with_table(text, runs):
    """``text`` (the README) with its performance block filled in; a ValueError when it
    has no such block."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"the README has no block between {BEGIN} and {END} (one of each, in that order)")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    block = "\n".join(["", "<!-- made by `python -m benchmarks report` from docs/performance/data/: do not edit -->", ""]
                      + headline(runs)
                      + ["", "Every suite, machine and command: [docs/performance](docs/performance/index.md).", ""])
    return head + BEGIN + block + END + tail


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------


def pages(data_dir, out_dir, readme=None):
    """``{path: text}`` of every page the JSON files of ``data_dir`` give (and the README's
    new text when ``readme`` is a path)."""
    runs = load_runs(data_dir)
    out = {os.path.join(out_dir, "index.md"): index_page(runs)}
    for suite, suite_runs in runs.items():
        out[os.path.join(out_dir, f"{suite}.md")] = suite_page(suite, suite_runs)
    if readme is not None:
        with open(readme) as fh:
            out[readme] = readme_with_table(fh.read(), runs)
    return out


def main(args):
    """``python -m benchmarks report``: writes the pages (or, with ``--check``, compares);
    returns the exit status."""
    try:
        made = pages(args.data, args.out, None if args.no_readme else args.readme)
    except (OSError, ValueError, KeyError) as err:
        print(f"python -m benchmarks report: {type(err).__name__}: {err}")
        return 2
    stale = []
    for path, text in made.items():
        old = open(path).read() if os.path.exists(path) else None
        if old == text:
            continue
        stale.append(path)
        if not args.check:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(text)
    for path in stale:
        print(f"{'differs' if args.check else 'wrote'}: {os.path.relpath(path)}")
    if not stale:
        print(f"{len(made)} pages, all as the JSON files give them")
    return 1 if (args.check and stale) else 0
