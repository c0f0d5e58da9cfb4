"""The runner of the benchmarks: interleaved rounds, adaptive repeats, a slowdown injected
on purpose, and the statistics of one case's calls.

**Rounds** (:func:`run_cases`). Every case (a method, a row of a table) first runs alone:
its first call is timed by itself (``first call``: tracing, compilation, cuDNN's
algorithm search, allocator growth) and ``warmup − 1`` more calls are made untimed. Then
rounds time every case once each, the first case of round ``r`` being case ``r mod k``
(the order rotates, so that no case always follows the same one), so that a change of
the machine's load during the run reaches every case alike, and two cases' times of one
round form a pair (:func:`benchmarks.rounds.stats.compare_paired`).

**Adaptive repeats** (:class:`Policy`): after ``repeats`` rounds, more rounds run while some
case's relative spread (IQR / median, :func:`benchmarks.rounds.stats.relative_spread`) is
above ``max_spread``, up to ``max_repeats`` rounds and ``max_seconds`` of rounds per group
of cases; a case still above the target is flagged *noisy* (its row says so, as
torch.utils.benchmark warns when the IQR is a large part of the median). A case may be
limited to fewer rounds (a method that takes seconds per call: ``slow_seconds``): it
leaves the rounds after its last one, and its pairs are the rounds it took part in.

How one call is timed (the wall clock, CUDA events after an L2 flush, graph replays) is
:mod:`benchmarks.rounds.timers`'s docstring.

**Injected slowdown** (``--inject-slowdown CASE=FRACTION``): the timed calls of the cases
whose key or label is ``CASE`` are followed by a wait of ``FRACTION`` × their own median time
(measured on 3 calls before the rounds): a busy loop on the CPU, a kernel that spins on
the GPU's global timer on the GPU. It is how the harness checks itself: a 10 % slowdown
injected in one case must come out SLOW in ``python -m benchmarks compare``, and the
other cases must not.
"""
import math
import statistics
import time

from benchmarks.rounds import stats as bstats
from benchmarks.rounds.timers import as_timer, cupy_graph, slowed, torch_graph

DEFAULT_MAX_SPREAD = 0.05
DEFAULT_MAX_SECONDS = 20.0


# ---------------------------------------------------------------------------------------
# Statistics of one case
# ---------------------------------------------------------------------------------------


class Stats:
    """Seconds of the timed calls of one case, with the first call and the timer's name.
    ``scale`` multiplies every figure (a loop timed on a subset of the examples and scaled
    to the batch). ``max_spread`` is the target the case was run against (None: fixed
    repeats); ``notes`` are the runner's remarks (graph capture, injected slowdown)."""

    def __init__(self, times, first, timer, warmup, scale=1.0, max_spread=None, notes=()):
        self.raw = list(times)
        self.scale = scale
        self.times = [t * scale for t in times]
        self.first = first * scale
        self.timer = timer
        self.warmup = warmup
        self.max_spread = max_spread
        self.notes = list(notes)

    @property
    def median(self):
        return statistics.median(self.times)

    @property
    def min(self):
        return min(self.times)

    @property
    def max(self):
        return max(self.times)

    @property
    def mean(self):
        return statistics.fmean(self.times)

    @property
    def spread(self):
        """IQR / median (NaN for a single call)."""
        return bstats.relative_spread(self.times)

    @property
    def noisy(self):
        """Whether the spread is above the target the case ran against (or above
        :data:`DEFAULT_MAX_SPREAD` when it ran a fixed count); unknown spreads are not."""
        s = self.spread
        return bool(math.isfinite(s) and s > (self.max_spread if self.max_spread else DEFAULT_MAX_SPREAD)) \
            or s == math.inf

    def as_dict(self, per=1):
        """Milliseconds (divided by ``per``, e.g. the batch size for per-example figures)."""
        ms = 1e3 / per
        spread = self.spread
        return dict(median_ms=self.median * ms, min_ms=self.min * ms, max_ms=self.max * ms,
                    mean_ms=self.mean * ms, first_call_ms=self.first * ms, repeats=len(self.times),
                    warmup=self.warmup, timer=self.timer, scale=self.scale,
                    spread=spread if math.isfinite(spread) else None, noisy=self.noisy,
                    timing_notes=self.notes, times_ms=[t * ms for t in self.times])


def spread_text(stats):
    """The spread of a :class:`Stats` for a table: ``3.1%``, with `` ⚠`` when noisy."""
    s = stats.spread if isinstance(stats, Stats) else stats
    if s is None or not math.isfinite(s):
        return "–"
    return f"{100 * s:.1f}%" + (" ⚠" if (stats.noisy if isinstance(stats, Stats) else False) else "")



# ---------------------------------------------------------------------------------------
# The policy and the runner
# ---------------------------------------------------------------------------------------


class Policy:
    """How many rounds to time (the module's docstring).

    ``repeats``: rounds at least; ``warmup``: calls before them (the first timed alone);
    ``max_spread``: the target IQR / median (None or 0: exactly ``repeats`` rounds);
    ``max_repeats`` and ``max_seconds``: the adaptive rounds' limits per group of cases;
    ``inject``: ``{case key or label: fraction}``; ``cuda_graph``: time GPU cases as graph
    replays."""

    def __init__(self, repeats=5, warmup=1, max_spread=DEFAULT_MAX_SPREAD, max_repeats=None,
                 max_seconds=DEFAULT_MAX_SECONDS, inject=None, cuda_graph=False):
        self.repeats = max(1, int(repeats))
        self.warmup = max(1, int(warmup))
        self.max_spread = max_spread or None
        self.max_repeats = max(self.repeats, int(max_repeats if max_repeats is not None
                                                 else max(20, 4 * self.repeats)))
        self.max_seconds = max_seconds
        self.inject = dict(inject or {})
        self.matched = set()
        self.cuda_graph = cuda_graph
        self.load = None   # a BackgroundLoad of --alternate-load (benchmarks/background.py): rounds timed twice

    @property
    def adaptive(self):
        return self.max_spread is not None and self.max_repeats > self.repeats

    @classmethod
    def fixed(cls, repeats=5, warmup=1):
        return cls(repeats, warmup, max_spread=None)

    @classmethod
    def from_args(cls, args):
        """From the CLI's common options (``--repeats``, ``--warmup``, ``--max-spread``,
        ``--max-repeats``, ``--max-seconds``, ``--inject-slowdown``, ``--cuda-graph``)."""
        return cls(args.repeats, args.warmup, getattr(args, "max_spread", None), getattr(args, "max_repeats", None),
                   getattr(args, "max_seconds", DEFAULT_MAX_SECONDS),
                   parse_injections(getattr(args, "inject_slowdown", None) or []),
                   getattr(args, "cuda_graph", False))

    def with_repeats(self, repeats, warmup=None):
        """The same policy with another minimum of rounds (and warm-up)."""
        p = Policy(repeats, self.warmup if warmup is None else warmup, self.max_spread, None, self.max_seconds,
                   self.inject, self.cuda_graph)
        p.max_repeats = max(p.repeats, self.max_repeats)
        p.matched = self.matched
        p.load = self.load
        return p

    def injection(self, case):
        """The slowdown fraction injected into ``case`` (0 when none); the names matched are
        kept in ``matched`` (:meth:`unmatched` lists the others after a run)."""
        for name in (case.key, case.label):
            if name in self.inject:
                self.matched.add(name)
                return self.inject[name]
        return 0.0

    def unmatched(self):
        """The ``--inject-slowdown`` names that matched no case."""
        return sorted(set(self.inject) - self.matched)

    def describe(self):
        if not self.adaptive:
            text = f"{self.repeats} round(s)"
        else:
            text = (f"{self.repeats} to {self.max_repeats} rounds, more while a case's IQR / median is above "
                    f"{100 * self.max_spread:g}% (at most {self.max_seconds:g} s of rounds per group; cases above "
                    f"are flagged ⚠)")
        text += ", each case once per round in rotating order"
        if self.cuda_graph:
            text += "; GPU cases timed as CUDA-graph replays"
        if self.inject:
            text += "; INJECTED SLOWDOWN " + ", ".join(f"{k} +{100 * v:g}%" for k, v in self.inject.items())
        return text


def policy_of(args):
    """The timing policy of a run: the CLI's (``args.policy``), or one from ``args``."""
    policy = getattr(args, "policy", None)
    return policy if policy is not None else Policy.from_args(args)


def parse_injections(items):
    """``["CASE=0.1", ...]`` → ``{"CASE": 0.1}`` (``CASE`` may contain ``=``: the last one
    splits)."""
    out = {}
    for item in items:
        key, sep, value = item.rpartition("=")
        if not sep or not key:
            raise ValueError(f"--inject-slowdown {item!r}: expected CASE=FRACTION, e.g. vmap=0.1")
        out[key] = float(value)
    return out


class Case:
    """One timed case: ``key`` (short, stable: how JSON files and ``--inject-slowdown`` name
    it), ``label``, ``fn``, ``timer`` (a :class:`~benchmarks.rounds.timers.Timer` or
    ``(name, time_one)``), ``scale`` (the figures' factor), ``max_rounds`` (None: as many
    as the others). ``output``: the result of its first call, where :func:`warm_up` was
    asked to keep it."""

    def __init__(self, key, label, fn, timer=None, scale=1.0, max_rounds=None):
        self.key, self.label, self.fn = key, label, fn
        self.timer = as_timer(timer)
        self.scale, self.max_rounds = scale, max_rounds
        self.output = None


def warm_up(cases, warmup, progress=None, where="", slow_seconds=None, keep_outputs=False):
    """Each case's first call, timed alone (with ``keep_outputs``, its result kept in
    ``case.output``), then ``warmup − 1`` untimed calls: ``{key: seconds}``.

    ``slow_seconds``: a case whose first call takes longer calls again, timed; when that
    call takes longer too, the case is *slow* — no more warm-up, and two rounds at most
    (``max_rounds``) — and otherwise that call counts as a warm-up call. The first call may
    include one-time work (tracing, the kernels' timing), hence the second look."""
    firsts = {}
    for c in cases:
        if progress is not None:
            progress.set(f"{where}{c.label} (first call)")
        if keep_outputs:
            held = []
            firsts[c.key] = c.timer.time_one(lambda: held.append(c.fn()))
            c.output = held[0]
        else:
            firsts[c.key] = c.timer.time_one(c.fn)
        warm = max(0, warmup - 1)
        if slow_seconds is not None and firsts[c.key] > slow_seconds:
            if c.timer.time_one(c.fn) > slow_seconds:
                c.max_rounds, warm = 2, 0
            else:
                warm = max(0, warm - 1)
        for _ in range(warm):
            c.fn()
        if progress is not None and slow_seconds is not None:
            progress.step(f"{where}{c.label}: first call {firsts[c.key] * 1e3:.1f} ms")
    return firsts


def _prepare(cases, policy):
    """The functions the rounds time, and each case's notes: graph replays and injected
    slowdowns applied."""
    fns, notes = {}, {}
    for c in cases:
        fn, notes[c.key] = c.fn, []
        if policy.cuda_graph and c.timer.kind in ("cupy", "torch"):
            make = cupy_graph if c.timer.kind == "cupy" else torch_graph
            replay, note = make(fn, c.timer.module)
            notes[c.key].append(note)
            fn = replay or fn
        fraction = policy.injection(c)
        if fraction:
            base = statistics.median(c.timer.time_one(fn) for _ in range(3))
            fn = slowed(fn, fraction * base, c.timer)
            notes[c.key].append(f"INJECTED SLOWDOWN: +{100 * fraction:g}% of its time ({fraction * base * 1e3:.3g} ms) "
                                "per timed call")
        fns[c.key] = fn
    return fns, notes


def timed_rounds(cases, policy, progress=None, where="", clock=time.perf_counter):
    """The rounds (the module's docstring): ``({key: [seconds, ...]}, {key: notes})``, the
    seconds unscaled, in round order. ``clock`` measures the time budget (tests pass a
    fake one)."""
    fns, notes = _prepare(cases, policy)
    times = {c.key: [] for c in cases}
    k = len(cases)
    # --alternate-load: each round twice, the background loops paused and running, the
    # order alternating so that one change of state serves two rounds (benchmarks/background.py);
    # the quiet halves are the rounds' times, the load records both
    load = getattr(policy, "load", None)
    start = clock()
    r = 0
    while True:
        if progress is not None:
            progress.set(f"{where}round {r + 1}" + (f"/{policy.repeats}" if r < policy.repeats else ""))
        for running in ((None,) if load is None else (False, True) if r % 2 == 0 else (True, False)):
            if load is not None:
                load.set_running(running)
            for i in range(k):
                c = cases[(r + i) % k]
                if c.max_rounds is not None and len(times[c.key]) >= c.max_rounds:
                    continue
                t = c.timer.time_one(fns[c.key])
                if load is not None:
                    load.record(where, c, t)
                if not running:
                    times[c.key].append(t)
        r += 1
        if r < policy.repeats:
            continue
        if not policy.adaptive or r >= policy.max_repeats:
            break
        active = [c for c in cases if c.max_rounds is None or len(times[c.key]) < c.max_rounds]
        if not active:
            break
        if all(bstats.relative_spread(times[c.key]) <= policy.max_spread for c in active):
            break
        elapsed = clock() - start
        if elapsed + elapsed / r > policy.max_seconds:
            break
    return times, notes


def run_cases(cases, policy, progress=None, where="", slow_seconds=None, keep_outputs=False):
    """Warm-up (:func:`warm_up`), then the rounds: ``{key: Stats}`` (times scaled by each
    case's ``scale``)."""
    firsts = warm_up(cases, policy.warmup, progress, where, slow_seconds, keep_outputs)
    times, notes = timed_rounds(cases, policy, progress, where)
    return {c.key: Stats(times[c.key], firsts[c.key], c.timer.name + ", interleaved", policy.warmup, c.scale,
                         policy.max_spread if policy.adaptive else None, notes[c.key]) for c in cases}


def measure(fn, *, repeats=5, warmup=1, timer=None, scale=1.0, policy=None):
    """Times ``fn()`` alone: the first call, ``warmup − 1`` more untimed calls, then
    ``repeats`` timed ones (or, with a ``policy``, as many as it asks, ``repeats`` and
    ``warmup`` overriding its own). Returns :class:`Stats` (seconds, times ``scale``)."""
    policy = Policy.fixed(repeats, warmup) if policy is None else policy.with_repeats(repeats, warmup)
    timer = as_timer(timer)
    case = Case("case", "case", fn, timer, scale)
    first = warm_up([case], policy.warmup)["case"]
    times, notes = timed_rounds([case], policy)
    return Stats(times["case"], first, timer.name, policy.warmup, scale,
                 policy.max_spread if policy.adaptive else None, notes["case"])
