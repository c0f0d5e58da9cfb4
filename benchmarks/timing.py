"""Timers and the runner of the benchmarks: interleaved rounds, adaptive repeats, a
slowdown injected on purpose, CUDA events with an L2 flush, graph replay, device peak
memory.

**Rounds** (:func:`run_cases`). Every case (a method, a row of a table) first runs alone:
its first call is timed by itself (``first call``: tracing, compilation, cuDNN's
algorithm search, allocator growth) and ``warmup − 1`` more calls are made untimed. Then
rounds time every case once each, the first case of round ``r`` being case ``r mod k``
(the order rotates, so that no case always follows the same one), so that a change of
the machine's load during the run reaches every case alike, and two cases' times of one
round form a pair (:func:`benchmarks.stats.compare_paired`).

**Adaptive repeats** (:class:`Policy`): after ``repeats`` rounds, more rounds run while some
case's relative spread (IQR / median, :func:`benchmarks.stats.relative_spread`) is above
``max_spread``, up to ``max_repeats`` rounds and ``max_seconds`` of rounds per group of
cases; a case still above the target is flagged *noisy* (its row says so, as
torch.utils.benchmark warns when the IQR is a large part of the median). A case may be
limited to fewer rounds (a method that takes seconds per call): it leaves the rounds
after its last one, and its pairs are the rounds it took part in.

**Timers.** On the CPU, ``time.perf_counter`` around the call. On the GPU, the device is
synchronised, the L2 cache is flushed by writing a buffer twice its size (not timed; as
triton's ``do_bench``), and CUDA events recorded before and after the call on the current
stream give the time (CuPy's events for cuvmap, torch's for torch; JAX exposes none and is
timed by the wall clock around ``block_until_ready``). With ``--cuda-graph`` a CuPy or torch
case is captured once as a CUDA graph (on a private memory pool, after one call outside
the capture) and its timed calls replay the graph: the kernels' time without Python's
and the launches' (triton's ``do_bench_cudagraph``); a case that cannot be captured (a
host synchronisation, an allocation the capture refuses) is timed as it is, with a note.

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

import numpy as np

from benchmarks import stats as bstats

DEFAULT_MAX_SPREAD = 0.05
DEFAULT_MAX_SECONDS = 20.0

# GPU timing for the timers made by timer_for / torch_event_timer; the CLI sets it from
# --l2-flush before a suite runs
GPU_TIMING = dict(l2_flush=True)


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
# Timers
# ---------------------------------------------------------------------------------------


class Timer:
    """``time_one(fn)`` returns the seconds of one call of ``fn``; ``name`` says how;
    ``kind`` is ``cpu``, ``cupy`` or ``torch`` (whose device the call runs on; ``simulated``
    for a clock of the self-check's); ``module`` the CuPy or torch module; ``wait(seconds)``
    makes what this timer measures take that much longer (an injected slowdown; None where
    it cannot). Unpacks as ``name, time_one``."""

    def __init__(self, name, time_one, kind="cpu", module=None, wait=None):
        self.name, self.time_one, self.kind, self.module = name, time_one, kind, module
        self.wait = wait if wait is not None else (spin_cpu if kind == "cpu" else None)

    def __iter__(self):
        return iter((self.name, self.time_one))

    def __getitem__(self, i):
        return (self.name, self.time_one)[i]

    def __call__(self, fn):
        return self.time_one(fn)


def cpu_timer():
    """Wall-clock seconds of ``fn()`` (``time.perf_counter``)."""

    def time_one(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return Timer("perf_counter", time_one)


def _l2_bytes_cupy(cp):
    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        return int(props.get("l2CacheSize", 0)) or None
    except Exception:  # noqa: BLE001 - a stand-in or an old CuPy: use the fixed size
        return None


def flush_bytes(l2_bytes):
    """Bytes written to flush an L2 cache of ``l2_bytes`` (twice it; 256 MiB when unknown,
    as triton's ``do_bench``)."""
    return 2 * l2_bytes if l2_bytes else 256 << 20


def cupy_event_timer(cp, l2_flush=None):
    """Seconds between CUDA events on CuPy's current stream, recorded around ``fn()`` after a
    device-wide synchronisation and (``l2_flush``, by default :data:`GPU_TIMING`'s) a write
    of twice the L2 cache's size, which runs before the first event."""
    flush = GPU_TIMING["l2_flush"] if l2_flush is None else l2_flush
    buffer = []

    def time_one(fn):
        cp.cuda.Device().synchronize()
        stream = cp.cuda.get_current_stream()
        if flush:
            if not buffer:
                buffer.append(cp.empty(flush_bytes(_l2_bytes_cupy(cp)) // 4, dtype=np.int32))
            buffer[0].fill(0)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3

    return Timer("CUDA events (CuPy)" + (", L2 flushed" if flush else ""), time_one, "cupy", cp,
                 wait=lambda seconds: spin_gpu(cp, seconds))


def torch_event_timer(torch, l2_flush=None):
    """Like :func:`cupy_event_timer`, with torch's events on torch's current stream."""
    flush = GPU_TIMING["l2_flush"] if l2_flush is None else l2_flush
    buffer = []

    def time_one(fn):
        torch.cuda.synchronize()
        if flush:
            if not buffer:
                try:
                    l2 = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                                     "L2_cache_size", 0)) or None
                except Exception:  # noqa: BLE001
                    l2 = None
                buffer.append(torch.empty(flush_bytes(l2), dtype=torch.int8, device="cuda"))
            buffer[0].zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return Timer("CUDA events (torch)" + (", L2 flushed" if flush else ""), time_one, "torch", torch)


def timer_for(xp):
    """The timer for arrays of module ``xp``: CUDA events for CuPy, perf_counter for NumPy."""
    return cpu_timer() if xp is np else cupy_event_timer(xp)


def as_timer(timer):
    """A :class:`Timer` from a Timer or a ``(name, time_one)`` pair (the CPU kind)."""
    if timer is None:
        return cpu_timer()
    if isinstance(timer, Timer):
        return timer
    name, time_one = timer
    return Timer(name, time_one)


# ---------------------------------------------------------------------------------------
# Graph replay, injected slowdowns, device peak memory
# ---------------------------------------------------------------------------------------


def cupy_graph(fn, cp):
    """``(replay, note)``: ``replay()`` launches a CUDA graph of one call of ``fn`` on CuPy's
    current stream; ``replay`` is None and ``note`` says why when ``fn`` cannot be captured.
    The capture runs on a private stream and memory pool (kept alive with the graph), after
    one call outside the capture that fills the pool, so that no address the graph writes
    is ever handed to another array."""
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.wait_event(cp.cuda.get_current_stream().record())
    try:
        with cp.cuda.using_allocator(pool.malloc), stream:
            fn()
            stream.begin_capture(cp.cuda.runtime.streamCaptureModeThreadLocal)
            try:
                fn()
            except BaseException:
                try:
                    stream.end_capture()
                except Exception:  # noqa: BLE001 - the capture was already invalidated
                    pass
                raise
            graph = stream.end_capture()
        stream.synchronize()
    except Exception as err:  # noqa: BLE001 - any failure: time the call as it is
        return None, f"not captured as a CUDA graph ({type(err).__name__}: {err}); timed as called"
    keep = (pool, stream)

    def replay():
        graph.launch(stream=cp.cuda.get_current_stream())
        return keep

    return replay, "timed as CUDA-graph replays"


def torch_graph(fn, torch):
    """Like :func:`cupy_graph` with ``torch.cuda.CUDAGraph`` (torch's private pool)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001
        return None, f"not captured as a CUDA graph ({type(err).__name__}: {err}); timed as called"
    return graph.replay, "timed as CUDA-graph replays"


def spin_cpu(seconds):
    """Busy-waits ``seconds`` of wall time (``perf_counter``)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


_SPIN_SOURCE = r"""
extern "C" __global__ void cuvmap_bench_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
_spin_kernels = {}


def spin_gpu(cp, seconds):
    """Enqueues on CuPy's current stream a one-thread kernel that spins ``seconds`` on the
    GPU's global timer."""
    kernel = _spin_kernels.get(id(cp))
    if kernel is None:
        kernel = _spin_kernels[id(cp)] = cp.RawKernel(_SPIN_SOURCE, "cuvmap_bench_spin")
    kernel((1,), (1,), (np.uint64(max(0, round(seconds * 1e9))),))


def slowed(fn, extra_seconds, timer):
    """``fn`` followed by ``timer.wait(extra_seconds)``: a busy loop on the CPU, a spinning
    kernel on CuPy's stream. Cases whose timer cannot wait (torch's GPU rows, JAX on the
    GPU) cannot be slowed (a ValueError)."""
    if timer.wait is None:
        raise ValueError(f"--inject-slowdown: cases timed by {timer.name} cannot be slowed (CPU and CuPy cases can)")
    wait = timer.wait

    def run():
        out = fn()
        wait(extra_seconds)
        return out

    return run


def cupy_pool_peak(fn, cp):
    """Bytes that CuPy's default memory pool had to add to hold one call of ``fn``: the pool
    is emptied of its cached blocks first, so that it grows to the call's peak of live
    memory (rounded up to the pool's blocks). Arrays alive before the call (a jitted
    program's buffers kept across calls) are not counted."""
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    pool.free_all_blocks()
    before = pool.total_bytes()
    out = fn()
    cp.cuda.Device().synchronize()
    peak = pool.total_bytes() - before
    del out
    return peak


def torch_cuda_peak(fn, torch):
    """Bytes above those allocated before the call at the peak of torch's CUDA allocator
    during one call of ``fn``."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


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
    it), ``label``, ``fn``, ``timer`` (a :class:`Timer` or ``(name, time_one)``), ``scale``
    (the figures' factor), ``max_rounds`` (None: as many as the others)."""

    def __init__(self, key, label, fn, timer=None, scale=1.0, max_rounds=None):
        self.key, self.label, self.fn = key, label, fn
        self.timer = as_timer(timer)
        self.scale, self.max_rounds = scale, max_rounds


def warm_up(cases, warmup, progress=None, where=""):
    """Each case's first call, timed alone, then ``warmup − 1`` untimed calls: ``{key: seconds}``."""
    firsts = {}
    for c in cases:
        if progress is not None:
            progress.set(f"{where}{c.label} (warm-up)")
        firsts[c.key] = c.timer.time_one(c.fn)
        for _ in range(max(0, warmup - 1)):
            c.fn()
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


def run_cases(cases, policy, progress=None, where=""):
    """Warm-up, then the rounds: ``{key: Stats}`` (times scaled by each case's ``scale``)."""
    firsts = warm_up(cases, policy.warmup, progress, where)
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
