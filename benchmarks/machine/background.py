"""Background load for the benchmarks (issue 27: speed that survives a busy machine).

``--background-load N`` starts N busy-loop processes before a suite runs and stops them
when it ends. Each is a Python loop of additions that never sleeps — one core's worth of
demand, as a data loader or another job on a shared machine — started in this process's
session, so the scheduler shares the cores between the suite's threads and the loops as
it would with any other process of the user. A loop asks the kernel to kill it when its
parent dies (Linux: PR_SET_PDEATHSIG) and checks every few milliseconds that its parent
is still the benchmark, so no loop outlives a benchmark that was killed; a normal end
stops them, and so does the interpreter's exit.

``--alternate-load`` (with ``--background-load N``) times every round twice, once with the
loops paused (SIGSTOP) and once with them running, in alternating order (quiet then
loaded, loaded then quiet, ...), after :data:`SETTLE` seconds of each state. The suite's
own tables are the quiet halves; :func:`BackgroundLoad.report` gives each case's loaded /
quiet ratio and, for a cuvmap case with a torch counterpart (the suite's
``TORCH_COUNTERPART``), cuvmap / torch under load — both paired by round, so that the
load that other processes put on a shared machine, which changes from minute to minute,
reaches both sides of each ratio alike.
"""
import atexit
import os
import signal
import subprocess
import sys
import time

from benchmarks.report.tables import markdown_table
from benchmarks.rounds import stats as bstats

SETTLE = 1.0          # seconds in a new state (loops paused or running) before timing resumes
MAX_SLOWDOWN = 1.5    # issue 27's target: a case under one busy core at most 1.5 × its quiet time

# the loop: about 1e5 additions (a few ms) between two looks at the parent
LOOP = ("import os\n"
        "parent = {ppid}\n"
        "try:\n"
        "    import ctypes\n"
        "    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: also when paused\n"
        "except Exception:\n"
        "    pass\n"
        "x = 0\n"
        "while os.getppid() == parent:\n"
        "    for _ in range(100000):\n"
        "        x += 1\n")


def _cpu_seconds(pid):
    """User + system CPU seconds of process ``pid`` (/proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class BackgroundLoad:
    """``with BackgroundLoad(n) as load:`` runs ``n`` busy loops in child processes for the
    body. ``load.pids`` while they run; ``load.set_running(flag)`` pauses or resumes them
    (and waits :data:`SETTLE` seconds when that changes anything); ``load.stop()``
    (idempotent) stops and reaps them and returns ``dict(processes, cores_used, wall_s)``,
    the CPU the loops used in cores on average over their lifetime (None where /proc is
    unavailable). With ``alternate=True`` the rounds of ``benchmarks/rounds/runner.py`` time each
    case with the loops paused and running (:meth:`record`, :meth:`report`)."""

    def __init__(self, n, alternate=False, settle=None):
        if n < 0:
            raise ValueError(f"--background-load must be 0 or more, not {n}")
        if alternate and n == 0:
            raise ValueError("--alternate-load needs --background-load N with N ≥ 1")
        self.n, self.alternate = int(n), bool(alternate)
        self.settle = SETTLE if settle is None else settle   # (read when made: tests shorten it)
        self.procs = []
        self.running = False
        self.started = None
        self.result = None
        self.records = {}      # (where, key) -> dict(label, scale, quiet=[s], loaded=[s])

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def start(self):
        code = LOOP.format(ppid=os.getpid())
        self.started = time.perf_counter()
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if self.procs:
            self.running = True
            atexit.register(self.stop)
            time.sleep(0.2)   # let the loops start before the first measurement
        return self

    def set_running(self, flag):
        """Resumes (``True``) or pauses (``False``) the loops; after a change, waits
        ``settle`` seconds so that the machine (and cuvmap's thread rule) is in the new
        state when timing resumes."""
        if not self.procs or bool(flag) == self.running or self.result is not None:
            return
        sig = signal.SIGCONT if flag else signal.SIGSTOP
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, sig)
        self.running = bool(flag)
        time.sleep(self.settle)

    def stop(self):
        if self.result is not None:
            return self.result
        wall = time.perf_counter() - self.started if self.started is not None else 0.0
        cpu = [_cpu_seconds(p.pid) for p in self.procs]
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)   # a paused loop takes SIGTERM once resumed
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        used = None if any(c is None for c in cpu) or wall <= 0 else sum(cpu) / wall
        self.result = dict(processes=self.n, cores_used=used, wall_s=wall, alternate=self.alternate)
        return self.result

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def describe(self):
        """The setting, for the settings table."""
        if self.n == 0:
            return "none (--background-load 0)"
        how = (f"paused and resumed in alternate halves of every round (--alternate-load; {self.settle:g} s in each "
               "state before timing)" if self.alternate else "running throughout")
        return (f"{self.n} busy-loop process(es) started by the benchmark (pids {', '.join(map(str, self.pids))}), "
                f"{how}, stopped at its end")

    @staticmethod
    def describe_result(result):
        if not result or not result["processes"]:
            return None
        used = "" if result["cores_used"] is None else f": they used {result['cores_used']:.2f} cores on average"
        return f"background load {result['processes']} busy-loop process(es) over {result['wall_s']:.0f} s{used}"

    # -----------------------------------------------------------------------------------
    # Alternating rounds
    # -----------------------------------------------------------------------------------

    def record(self, where, case, seconds):
        """Keeps one timed call of ``case`` (a :class:`benchmarks.rounds.runner.Case`) in the
        current state of the loops."""
        entry = self.records.setdefault((where, case.key), dict(label=case.label, scale=case.scale, quiet=[],
                                                                loaded=[]))
        entry["loaded" if self.running else "quiet"].append(seconds)

    def report(self, counterparts=None, max_slowdown=MAX_SLOWDOWN, factor=bstats.DEFAULT_FACTOR,
               confidence=bstats.DEFAULT_CONFIDENCE):
        """Per case, a dict: ``where``, ``key``, ``label``, the medians ``quiet_ms`` and
        ``loaded_ms``, ``slowdown`` (loaded / quiet, paired by round: a
        :class:`benchmarks.rounds.stats.Comparison` as a dict) and whether it meets
        ``≤ max_slowdown`` beyond the noise; for a case whose key has a counterpart in
        ``counterparts`` (``{cuvmap key: torch key}``) timed in the same rounds, ``vs_torch``
        (cuvmap / torch, both loaded, paired by round) and whether it is ``≤ 1``."""
        counterparts = counterparts or {}
        rows = []
        for (where, key), e in self.records.items():
            n = min(len(e["quiet"]), len(e["loaded"]))
            if n == 0:
                continue
            ms = 1e3 * e["scale"]
            quiet, loaded = [t * ms for t in e["quiet"][:n]], [t * ms for t in e["loaded"][:n]]
            c = bstats.compare_samples(loaded, quiet, paired=True, confidence=confidence, factor=factor)
            row = dict(where=where.rstrip(": "), key=key, label=e["label"], rounds=n, quiet_ms=_median(quiet),
                       loaded_ms=_median(loaded), slowdown=c.as_dict(),
                       slowdown_met=bstats.target_met(c, "≤", max_slowdown), quiet_times_ms=quiet,
                       loaded_times_ms=loaded)
            other = self.records.get((where, counterparts.get(key)))
            if other is not None:
                m = min(n, len(other["loaded"]))
                theirs = [t * 1e3 * other["scale"] for t in other["loaded"][:m]]
                ct = bstats.compare_samples(loaded[:m], theirs, paired=True, confidence=confidence, factor=factor)
                row.update(torch_key=counterparts[key], torch_label=other["label"], torch_loaded_ms=_median(theirs),
                           vs_torch=ct.as_dict(), vs_torch_met=bstats.target_met(ct, "≤", 1.0))
            rows.append(row)
        return rows


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _ratio_text(c):
    lo, hi = c["ci_low"], c["ci_high"]
    return f"{c['ratio']:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{c['ratio']:.2f}"


def report_lines(rows, n, max_slowdown=MAX_SLOWDOWN, confidence=bstats.DEFAULT_CONFIDENCE):
    """The report of :meth:`BackgroundLoad.report` as markdown lines."""
    table = []
    for r in rows:
        t = r.get("vs_torch")
        table.append((r["where"], r["label"], r["rounds"], r["quiet_ms"], r["loaded_ms"], _ratio_text(r["slowdown"]),
                      r["slowdown"]["verdict"], r["slowdown_met"], r.get("torch_loaded_ms"),
                      _ratio_text(t) if t else "–", r.get("vs_torch_met") or "–"))
    return [f"## Under {n} busy core(s): each case loaded / quiet, and cuvmap / torch loaded "
            f"({100 * confidence:g}% CI, paired by round)", "",
            markdown_table(["case", "method", "rounds", "quiet ms", "loaded ms", "loaded / quiet", "verdict",
                                    f"≤ {max_slowdown:g}", "torch loaded ms", "cuvmap / torch loaded", "≤ 1"], table,
                                   "llrrrllllll"), "",
            "- each round timed every case twice, with the loops paused (quiet) and running (loaded), the order "
            "alternating between rounds; ratios: Hodges–Lehmann estimates of the per-round ratios with Wilcoxon "
            "intervals (benchmarks/rounds/stats.py); met: yes / no when the whole interval is on one side of the target",
            "- cuvmap / torch loaded: each cuvmap row against its torch counterpart (the suite's TORCH_COUNTERPART), "
            "timed in the same loaded halves"]
