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
from cuvmap import config

_lock = threading.Lock()
_settings = {"threading": None}   # "openmp" or "threads" (NOTE [oneDNN beside another OpenMP user])
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
# So cuvmap loads libdnnl (whose libgomp reads its environment once, when it loads) with
# OMP_WAIT_POLICY=PASSIVE, and restores the environment right after, so that neither the
# user's subprocesses nor other libraries see the change. It does nothing when the user set
# OMP_WAIT_POLICY or GOMP_SPINCOUNT (theirs wins), or when libgomp.so.1 is already loaded
# (its settings are fixed then: NOTE [oneDNN beside another OpenMP user] says what cuvmap
# does instead). onednn.describe() says which applied.


def prepare_environment():
    """The environment variables to set while libdnnl loads (NOTE [OpenMP threads beside
    OpenBLAS]), and the threading mode (NOTE [oneDNN beside another OpenMP user])."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        _thread_settings["OMP_WAIT_POLICY"] = f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')} (the user's)"
        _default_threading("openmp")
        return {}
    if _libgomp_loaded():
        _thread_settings["OMP_WAIT_POLICY"] = "(libgomp.so.1 was already loaded: its own setting)"
        _default_threading("threads")
        return {}
    _thread_settings["OMP_WAIT_POLICY"] = "PASSIVE (set by cuvmap while libdnnl loaded)"
    _default_threading("openmp")
    return {"OMP_WAIT_POLICY": "PASSIVE"}


# NOTE [oneDNN beside another OpenMP user]
# When libgomp.so.1 is already in the process as libdnnl loads — torch imported first
# brings its own copy under that soname, and the loader hands it to libdnnl — its wait
# policy was read from the environment when it loaded, before cuvmap could set PASSIVE:
# by default its threads spin at every barrier and after every parallel region. GNU
# OpenMP has no call that changes the policy afterwards (omp_set_dynamic and the thread
# counts do not touch it; GOMP_SPINCOUNT is read once), so cuvmap's own calls stop using
# OpenMP's thread team instead: in the "threads" mode each convolution is split into
# contiguous chunks — of the examples N, or of the groups when N = 1 (the per-example
# weight gradient's groups·B) — one per thread that OpenMP would have used
# (omp_get_max_threads() of the calling thread: OMP_NUM_THREADS, torch.set_num_threads),
# and the chunks run at once on cuvmap's own worker threads, each of which has set
# omp_set_num_threads(1) for itself, so that oneDNN runs them without a parallel region:
# no OpenMP thread of anyone's spins for cuvmap, and the caller waits on a condition
# variable. A weight gradient over several chunks of N sums their partial gradients.
# The other threads' OpenMP settings (torch's included) are never changed. The mode is
# "threads" only where libgomp was loaded first and the user set neither OMP_WAIT_POLICY
# nor GOMP_SPINCOUNT (their policy wins: OpenMP runs as they asked); it is "openmp" where
# cuvmap loaded libgomp itself (PASSIVE). CUVMAP_ONEDNN_THREADING=openmp|threads or
# set_threading() chooses it. Plans are keyed on the creating thread's OpenMP thread count
# too, since oneDNN sizes a primitive's work split and scratchpad for the threads it is
# made with. `python -m benchmarks per_example --torch-first` measures the mode.
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

