"""cuvmap's CPU thread rule (cuvmap/cpu/threads.py) and the benchmarks' background load.

- the rule, as a table: free cores and the current count in, the next count out;
- the measurement, on fed /proc/stat and CPU-time readings: a busy machine lowers the
  count, a quiet one leaves the libraries alone, the user's settings switch it off;
- ``limited``: lowers a default count for its body and gives it back, leaves a count
  the user chose alone (fake libraries, then NumPy's real OpenBLAS);
- ``--background-load N``: the suite starts N loops, prints them, and stops them; a loop
  exits by itself when the benchmark that started it dies.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import cuvmap as cv
from cuvmap.cpu import openmp, threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/this file
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.cli import main as cli_main  # noqa: E402
from benchmarks.machine import background  # noqa: E402
from benchmarks.rounds.runner import Case  # noqa: E402


@pytest.fixture
def fresh_state(monkeypatch):
    """A rule state of its own (set_adaptive(None) resets it), no user setting in the
    environment, and the rule back as it was after the test."""
    for k in threads.USER_SETTINGS + ("CUVMAP_CPU_THREADS",):
        monkeypatch.delenv(k, raising=False)
    threads.set_adaptive(None)
    yield threads._state
    threads.set_adaptive(None)


# ---------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------

RULE = [  # free cores, current, maximum, expected
    (2.0, 2, 2, 2),      # quiet 2-core machine
    (1.7, 2, 2, 2),      # a little work elsewhere: keep both
    (1.49, 2, 2, 1),     # half a core taken: one thread
    (1.3, 2, 2, 1),      # one busy loop seen while cuvmap still runs 2 threads (it takes a share)
    (1.0, 2, 2, 1),      # one busy loop
    (0.2, 2, 2, 1),      # never below one
    (1.6, 1, 2, 1),      # hysteresis: back to 2 only above 1.7
    (1.75, 1, 2, 2),
    (16.0, 16, 16, 16),  # 16 cores
    (12.0, 16, 16, 12),  # 4 busy elsewhere
    (12.0, 4, 16, 12),   # back up in one look
    (11.8, 12, 16, 12),  # inside the band: unchanged
    (3.0, 4, 2, 2),      # current above the maximum: clamped
    (1.0, 1, 1, 1),      # one core: nothing to lower
]


@pytest.mark.parametrize("free,current,maximum,expected", RULE)
def test_rule(free, current, maximum, expected):
    assert threads.rule(free, current, maximum) == expected


def _feed(monkeypatch, readings):
    """Makes _update read ``readings``: a list of (busy seconds of the cores, own CPU
    seconds), one per look."""
    it = iter(readings)
    cur = {}

    def busy(cpus):
        cur["r"] = next(it)
        return cur["r"][0]

    monkeypatch.setattr(threads, "_busy_seconds", busy)
    monkeypatch.setattr(threads.time, "process_time", lambda: cur["r"][1])
    monkeypatch.setattr(threads, "_affinity", lambda: {0, 1})


def _looks(times):
    return [threads._update(t) or threads._state.limit for t in times]


def test_busy_machine_lowers_and_quiet_restores(fresh_state, monkeypatch):
    # looks every 0.25 s on 2 cores; this process uses 1 core throughout; others: 0 then 1
    # core (busy = own + others), then 0 again
    readings, busy, own = [], 0.0, 0.0
    for others in (0, 0, 0, 1, 1, 1, 0.3, 0, 0):
        busy += 0.25 * (1 + others)
        own += 0.25
        readings.append((busy, own))
    _feed(monkeypatch, readings)
    limits = _looks([0.25 * (i + 1) for i in range(len(readings))])
    assert limits == [None, None, None, 1, 1, 1, 1, None, None]
    assert fresh_state.free == pytest.approx(2.0)


def test_a_stale_window_starts_afresh(fresh_state, monkeypatch):
    _feed(monkeypatch, [(0.0, 0.0), (10.0, 0.0), (10.5, 0.25)])
    # 10 s between the first two looks: the second only starts a new window
    assert _looks([1.0, 1.0 + 10 * threads.STALE, 1.25 + 10 * threads.STALE]) == [None, None, 1]


@pytest.mark.parametrize("var", threads.USER_SETTINGS)
def test_user_environment_switches_the_rule_off(fresh_state, monkeypatch, var):
    monkeypatch.setenv(var, "2")
    _feed(monkeypatch, [(0.5 * i, 0.0) for i in range(5)])   # 2 cores busy elsewhere
    assert _looks([0.25 * i for i in range(1, 6)]) == [None] * 5
    assert "the user's thread settings" in threads.describe() and var in threads.describe()


def test_set_adaptive_and_environment(fresh_state, monkeypatch):
    monkeypatch.setenv("CUVMAP_CPU_THREADS", "fixed")
    assert "CUVMAP_CPU_THREADS=fixed" in threads.describe()
    assert threads.set_adaptive(True) is None
    assert threads.describe().startswith("adaptive")       # set_adaptive wins over the environment
    assert threads.set_adaptive(False) is True
    assert "set_adaptive(False)" in threads.describe()
    monkeypatch.setenv("CUVMAP_CPU_THREADS", "")  # `CUVMAP_CPU_THREADS= python ...`: the default
    threads.set_adaptive(None)
    assert threads.describe().startswith("adaptive")
    monkeypatch.setenv("CUVMAP_CPU_THREADS", "sometimes")
    threads.set_adaptive(None)
    with pytest.raises(ValueError, match="CUVMAP_CPU_THREADS"):
        threads.describe()


# ---------------------------------------------------------------------------------------
# limited(): asks per call, gives back, leaves the user's counts alone
# ---------------------------------------------------------------------------------------


class FakeLibrary:
    def __init__(self, n):
        self.n, self.calls = n, []

    def get(self):
        return self.n

    def set(self, n):
        self.calls.append(n)
        self.n = n


LIMITED = [  # BLAS and OpenMP counts before, the limit, the counts inside, sets per library
    (4, 4, 2, 2, 2, 2, 2),        # defaults: lowered, then given back
    (4, 4, None, 4, 4, 0, 0),     # quiet machine: nothing asked
    (3, 4, 2, 3, 2, 0, 2),        # BLAS limited by the user (threadpoolctl): left alone; OpenMP lowered
    (4, 1, 2, 2, 1, 2, 0),        # OpenMP chosen by the user (torch.set_num_threads, share_cores): left alone
    (4, 4, 4, 4, 4, 0, 0),        # no lower than the default: nothing to do
]


@pytest.mark.parametrize("blas_n,omp_n,limit,blas_in,omp_in,blas_sets,omp_sets", LIMITED)
def test_limited_gives_back_and_respects_the_user(monkeypatch, blas_n, omp_n, limit, blas_in, omp_in, blas_sets,
                                                  omp_sets):
    blas, omp = FakeLibrary(blas_n), FakeLibrary(omp_n)
    monkeypatch.setitem(threads._blas, "get", blas.get)
    monkeypatch.setitem(threads._blas, "set", blas.set)
    monkeypatch.setitem(threads._blas, "defaults", (4, 4))
    monkeypatch.setattr(threads, "_openmp_functions", lambda: (omp.get, omp.set))
    with threads.limited(limit, openmp=True):
        assert (blas.n, omp.n) == (blas_in, omp_in)
    assert (blas.n, omp.n) == (blas_n, omp_n)
    assert (len(blas.calls), len(omp.calls)) == (blas_sets, omp_sets)


def test_limited_on_numpys_openblas():
    default = threads.blas_threads()
    if default is None or default < 2 or default != threads._defaults()[0]:
        pytest.skip(f"NumPy's BLAS is not OpenBLAS at its default count of ≥ 2 threads ({default})")
    a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    with threads.limited(1):
        assert threads.blas_threads() == 1
        inside = a @ a
    assert threads.blas_threads() == default
    np.testing.assert_array_equal(inside, a @ a)
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(default - 1 if default > 2 else 1, "blas"):
        user = threads.blas_threads()
        with threads.limited(1):
            assert threads.blas_threads() == user    # the user's limit stands
        assert threads.blas_threads() == user
    assert threads.blas_threads() == default


def test_gemm_limit_skips_small_gemms(fresh_state, monkeypatch):
    monkeypatch.setattr(threads, "target", lambda: 1)
    assert threads.gemm_limit(32, 64, 64) is None           # OpenBLAS runs it on one thread anyway
    assert threads.gemm_limit(32, 1024, 1024) == 1


def test_dot_general_and_conv_run_under_the_rule(fresh_state, monkeypatch):
    """With the rule asking for one thread, cuvmap's GEMMs and convolutions enter
    ``limited`` with it and give the count back; results are unchanged."""
    entered = []
    real = threads.limited

    class Spy(real):
        __slots__ = ()

        def __enter__(self):
            entered.append((self.n, self.openmp))
            return super().__enter__()

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 128)), rng.standard_normal((128, 96))
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    want_mm = a @ b
    want_conv = cv.nn.conv(x, w, None, padding=1)
    monkeypatch.setattr(threads, "limited", Spy)
    monkeypatch.setattr(threads, "target", lambda: 1)
    before = threads.blas_threads()
    np.testing.assert_allclose(cv.numpy.matmul(a, b), want_mm, rtol=1e-12)
    np.testing.assert_allclose(cv.nn.conv(x, w, None, padding=1), want_conv, rtol=1e-6, atol=1e-6)
    assert (1, False) in entered and (1, True) in entered
    assert threads.blas_threads() == before


# NOTE [two thread pools]: which sequences shut OpenBLAS's pool down before a convolution.
# name: (the calls, in order, and whether another Python thread is alive) -> shutdowns
_A, _B = np.ones((64, 128)), np.ones((128, 96))   # m·n·k above OpenBLAS's one-thread size
_X, _W = np.ones((2, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32)
_GEMM = lambda: cv.numpy.matmul(_A, _B)  # noqa: E731
_SMALL_GEMM = lambda: cv.numpy.matmul(_A[:4, :8], _B[:8, :4])  # noqa: E731
_CONV = lambda: cv.nn.conv(_X, _W, None, padding=1)  # noqa: E731
TWO_POOLS = {
    "a conv after a threaded GEMM": ([_GEMM, _CONV], False, 1),
    "two convs after it: one shutdown": ([_GEMM, _CONV, _CONV], False, 1),
    "each GEMM -> conv switch": ([_GEMM, _CONV, _GEMM, _CONV], False, 2),
    "GEMMs only (an MLP)": ([_GEMM, _GEMM, _GEMM], False, 0),
    "a small GEMM wakes no worker": ([_SMALL_GEMM, _CONV], False, 0),
    "another Python thread alive: left alone": ([_GEMM, _CONV], True, 0),
}


@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "the rule limiting"])
@pytest.mark.parametrize("name", TWO_POOLS)
def test_a_convolution_after_a_threaded_gemm_shuts_openblas_pool_down(name, busy, fresh_state, monkeypatch):
    """Under load the rule runs GEMMs on fewer threads: nothing to shut down (and setting
    the count would start a shut pool again), so no shutdown at all."""
    import threading

    from cuvmap.cpu import onednn
    from cuvmap.lax import conv_strategy

    if not onednn.available():
        pytest.skip(f"oneDNN not loadable: {onednn.load_error()}")
    # the convolutions on OpenMP's threads every time (the strategy is given back after the test)
    monkeypatch.setattr(conv_strategy, "_strategy", ["onednn"])
    monkeypatch.setattr(threads, "target", lambda: 1 if busy else None)
    fresh_state.limit = 1 if busy else None
    calls, other_thread, want = TWO_POOLS[name]
    want = 0 if busy else want
    shutdowns = []
    monkeypatch.setitem(threads._blas, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setitem(threads._pool, "awake", False)
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, name="a data loader") if other_thread else None
    if helper is not None:
        helper.start()
    try:
        for call in calls:
            call()
    finally:
        stop.set()
        if helper is not None:
            helper.join()
    assert len(shutdowns) == want


# NOTE [oneDNN beside another OpenMP user]: beside an OpenMP team whose idle workers spin
# (torch's libgomp loaded first), a GEMM within the spin window after cuvmap's last
# convolution asks OpenBLAS for one thread, OpenBLAS's pool is never shut down, and the
# unfold kernels' GEMMs run on one thread.
# name: (how long the team spins, the calls) -> what gemm_limit answered for each GEMM
_AGE = lambda: openmp._settings.__setitem__("region_end", time.monotonic() - 1.0)  # noqa: E731  a second later
BESIDE_A_SPINNING_TEAM = {
    "no convolution yet: OpenBLAS's threads": (0.03, [_GEMM, _GEMM], [None, None]),
    "a GEMM right after a convolution: one thread": (0.03, [_CONV, _GEMM, _GEMM], [1, 1]),
    "after the window: OpenBLAS's threads again": (0.03, [_CONV, _GEMM, _AGE, _GEMM], [1, None]),
    "ACTIVE: one thread for good after a convolution": (float("inf"), [_GEMM, _CONV, _AGE, _GEMM], [None, 1]),
    "PASSIVE: nothing spins, OpenBLAS's threads": (0.0, [_CONV, _GEMM], [None]),
    "a small GEMM asks nothing": (0.03, [_CONV, _SMALL_GEMM], []),
    "another Python thread alive: OpenBLAS's count left alone": (0.03, ["thread", _CONV, _GEMM], [None]),
}


@pytest.mark.parametrize("name", BESIDE_A_SPINNING_TEAM)
def test_gemms_beside_a_spinning_openmp_team(name, fresh_state, monkeypatch):
    from cuvmap.cpu import onednn
    from cuvmap.lax import conv_strategy

    if not onednn.available():
        pytest.skip(f"oneDNN not loadable: {onednn.load_error()}")
    monkeypatch.setattr(conv_strategy, "_strategy", ["onednn"])
    monkeypatch.setattr(threads, "target", lambda: None)      # a quiet machine, whatever CI's load
    spins, calls, want = BESIDE_A_SPINNING_TEAM[name]
    if "thread" not in calls:   # (whatever threads earlier tests left behind)
        monkeypatch.setattr(threads, "sole_python_thread", lambda: True)
    monkeypatch.setitem(openmp._settings, "spins", spins)
    monkeypatch.setitem(openmp._settings, "region_end", float("-inf"))
    monkeypatch.setitem(threads._pool, "awake", True)         # a threaded GEMM ran before
    shutdowns, answers = [], []
    monkeypatch.setitem(threads._blas, "shutdown", lambda: shutdowns.append(1))
    real = threads.gemm_limit
    monkeypatch.setattr(threads, "gemm_limit", lambda m, n, k: answers.append(real(m, n, k)) or answers[-1])
    before = threads.blas_threads()
    import threading

    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, name="a data loader") if "thread" in calls else None
    if helper is not None:
        helper.start()
    try:
        calls = [c for c in calls if c != "thread"]
        results = [call() for call in calls]
    finally:
        stop.set()
        if helper is not None:
            helper.join()
    assert answers == want
    # never a shutdown beside a spinning team; PASSIVE: the convolution after the awake pool
    # shuts it down, as NOTE [two thread pools] says
    assert len(shutdowns) == (1 if spins == 0 else 0)
    assert threads.blas_threads() == before
    for call, result in zip(calls, results):
        if call is _GEMM:   # one OpenBLAS thread or two: the same bits (its threads split m and n, not k)
            np.testing.assert_array_equal(result, _A @ _B)


def test_the_unfold_kernels_run_one_blas_thread_beside_a_spinning_team(fresh_state, monkeypatch):
    """The unfold kernels' GEMMs would run beside the team's spinning workers: one
    OpenBLAS thread for them, the result the same."""
    from cuvmap.lax import conv_strategy

    monkeypatch.setattr(threads, "target", lambda: None)
    monkeypatch.setattr(threads, "sole_python_thread", lambda: True)
    want = _CONV()
    monkeypatch.setattr(conv_strategy, "_strategy", ["unfold"])
    seen = []
    real_gemm = conv_strategy.conv_gemm.forward

    def spy(*args, **kw):
        seen.append(threads.blas_threads())
        return real_gemm(*args, **kw)

    monkeypatch.setattr(conv_strategy.conv_gemm, "forward", spy)
    for spins, threads_inside in [(0.0, threads.blas_threads()), (0.03, 1)]:
        monkeypatch.setitem(openmp._settings, "spins", spins)
        seen.clear()
        np.testing.assert_allclose(_CONV(), want, rtol=1e-5, atol=1e-5)
        assert seen == [threads_inside], (spins, seen)


SPIN_SECONDS = [  # OMP_WAIT_POLICY, GOMP_SPINCOUNT (None: unset) -> seconds the idle workers spin
    (None, None, openmp.DEFAULT_SPIN_SECONDS),
    ("PASSIVE", None, 0.0),
    ("passive", None, 0.0),
    ("ACTIVE", None, float("inf")),
    (None, "0", 0.0),
    (None, "INFINITE", float("inf")),
    (None, "300000", openmp.DEFAULT_SPIN_SECONDS),
    (None, "3M", 10 * openmp.DEFAULT_SPIN_SECONDS),
    (None, "30k", openmp.DEFAULT_SPIN_SECONDS / 10),
    ("PASSIVE", "30k", openmp.DEFAULT_SPIN_SECONDS / 10),     # the count is what libgomp spins
    (None, "many", openmp.DEFAULT_SPIN_SECONDS),              # unreadable: libgomp's default
]


@pytest.mark.parametrize("policy,spincount,seconds", SPIN_SECONDS)
def test_spin_seconds(policy, spincount, seconds):
    assert openmp.spin_seconds(policy, spincount) == pytest.approx(seconds)


def test_the_real_shutdown_keeps_gemms_and_convs_right(fresh_state, monkeypatch):
    """NumPy's OpenBLAS shut down between calls: its next threaded GEMM starts its workers
    again, and every result is the same as before."""
    monkeypatch.setattr(threads, "target", lambda: None)  # a quiet machine, whatever CI's load
    monkeypatch.setitem(threads._pool, "awake", False)
    want = (_GEMM(), _CONV())
    for _ in range(3):
        np.testing.assert_array_equal(_GEMM(), want[0])
        np.testing.assert_array_equal(_CONV(), want[1])
    assert threads._blas.get("shutdown") is not None or not threads.loaded_libraries("openblas")


@pytest.mark.slow
def test_a_real_busy_loop_is_seen(fresh_state):
    cores = threads.available_cores()
    if cores < 2 or threads._busy_seconds(None) is None:
        pytest.skip("needs 2 cores and /proc/stat")
    with background.BackgroundLoad(1):
        deadline = time.monotonic() + 3.0
        limit = None
        while time.monotonic() < deadline and limit is None:
            time.sleep(0.3)
            limit = threads.target()
    assert limit is not None and limit <= cores - 1, threads.stats()


# ---------------------------------------------------------------------------------------
# The benchmarks' background load
# ---------------------------------------------------------------------------------------


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_background_load_starts_and_stops():
    with background.BackgroundLoad(2) as load:
        pids = load.pids
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        time.sleep(0.3)
        assert all(background._cpu_seconds(p) > 0 for p in pids)
    assert not any(_alive(p) for p in pids)
    assert load.result["processes"] == 2 and load.result["cores_used"] > 0
    assert load.stop() is load.result                    # idempotent
    with pytest.raises(ValueError):
        background.BackgroundLoad(-1)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_background_loops_outlive_no_killed_benchmark(tmp_path):
    code = ("import os, sys\nsys.path.insert(0, %r)\nfrom benchmarks.machine import background\n"
            "load = background.BackgroundLoad(1).start()\nprint(load.pids[0], flush=True)\nos._exit(0)\n" % ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


@pytest.mark.slow
def test_suite_option_starts_prints_and_stops_the_loops(capsys, tmp_path):
    path = tmp_path / "out.json"
    argv = ["dp", "--models", "mlp", "--batch", "2", "--mlp-widths", "16", "8", "4", "--no-jit", "--no-torch",
            "--repeats", "2", "--warmup", "1", "--max-repeats", "2", "--progress", "off", "--background-load", "1",
            "--json", str(path), "--no-plot"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    res = json.loads(path.read_text())
    assert "| background load | 1 busy-loop process(es) started by the benchmark (pids" in out
    assert "| cuvmap CPU threads |" in out and "cuvmap's CPU threads:" in out
    pid = int(res["settings"]["background load"].split("pids ")[1].split(")")[0])
    assert not _alive(pid)
    assert res["background_load"]["processes"] == 1


def test_alternate_load_report():
    """--alternate-load: rounds timed with the loops paused and running; the report pairs
    them by round, and holds cuvmap's case against its torch counterpart under load."""
    load = background.BackgroundLoad(1, alternate=True, settle=0.0)
    load.procs = []     # no processes: record() reads only the state
    cases = {k: Case(k, k, None, None) for k in ("batched", "torch_batched")}
    for r in range(8):
        for running in (False, True):
            load.running = running
            load.record("mlp batch 32: ", cases["batched"], (13.0 if running else 10.0 + 0.1 * r) * 1e-3)
            load.record("mlp batch 32: ", cases["torch_batched"], (20.0 if running else 12.0) * 1e-3)
    rows = {r["key"]: r for r in load.report({"batched": "torch_batched"})}
    mine = rows["batched"]
    assert mine["where"] == "mlp batch 32" and mine["rounds"] == 8
    assert mine["quiet_ms"] == pytest.approx(10.35) and mine["loaded_ms"] == pytest.approx(13.0)
    assert 1.2 < mine["slowdown"]["ratio"] < 1.35 and mine["slowdown_met"] == "yes"
    assert mine["vs_torch"]["ratio"] == pytest.approx(0.65) and mine["vs_torch_met"] == "yes"
    assert "vs_torch" not in rows["torch_batched"]
    lines = "\n".join(background.report_lines(list(rows.values()), 1))
    assert "| mlp batch 32 | batched | 8 |" in lines
    with pytest.raises(ValueError, match="--alternate-load"):
        background.BackgroundLoad(0, alternate=True)


@pytest.mark.slow
def test_alternate_load_pauses_and_resumes(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(background, "SETTLE", 0.1)   # (the suites settle for a second after each change)
    path = tmp_path / "out.json"
    argv = ["dp", "--models", "mlp", "--batch", "2", "--mlp-widths", "16", "8", "4", "--no-jit", "--no-torch",
            "--repeats", "2", "--warmup", "1", "--max-spread", "0", "--progress", "off", "--background-load", "1",
            "--alternate-load", "--json", str(path), "--no-plot"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    res = json.loads(path.read_text())
    assert "## Under 1 busy core(s)" in out
    rows = {r["key"]: r for r in res["alternate_load"]}
    assert set(rows) == {"batched", "vmap_clip", "ghost"}
    assert all(r["rounds"] == 2 and len(r["loaded_times_ms"]) == 2 for r in rows.values())
    assert all(len(r["times_ms"]) == 2 for r in res["rows"])     # the suite's own rows: the quiet halves
