"""The privacy accountants: ε of the anchor recipes by the PLD and RDP accountants, and the
time of ``get_epsilon`` and of ``dp.calibrate_noise``.

    python -m benchmarks accounting [--recipes mnist cifar10 ...] [--repeats 3] [--json PATH]

For each recipe (σ, q, steps, δ) — the anchors of issue 25 (MNIST: σ = 1.1, q = 256/60000,
60 epochs = 14,063 steps; CIFAR-10: σ = 3, q = 4096/50000, 2,500 steps; δ = 1e-5) and two
more — it reports ε by ``dp.RDPAccountant`` and by ``dp.PLDAccountant`` at its default
grid (1e-4) and at 1e-3, against the values Google's ``dp_accounting`` 0.6.0 gives (stored
here, as in tests/dp/test_pld.py); then the time of one ``get_epsilon`` from scratch (a new
accountant, the per-step PLD cache cleared: what a training loop pays once at its end) and
of one ``calibrate_noise(ε_PLD, δ, q, steps)`` from scratch (its memo cleared) for each
accountant, with the σ it returns, and the time of a memoised call. When ``dp_accounting``
is installed, its PLD accountant's time and value are measured beside ours.

Every figure is single-threaded work in this process, timed with ``perf_counter`` (wall
clock) and, for ``calibrate_noise``, with ``process_time`` too (the CPU it used: what a
quiet machine would show when other processes share the cores); medians of ``--repeats``
rounds, the ``get_epsilon`` cases interleaved. Targets (issue 25): ε_PLD within 1 % of dp_accounting's,
and ``calibrate_noise`` under a second.
"""
import time

from cuvmap import dp
from cuvmap.dp import accounting as _accounting
from cuvmap.dp import pld as _pld

from benchmarks.methods import dp_accounting_methods
from benchmarks.report.progress import Progress
from benchmarks.report.tables import DocTable, markdown_table, settings_table

SUMMARY = "privacy accountants: ε by PLD and RDP on the anchor recipes, time of get_epsilon and calibrate_noise"
DEFAULTS = dict(repeats=3, warmup=1)

# name → (σ, q, steps, δ), dp_accounting 0.6.0's (PLD at 1e-4, PLD at 1e-3, RDP)
RECIPES = {
    "mnist": ((1.1, 256 / 60000, 14063, 1e-5), (2.381778813, 2.390623414, 2.59665553)),
    "cifar10": ((3.0, 4096 / 50000, 2500, 1e-5), (6.578903907, 6.579700497, 7.098494143)),
    "small_q": ((2.0, 0.001, 50000, 1e-6), (0.4828017598, 0.619414948, 0.5213005766)),
    "large_q": ((1.0, 0.1, 100, 1e-5), (7.046602877, 7.046628943, 7.903850224)),
}
CALIBRATE_TARGET_S = 1.0
REL_TARGET = 0.01


DOC_TABLES = [
    DocTable("ε", "rows", [
        ("recipe", "recipe", "l"), ("σ", "sigma", "r"), ("q", "q", "r"), ("steps", "steps", "r"), ("δ", "delta", "r"),
        ("ε RDP", "eps_rdp", "r"), ("ε PLD (1e-4)", "eps_pld", "r"), ("dp_accounting PLD", "dp_accounting_pld", "r"),
        ("PLD / dp_accounting − 1", "rel_vs_dp_accounting", "r")]),
    DocTable("Time (ms, medians; calibrate from scratch to the recipe's ε_PLD)", "rows", [
        ("recipe", "recipe", "l"), ("get_epsilon RDP", lambda row, run: row["get_epsilon_ms"]["rdp"], "r"),
        ("get_epsilon PLD", lambda row, run: row["get_epsilon_ms"]["pld"], "r"),
        ("calibrate PLD", lambda row, run: row["calibrate"]["pld"]["ms"], "r"),
        ("calibrate RDP", lambda row, run: row["calibrate"]["rdp"]["ms"], "r")]),
    DocTable("Targets", "targets", [("check", "check", "l"), ("value", "value", "r"), ("target", "target", "l"),
                                    ("met", lambda row, run: "yes" if row["met"] else "no", "l")]),
]


def add_arguments(parser):
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=list(RECIPES),
                        help="the recipes to account")
    parser.add_argument("--no-dp-accounting", action="store_true",
                        help="skip dp_accounting even when installed")


def _fresh_epsilon(kind, sigma, q, steps, delta, h=None):
    """ε by a new accountant, nothing cached."""
    if kind == "rdp":
        acct = dp.RDPAccountant()
    else:
        _pld._cached_step.cache_clear()
        acct = dp.PLDAccountant(discretization=h)
    acct.step(sigma, q, steps)
    return acct.get_epsilon(delta)


def _fresh_calibrate(kind, target, delta, q, steps):
    _accounting._calibrate.cache_clear()
    _pld._cached_step.cache_clear()
    return dp.calibrate_noise(target, delta, q, steps, accountant=kind)


def _median_time(fn, repeats):
    """Median wall-clock and CPU (this process) seconds of ``fn()``, and its last value."""
    walls, cpus = [], []
    out = None
    for _ in range(max(1, repeats)):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return sorted(walls)[len(walls) // 2], sorted(cpus)[len(cpus) // 2], out


def run(args, settings):
    reference = None if args.no_dp_accounting else dp_accounting_methods.pld_epsilon()
    print("# privacy accountants of the Poisson-subsampled Gaussian (add/remove-one)")
    print()
    print(settings_table(settings))
    print()
    rows, eps_table, time_table = [], [], []
    cases = [(name, *RECIPES[name]) for name in args.recipes]
    with Progress(len(cases), args.progress) as progress:
        for name, (sigma, q, steps, delta), (ref_fine, ref_coarse, ref_rdp) in cases:
            progress.set(name)
            for _ in range(max(0, args.warmup)):
                _fresh_epsilon("pld", sigma, q, steps, delta, 1e-4)
            timed = {
                "rdp": lambda: _fresh_epsilon("rdp", sigma, q, steps, delta),
                "pld": lambda: _fresh_epsilon("pld", sigma, q, steps, delta, 1e-4),
                "pld_coarse": lambda: _fresh_epsilon("pld", sigma, q, steps, delta, 1e-3),
            }
            if reference is not None:
                timed["dp_accounting"] = lambda: reference(sigma, q, steps, delta)
            stats = {k: [] for k in timed}
            values = {}
            for _ in range(max(1, args.repeats)):  # interleaved rounds
                for key, fn in timed.items():
                    t, _, values[key] = _median_time(fn, 1)
                    stats[key].append(t)
            med = {k: sorted(v)[len(v) // 2] for k, v in stats.items()}
            target = values["pld"]
            cal = {}
            for kind in ("pld", "rdp"):
                t, c, s = _median_time(lambda: _fresh_calibrate(kind, target, delta, q, steps), args.repeats)
                t0 = time.perf_counter()
                dp.calibrate_noise(target, delta, q, steps, accountant=kind)
                cal[kind] = (s, t, time.perf_counter() - t0, c)
            row = dict(recipe=name, sigma=sigma, q=q, steps=steps, delta=delta,
                       eps_rdp=values["rdp"], eps_pld=values["pld"], eps_pld_coarse=values["pld_coarse"],
                       dp_accounting_pld=ref_fine, dp_accounting_pld_coarse=ref_coarse, dp_accounting_rdp=ref_rdp,
                       rel_vs_dp_accounting=values["pld"] / ref_fine - 1,
                       pld_over_rdp=values["pld"] / values["rdp"],
                       get_epsilon_ms={k: v * 1e3 for k, v in med.items()},
                       dp_accounting_measured=values.get("dp_accounting"),
                       calibrate=dict((k, dict(sigma=v[0], ms=v[1] * 1e3, cpu_ms=v[3] * 1e3,
                                               memoised_us=v[2] * 1e6)) for k, v in cal.items()))
            rows.append(row)
            eps_table.append((name, f"σ={sigma:g} q={q:.4g} T={steps} δ={delta:g}", f"{values['rdp']:.4f}",
                              f"{values['pld']:.4f}", f"{ref_fine:.4f}", f"{100 * row['rel_vs_dp_accounting']:+.6f} %",
                              f"{values['pld_coarse']:.4f}", f"{row['pld_over_rdp']:.3f}"))
            time_table.append((name, med["rdp"] * 1e3, med["pld"] * 1e3, med["pld_coarse"] * 1e3,
                               med.get("dp_accounting", float("nan")) * 1e3 if reference else None,
                               cal["pld"][1] * 1e3, cal["pld"][3] * 1e3, f"{cal['pld'][0]:.4f}",
                               cal["rdp"][1] * 1e3, cal["rdp"][3] * 1e3, f"{cal['rdp'][0]:.4f}",
                               cal["pld"][2] * 1e6))
            progress.step(name)
    print("## ε\n")
    print(markdown_table(["recipe", "parameters", "ε RDP", "ε PLD (1e-4)", "dp_accounting PLD",
                                  "PLD vs dp_accounting", "ε PLD (1e-3)", "PLD / RDP"], eps_table))
    print("\n## time (ms, medians; calibrate from scratch to the recipe's ε_PLD)\n")
    print(markdown_table(["recipe", "get_epsilon RDP", "get_epsilon PLD", "PLD (1e-3)",
                                  "dp_accounting PLD", "calibrate PLD", "(CPU)", "σ (PLD)", "calibrate RDP", "(CPU)",
                                  "σ (RDP)",
                                  "memoised call (µs)"], time_table))
    checks = []
    for r in rows:
        checks.append((f"|ε_PLD / dp_accounting − 1| ({r['recipe']})", abs(r["rel_vs_dp_accounting"]),
                       f"≤ {REL_TARGET:g}", "yes" if abs(r["rel_vs_dp_accounting"]) <= REL_TARGET else "no"))
        for kind in ("pld", "rdp"):
            for clock, key in (("wall", "ms"), ("CPU", "cpu_ms")):
                s = r["calibrate"][kind][key] / 1e3
                checks.append((f"calibrate_noise {kind} seconds, {clock} ({r['recipe']})", s,
                               f"< {CALIBRATE_TARGET_S:g}", "yes" if s < CALIBRATE_TARGET_S else "no"))
    print("\n## targets\n")
    print(markdown_table(["check", "value", "target", "met"], checks, "lrll"))
    if reference is None and not args.no_dp_accounting:
        print("\n(dp_accounting is not installed: its column holds the stored 0.6.0 values only)")
    return dict(config=dict(recipes=args.recipes), rows=rows,
                targets=[dict(check=c, value=v, target=t, met=m == "yes") for c, v, t, m in checks])
