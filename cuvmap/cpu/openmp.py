"""The OpenMP environment of oneDNN's convolutions: the wait policy libdnnl's GNU OpenMP
is loaded with (NOTE [OpenMP threads beside OpenBLAS]), the threading mode when another
OpenMP user loaded libgomp first (NOTE [oneDNN beside another OpenMP user]), the OpenMP
functions of libdnnl's libgomp, and cuvmap's worker threads of the "threads" mode.
:mod:`cuvmap.cpu.libdnnl` asks it for the environment to load in and hands it the loaded
library; it imports nothing of cuvmap.
"""
import ctypes
import os
import threading
import time
from cuvmap import config

_lock = threading.Lock()
# "threading": "openmp" or "threads" (NOTE [oneDNN beside another OpenMP user]); "spins":
# how long OpenMP's idle workers spin after a parallel region, in seconds (0: they sleep
# at once, PASSIVE; inf: for good, ACTIVE); "region_end": when cuvmap's last OpenMP region
# ended (time.monotonic)
_settings = {"threading": None, "spins": 0.0, "region_end": float("-inf")}
_thread_settings = {}             # what prepare_environment set (for settings_description())
_omp = {}                         # omp_get_max_threads / omp_set_num_threads of libdnnl's libgomp


def _libgomp_loaded():
    """Whether the system's GNU OpenMP (``libgomp.so.1``, the one libdnnl links) is already
    in this process: its settings are then fixed. (Wheels such as torch's bring their own
    copies under other names, ``libgomp-<hash>.so.1``, which libdnnl does not use.)"""
    try:
        with open("/proc/self/maps") as fh:
            return any(os.path.basename(line.split()[-1]).startswith("libgomp.so") for line in fh if "/" in line)
    except OSError:
        return False


def libgomp_loaded():
    """Whether ``libgomp.so.1`` is in this process already (another library loaded it)."""
    return _libgomp_loaded()


# NOTE [OpenMP threads beside OpenBLAS]
# oneDNN runs its convolutions on GNU OpenMP's thread pool; NumPy's GEMMs and element-wise
# work run on OpenBLAS's pthreads pool and the calling thread, on the same cores. What
# matters is what OpenMP's workers do between convolutions: by default (OMP_WAIT_POLICY
# unset) an idle worker spins for GOMP_SPINCOUNT iterations before it sleeps, and
# OMP_WAIT_POLICY=ACTIVE spins for good. A spinning worker holds a core that the OpenBLAS
# GEMM or the NumPy op right after a convolution wants. On the benchmark CNN's vmap(grad),
# spinning workers make the step several times slower than passive ones, and its times
# far more spread out (`OMP_WAIT_POLICY=ACTIVE python -m benchmarks per_example` against
# `OMP_WAIT_POLICY=PASSIVE python -m benchmarks per_example`, each setting in its own
# process; the policy in force is printed with the figures). A lone small convolution is
# slower with PASSIVE (a sleeping worker takes a fraction of a millisecond to wake), but
# a training step is many operations in a row, and there PASSIVE wins. Matching the
# thread counts changes nothing here: both pools default to one thread per core.
# libgomp's own default spin is another matter since cuvmap joins a spinning team (NOTE
# [oneDNN beside another OpenMP user]: GEMMs on one OpenBLAS thread while the workers
# spin): with GOMP_SPINCOUNT=300000 set (the count libgomp uses when no policy is set),
# the benchmark CNN's steps at batch 8 and 32 ran faster than with PASSIVE, eager and
# jitted, and at batch 128 slower (`GOMP_SPINCOUNT=300000 python -m benchmarks
# per_example --batch 8 32 128` against the plain command, each in its own process,
# alternated). On the 2-core Ice Lake machine of issue 36's later sessions one run of each
# of those commands gave the opposite (cuvmap's steps slower spinning at batch 8 and 32,
# faster at 128), while processes that ran only cuvmap's jit(grad) and eager vmap(grad)
# of that network were faster spinning, both steps, in each of four alternated pairs of
# processes (two at batch 32, two at 128; by 2 to 21%, most by 14 to 20%): which policy
# wins depends on the machine and on what else the process runs. PASSIVE stays the default: it is the
# policy that leaves the cores alone where several processes share them (the distributed
# jobs); a user with steps on a machine of their own may set GOMP_SPINCOUNT and measure.
# So cuvmap loads libdnnl (whose libgomp reads its environment once, when it loads) with
# OMP_WAIT_POLICY=PASSIVE, and restores the environment right after, so that neither the
# user's subprocesses nor other libraries see the change. It does nothing when the user set
# OMP_WAIT_POLICY or GOMP_SPINCOUNT (theirs wins), or when libgomp.so.1 is already loaded
# (its settings are fixed then: NOTE [oneDNN beside another OpenMP user] says what cuvmap
# does instead). onednn.describe() says which applied.


def prepare_environment():
    """The environment variables to set while libdnnl loads (NOTE [OpenMP threads beside
    OpenBLAS]), the threading mode and how long the team's idle workers spin (NOTE
    [oneDNN beside another OpenMP user])."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        _thread_settings["OMP_WAIT_POLICY"] = f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')} (the user's)"
        _settings["spins"] = spin_seconds(os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"))
        _default_threading("openmp")
        return {}
    if _libgomp_loaded():
        _thread_settings["OMP_WAIT_POLICY"] = ("(libgomp.so.1 was already loaded: its own setting, idle workers "
                                               "spin after each parallel region)")
        _settings["spins"] = spin_seconds(None, None)
        _default_threading("openmp")
        return {}
    _thread_settings["OMP_WAIT_POLICY"] = "PASSIVE (set by cuvmap while libdnnl loaded)"
    _default_threading("openmp")
    return {"OMP_WAIT_POLICY": "PASSIVE"}


# libgomp's default spin (GOMP_SPINCOUNT unset: 300,000 polls), measured as about a third
# of this window in a worker's CPU time after each region on the project's machines; the
# window is wider, for slower polls (a PAUSE instruction takes 10 to 140 cycles across x86
# cores)
DEFAULT_SPIN_SECONDS = 0.03


def spin_seconds(policy, spincount):
    """How long libgomp's idle workers spin after a region, in seconds, under the wait
    ``policy`` and ``spincount`` it loaded with (None: unset): 0 for PASSIVE or a spin count
    of 0, inf for ACTIVE or an "infinite" count, else about :data:`DEFAULT_SPIN_SECONDS`
    scaled by the count."""
    policy = (policy or "").strip().upper()
    if spincount is not None and spincount.strip():
        text = spincount.strip().upper()
        if text == "INFINITE" or text == "INFINITY":
            return float("inf")
        try:
            count = float(text.rstrip("KMGT")) * {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(text[-1:], 1)
        except ValueError:
            count = 300_000.0
        return 0.0 if count <= 0 else DEFAULT_SPIN_SECONDS * count / 300_000
    if policy == "PASSIVE":
        return 0.0
    if policy == "ACTIVE":
        return float("inf")
    return DEFAULT_SPIN_SECONDS


def spin_seconds_in_force():
    """How long the loaded libgomp's idle workers spin after a region (0 before libdnnl
    loads, or where they sleep at once)."""
    return _settings["spins"]


def region_ended():
    """Records that one of cuvmap's calls ran a region on OpenMP's team (a convolution in
    the "openmp" mode): its workers spin for a while now (:func:`team_spinning`)."""
    if _settings["spins"] > 0:
        _settings["region_end"] = time.monotonic()


def team_spinning():
    """Whether OpenMP's workers may still be spinning after cuvmap's last region, holding
    the cores that OpenBLAS's threads would take (NOTE [oneDNN beside another OpenMP
    user])."""
    spins = _settings["spins"]
    return spins > 0 and time.monotonic() - _settings["region_end"] < spins


# NOTE [oneDNN beside another OpenMP user]
# When libgomp.so.1 is already in the process as libdnnl loads — torch imported first
# brings its own copy under that soname, and the loader hands it to libdnnl — its wait
# policy was read from the environment when it loaded, before cuvmap could set PASSIVE:
# by default each idle worker spins for GOMP_SPINCOUNT polls (milliseconds) after
# every parallel region, torch's and oneDNN's alike, and GNU OpenMP has no call that
# changes the policy afterwards. A spinning worker holds a core: on two cores, whatever
# else runs multi-threaded then (OpenBLAS's second thread, cuvmap's own workers) waits for
# time slices. Torch thrives on it, since its next region finds the team awake.
# So cuvmap joins the team, as oneDNN does inside torch: its convolutions run on the
# calling thread's OpenMP team (the "openmp" mode; the spinning worker takes the next
# region at once), and cuvmap keeps OpenBLAS's second thread off the spinning cores:
# within the spin window after cuvmap's last region (team_spinning(): region_ended()
# stamps it, spin_seconds() estimates the window from the policy and GOMP_SPINCOUNT with
# margin, inf under ACTIVE) a GEMM asks OpenBLAS for one thread (threads.gemm_limit), and
# the unfold kernels' GEMMs always do (threads.beside_team). OpenBLAS's pool is never shut
# down in this state (threads.quiet_blas_pool): setting its thread count after a shutdown
# starts a pool whose new workers spin for a tenth of a second; with the pool kept, the
# count's 2 → 1 → 2 costs two ctypes calls and starts nothing. One thread or two give
# the same bits (OpenBLAS's threads split a GEMM's rows and columns, not its sums), so
# the window's timing never shows in a result. A GEMM-only program (no
# convolution, no region) keeps OpenBLAS's threads, and so does a process with other
# Python threads (OpenBLAS's count is process-wide: threads.sole_python_thread). On the
# benchmark CNN with torch's calls interleaved, this took eager vmap(grad) and the
# batched gradient from well behind torch's to level with them (`python -m benchmarks
# per_example --torch-first`); the earlier "threads" mode below ran its chunks beside
# the workers that spun after every torch call.
# The "threads" mode stays as a choice (CUVMAP_ONEDNN_THREADING=threads or
# set_threading()): each convolution is split into contiguous chunks — of the examples
# N, or of the groups when N = 1 (the per-example weight gradient's groups·B) — one per
# thread that OpenMP would have used (omp_get_max_threads() of the calling thread), run
# at once on cuvmap's own worker threads, each of which has set omp_set_num_threads(1)
# for itself, so that oneDNN runs them without a parallel region (a weight gradient over
# several chunks of N sums their partial gradients). The other threads' OpenMP settings
# (torch's included) are never changed. Where the user set OMP_WAIT_POLICY or
# GOMP_SPINCOUNT their policy is the one in force and spin_seconds() reads it the same
# way; where cuvmap loaded libgomp itself (PASSIVE) nothing spins and none of this
# applies. Plans are keyed on the creating thread's OpenMP thread count too, since oneDNN
# sizes a primitive's work split and scratchpad for the threads it is made with.
# `python -m benchmarks per_example --torch-first` measures it.
_THREADING = ("openmp", "threads")


def _default_threading(mode):
    if _settings["threading"] is None:
        env = config.from_environment("CUVMAP_ONEDNN_THREADING", "")
        _settings["threading"] = _validate_threading(env, "CUVMAP_ONEDNN_THREADING") if env else mode


def _validate_threading(mode, source):
    if mode not in _THREADING:
        raise ValueError(f"oneDNN threading must be one of {', '.join(_THREADING)}; {source} is {mode!r}")
    return mode


def set_threading(mode):
    """How oneDNN's convolutions use threads: ``"openmp"`` (oneDNN's own OpenMP team) or
    ``"threads"`` (chunks on cuvmap's threads, OpenMP single-threaded in each: NOTE [oneDNN
    beside another OpenMP user]). Returns the previous mode (None before libdnnl loads)."""
    previous = _settings["threading"]
    _settings["threading"] = _validate_threading(mode, "set_threading's argument")
    return previous


def mode():
    """The threading mode in force once libdnnl has loaded (``"openmp"`` before)."""
    return _settings["threading"] or "openmp"


def settings_description():
    """What :func:`prepare_environment` did, as ``"OMP_WAIT_POLICY=..."`` (for describe())."""
    return ", ".join(f"{k}={v}" for k, v in _thread_settings.items())


def bind(lib):
    """omp_get_max_threads and omp_set_num_threads of the libgomp libdnnl uses (found
    through libdnnl's dependencies); without them only the "openmp" mode runs."""
    try:
        get, set_ = lib.omp_get_max_threads, lib.omp_set_num_threads
    except AttributeError:
        _settings["threading"] = "openmp"
        return
    get.argtypes, get.restype = [], ctypes.c_int
    set_.argtypes, set_.restype = [ctypes.c_int], None
    _omp.update(get=get, set=set_)


def functions():
    """``(omp_get_max_threads, omp_set_num_threads)`` of the libgomp libdnnl uses (the
    calling thread's count), ``(None, None)`` where not found or libdnnl is not loaded."""
    return _omp.get("get"), _omp.get("set")


class Workers:
    """cuvmap's worker threads for the "threads" mode, each with OpenMP single-threaded
    (omp_set_num_threads(1) in the thread itself)."""

    def __init__(self):
        self.pool = None
        self.size = 0
        self.pid = None

    def get(self, size):
        with _lock:
            forked = self.pid != os.getpid()     # a fork's child has none of the parent's threads
            if self.pool is None or self.size < size or forked:
                import concurrent.futures

                old = None if forked else self.pool
                self.pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=size, thread_name_prefix="cuvmap-onednn", initializer=_omp["set"],
                    initargs=(1,))
                self.size = size
                self.pid = os.getpid()
                if old is not None:
                    old.shutdown(wait=False)
            return self.pool


workers = Workers()


def split_parts():
    """How many chunks a call runs as (1: oneDNN's own OpenMP team runs it whole)."""
    if _settings["threading"] != "threads" or not _omp:
        return 1
    return max(1, int(_omp["get"]()))

