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
    python -m benchmarks report
    python -m benchmarks dp --batch 32 128 --background-load 1 --alternate-load
    python -m benchmarks SUITE --help

Every suite prints its settings and markdown tables on stdout, writes its figures as JSON
(``--json PATH``; by default ``benchmarks/results/SUITE-DEVICE-TIME.json``, git-ignored;
with ``--save-to-docs`` the committed ``docs/performance/data/SUITE-DEVICE.json``, from
which ``python -m benchmarks report`` makes the pages of ``docs/performance/`` and the
README's performance table) and, where it has a batch axis and matplotlib is installed, a
PNG plot beside the JSON (``--plot PATH``). A progress bar goes to stderr on a terminal (``--progress on`` for one
line per step in logs, ``off`` for none).

The methods of a suite are timed side by side: each case's first call alone, warm-up,
then rounds that time every case once, in rotating order, repeated until each case's
IQR / median is below ``--max-spread`` (or ``--max-repeats`` / ``--max-seconds`` are spent
and the case is flagged ⚠); on the GPU with CUDA events after an L2 flush
(``--l2-flush off``), or as CUDA-graph replays (``--cuda-graph``) (``benchmarks/rounds/``).
Ratios between methods come with a confidence interval from the paired rounds and a
verdict, FAST, SLOW or SAME (``benchmarks/rounds/stats.py``). ``compare BASE.json HEAD.json`` (or
``--compare-to BASE.json`` after a run) gives a verdict per case between two runs
(``--relative-to KEY``: by each case's per-round ratio to the case ``KEY`` of its group,
which cancels a machine busier in one run) and exits with status 1 on a SLOW
(``benchmarks/report/compare.py``); ``selfcheck`` checks that a
slowdown of 10 % injected into one case (``--inject-slowdown CASE=0.1``, any suite) comes
out SLOW and the other cases do not.

``--background-load N`` starts N busy-loop processes before the suite and stops them
after it (a machine with N cores busy with other work; printed with the settings, and the
CPU the loops got is printed with the machine's load); with ``--alternate-load`` every
round is timed twice, the loops paused and running, and a table gives each case's loaded /
quiet ratio and cuvmap / torch under load, paired by round (``benchmarks/machine/background.py``).

The benchmarks never change the threading environment (``OPENBLAS_CORETYPE``,
``OMP_NUM_THREADS``, ...): set or unset it in the command, e.g.
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks per_example``; the
values in force are printed with the figures.
"""
import argparse
import importlib
import sys

from benchmarks.report import compare, pages
from benchmarks.rounds import runner
from benchmarks.suites import SUITES


def add_common_arguments(parser, defaults):
    g = parser.add_argument_group("common options")
    g.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="cpu (NumPy) or gpu (CuPy; timed with CUDA events)")
    g.add_argument("--repeats", type=int, default=defaults.get("repeats", 5),
                   help="timed rounds at least (each case once per round)")
    g.add_argument("--max-spread", type=float, default=runner.DEFAULT_MAX_SPREAD,
                   help="more rounds while a case's IQR / median is above this (0: exactly --repeats rounds); "
                        "cases still above it are flagged")
    g.add_argument("--max-repeats", type=int, default=None,
                   help="rounds at most while a case is above --max-spread (default max(20, 4 × --repeats))")
    g.add_argument("--max-seconds", type=float, default=runner.DEFAULT_MAX_SECONDS,
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
    g.add_argument("--save-to-docs", action="store_true",
                   help="write the figures to docs/performance/data/SUITE-DEVICE.json, the committed file that "
                        "`python -m benchmarks report` makes the docs' pages from (instead of the default path)")
    g.add_argument("--plot", metavar="PATH", default=None, help="PNG plot path (default: the JSON's, .png)")
    g.add_argument("--no-plot", action="store_true", help="make no plot")
    g.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                   help="progress bar on stderr: auto (on a terminal), on (also one line per step in logs), off")


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for name, mod in (("compare", compare), ("report", pages)):
        p = sub.add_parser(name, help=mod.SUMMARY, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
    for name, modname in SUITES.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.SUMMARY, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        add_common_arguments(p, getattr(mod, "DEFAULTS", {}))
    return parser


def main(argv=None):
    """``python -m benchmarks ARGV``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--torch-first" in argv:
        # before cuvmap: torch's libgomp.so.1, with the OpenMP wait policy of the
        # environment as it is now, is the one libdnnl gets (NOTE [oneDNN beside another
        # OpenMP user] in cuvmap/cpu/onednn.py)
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
    from benchmarks import run  # imports cuvmap: after --torch-first's torch (above)

    args = build_parser().parse_args(argv)
    if args.suite == "compare":
        return compare.main(args)
    if args.suite == "report":
        return pages.main(args)
    args.argv = argv
    results = run.run(args)
    return results.get("exit_status", 0) if results is not None else 2
