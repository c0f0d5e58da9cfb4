"""What the launcher says about this process, and how to start a job of several.

A launcher starts ``n`` copies of a program and tells each, in its environment, how many
there are and which one it is (NOTE [launchers]). :func:`detect` reads them; without any,
the process is a job of one.

NOTE [launchers]
Three families, read in this order (the first present wins):

- MPI: ``mpiexec``/``mpirun`` of MPICH and Intel MPI (and ``srun --mpi=pmi2``) set
  ``PMI_SIZE``/``PMI_RANK`` (``MPI_LOCALRANKID``/``MPI_LOCALNRANKS`` on one host); Open
  MPI sets ``OMPI_COMM_WORLD_SIZE``/``..._RANK`` (``..._LOCAL_RANK``/``..._LOCAL_SIZE``).
  Read first: inside a Slurm allocation ``mpiexec`` describes the job it started, while
  the allocation's ``SLURM_*`` variables describe the allocation.
- Slurm's ``srun``: ``SLURM_PROCID`` (this task), ``SLURM_STEP_NUM_TASKS`` (else
  ``SLURM_NTASKS``), ``SLURM_LOCALID`` and, for the tasks on this node,
  ``SLURM_STEP_TASKS_PER_NODE`` (else ``SLURM_TASKS_PER_NODE``) at index ``SLURM_NODEID``, in
  Slurm's compressed form ``2(x3),1`` (= 2, 2, 2, 1). Only ``srun`` sets ``SLURM_PROCID``
  (``salloc``/``sbatch`` do not), so a batch script's own process is not taken for a task.
  The processes still talk through MPI (``srun --mpi=pmix`` or ``pmi2``: mpi4py's
  ``COMM_WORLD`` must have the tasks' size, which ``initialize`` checks).
- torchrun-style: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT`` (``torchrun``, and any launcher that imitates it). There
  is no MPI: the processes meet at ``MASTER_ADDR:MASTER_PORT`` (a TCP store that process 0
  serves, CuPy's ``cupyx.distributed`` store), which carries NCCL's unique id; the
  collectives are NCCL's, so this form needs CuPy with NCCL and a GPU per process
  (:func:`cuvmap.distributed.initialize` says so otherwise; the CPU engine is MPI's).
"""
import os
import re
import shutil
import subprocess
import sys

# (launcher, size, rank, local rank, local size) variables of the MPI launchers
_LAUNCHERS = (
    ("Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI (MPICH, Intel MPI, srun --mpi=pmi2)", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)
SLURM = "Slurm (srun)"
TORCHRUN = "torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"


class LaunchInfo:
    """This process's place in its job: ``size`` processes, this one ``rank``; on its host
    ``local_size`` of them, this one ``local_rank`` (which picks its GPU); ``launcher``
    names the environment it came from (``None``: no launcher, a job of one);
    ``rendezvous`` is ``(host, port)`` where a torchrun-style job's processes meet
    (``None`` for the MPI and Slurm launchers, whose processes meet through MPI)."""

    __slots__ = ("size", "rank", "local_rank", "local_size", "launcher", "rendezvous")

    def __init__(self, size=1, rank=0, local_rank=0, local_size=1, launcher=None, rendezvous=None):
        self.size, self.rank, self.local_rank, self.local_size, self.launcher = size, rank, local_rank, local_size, launcher
        self.rendezvous = rendezvous

    @property
    def uses_mpi(self):
        """Whether the processes talk through MPI (every launcher but the torchrun-style one)."""
        return self.launcher is not None and self.launcher != TORCHRUN

    def __repr__(self):
        where = f", rendezvous={self.rendezvous!r}" if self.rendezvous else ""
        return (f"LaunchInfo(size={self.size}, rank={self.rank}, local_rank={self.local_rank}, "
                f"local_size={self.local_size}, launcher={self.launcher!r}{where})")


def _int(environ, name, default, launcher):
    text = environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise RuntimeError(f"cuvmap.distributed: the launcher's variable {name}={text!r} ({launcher}) is not an "
                           "integer") from None


def slurm_tasks_per_node(text):
    """Slurm's compressed list of tasks per node, ``"2(x3),1"`` → ``[2, 2, 2, 1]``."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise RuntimeError(f"cuvmap.distributed: Slurm's tasks per node {text!r} is not in Slurm's form "
                               "(such as '2(x3),1')")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _slurm(environ):
    size = _int(environ, "SLURM_STEP_NUM_TASKS", None, SLURM)
    size = _int(environ, "SLURM_NTASKS", 1, SLURM) if size is None else size
    rank = _int(environ, "SLURM_PROCID", 0, SLURM)
    local_rank = _int(environ, "SLURM_LOCALID", 0, SLURM)
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    local_size = size
    if per_node:
        counts = slurm_tasks_per_node(per_node)
        node = _int(environ, "SLURM_NODEID", 0, SLURM)
        local_size = counts[node] if 0 <= node < len(counts) else counts[0]
    return size, rank, local_rank, local_size


def _torchrun(environ):
    size = _int(environ, "WORLD_SIZE", 1, TORCHRUN)
    rank = _int(environ, "RANK", 0, TORCHRUN)
    local_size = _int(environ, "LOCAL_WORLD_SIZE", size, TORCHRUN)
    local_rank = _int(environ, "LOCAL_RANK", rank if local_size == size else 0, TORCHRUN)
    host = (environ.get("MASTER_ADDR") or "").strip()
    port = _int(environ, "MASTER_PORT", None, TORCHRUN)
    if size > 1 and (not host or port is None):
        raise RuntimeError(f"cuvmap.distributed: a torchrun-style job of {size} processes (RANK={rank}, "
                           f"WORLD_SIZE={size}) needs MASTER_ADDR and MASTER_PORT, where its processes meet; "
                           f"got MASTER_ADDR={environ.get('MASTER_ADDR')!r}, MASTER_PORT={environ.get('MASTER_PORT')!r}")
    return size, rank, local_rank, local_size, (host or "127.0.0.1", port)


def detect(environ=None):
    """The :class:`LaunchInfo` of this process, from the launcher's environment variables
    (``environ``: ``os.environ`` by default; NOTE [launchers]); a job of one without a launcher."""
    environ = os.environ if environ is None else environ
    found = None
    for launcher, size_var, rank_var, local_rank_var, local_size_var in _LAUNCHERS:
        if size_var in environ:
            size = _int(environ, size_var, 1, launcher)
            rank = _int(environ, rank_var, 0, launcher)
            local_size = _int(environ, local_size_var, size, launcher)
            local_rank = _int(environ, local_rank_var, rank if local_size == size else 0, launcher)
            found = launcher, (size, rank, local_rank, local_size), None
            break
    else:
        if "SLURM_PROCID" in environ:
            found = SLURM, _slurm(environ), None
        elif "WORLD_SIZE" in environ and "RANK" in environ:
            *place, rendezvous = _torchrun(environ)
            found = TORCHRUN, tuple(place), rendezvous
    if found is None:
        return LaunchInfo()
    launcher, (size, rank, local_rank, local_size), rendezvous = found
    if not (size >= 1 and 0 <= rank < size and 0 <= local_rank < max(local_size, 1)):
        raise RuntimeError(f"cuvmap.distributed: the launcher's environment ({launcher}) says rank {rank} of "
                           f"{size} (local {local_rank} of {local_size}), which is not a place in a job")
    return LaunchInfo(size, rank, local_rank, local_size, launcher, rendezvous)


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
