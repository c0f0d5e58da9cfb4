"""Several processes of a job on one machine share its cores.

NumPy's BLAS and oneDNN's OpenMP each start one thread per core by default, so ``k``
processes on one machine run ``k`` times as many threads as there are cores, and each
process's BLAS threads spin and wait for cores that the others hold. On a 2-core machine
the main job's DP-SGD step took about ten times longer on 2 processes than with one
thread per process (``python -m benchmarks distributed --threads-per-process split``
measures it). So when a job has several processes on this machine and the user has
chosen no thread count, :func:`share_cores` gives each process ``cores // local size``
threads, as torchrun sets ``OMP_NUM_THREADS=1`` for its workers.
"""
import ctypes
import os

# a user who set any of these chose the thread counts: they are left alone
USER_SETTINGS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")

_setting = None


def _available_cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _loaded_libraries(fragment):
    """The shared libraries whose path contains ``fragment`` that this process has loaded
    (Linux: /proc/self/maps; elsewhere none)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if fragment in line and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if ".so" in p)


def _call_first(paths, names, *args):
    """Calls the first function of ``names`` found in the libraries at ``paths``; returns
    its result, or None when none has one."""
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return fn(*(ctypes.c_int(a) for a in args))
    return None


def blas_threads():
    """The threads of the OpenBLAS that NumPy loaded, or None where it cannot tell."""
    return _call_first(_loaded_libraries("openblas"), _GETTERS)


def share_cores(local_size):
    """Gives this process ``cores // local_size`` BLAS and OpenMP threads (at least one)
    when ``local_size`` processes of the job run on this machine and the user set none of
    :data:`USER_SETTINGS`; once per process. Returns :func:`setting`."""
    global _setting
    if _setting is not None:
        return _setting
    user = [k for k in USER_SETTINGS if k in os.environ]
    if local_size <= 1:
        _setting = "unchanged (one process on this machine)"
    elif user:
        _setting = f"the user's ({', '.join(user)} set)"
    else:
        n = max(1, _available_cores() // local_size)
        # OpenMP libraries loaded later (oneDNN's libgomp, at the first convolution) read it
        os.environ["OMP_NUM_THREADS"] = str(n)
        _call_first(_loaded_libraries("openblas"), _SETTERS, n)
        _call_first(_loaded_libraries("libgomp"), ("omp_set_num_threads",), n)
        _setting = f"{n} thread(s) per process ({local_size} processes on {_available_cores()} cores)"
    return _setting


def setting():
    """What :func:`share_cores` did (a sentence), or None before a job of processes."""
    return _setting
