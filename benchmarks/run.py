"""One run of a suite: what every suite's run shares.

The timing policy from the common options, the background load started and stopped
around the suite, the settings printed before its tables, the machine's load measured
during it, and the results: printed, written as JSON (with the machine, the commit, the
command line, the settings and the peers' versions: :func:`record`), plotted where the
suite has a batch-size axis, and compared with a stored run (``--compare-to``).
"""
import importlib
import os
import sys

from benchmarks.machine import settings as machine_settings
from benchmarks.machine.background import BackgroundLoad, report_lines
from benchmarks.machine.load import LoadMonitor
from benchmarks.report import compare, plots
from benchmarks.report import results as results_files
from benchmarks.rounds import stats as bstats
from benchmarks.rounds import timers
from benchmarks.rounds.runner import Policy
from benchmarks.suites import OWN_ROUNDS, SUITES
from cuvmap.cpu import threads as cpu_threads


def run(args):
    """Runs the suite ``args.suite``; returns the results dict (also written as JSON), or
    None when nothing could be measured (a message on stderr)."""
    mod = importlib.import_module(SUITES[args.suite])
    if args.device == "gpu":
        from cuvmap.cuda import device as cuda_device  # GPU-only code: imported where asked for

        if not cuda_device.gpu_available():
            print("python -m benchmarks: --device gpu, but CuPy is not installed or sees no CUDA device; "
                  "nothing measured", file=sys.stderr)
            return None
    timers.GPU_TIMING["l2_flush"] = getattr(args, "l2_flush", "on") == "on"
    try:
        args.policy = Policy.from_args(args)
        load = BackgroundLoad(getattr(args, "background_load", 0) or 0, alternate=getattr(args, "alternate_load", False))
    except ValueError as err:
        print(f"python -m benchmarks {args.suite}: {err}", file=sys.stderr)
        return None
    if load.alternate:
        args.policy.load = load
    try:
        load.start()
        return _run_loaded(args, mod, load)
    finally:
        load.stop()


def run_settings(args, load):
    """The settings printed with the figures: the machine's, the background load, cuvmap's
    CPU threads, the rounds, the GPU timing."""
    settings = machine_settings.settings(args.device)
    settings["background load"] = load.describe()
    if args.device == "cpu":
        settings["cuvmap CPU threads"] = cpu_threads.describe()
    if args.suite in OWN_ROUNDS:
        settings["rounds"] = "the suite's own (--max-spread and --inject-slowdown do not apply)"
    else:
        settings["rounds"] = args.policy.describe()
    if args.device == "gpu":
        settings["GPU timing"] = ("CUDA events after a device synchronisation" +
                                  (", the L2 cache flushed before each call" if timers.GPU_TIMING["l2_flush"] else "") +
                                  ("; CuPy/torch cases as CUDA-graph replays" if args.cuda_graph else ""))
    return settings


def record(args, argv):
    """What a JSON file keeps about the run besides its figures: the machine, the commit,
    the command line (and the command that reproduces it), the threading environment,
    the versions of cuvmap and of the peers."""
    environment = machine_settings.thread_environment()
    return dict(machine=machine_settings.machine_record(args.device), git=machine_settings.git_commit(),
                versions=machine_settings.versions(), environment=environment,
                command=machine_settings.command_line(argv, environment))


def _run_loaded(args, mod, load):
    settings = run_settings(args, load)
    argv = getattr(args, "argv", None)
    argv = argv if argv is not None else sys.argv[1:]
    results = dict(suite=args.suite, device=args.device, argv=argv, settings=settings)
    git = machine_settings.git_commit()  # the code that runs: the tree as it is now
    monitor = LoadMonitor()
    results.update(mod.run(args, settings))
    machine = monitor.stop()
    results["machine_load"] = machine
    results["background_load"] = load.stop()
    results.update(record(args, argv), git=git)
    confidence = getattr(args, "confidence", bstats.DEFAULT_CONFIDENCE)
    if load.alternate:
        rows = load.report(getattr(mod, "TORCH_COUNTERPART", {}), factor=getattr(args, "factor", bstats.DEFAULT_FACTOR),
                           confidence=confidence)
        results["alternate_load"] = rows
        print()
        print("\n".join(report_lines(rows, load.n, confidence=confidence)))
    p = args.policy
    results["timing_policy"] = dict(repeats=p.repeats, warmup=p.warmup, max_spread=p.max_spread,
                                    max_repeats=p.max_repeats, max_seconds=p.max_seconds, inject=p.inject,
                                    cuda_graph=p.cuda_graph)
    unmatched = p.unmatched() if args.suite not in OWN_ROUNDS else []
    if unmatched:
        print(f"\n**--inject-slowdown**: no case is named {', '.join(map(repr, unmatched))} (a row's key or its "
              "method label)")
        results["exit_status"] = max(results.get("exit_status", 0), 2)
    plot = results.pop("plot", None)

    print(f"\nmachine load during the run: {LoadMonitor.describe(machine)}")
    background = BackgroundLoad.describe_result(results["background_load"])
    if background:
        print(f"{background} (counted in the load above)")
    if args.device == "cpu":
        print(f"cuvmap's CPU threads: {cpu_threads.describe()}")
    if machine["warning"]:
        print(f"\n**warning**: {machine['warning']}")
    _write(args, results, plot)
    if getattr(args, "compare_to", None):
        _compare_to(args, results)
    return results


def _write(args, results, plot):
    """The JSON files (``--json``, ``--save-to-docs``, else the default path) and the plot
    (``--plot``, else beside the JSON of ``--json`` or the default one)."""
    default = results_files.default_json_path(args.suite, args.device)
    print()
    if plot is not None and not args.no_plot:
        path, note = plots.plot_lines(args.plot or os.path.splitext(args.json or default)[0] + ".png", **plot)
        if path:
            results["plot_path"] = path
        print(f"plot: {path}" if path else note)
    elif plot is None and not args.no_plot:
        print(f"no plot: the {args.suite} suite has no batch-size axis to plot")
    json_path = args.json or (default if not (args.no_json or args.save_to_docs) else None)
    if json_path:
        results["json_path"] = json_path
        results_files.write_json(json_path, results)
        print(f"JSON: {json_path}")
    if args.save_to_docs:
        # the committed file: no path of this machine in it
        variant = "torch-first" if getattr(args, "torch_first", False) else None
        path = results_files.docs_json_path(args.suite, args.device, variant=variant)
        results_files.write_json(path, {k: v for k, v in results.items() if k not in ("json_path", "plot_path")})
        print(f"JSON for the docs: {path} (`python -m benchmarks report` makes docs/performance/ and the README's "
              "table from it)")


def _compare_to(args, results):
    try:
        base = results_files.load(args.compare_to)
    except (OSError, ValueError) as err:
        print(f"\n--compare-to: cannot read {err}")
        results["exit_status"] = 2
        return
    print()
    report = compare.compare_results(base, results_files.jsonable(results), args.factor, args.confidence,
                                     args.relative_to)
    compare.print_report(report, "BASE", "this run")
    print(f"\nBASE: {args.compare_to}")
    results["exit_status"] = max(results.get("exit_status", 0), report["status"])
