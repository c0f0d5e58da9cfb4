"""More than one process: data parallelism through a named axis that spans processes.

    mpiexec -n 2 python train.py           # or: python train.py (a job of one)

::

    import cuvmap as cv
    from cuvmap import distributed, lax

    group = distributed.initialize()        # reads the launcher's environment

    @distributed.data_parallel             # axis_name="batch": the axis of processes
    @cv.jit
    def step(params, x, y):                 # x, y: this process's shard of the batch
        g = cv.grad(loss)(params, x, y)
        return cv.tree.map(lambda p, g: p - lr * g, params, lax.pmean(g, "batch"))

Every process runs the same program on its own shard, as ordinary NumPy or CuPy arrays;
the collectives of :mod:`cuvmap.lax.parallel` over the axis name combine them: MPI
(mpi4py) all-reduces NumPy arrays on the CPU, NCCL (through CuPy) CuPy arrays on GPUs, one
process per GPU, chosen by the operands' device. There is no transport of cuvmap's own.

Why ``data_parallel(f, axis_name)`` and not ``shard_map``: ``shard_map(f, mesh, in_specs,
out_specs)`` is written against *global* arrays, which it splits along a mesh and joins
again; a process of an MPI job never holds a global array, only its shard (its Poisson
sample of the data, its part of the dataset), and the typical results of data
parallelism (an all-reduced gradient, the updated parameters) are already the same
everywhere. So the wrapper is ``pmap``'s multi-process form, as torch's DDP and JAX's
multi-controller programs are written: it binds the name for as long as ``f`` runs and
changes no argument or result. Its axis is a named axis like ``vmap``'s
(NOTE [named axes] in :mod:`cuvmap.core`), so one program runs under ``vmap(f,
axis_name="batch")`` in one process (as the tests do) and under ``data_parallel(f)``
across processes, with the same results to rounding; ``jit`` stages the collectives as
equations that all-reduce each time the program runs, and ``grad`` transposes them.

- :func:`initialize`, :class:`ProcessGroup`: the job (rank, size, engines, watchdog);
- :mod:`cuvmap.distributed.engine`: the interface to a transport (:class:`Engine`,
  :class:`Bootstrap`, :func:`register_engine`; NOTE [engines]) and the one a group offers
  the collectives (:class:`Communicator`);
- the collective check: every process calls the same collectives in the same order, or
  every process raises :class:`CollectiveMismatchError` (NOTE [the collective check] in
  :mod:`cuvmap.distributed.check`; on by default, ``collective_check`` in
  :mod:`cuvmap.config` turns it off);
- :func:`data_parallel`: the named axis of processes; :func:`step`: marks the loop's
  steps for the collective check;
- :func:`launch`, :func:`find_mpiexec`, :func:`detect`: starting a job and reading the
  launcher's environment (:mod:`cuvmap.distributed.launcher`);
- faults end the job with a non-zero status instead of hanging: an exception,
  ``sys.exit(n)``, a process that ends while others wait in a collective, a collective
  that waits too long (NOTE [a job ends when one process fails] in
  :mod:`cuvmap.distributed.watchdog`).

Install the CPU engine with ``pip install 'cuvmap[distributed]'`` (mpi4py, and on Linux
x86-64 the ``mpich`` wheel, whose ``mpiexec`` lands next to the environment's
``python``); on GPUs NCCL comes with CuPy (``nvidia-nccl-cu12``).
"""
from cuvmap.distributed.check import CollectiveMismatchError  # noqa: F401
from cuvmap.distributed.engine import (Bootstrap, Communicator, DistributedError, Engine, LocalEngine,  # noqa: F401
                                       register_engine)
from cuvmap.distributed.group import ProcessGroup, data_parallel, initialize, step  # noqa: F401
from cuvmap.distributed.launcher import LaunchInfo, detect, find_mpiexec, launch  # noqa: F401
