"""cuvmap's benchmarks, one CLI:

    python -m benchmarks per_example --batch 32 128 --device cpu
    python -m benchmarks conv --batch 32 128
    python -m benchmarks dispatch
    python -m benchmarks distributed
    python -m benchmarks control_flow --length 1000
    python -m benchmarks dp --batch 32 128 512
    python -m benchmarks accounting
    python -m benchmarks SUITE --help

Every suite prints its settings and markdown tables on stdout, writes its figures as JSON
(``--json PATH``; by default ``benchmarks/results/SUITE-DEVICE-TIME.json``, git-ignored)
and, where it has a batch axis and matplotlib is installed, a PNG plot beside the JSON
(``--plot PATH``). A progress bar goes to stderr on a terminal (``--progress on`` for one
line per step in logs, ``off`` for none).

The benchmarks never change the threading environment (``OPENBLAS_CORETYPE``,
``OMP_NUM_THREADS``, ...): set or unset it in the command, e.g.
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks per_example``; the
values in force are printed with the figures.
"""
import argparse
import importlib
import os
import sys

SUITES = {
    "per_example": "benchmarks.suite_per_example",
    "conv": "benchmarks.bench_conv",
    "dispatch": "benchmarks.bench_dispatch",
    "distributed": "benchmarks.bench_distributed",
    "control_flow": "benchmarks.bench_control_flow",
    "dp": "benchmarks.bench_dp",
    "accounting": "benchmarks.bench_accounting",
}


def add_common_arguments(parser, defaults):
    g = parser.add_argument_group("common options")
    g.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="cpu (NumPy) or gpu (CuPy; timed with CUDA events)")
    g.add_argument("--repeats", type=int, default=defaults.get("repeats", 5),
                   help="timed calls per case (median, min, max)")
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
    settings = harness.settings(args.device)
    argv = getattr(args, "argv", None)
    results = dict(suite=args.suite, device=args.device, argv=argv if argv is not None else sys.argv[1:],
                   settings=settings)
    monitor = harness.LoadMonitor()
    results.update(mod.run(args, settings))
    load = monitor.stop()
    results["machine_load"] = load
    plot = results.pop("plot", None)

    print(f"\nmachine load during the run: {harness.LoadMonitor.describe(load)}")
    if load["warning"]:
        print(f"\n**warning**: {load['warning']}")

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
    args.argv = argv
    results = run(args)
    return 0 if results is not None else 2


if __name__ == "__main__":
    sys.exit(main())
