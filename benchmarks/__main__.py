"""cuvmap's benchmarks, one CLI:

    python -m benchmarks per_example --batch 32 128 --device cpu
    python -m benchmarks conv --batch 32 128
    python -m benchmarks dispatch
    python -m benchmarks distributed
    python -m benchmarks control_flow --length 1000
    python -m benchmarks dp --batch 32 128 512
    python -m benchmarks accounting
    python -m benchmarks selfcheck
    python -m benchmarks compare BASE.json HEAD.json
    python -m benchmarks dp --batch 32 128 --background-load 1 --alternate-load
    python -m benchmarks SUITE --help

Every suite prints its settings and markdown tables on stdout, writes its figures as JSON
(``--json PATH``; by default ``benchmarks/results/SUITE-DEVICE-TIME.json``, git-ignored)
and, where it has a batch axis and matplotlib is installed, a PNG plot beside the JSON
(``--plot PATH``). A progress bar goes to stderr on a terminal (``--progress on`` for one
line per step in logs, ``off`` for none).

The methods of a suite are timed side by side: each case's first call alone, warm-up,
then rounds that time every case once, in rotating order, repeated until each case's
IQR / median is below ``--max-spread`` (or ``--max-repeats`` / ``--max-seconds`` are spent
and the case is flagged ⚠); on the GPU with CUDA events after an L2 flush
(``--l2-flush off``), or as CUDA-graph replays (``--cuda-graph``) (``benchmarks/timing.py``).
Ratios between methods come with a confidence interval from the paired rounds and a
verdict, FAST, SLOW or SAME (``benchmarks/stats.py``). ``compare BASE.json HEAD.json`` (or
``--compare-to BASE.json`` after a run) gives a verdict per case between two runs
(``--relative-to KEY``: by each case's per-round ratio to the case ``KEY`` of its group,
which cancels a machine busier in one run) and exits with status 1 on a SLOW
(``benchmarks/compare.py``); ``selfcheck`` checks that a
slowdown of 10 % injected into one case (``--inject-slowdown CASE=0.1``, any suite) comes
out SLOW and the other cases do not.

``--background-load N`` starts N busy-loop processes before the suite and stops them
after it (a machine with N cores busy with other work; printed with the settings, and the
CPU the loops got is printed with the machine's load); with ``--alternate-load`` every
round is timed twice, the loops paused and running, and a table gives each case's loaded /
quiet ratio and cuvmap / torch under load, paired by round (``benchmarks/background.py``).

The benchmarks never change the threading environment (``OPENBLAS_CORETYPE``,
``OMP_NUM_THREADS``, ...): set or unset it in the command, e.g.
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks per_example``; the
values in force are printed with the figures.
"""
import argparse
import importlib
import os
import sys

from benchmarks import background, compare, timing
from benchmarks import stats as bstats

SUITES = {
    "per_example": "benchmarks.suite_per_example",
    "conv": "benchmarks.bench_conv",
    "dispatch": "benchmarks.bench_dispatch",
    "distributed": "benchmarks.bench_distributed",
    "control_flow": "benchmarks.bench_control_flow",
    "dp": "benchmarks.bench_dp",
    "accounting": "benchmarks.bench_accounting",
    "memory": "benchmarks.bench_memory",
    "selfcheck": "benchmarks.selfcheck",
}
# suites that time their cases in their own way (rounds under mpiexec, the accountants'
# single calls): the rounds' options (--max-spread, --inject-slowdown, ...) do not reach them
OWN_ROUNDS = {"distributed", "accounting"}


def add_common_arguments(parser, defaults):
    g = parser.add_argument_group("common options")
    g.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="cpu (NumPy) or gpu (CuPy; timed with CUDA events)")
    g.add_argument("--repeats", type=int, default=defaults.get("repeats", 5),
                   help="timed rounds at least (each case once per round)")
    g.add_argument("--max-spread", type=float, default=timing.DEFAULT_MAX_SPREAD,
                   help="more rounds while a case's IQR / median is above this (0: exactly --repeats rounds); "
                        "cases still above it are flagged")
    g.add_argument("--max-repeats", type=int, default=None,
                   help="rounds at most while a case is above --max-spread (default max(20, 4 × --repeats))")
    g.add_argument("--max-seconds", type=float, default=timing.DEFAULT_MAX_SECONDS,
                   help="time budget of the adaptive rounds of one group of cases, in seconds")
    compare.add_verdict_arguments(g)
    g.add_argument("--compare-to", metavar="BASE.json", default=None,
                   help="compare this run with a stored one (as `compare BASE.json HEAD.json`); exit status 1 on a "
                        "SLOW")
    g.add_argument("--inject-slowdown", metavar="CASE=FRACTION", action="append", default=None,
                   help="self-check: make the timed calls of the case with this key or label slower by FRACTION of "
                        "its own time (repeatable)")
    g.add_argument("--background-load", type=int, default=0, metavar="N",
                   help="start N busy-loop processes before the suite and stop them after it (a machine with N "
                        "cores busy with other work); printed with the settings")
    g.add_argument("--alternate-load", action="store_true",
                   help="with --background-load N: time each round twice, the loops paused and running, and report "
                        "each case's loaded / quiet ratio and cuvmap / torch under load, paired by round")
    g.add_argument("--l2-flush", choices=["on", "off"], default="on",
                   help="gpu: flush the L2 cache (write twice its size) before each timed call")
    g.add_argument("--cuda-graph", action="store_true",
                   help="gpu: capture each CuPy/torch case as a CUDA graph and time its replays")
    g.add_argument("--warmup", type=int, default=defaults.get("warmup", 1),
                   help="untimed calls before the timed ones (the first is reported as 'first call')")
    g.add_argument("--json", metavar="PATH", default=None,
                   help="write the figures here (default benchmarks/results/SUITE-DEVICE-TIME.json)")
    g.add_argument("--no-json", action="store_true", help="write no JSON file")
    g.add_argument("--plot", metavar="PATH", default=None, help="PNG plot path (default: the JSON's, .png)")
    g.add_argument("--no-plot", action="store_true", help="make no plot")
    g.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                   help="progress bar on stderr: auto (on a terminal), on (also one line per step in logs), off")


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)
    p = sub.add_parser("compare", help=compare.SUMMARY, description=compare.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    compare.add_arguments(p)
    for name, modname in SUITES.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.SUMMARY, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        add_common_arguments(p, getattr(mod, "DEFAULTS", {}))
    return parser


def run(args):
    """Runs the suite ``args.suite``; returns the results dict (also written as JSON)."""
    from benchmarks import harness

    mod = importlib.import_module(SUITES[args.suite])
    if args.device == "gpu":
        from cuvmap.cuda import device as cuda_device

        if not cuda_device.gpu_available():
            print("python -m benchmarks: --device gpu, but CuPy is not installed or sees no CUDA device; "
                  "nothing measured", file=sys.stderr)
            return None
    timing.GPU_TIMING["l2_flush"] = getattr(args, "l2_flush", "on") == "on"
    try:
        args.policy = harness.Policy.from_args(args)
        load = background.BackgroundLoad(getattr(args, "background_load", 0) or 0,
                                         alternate=getattr(args, "alternate_load", False))
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


def _run_loaded(args, mod, load):
    from benchmarks import harness
    from cuvmap.cpu import threads as cpu_threads  # after main()'s --torch-first import of torch

    settings = harness.settings(args.device)
    settings["background load"] = load.describe()
    if args.device == "cpu":
        settings["cuvmap CPU threads"] = cpu_threads.describe()
    if args.suite in OWN_ROUNDS:
        settings["rounds"] = "the suite's own (--max-spread and --inject-slowdown do not apply)"
    else:
        settings["rounds"] = args.policy.describe()
    if args.device == "gpu":
        settings["GPU timing"] = ("CUDA events after a device synchronisation" +
                                  (", the L2 cache flushed before each call" if timing.GPU_TIMING["l2_flush"] else "") +
                                  ("; CuPy/torch cases as CUDA-graph replays" if args.cuda_graph else ""))
    argv = getattr(args, "argv", None)
    results = dict(suite=args.suite, device=args.device, argv=argv if argv is not None else sys.argv[1:],
                   settings=settings)
    monitor = harness.LoadMonitor()
    results.update(mod.run(args, settings))
    machine = monitor.stop()
    results["machine_load"] = machine
    results["background_load"] = load.stop()
    if load.alternate:
        rows = load.report(getattr(mod, "TORCH_COUNTERPART", {}), factor=getattr(args, "factor", bstats.DEFAULT_FACTOR),
                           confidence=getattr(args, "confidence", bstats.DEFAULT_CONFIDENCE))
        results["alternate_load"] = rows
        print()
        print("\n".join(background.report_lines(rows, load.n, confidence=getattr(args, "confidence",
                                                                                   bstats.DEFAULT_CONFIDENCE))))
    results["timing_policy"] = dict(repeats=args.policy.repeats, warmup=args.policy.warmup,
                                    max_spread=args.policy.max_spread, max_repeats=args.policy.max_repeats,
                                    max_seconds=args.policy.max_seconds, inject=args.policy.inject,
                                    cuda_graph=args.policy.cuda_graph)
    unmatched = args.policy.unmatched() if args.suite not in OWN_ROUNDS else []
    if unmatched:
        print(f"\n**--inject-slowdown**: no case is named {', '.join(map(repr, unmatched))} (a row's key or its "
              "method label)")
        results["exit_status"] = max(results.get("exit_status", 0), 2)
    plot = results.pop("plot", None)

    print(f"\nmachine load during the run: {harness.LoadMonitor.describe(machine)}")
    if background.BackgroundLoad.describe_result(results["background_load"]):
        print(f"{background.BackgroundLoad.describe_result(results['background_load'])} (counted in the load above)")
    if args.device == "cpu":
        print(f"cuvmap's CPU threads: {cpu_threads.describe()}")
    if machine["warning"]:
        print(f"\n**warning**: {machine['warning']}")

    json_path = None
    if not args.no_json:
        json_path = args.json or harness.default_json_path(args.suite, args.device)
    print()
    if plot is not None and not args.no_plot:
        plot_path = args.plot or (os.path.splitext(json_path)[0] + ".png" if json_path
                                  else harness.default_json_path(args.suite, args.device)[:-5] + ".png")
        path, note = harness.plot_lines(plot_path, **plot)
        if path:
            results["plot_path"] = path
        print(f"plot: {path}" if path else note)
    elif plot is None and not args.no_plot:
        print(f"no plot: the {args.suite} suite has no batch-size axis to plot")
    if json_path:
        results["json_path"] = json_path
        harness.write_json(json_path, results)
        print(f"JSON: {json_path}")
    if getattr(args, "compare_to", None):
        try:
            base = compare.load(args.compare_to)
        except (OSError, ValueError) as err:
            print(f"\n--compare-to: cannot read {err}")
            results["exit_status"] = 2
            return results
        print()
        report = compare.compare_results(base, harness.jsonable(results), args.factor, args.confidence,
                                         args.relative_to)
        compare.print_report(report, "BASE", "this run")
        print(f"\nBASE: {args.compare_to}")
        results["exit_status"] = max(results.get("exit_status", 0), report["status"])
    return results


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--torch-first" in argv:
        # before NumPy and cuvmap: torch's libgomp.so.1, with the OpenMP wait policy of the
        # environment as it is now, is the one libdnnl gets (NOTE [oneDNN beside another
        # OpenMP user] in cuvmap/cpu/onednn.py)
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
    args = build_parser().parse_args(argv)
    if args.suite == "compare":
        return compare.main(args)
    args.argv = argv
    results = run(args)
    return results.get("exit_status", 0) if results is not None else 2


if __name__ == "__main__":
    sys.exit(main())
