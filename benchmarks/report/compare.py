"""Compares two runs of a suite, case by case: FAST, SLOW or SAME.

    python -m benchmarks compare BASE.json HEAD.json [--factor 1.05] [--confidence 0.95] [--json OUT]
    python -m benchmarks SUITE ... --compare-to BASE.json     (the same, right after a run)

A case is any entry of the JSON files that holds the times of its calls (``times_ms``):
the rows of every suite, the GEMM rate measured before and after the methods, the conv
suite's kernels. Cases are matched by what names them (network, layer, batch, size, op,
case, key — or the method's label — and where they sit in the file); a case in one file
only is listed, not compared.

For each case the ratio HEAD / BASE is the two-sample Hodges–Lehmann estimate of the
per-call times, with a distribution-free confidence interval (Mann–Whitney), and the
verdict is SLOW when the interval lies above 1 and the estimate is at least ``--factor``,
FAST in the mirror case, SAME otherwise (:mod:`benchmarks.rounds.stats`). With ``--relative-to
KEY`` a case is judged by its ratios to the case ``KEY`` of its group, round by round (the
two were timed in the same rounds), so that a machine that is slower during one run than
the other — the load of a shared machine — does not make every case SLOW. The settings that
differ between the runs and the machine's load during each are printed first: a verdict
from two machines, two BLAS kernels or a busy machine says as much about them as about
the code.

Exit status: 1 when a case is SLOW, 2 when the files cannot be compared (different
suites, no case in common, unreadable), 0 otherwise — a gate for CI, as asv's
``continuous -f`` and pytest-benchmark's ``--benchmark-compare-fail``.
"""
import math

from benchmarks.machine.load import LoadMonitor
from benchmarks.report import results as results_files
from benchmarks.report.tables import markdown_table
from benchmarks.rounds import stats as bstats

SUMMARY = "compare two JSON runs of a suite: FAST / SLOW / SAME per case, exit status 1 on a SLOW"

ID_FIELDS = ("network", "layer", "batch", "size", "op", "case", "key")
# top-level entries that are not measurements (or are ratios of measurements)
REFERENCE = "REF"
NOT_CASES = {"settings", "argv", "machine_load", "config", "frameworks", "notes", "plot", "plot_path", "json_path",
             "ratios", "targets", "flops", "layer_methods", "trace_ms", "timing_policy", "comparison", "base_rows"}


def add_arguments(parser):
    parser.add_argument("base", metavar="BASE.json", help="the reference run")
    parser.add_argument("head", metavar="HEAD.json", help="the run to judge")
    add_verdict_arguments(parser)
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the comparison here")


def add_verdict_arguments(parser):
    parser.add_argument("--factor", type=float, default=bstats.DEFAULT_FACTOR,
                        help="the smallest ratio a verdict calls SLOW (its inverse: FAST), as asv's -f (default "
                             f"{bstats.DEFAULT_FACTOR})")
    parser.add_argument("--confidence", type=float, default=bstats.DEFAULT_CONFIDENCE,
                        help=f"confidence of the intervals (default {bstats.DEFAULT_CONFIDENCE})")
    parser.add_argument("--relative-to", metavar="KEY", default=None,
                        help="judge each case by its per-round ratio to the case with this key (or case name) in its "
                             "group, which cancels a change of the whole machine between the runs")


def _identity(item, index):
    parts = [(f, item[f]) for f in ID_FIELDS if f in item and isinstance(item[f], (str, int, float))]
    if not any(f in ("key", "case") for f, _ in parts) and isinstance(item.get("method"), str):
        parts.append(("method", item["method"]))
    return parts or [("#", index)]


def _walk(obj, ident, out):
    if isinstance(obj.get("times_ms"), list) and obj["times_ms"]:
        key = tuple(ident)
        while key in out:  # two entries named alike: keep both, in order
            key = key + (("#", len(out)),)
        out[key] = obj
        return
    for k, v in obj.items():
        if not ident and k in NOT_CASES:
            continue
        if isinstance(v, dict):
            _walk(v, ident + [("", k)], out)
        elif isinstance(v, list):
            for i, item in enumerate(v):
                if isinstance(item, dict):
                    _walk(item, ident + ([] if k == "rows" else [("", k)]) + _identity(item, i), out)


def timed_cases(results):
    """``{identity: entry}`` of every entry of ``results`` with ``times_ms``, in file order."""
    out = {}
    _walk(results, [], out)
    return out


def label(identity, entry):
    """A case's name for the table: where it sits, then its method (or case, or key)."""
    where = [str(v) if not f or f == "#" else f"{f} {v}" for f, v in identity
             if f not in ("key", "case", "method")]
    what = entry.get("method") or entry.get("case") or dict(identity).get("method") or dict(identity).get("key")
    text = " · ".join(where)
    return f"{text}: {what}" if what and text else (what or text or "?")


def reference_of(identity, relative_to):
    """The identity of the case named ``relative_to`` in the group of ``identity`` (its
    ``key``, ``case`` or ``method`` replaced), or None when the case has no such name."""
    for i in range(len(identity) - 1, -1, -1):
        if identity[i][0] in ("key", "case", "method"):
            return identity[:i] + ((identity[i][0], relative_to),) + identity[i + 1:]
    return None


def _per_round(case, ref):
    """``case``'s times over ``ref``'s, round by round (the rounds both took part in)."""
    n = min(len(case["times_ms"]), len(ref["times_ms"]))
    return [a / b for a, b in zip(case["times_ms"][:n], ref["times_ms"][:n])]


def compare_results(base, head, factor=bstats.DEFAULT_FACTOR, confidence=bstats.DEFAULT_CONFIDENCE,
                    relative_to=None):
    """The comparison of two results dicts (as the suites return and write them): a dict
    with ``rows`` (one per case in both), ``only_base``, ``only_head``, ``settings`` (those
    that differ: ``{name: (base, head)}``), ``counts`` and ``status`` (the exit status).

    ``relative_to`` (a key, case or method name): each case is judged by its per-round
    ratios to the case of that name in its group (the same network, batch, ...), which a
    change of the machine's speed between the runs hits alike and so cancels; cases
    without such a reference are judged by their times."""
    b_cases, h_cases = timed_cases(base), timed_cases(head)
    rows = []
    for ident, b in b_cases.items():
        h = h_cases.get(ident)
        if h is None:
            continue
        ref = reference_of(ident, relative_to) if relative_to else None
        notes = []
        if ref == ident:
            notes.append("the reference of --relative-to: its own times, not judged")
            c = bstats.compare_unpaired(h["times_ms"], b["times_ms"], confidence=confidence, factor=factor)
        elif ref is not None and ref in b_cases and ref in h_cases:
            c = bstats.compare_unpaired(_per_round(h, h_cases[ref]), _per_round(b, b_cases[ref]),
                                        confidence=confidence, factor=factor)
        else:
            if relative_to:
                notes.append(f"no {relative_to!r} beside it: by its times")
            c = bstats.compare_unpaired(h["times_ms"], b["times_ms"], confidence=confidence, factor=factor)
        notes = ([c.note] if c.note and ref != ident else []) + notes
        noisy = [side for side, e in (("base", b), ("head", h)) if e.get("noisy")]
        if noisy:
            notes.append("noisy in " + " and ".join(noisy))
        for side, e in (("base", b), ("head", h)):
            for n in e.get("timing_notes") or ():
                if n.startswith("INJECTED"):
                    notes.append(f"{side}: {n}")
        judged = c.as_dict()
        if ref == ident:
            judged.update(verdict=REFERENCE, resolved=True)
        rows.append(dict(case=label(ident, h), identity=[list(p) for p in ident],
                         base_median_ms=_median(b["times_ms"]), head_median_ms=_median(h["times_ms"]),
                         base_calls=len(b["times_ms"]), head_calls=len(h["times_ms"]), interval=c.interval(),
                         note="; ".join(notes),
                         **{k: v for k, v in judged.items() if k != "note"}))
    counts = {v: sum(r["verdict"] == v for r in rows) for v in (bstats.SLOW, bstats.FAST, bstats.SAME)}
    finite = [r["ratio"] for r in rows if r["ratio"] is not None and math.isfinite(r["ratio"])]
    drift = _median(finite) if len(finite) >= 3 and not relative_to else None
    counts["unresolved"] = sum(not r["resolved"] for r in rows)
    counts[REFERENCE] = sum(r["verdict"] == REFERENCE for r in rows)
    bs, hs = base.get("settings", {}), head.get("settings", {})
    settings = {k: (bs.get(k, "(absent)"), hs.get(k, "(absent)")) for k in dict.fromkeys(list(bs) + list(hs))
                if bs.get(k) != hs.get(k)}
    status = 1 if counts[bstats.SLOW] else 0
    problem = None
    if base.get("suite") != head.get("suite"):
        problem, status = f"the files hold different suites ({base.get('suite')} and {head.get('suite')})", 2
    elif not rows:
        problem, status = "no case in common (or no case with its times: a JSON from before times_ms?)", 2
    return dict(suite=head.get("suite"), factor=factor, confidence=confidence, relative_to=relative_to,
                rows=rows, counts=counts,
                only_base=[label(i, e) for i, e in b_cases.items() if i not in h_cases],
                only_head=[label(i, e) for i, e in h_cases.items() if i not in b_cases],
                settings=settings, load=(base.get("machine_load"), head.get("machine_load")), drift=drift,
                problem=problem, status=status)


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def print_report(report, base_name="BASE", head_name="HEAD"):
    """Prints a comparison as markdown."""
    print(f"# compare {report['suite']}: {head_name} against {base_name}")
    print()
    if report["settings"]:
        print("Settings that differ:\n")
        print(markdown_table(["setting", base_name, head_name],
                                     [(k, str(b), str(h)) for k, (b, h) in report["settings"].items()], "lll"))
        print()
    for name, load in zip((base_name, head_name), report["load"]):
        if load:
            print(f"- machine load during {name}: {LoadMonitor.describe(load)}"
                  + (" **(busy)**" if load.get("warning") else ""))
    conf = f"{100 * report['confidence']:g}% CI"
    table = [(r["case"], r["base_median_ms"], r["head_median_ms"], r["ratio"], r["interval"],
              f"**{r['verdict']}**" if r["verdict"] in (bstats.SLOW, bstats.FAST) else r["verdict"], r["note"])
             for r in report["rows"]]
    print()
    ratio = "head / base" + (f" of the ratio to {report['relative_to']}" if report.get("relative_to") else "")
    print(markdown_table(["case", f"{base_name} median ms", f"{head_name} median ms", ratio, conf,
                                  "verdict", "note"], table, "lrrrlll"))
    print()
    c = report["counts"]
    ref = f", {c[REFERENCE]} REF (the reference of --relative-to)" if c.get(REFERENCE) else ""
    print(f"{len(report['rows'])} cases: {c['SLOW']} SLOW, {c['FAST']} FAST, {c['SAME']} SAME "
          f"({c['unresolved']} unresolved){ref}; SLOW / FAST: the {conf} of head / base lies above / below 1 and "
          f"the estimate beyond ×{report['factor']:g} / ×{1 / report['factor']:.3g}")
    for side, names in (("only in " + base_name, report["only_base"]), ("only in " + head_name, report["only_head"])):
        if names:
            print(f"- {side} (not compared): " + "; ".join(names))
    drift = report.get("drift")
    if drift is not None and abs(math.log(drift)) > math.log(1 + (report["factor"] - 1) / 2):
        print(f"- **every case moved**: the median head / base over the cases is {drift:.3g}: a change of the machine "
              "(its load, clocks, BLAS) between the runs is likelier than one of every case; rerun both on a "
              "quiet machine, or judge each case by its ratio to another (--relative-to KEY)")
    if report["problem"]:
        print(f"\n**cannot compare**: {report['problem']}")


def main(args):
    """``python -m benchmarks compare``: prints the report; returns the exit status."""
    try:
        base, head = results_files.load(args.base), results_files.load(args.head)
    except (OSError, ValueError) as err:
        print(f"python -m benchmarks compare: cannot read {err}")
        return 2
    report = compare_results(base, head, args.factor, args.confidence, args.relative_to)
    print_report(report, "BASE", "HEAD")
    print(f"\nBASE: {args.base}\nHEAD: {args.head}")
    if args.json:
        results_files.write_json(args.json, dict(report, base_path=args.base, head_path=args.head))
        print(f"JSON: {args.json}")
    return report["status"]
