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
import os

# the ctypes helpers and the user's settings are the CPU thread rule's (cuvmap/cpu/threads.py)
from cuvmap.cpu.threads import USER_SETTINGS, available_cores, blas_threads, call_first, loaded_libraries  # noqa: F401

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")

_setting = None


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
        n = max(1, available_cores() // local_size)
        # OpenMP libraries loaded later (oneDNN's libgomp, at the first convolution) read it
        os.environ["OMP_NUM_THREADS"] = str(n)
        call_first(loaded_libraries("openblas"), _SETTERS, n)
        call_first(loaded_libraries("libgomp"), ("omp_set_num_threads",), n)
        _setting = f"{n} thread(s) per process ({local_size} processes on {available_cores()} cores)"
    return _setting


def setting():
    """What :func:`share_cores` did (a sentence), or None before a job of processes."""
    return _setting
