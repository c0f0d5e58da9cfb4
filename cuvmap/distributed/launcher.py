"""What the launcher says about this process, and how to start a job of several.

A launcher (``mpiexec``/``mpirun`` of MPICH, Intel MPI or Open MPI, or Slurm's ``srun
--mpi=pmi2``) starts ``n`` copies of a program and tells each, in its environment, how
many there are and which one it is: MPICH's Hydra and PMI-based launchers set
``PMI_SIZE``/``PMI_RANK`` (and ``MPI_LOCALRANKID``/``MPI_LOCALNRANKS`` for the processes on
one host), Open MPI sets ``OMPI_COMM_WORLD_SIZE``/``OMPI_COMM_WORLD_RANK`` (and
``..._LOCAL_RANK``/``..._LOCAL_SIZE``). :func:`detect` reads them; without any, the process is
a job of one.
"""
import os
import shutil
import subprocess
import sys

# (launcher, size, rank, local rank, local size) variables, the first present wins
_LAUNCHERS = (
    ("Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI (MPICH, Intel MPI, srun --mpi=pmi2)", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


class LaunchInfo:
    """This process's place in its job: ``size`` processes, this one ``rank``; on its host
    ``local_size`` of them, this one ``local_rank`` (which picks its GPU); ``launcher``
    names the environment it came from (``None``: no launcher, a job of one)."""

    __slots__ = ("size", "rank", "local_rank", "local_size", "launcher")

    def __init__(self, size=1, rank=0, local_rank=0, local_size=1, launcher=None):
        self.size, self.rank, self.local_rank, self.local_size, self.launcher = size, rank, local_rank, local_size, launcher

    def __repr__(self):
        return (f"LaunchInfo(size={self.size}, rank={self.rank}, local_rank={self.local_rank}, "
                f"local_size={self.local_size}, launcher={self.launcher!r})")


def _int(environ, name, default, launcher):
    text = environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise RuntimeError(f"cuvmap.distributed: the launcher's variable {name}={text!r} ({launcher}) is not an "
                           "integer") from None


def detect(environ=None):
    """The :class:`LaunchInfo` of this process, from the launcher's environment variables
    (``environ``: ``os.environ`` by default); a job of one without a launcher."""
    environ = os.environ if environ is None else environ
    for launcher, size_var, rank_var, local_rank_var, local_size_var in _LAUNCHERS:
        if size_var in environ:
            size = _int(environ, size_var, 1, launcher)
            rank = _int(environ, rank_var, 0, launcher)
            local_size = _int(environ, local_size_var, size, launcher)
            local_rank = _int(environ, local_rank_var, rank if local_size == size else 0, launcher)
            if not (size >= 1 and 0 <= rank < size and 0 <= local_rank < max(local_size, 1)):
                raise RuntimeError(f"cuvmap.distributed: the launcher's environment ({launcher}) says rank {rank} of "
                                   f"{size} (local {local_rank} of {local_size}), which is not a place in a job")
            return LaunchInfo(size, rank, local_rank, local_size, launcher)
    return LaunchInfo()


def find_mpiexec():
    """The ``mpiexec`` to start jobs with: the one next to the running Python (a virtual
    environment's ``bin/``, where the ``mpich`` wheel puts it), else the first on ``PATH``;
    ``None`` when there is none."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def launch(num_processes, argv, *, mpiexec=None, env=None, timeout=None, **run_kwargs):
    """Runs ``python argv...`` as a job of ``num_processes`` processes under ``mpiexec``
    and waits for it.

    Args:
      num_processes: the number of processes (≥ 1).
      argv: the script and its arguments, as after ``python`` on a command line.
      mpiexec: the launcher to use (default :func:`find_mpiexec`).
      env: the processes' environment (default this one's).
      timeout: seconds before the job is killed (``subprocess.TimeoutExpired``).
      run_kwargs: passed to ``subprocess.run`` (``capture_output=True``, ``text=True``, ...).
    Returns:
      the ``subprocess.CompletedProcess`` (its ``returncode`` is non-zero when a process
      failed).

    Example::

        launch(2, ["examples/dp_sgd_digits.py", "--epochs", "1"]).check_returncode()
    """
    if not (isinstance(num_processes, int) and num_processes >= 1):
        raise ValueError(f"launch: num_processes must be a positive int, got {num_processes!r}")
    mpiexec = mpiexec or find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("launch: no mpiexec next to this Python or on PATH; install one with "
                           "pip install 'cuvmap[distributed]' (mpi4py and the mpich wheel)")
    command = [mpiexec, "-n", str(num_processes), sys.executable, *argv]
    return subprocess.run(command, env=env, timeout=timeout, **run_kwargs)
