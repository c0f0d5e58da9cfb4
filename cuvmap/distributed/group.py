"""Process groups, ``initialize`` and ``data_parallel``: see :mod:`cuvmap.distributed`."""
import os
import sys
import time

import numpy as np

from cuvmap import api_util, backend, config, core, measured_choices
from cuvmap.distributed import check as check_mod
from cuvmap.distributed import engine as engine_mod
from cuvmap.distributed import launcher as launch_mod
from cuvmap.distributed import mpi as _mpi  # noqa: F401 - registers the "cpu" engine
from cuvmap.distributed import nccl as _nccl  # noqa: F401 - registers the "gpu" engine
from cuvmap.distributed import threads as threads_mod
from cuvmap.distributed import watchdog as watchdog_mod
from cuvmap.distributed.engine import DistributedError  # noqa: F401 - re-exported (it lived here)
from cuvmap.distributed.engine import LocalBootstrap, MPIBootstrap

_ABORT_GRACE_SECONDS = 0.5
_REDUCERS = {"sum": "psum", "max": "pmax", "min": "pmin"}


class ProcessGroup:
    """The processes of a job, ``size`` of them, this one ``rank`` (``local_rank`` on its
    host), and the engines of their collectives, one per array kind (NOTE [engines] in
    :mod:`cuvmap.distributed.engine`: MPI for NumPy arrays, NCCL for CuPy arrays). Bound
    to an axis name by :func:`data_parallel`; the collectives of :mod:`cuvmap.lax.parallel`
    over that name call its methods (``allreduce``, ``allgather``, ``reduce_scatter``,
    ``alltoall``, ``permute``), each checked first (NOTE [the collective check] in
    :mod:`cuvmap.distributed.check`) and timed by the group's watchdog (NOTE [a job ends
    when one process fails]).

    Made by :func:`initialize`; ``ProcessGroup(comm)`` wraps an ``mpi4py`` communicator of
    your own (a sub-communicator of ``COMM_WORLD``, say), ``ProcessGroup()`` is a job of one.
    ``engines`` (``{"cpu": engine, ...}``) gives engines of your own instead of the
    registered ones (the group's rank and size are then the ``"cpu"`` engine's when there
    is no ``comm``); ``bootstrap`` (:class:`~cuvmap.distributed.engine.Bootstrap`) how the
    processes agree before an engine starts (default: ``comm``'s broadcast).
    """

    def __init__(self, comm=None, *, local_rank=0, timeout=None, launcher=None, engines=None, bootstrap=None):
        self.comm = comm
        self._engines = dict(engines or {})
        if comm is not None:
            self.rank, self.size = comm.Get_rank(), comm.Get_size()
        elif "cpu" in self._engines:
            self.rank, self.size = self._engines["cpu"].rank, self._engines["cpu"].size
        else:
            self.rank, self.size = 0, 1
        self.local_rank = local_rank
        self.launcher = launcher
        if bootstrap is None:
            bootstrap = MPIBootstrap(comm) if comm is not None else LocalBootstrap() if self.size == 1 else None
        self.bootstrap = bootstrap
        self.timeout = watchdog_mod.default_timeout() if timeout is None else float(timeout)
        self.watchdog = None
        self.check = None
        self._depth = 0  # data_parallel calls in progress (nested ones count once)
        if self.size > 1:
            self.watchdog = watchdog_mod.Watchdog(self.timeout, self._timed_out, describe=f"{self.describe()}: ")
            shared = self._agree_on_settings()  # (after the watchdog: the engine it makes is timed by it)
            self.check = check_mod.CollectiveCheck(self._engine("cpu"), self.rank, self.size, self.describe(),
                                                   self.watchdog, shared)

    # NOTE [settings every process shares]
    # The collective check pairs its small all-reduce with the other processes' check: a
    # process that checks while another does not pairs its check with the other's
    # collective (its own input comes back as the "sum", and the other waits out the
    # timeout); processes with different collective timeouts report a hang at different
    # times. So a group agrees on both when it is made (initialize makes it), in one
    # all-reduce of [check, -check, timeout, -timeout] (max), and refuses a disagreement
    # there, on every process, naming each one's values. A later config.update must be made
    # on every process alike (the benchmark that measures the check does so). The same
    # exchange carries process 0's count of measured choices, from which on they are shared
    # (NOTE [one choice for every process] in cuvmap/measured_choices.py).
    def _agree_on_settings(self):
        """Returns process 0's count of measured choices (the same on every process)."""
        mine = [1.0 if config.read("collective_check") else 0.0, float(self.timeout)]
        want = [mine[0], -mine[0], mine[1], -mine[1]]
        measured = float(measured_choices.measured_count()) if self.rank == 0 else 0.0
        engine = self._engine("cpu")
        out = engine.allreduce(np.array(want + [measured], np.float64), "max", in_place=True).tolist()
        if out[:4] == want:
            return int(out[4])
        rows = engine.allgather(np.array(mine, np.float64))
        each = ", ".join(f"process {r} has the check {'on' if rows[r][0] else 'off'} and a timeout of "
                         f"{rows[r][1]:g} s" for r in range(self.size))
        raise DistributedError(
            f"{self.describe()}: the processes of the job disagree about the collective check or the collective "
            f"timeout: {each}. Set CUVMAP_COLLECTIVE_CHECK and CUVMAP_COLLECTIVE_TIMEOUT (or initialize(timeout=)) "
            "alike on every process (NOTE [settings every process shares] in cuvmap/distributed/group.py)")

    def describe(self):
        return f"process {self.rank} of {self.size}"

    def __repr__(self):
        engines = ", ".join(f"{k}: {type(e).__name__}" for k, e in sorted(self._engines.items())) or "no engine yet"
        return f"ProcessGroup(rank={self.rank}, size={self.size}, {engines})"

    def _engine(self, kind):
        engine = self._engines.get(kind)
        if engine is None:
            engine = self._engines[kind] = engine_mod.engine_factory(kind)(self)
        return engine

    def engine(self, x):
        """The engine for operand ``x``: the one registered for its array kind (NCCL for a
        CuPy array, MPI, or the job of one's, for anything else), made on first use."""
        return self._engine(engine_mod.array_kind(x))

    def _checked(self, primitive, axis_name, x, extra=None):
        """The collective check before a collective on ``x`` (NOTE [the collective check])."""
        check = self.check
        if check is not None:
            if config.read("collective_check"):
                check(primitive, axis_name, x.dtype, x.shape, extra)
            else:
                check.note(primitive, axis_name, x.dtype, x.shape, extra)

    # the Communicator protocol (cuvmap.distributed.engine) that a ProcessAxis of
    # cuvmap.lax.process_axes holds; axis_name names the collective's axis in the messages
    def allreduce(self, x, op="sum", in_place=False, *, axis_name=None, leaves=None):
        self._checked(_REDUCERS.get(op, op), axis_name, x, leaves)
        return self.engine(x).allreduce(x, op, in_place)

    def allgather(self, x, *, axis_name=None):
        self._checked("all_gather", axis_name, x)
        return self.engine(x).allgather(x)

    def reduce_scatter(self, x, *, axis_name=None):
        self._checked("psum_scatter", axis_name, x)
        return self.engine(x).reduce_scatter(x)

    def alltoall(self, x, *, axis_name=None):
        self._checked("all_to_all", axis_name, x)
        return self.engine(x).alltoall(x)

    def permute(self, x, perm, *, axis_name=None):
        self._checked("ppermute", axis_name, x, tuple(tuple(p) for p in perm))
        return self.engine(x).permute(x, perm)

    def step(self, number):
        """Marks the start of step ``number`` of this process's loop: the collective check
        compares it at the next collective (NOTE [the collective check]), so that a
        process that skipped a step is named there. :func:`cuvmap.distributed.step`."""
        if isinstance(number, bool) or not isinstance(number, (int, np.integer)) or number < 0:
            raise ValueError(f"distributed.step: the step number must be an int >= 0 (the loop's index), got "
                             f"{number!r}")
        if self.check is not None:
            self.check.marker = int(number)

    def begin_call(self):
        """A call of a ``data_parallel`` function begins (the outermost one of a nest): the
        collective check counts them (NOTE [the collective check])."""
        self._depth += 1
        if self._depth == 1 and self.check is not None:
            self.check.calls += 1

    def end_call(self):
        self._depth -= 1

    def barrier(self):
        """Waits until every process of the group has called it."""
        check = self.check
        if check is not None and config.read("collective_check"):
            check("barrier")
        self._engine("cpu").barrier()

    def end(self):
        """The end of this process's program (the exit hook calls it): with the collective
        check on, returns once every process of the group has ended, and raises
        :class:`~cuvmap.distributed.check.CollectiveMismatchError` when another waits in a
        collective instead; without it, returns at once."""
        if self.check is not None and config.read("collective_check"):
            self.check.end()

    def abort(self, code=1):
        """Ends every process of the job now (``MPI_Abort``), with exit status ``code``."""
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            # the launcher forwards a process's output asynchronously: a moment for it to
            # pass on the report before the abort ends the job
            time.sleep(_ABORT_GRACE_SECONDS)
            gpu = self._engines.get("gpu")
            if gpu is not None:
                gpu.abort(code)
        finally:
            try:
                if self.comm is not None:
                    self.comm.Abort(code)
            finally:
                os._exit(code)

    def _timed_out(self, message):
        sys.stderr.write(message + "\n")
        self.abort(1)


_group = None


def initialize(*, timeout=None):
    """Joins this process to its job and returns the job's :class:`ProcessGroup` (made on
    the first call; later calls return it).

    Reads the launcher's environment (:func:`cuvmap.distributed.launcher.detect`, NOTE
    [launchers]: MPICH's and Intel MPI's ``PMI_*``, Open MPI's ``OMPI_COMM_WORLD_*``,
    Slurm's ``SLURM_*`` under ``srun``, torchrun's ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
    ``MASTER_PORT``). Without a launcher the job is this one process and needs no MPI;
    under an MPI launcher or ``srun`` it joins ``mpi4py``'s ``COMM_WORLD`` and checks that
    it has the launcher's size; under a torchrun-style one (no MPI) the processes meet at
    ``MASTER_ADDR:MASTER_PORT`` and talk through NCCL (NOTE [the TCP rendezvous] in
    :mod:`cuvmap.distributed.rendezvous`: CuPy and a GPU per process). In a job of several it
    installs the guards of NOTE [a job ends when one process fails] (an uncaught exception
    or ``sys.exit(n)`` aborts the job; a process that ends while another waits in a
    collective is reported on both at once; a collective that waits longer than
    ``timeout`` seconds aborts it),
    shares this machine's cores between the job's processes on it unless the user chose
    thread counts (:func:`cuvmap.distributed.threads.share_cores`) and, when CuPy sees
    GPUs, makes GPU ``local_rank % count`` this process's device.

    Args:
      timeout: seconds a collective may wait for the other processes (default
        ``CUVMAP_COLLECTIVE_TIMEOUT``, else 600).
    Returns:
      the :class:`ProcessGroup`.

    Example::

        group = cuvmap.distributed.initialize()
        print(f"process {group.rank} of {group.size}")
    """
    global _group
    if _group is not None:
        return _group
    info = launch_mod.detect()
    if info.launcher is None:
        _group = ProcessGroup(timeout=timeout)
        return _group
    if not info.uses_mpi:
        _group = _initialize_without_mpi(info, timeout)
        return _group
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise DistributedError(
            f"this is process {info.rank} of {info.size} of a job started by {info.launcher}, but mpi4py is not "
            "installed: pip install 'cuvmap[distributed]' (mpi4py and the mpich wheel, whose mpiexec to use)") from err
    comm = MPI.COMM_WORLD
    if comm.Get_size() != info.size and info.launcher == launch_mod.SLURM:
        raise DistributedError(
            f"srun started {info.size} tasks, but mpi4py's MPI sees {comm.Get_size()}: MPI did not join srun's tasks "
            "into one job. Start them with srun --mpi=pmix (or --mpi=pmi2, as your cluster's MPI supports), or use "
            "mpiexec inside the allocation")
    if comm.Get_size() != info.size:
        raise DistributedError(
            f"the launcher ({info.launcher}) started {info.size} processes, but mpi4py's MPI sees "
            f"{comm.Get_size()}: mpiexec comes from another MPI than the one mpi4py is built with (use the "
            f"mpiexec next to this Python: {launch_mod.find_mpiexec()})")
    group = ProcessGroup(comm, local_rank=info.local_rank, timeout=timeout, launcher=info.launcher)
    if group.size > 1:
        watchdog_mod.install_excepthook(group.describe(), group.abort)
        watchdog_mod.install_exit_hooks(group.describe(), group.abort, group.end)
    threads_mod.share_cores(info.local_size)
    _select_gpu(info.local_rank)
    _group = group
    return group


def _initialize_without_mpi(info, timeout):
    """A torchrun-style job: the TCP rendezvous at ``MASTER_ADDR:MASTER_PORT``, then NCCL for
    every collective (NOTE [the TCP rendezvous] in :mod:`cuvmap.distributed.rendezvous`)."""
    from cuvmap.distributed import rendezvous  # noqa: PLC0415 - only torchrun-style jobs need it

    if info.size == 1:
        return ProcessGroup(timeout=timeout, launcher=info.launcher)
    if backend.cupy_module() is None or not backend.gpu_available():
        raise DistributedError(
            f"this is process {info.rank} of {info.size} of a {info.launcher} job: such a job meets over TCP and "
            "talks through NCCL, which needs CuPy and a GPU per process, and this process has "
            f"{'no CuPy' if backend.cupy_module() is None else 'no GPU'}. Jobs on the CPU talk through MPI: start "
            "them with mpiexec -n P (or srun under Slurm), after pip install 'cuvmap[distributed]'")
    _select_gpu(info.local_rank)
    bootstrap = rendezvous.StoreBootstrap(info.rank, info.size, *info.rendezvous)
    gpu = _nccl.NCCLEngine(info.rank, info.size, bootstrap)
    group = ProcessGroup(local_rank=info.local_rank, timeout=timeout, launcher=info.launcher, bootstrap=bootstrap,
                         engines={"gpu": gpu, "cpu": rendezvous.HostThroughDevice(gpu)})
    gpu.watchdog = group.watchdog
    watchdog_mod.install_excepthook(group.describe(), group.abort)
    watchdog_mod.install_exit_hooks(group.describe(), group.abort, group.end)
    threads_mod.share_cores(info.local_size)
    return group


def _select_gpu(local_rank):
    cp = backend.cupy_module()
    if cp is not None:
        cp.cuda.Device(local_rank % cp.cuda.runtime.getDeviceCount()).use()


def data_parallel(f, axis_name="batch", *, group=None):
    """``f`` run by every process of a job on its own shard of the data, with
    ``axis_name`` naming the axis of processes: collectives over that name
    (:mod:`cuvmap.lax.parallel`: ``psum``, ``pmean``, ``all_gather``, ...) combine the
    processes' values (an MPI all-reduce of NumPy arrays, a NCCL one of CuPy arrays).

    Each process calls the wrapped function with its own arguments and gets its own
    results, as ordinary arrays; a result that comes out of a ``psum`` is the same on
    every process. ``jit``, ``grad`` and ``vmap`` compose with it inside and outside:
    under ``jit`` the staged collectives all-reduce each time the program runs, and the
    cotangent of a ``psum`` is the ``psum`` of the cotangents (reverse mode differentiates
    the sum of every process's outputs, as ``pmap`` does).

    Args:
      f: the function every process runs.
      axis_name: the name of the axis of processes.
      group: the :class:`ProcessGroup` (default: :func:`initialize`'s).
    Returns:
      the wrapped function.

    Example::

        @cuvmap.distributed.data_parallel
        def step(params, x, y):                   # x, y: this process's shard
            g = cuvmap.grad(loss)(params, x, y)   # loss: the mean over the shard
            return tree.map(lambda p, g: p - 0.1 * g, params, lax.pmean(g, "batch"))
    """
    api_util.check_callable(f, "data_parallel")
    where = f"data_parallel({api_util.fun_name(f)}, axis_name={axis_name!r})"
    if axis_name is None or isinstance(axis_name, tuple):
        raise api_util.TransformError(f"{where}: axis_name must be one name (a string), got {axis_name!r}")

    @api_util.with_context(where, f)
    def wrapped(*args, **kwargs):
        g = group if group is not None else initialize()
        counted = isinstance(g, ProcessGroup)  # (another Communicator has no step count)
        if counted:
            g.begin_call()
        try:
            with core.extend_axis_env(core.AxisFrame(axis_name, g.size, communicator=g)):
                return f(*args, **kwargs)
        finally:
            if counted:
                g.end_call()

    return wrapped


def step(number, *, group=None):
    """Marks the start of step ``number`` of the training loop on this process. The
    collective check (NOTE [the collective check] in :mod:`cuvmap.distributed.check`)
    compares the step every process last marked at their next collective, so a process
    that skipped a step (a ``continue`` on its own data, before calling the step
    function) is named there, with both step numbers, instead of having its collectives
    paired with the others' previous step until the end of the job. Call it at the top of
    the loop, before anything that may skip; a job of one ignores it.

    Args:
      number: the step's index (an int ≥ 0), the same on every process for the same step.
      group: the :class:`ProcessGroup` (default: :func:`initialize`'s).

    Example::

        for i in range(steps):
            cuvmap.distributed.step(i)
            x, y = next_batch()
            if len(y) == 0:
                continue          # every process must skip the same steps: the next collective says so
            params = train_step(params, x, y)
    """
    (group if group is not None else initialize()).step(number)
