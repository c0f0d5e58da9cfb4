"""CPU thread counts that follow the cores other processes leave free.

NumPy's OpenBLAS and oneDNN's OpenMP start one thread per core and split each GEMM and
convolution into equal parts, one per thread. When another process keeps a core busy,
the part on that core waits for the scheduler, and the whole call with it (NOTE [threads
under a busy machine] has the measurements). So, unless the user chose thread counts,
cuvmap's own GEMMs (``dot_general``) and CPU convolutions ask BLAS and OpenMP for no more
threads than there are cores left free by the other processes, measured as

    others = (B − P) / w          free = cores − others

over the last window of ``w`` seconds (about :data:`INTERVAL`): ``B`` is the CPU time the
cores this process may run on (``sched_getaffinity``) spent busy or stolen by the
hypervisor (``/proc/stat``), ``P`` this process's own CPU time (all its threads). The
thread count ``n`` (at most the libraries' default, one per core) follows ``free`` with
hysteresis (:func:`rule`): down while ``free < n − 1/2``, up while ``free > n + 0.7``.

The count is asked per call and given back after it (OpenBLAS's count is process-wide,
OpenMP's is the calling thread's): outside cuvmap's calls the libraries keep the counts
they had, and torch's or the user's own GEMMs are not touched. The rule does nothing when
the user chose: any of :data:`USER_SETTINGS` in the environment, a BLAS or OpenMP count
that is not the default when the call starts (threadpoolctl's limits, ``torch.set_num_threads``
on a shared libgomp, :func:`cuvmap.distributed.threads.share_cores`), or
``CUVMAP_CPU_THREADS=fixed`` / :func:`set_adaptive` ``(False)``.
"""
import ctypes
import os
import threading
import time

from cuvmap.cpu import openmp
from cuvmap import config

# a user who set any of these chose the thread counts: they are left alone
USER_SETTINGS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")
_CONFIGS = ("scipy_openblas_get_config64_", "scipy_openblas_get_config", "openblas_get_config64_",
            "openblas_get_config")

INTERVAL = 0.25          # seconds between two looks at /proc/stat
STALE = 2.0              # a window longer than this (no call in between) starts afresh
DOWN_MARGIN = 0.5        # n − 1 threads when free < n − DOWN_MARGIN
UP_MARGIN = 0.7          # n + 1 threads when free > n + UP_MARGIN
# OpenBLAS runs a GEMM of m·n·k ≤ 4 · 65536 (SMP_THRESHOLD_MIN · GEMM_MULTITHREAD_THRESHOLD)
# on one thread and gives it m·n·k / 262144 threads above: below twice that, one thread
# anyway, and cuvmap asks nothing (the loops' small GEMMs pay no ctypes call)
MIN_PARALLEL_MNK = 2 * 4 * 65536


# ---------------------------------------------------------------------------------------
# The libraries' thread counts, through ctypes
# ---------------------------------------------------------------------------------------


def available_cores():
    """The cores this process may run on (its affinity mask), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def loaded_libraries(fragment):
    """The shared libraries whose path contains ``fragment`` that this process has loaded
    (Linux: /proc/self/maps; elsewhere none)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if fragment in line and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if ".so" in p)


def find_function(paths, names, restype=ctypes.c_int, argtypes=()):
    """The first function of ``names`` found in the libraries at ``paths`` (a ctypes
    function with ``restype`` and ``argtypes``), or None."""
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = restype
                fn.argtypes = list(argtypes)
                return fn
    return None


def call_first(paths, names, *args):
    """Calls the first function of ``names`` found in the libraries at ``paths`` with int
    arguments; returns its int result, or None when none has one."""
    fn = find_function(paths, names, ctypes.c_int, [ctypes.c_int] * len(args))
    return None if fn is None else fn(*args)


_blas = {}   # "get", "set": OpenBLAS's functions (None when NumPy's BLAS is not OpenBLAS)


def _blas_functions():
    if "get" not in _blas:
        paths = loaded_libraries("openblas")
        _blas["get"] = find_function(paths, _GETTERS)
        _blas["set"] = find_function(paths, _SETTERS, None, [ctypes.c_int])
    return _blas["get"], _blas["set"]


def blas_threads():
    """The threads of the OpenBLAS that NumPy loaded, or None where it cannot tell."""
    get, _ = _blas_functions()
    return None if get is None else get()


def _defaults():
    """``(BLAS, OpenMP)``: the thread counts the libraries start with when nobody chose
    (one per core of the affinity mask; OpenBLAS at most its build's MAX_THREADS)."""
    if "defaults" not in _blas:
        cores = available_cores()
        blas_max = cores
        config = find_function(loaded_libraries("openblas"), _CONFIGS, ctypes.c_char_p)
        if config is not None:
            text = (config() or b"").decode(errors="replace")
            if "MAX_THREADS=" in text:
                digits = text.split("MAX_THREADS=", 1)[1].split()[0]
                blas_max = int(digits) if digits.isdigit() else cores
        _blas["defaults"] = (min(cores, blas_max), cores)
    return _blas["defaults"]


def _openmp_functions():
    """``omp_get_max_threads`` and ``omp_set_num_threads`` of the libgomp oneDNN uses, or
    ``(None, None)`` before oneDNN loads (or without it)."""
    return openmp.functions()


# NOTE [threads under a busy machine]
# Measured on the project's 2-core machine beside one busy-loop process (the figures are in
# the README's performance section, `--background-load 1`): on OpenBLAS's default 2
# threads cuvmap's batched MLP gradient became 2-3x slower with a long tail, while 1
# thread kept the same time quiet or loaded. OpenBLAS's idle worker spins after each GEMM,
# so loaded there are three runnable threads on two cores, and the half of a GEMM's split
# whose thread the scheduler puts behind the loop waits a time slice, and the call with it.
# OPENBLAS_THREAD_TIMEOUT (sleeping workers) slowed quiet GEMMs and left the loaded tail;
# torch (MKL + OpenMP) degrades the same way. So under load the remedy is fewer threads,
# not another wait policy. Lowering the count only while others hold cores keeps the
# quiet speed; the free cores are measured from /proc/stat (not the load average, a
# one-minute mean that counts this process's own spinning threads) every INTERVAL, with
# hysteresis so that cuvmap's own threads taking a share from the loop still count as busy.
# The floor: with one of two cores busy, one core is what this process gets (more threads
# do not take more: Linux's autogroup shares the CPU between sessions, and GEMMs split into
# blocks on a pool of two single-threaded workers took the one-thread time too), so a
# loaded call takes its single-thread time, and a GEMM-bound call that two threads ran
# 1.75-1.85x faster than one is that much slower under load (measured: loaded = one thread
# quiet, to within the noise; README "Under one busy core").
# Not covered: other threads of this process (a data-loading thread counts as this
# process's own time), cgroup CPU quotas (only the affinity mask is read), MKL or BLIS
# as NumPy's BLAS (no OpenBLAS functions found: BLAS is left alone).


# ---------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------


def rule(free, current, maximum, down=DOWN_MARGIN, up=UP_MARGIN):
    """The thread count after ``current`` when ``free`` cores are left by other processes:
    one less while ``free < n − down``, one more while ``free > n + up``, within
    ``[1, maximum]``. With 2 cores and one busy loop, ``free`` is about 1 (1.3 while cuvmap
    still runs 2 threads that take their share from the loop): 1 thread; back to 2 once
    ``free`` is above 1.7."""
    n = max(1, min(int(current), int(maximum)))
    while n > 1 and free < n - down:
        n -= 1
    while n < maximum and free > n + up:
        n += 1
    return n


def _busy_seconds(cpus):
    """CPU seconds the cores ``cpus`` spent busy or stolen since boot (/proc/stat), or None."""
    try:
        with open("/proc/stat") as fh:
            lines = fh.readlines()
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    total = 0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        f = [int(v) for v in fields]
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        total += f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)
    return total / hz


class _State:
    def __init__(self):
        self.adaptive = None      # set_adaptive's flag (None: CUVMAP_CPU_THREADS)
        self.limit = None         # the thread count to ask for, or None: the default
        self.n = None             # the rule's count (the default while not limiting)
        self.next = 0.0           # monotonic time of the next look
        self.snap = None          # (monotonic, busy seconds, own CPU seconds)
        self.free = None          # the last measured free cores
        self.calls = 0            # calls that asked for fewer threads
        self.lock = threading.Lock()


_state = _State()


def _why_fixed():
    """Why the rule does nothing now (a phrase), or None when it adapts."""
    if _state.adaptive is False:
        return "set_adaptive(False)"
    env = config.from_environment("CUVMAP_CPU_THREADS", "adaptive")  # set but empty: the default
    if _state.adaptive is None and env == "fixed":
        return "CUVMAP_CPU_THREADS=fixed"
    if env not in ("adaptive", "fixed"):
        raise ValueError(f"CUVMAP_CPU_THREADS must be adaptive or fixed, not {env!r}")
    user = [k for k in USER_SETTINGS if k in os.environ]
    if user:
        return f"the user's thread settings ({', '.join(user)} set)"
    return None


def _update(now):
    s = _state
    if not s.lock.acquire(blocking=False):
        return
    try:
        s.next = now + INTERVAL
        if _why_fixed() is not None:
            s.limit, s.n, s.snap = None, None, None
            return
        cpus = _affinity()
        busy = _busy_seconds(cpus)
        if busy is None:
            s.next = float("inf")
            return
        snap = (now, busy, time.process_time())
        prev, s.snap = s.snap, snap
        if prev is None or now - prev[0] > STALE or now - prev[0] < 0.5 * INTERVAL:
            return
        cores = len(cpus) if cpus is not None else available_cores()
        others = max(0.0, (busy - prev[1]) - (snap[2] - prev[2])) / (now - prev[0])
        s.free = cores - others
        s.n = rule(s.free, cores if s.n is None else s.n, cores)
        s.limit = s.n if s.n < cores else None
    finally:
        s.lock.release()


def _affinity():
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def target():
    """The thread count the rule asks of BLAS and OpenMP now, or None for the libraries'
    own (a quiet machine, or the user's settings); looks at the machine at most every
    :data:`INTERVAL` seconds."""
    now = time.monotonic()
    if now >= _state.next:
        _update(now)
    return _state.limit


def gemm_limit(m, n, k):
    """:func:`target` for an ``m × k`` by ``k × n`` GEMM, None where OpenBLAS runs it on
    one thread anyway; one thread while OpenMP's workers spin after cuvmap's last
    convolution (NOTE [oneDNN beside another OpenMP user] in cuvmap/cpu/openmp.py)."""
    if m * n * k < MIN_PARALLEL_MNK:
        return None
    limit = target()
    if limit is None and openmp.team_spinning() and sole_python_thread():
        return 1
    return limit


def beside_team():
    """1 where OpenMP's idle workers spin after a region (libgomp loaded by another
    library, not PASSIVE), else None: the OpenBLAS threads of a convolution's unfold
    kernels, which would run beside the team's spinning workers (NOTE [oneDNN beside
    another OpenMP user] in cuvmap/cpu/openmp.py). None while other Python threads run:
    OpenBLAS's count is process-wide, and theirs is left alone."""
    return 1 if openmp.spin_seconds_in_force() > 0 and sole_python_thread() else None


def sole_python_thread():
    """Whether the calling thread is the process's one Python thread (cuvmap's own helper
    threads, named cuvmap-*, run no GEMMs and do not count): only then does cuvmap change
    OpenBLAS's process-wide pool beyond the busy-machine rule (NOTE [two thread pools])."""
    if threading.active_count() == 1:
        return True
    current = threading.current_thread()
    return not any(t is not current and not t.name.startswith("cuvmap-") for t in threading.enumerate())


class limited:
    """``with limited(n):`` runs its body with at most ``n`` OpenBLAS threads (process-wide)
    and, with ``openmp=True``, ``n`` OpenMP threads for oneDNN (the calling thread's count),
    each given back afterwards; a library whose count is not its default (the user's
    choice) is left alone, and ``n=None`` changes nothing."""

    __slots__ = ("n", "openmp", "blas_prev", "omp_prev")

    def __init__(self, n, openmp=False):
        self.n, self.openmp, self.blas_prev, self.omp_prev = n, openmp, None, None

    def __enter__(self):
        n = self.n
        if n is None:
            return self
        blas_default, omp_default = _defaults()
        get, set_ = _blas_functions()
        if get is not None and set_ is not None:
            prev = get()
            if prev == blas_default and n < prev:
                set_(n)
                self.blas_prev = prev
        if self.openmp:
            get, set_ = _openmp_functions()
            if get is not None:
                prev = get()
                if prev == omp_default and n < prev:
                    set_(n)
                    self.omp_prev = prev
        if self.blas_prev is not None or self.omp_prev is not None:
            _state.calls += 1
        return self

    def __exit__(self, *exc):
        if self.blas_prev is not None:
            _blas_functions()[1](self.blas_prev)
        if self.omp_prev is not None:
            _openmp_functions()[1](self.omp_prev)
        return False


# NOTE [two thread pools]
# NumPy's OpenBLAS (pthreads) and oneDNN (OpenMP) each keep a pool of threads, one per
# core. oneDNN's OpenMP threads sleep as soon as a convolution ends (OMP_WAIT_POLICY=PASSIVE,
# set by cuvmap/cpu/onednn.py), but OpenBLAS's idle workers spin (sched_yield) for about a
# tenth of a second after each threaded GEMM before they sleep. A program that alternates
# GEMMs and convolutions (every CNN: a dense layer, then the convolutions' backward pass)
# thus runs its convolutions beside a spinning worker: two OpenMP threads and the spinner
# on two cores, and the convolutions take their one-thread time or more (the benchmark
# CNN's gradient was slower on two threads than with every library on one; the README's
# performance section has the figures). So a convolution on OpenMP's threads that follows
# a threaded GEMM first shuts OpenBLAS's pool down (``blas_thread_shutdown_``: a fraction
# of a GEMM's time, and the next threaded GEMM starts its workers again); GEMM-only
# programs (an MLP) never pay it. Shutting the pool down while
# another thread runs a GEMM on it would break that GEMM, so it is done only while this is
# the process's one Python thread (cuvmap's own helper threads, named cuvmap-*, run no
# GEMMs); with more threads the convolutions run as before. Not while the rule asks for
# fewer threads (NOTE [threads under a busy machine]): a GEMM limited to one thread gives
# the workers nothing to spin after, and setting OpenBLAS's thread count starts a pool that
# was shut down, whose new workers spin too.
_pool = {"awake": False}   # a threaded GEMM ran since OpenBLAS's pool was last shut down


def blas_pool_used():
    """Marks that a GEMM ran on OpenBLAS's threads, unless the rule has them limited (NOTE
    [two thread pools])."""
    if _state.limit is None:
        _pool["awake"] = True


def quiet_blas_pool():
    """Before work on OpenMP's threads: shuts OpenBLAS's pool down if a threaded GEMM woke
    it and no other Python thread could be running a GEMM on it (NOTE [two thread pools])."""
    if not _pool["awake"] or openmp.spin_seconds_in_force() > 0:
        return   # (beside spinning OpenMP workers the GEMMs ask for one thread instead: setting
        #          the count would start a shut pool again: NOTE [oneDNN beside another OpenMP user])
    if not sole_python_thread():
        return
    if "shutdown" not in _blas:
        _blas["shutdown"] = find_function(loaded_libraries("openblas"), ("blas_thread_shutdown_",))
    if _blas["shutdown"] is not None:
        _blas["shutdown"]()
    _pool["awake"] = False


def set_adaptive(flag):
    """Turns the rule on (``True``), off (``False``: the libraries' own counts) or back to
    ``CUVMAP_CPU_THREADS`` (``None``); returns the previous setting."""
    previous = _state.adaptive
    _state.adaptive = None if flag is None else bool(flag)
    _state.next, _state.limit, _state.n, _state.snap = 0.0, None, None, None
    return previous


def describe():
    """One line: whether the rule adapts, and to what it last measured."""
    why = _why_fixed()
    if why is not None:
        return f"fixed ({why}): BLAS and OpenMP use their own thread counts"
    if _busy_seconds(None) is None:
        return "fixed (no /proc/stat to measure other processes by)"
    now = "" if _state.free is None else (f"; last measured {_state.free:.2f} free of {available_cores()} cores, "
                                          f"{_state.n} thread(s)")
    return (f"adaptive: GEMMs and convolutions ask for at most the cores other processes leave free "
            f"({_state.calls} call(s) asked for fewer threads so far{now})")


def stats():
    """``dict(free, threads, limited_calls)``: the last measurement and how many calls asked
    for fewer threads than the default."""
    return dict(free=_state.free, threads=_state.n, limited_calls=_state.calls)
