"""The interface between a process group and a transport: engines, the bootstrap, the registry.

NOTE [engines]
A :class:`~cuvmap.distributed.ProcessGroup` moves no bytes itself: each collective goes to
the *engine* of its operand's array kind (``"cpu"`` for NumPy arrays, ``"gpu"`` for CuPy
arrays, as :func:`cuvmap.backend.backend_name` says), made on the first collective of that
kind by the factory registered for it (:func:`register_engine`):

- ``"cpu"``: :class:`~cuvmap.distributed.mpi.MPIEngine`, MPI through mpi4py's buffer
  interface (:class:`LocalEngine` in a job of one);
- ``"gpu"``: :class:`~cuvmap.distributed.nccl.NCCLEngine`, NCCL through CuPy
  (:class:`LocalEngine` in a job of one without NCCL).

An engine is anything with the methods of :class:`Engine` (a :class:`typing.Protocol`: no
base class to inherit). Every operation of the transport is one method there, so a new
operation touches the protocol, the engines, and the group's method that checks and
forwards it. Starting an engine may need the processes to agree on something first:
NCCL's communicator needs a unique id drawn by one process and given to all. *Who*
carries it is the :class:`Bootstrap`, a separate choice (MPI's broadcast by default,
:class:`MPIBootstrap`; :class:`LocalBootstrap` for a job of one), so an engine never
reaches into another engine's communicator.

Above the engines sits the interface the collectives of :mod:`cuvmap.lax.parallel` call:
:class:`Communicator`, what a :class:`~cuvmap.distributed.ProcessGroup` offers ``lax``
(the same operations, each told the axis name its messages use, and checked across the
processes before its engine runs it). ``lax`` imports nothing from this package (the
floors); a :class:`~cuvmap.lax.process_axes.ProcessAxis` holds any object with these
methods.
"""
from typing import Protocol, runtime_checkable

from cuvmap import backend, core


class DistributedError(core.CuvmapError, RuntimeError):
    """The processes of a job cannot work together as asked (no MPI for a launched job,
    a launcher and an MPI library that disagree, no engine for an array kind)."""


@runtime_checkable
class Engine(Protocol):
    """The collectives of one transport over the ``size`` processes of a group, this one
    ``rank``, on arrays of one kind. Each returns a fresh array (the operand is the
    caller's) unless ``in_place`` says the operand may be overwritten; each blocks, or
    enqueues on the current stream, until every process of the group has called it.

    - ``allreduce(x, op="sum", in_place=False)``: the elementwise ``op`` (``"sum"``,
      ``"max"``, ``"min"``) over processes, shaped like ``x``;
    - ``allgather(x)``: every process's ``x`` stacked, ``(size, *x.shape)``;
    - ``reduce_scatter(x)``: ``x`` of shape ``(size, *rest)``; the sum over processes of
      ``x[rank]``;
    - ``alltoall(x)``: ``x`` of shape ``(size, *rest)``; ``out[c] = x_c[rank]``;
    - ``permute(x, perm)``: ``x`` of the process ``s`` of the pair ``(s, rank)`` of
      ``perm``, zeros when no pair sends here;
    - ``barrier()``: returns when every process has called it;
    - ``abort(code=1)``: ends every process of the job now, with exit status ``code``
      where the transport can pass one (NCCL's ``ncclCommAbort`` cannot: it only stops
      the communicator, and the group's MPI abort then ends the job with ``code``).
    """

    rank: int
    size: int

    def allreduce(self, x, op="sum", in_place=False): ...

    def allgather(self, x): ...

    def reduce_scatter(self, x): ...

    def alltoall(self, x): ...

    def permute(self, x, perm): ...

    def barrier(self): ...

    def abort(self, code=1): ...


@runtime_checkable
class Communicator(Protocol):
    """What a process group offers the collectives of :mod:`cuvmap.lax.parallel`: the
    ``size`` processes of a named axis, this one ``rank``, and the operations of an
    :class:`Engine` on arrays of either backend, each with the keyword ``axis_name`` (the
    name the collective was called with, for messages). The group picks the engine of the
    operand's array kind and checks first that every process makes the same collective
    (NOTE [the collective check] in :mod:`cuvmap.distributed.check`).

    - ``allreduce(x, op="sum", in_place=False, *, axis_name=None, leaves=None)``: ``leaves``,
      the shapes of the leaves a bucket ``x`` holds (NOTE [buckets] in
      :mod:`cuvmap.lax.parallel`), or None for one leaf: the check compares them too;
    - ``allgather(x, *, axis_name=None)``, ``reduce_scatter(x, *, axis_name=None)``,
      ``alltoall(x, *, axis_name=None)``, ``permute(x, perm, *, axis_name=None)``: as
      :class:`Engine`'s.

    :class:`~cuvmap.distributed.ProcessGroup` is the one in cuvmap; a
    :class:`~cuvmap.lax.process_axes.ProcessAxis` holds one (``data_parallel`` binds it).
    """

    rank: int
    size: int

    def allreduce(self, x, op="sum", in_place=False, *, axis_name=None, leaves=None): ...

    def allgather(self, x, *, axis_name=None): ...

    def reduce_scatter(self, x, *, axis_name=None): ...

    def alltoall(self, x, *, axis_name=None): ...

    def permute(self, x, perm, *, axis_name=None): ...


@runtime_checkable
class Bootstrap(Protocol):
    """How the processes of a group agree on a value before an engine exists (NCCL's
    unique id): ``broadcast(value, root=0)`` returns ``root``'s ``value`` on every process
    (any picklable object)."""

    rank: int
    size: int

    def broadcast(self, value, root=0): ...


class LocalBootstrap:
    """The bootstrap of a job of one: the value is already everywhere."""

    rank = 0
    size = 1

    def broadcast(self, value, root=0):
        return value


class MPIBootstrap:
    """The bootstrap through an mpi4py communicator's ``bcast`` (pickled; once per engine)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def broadcast(self, value, root=0):
        return self.comm.bcast(value, root=root)


class LocalEngine:
    """The collectives of a job of one process (no transport): each is the identity it is
    for one member, on arrays of either backend."""

    rank = 0
    size = 1

    def allreduce(self, x, op="sum", in_place=False):
        return x if in_place else x.copy()

    def allgather(self, x):
        return x[None].copy()

    def reduce_scatter(self, x):
        return x[0].copy()

    def alltoall(self, x):
        return x.copy()

    def permute(self, x, perm):
        return x.copy() if perm else x * 0

    def barrier(self):
        pass

    def abort(self, code=1):
        pass


# kind ("cpu", "gpu") -> factory(group) -> Engine
_FACTORIES = {}


def register_engine(kind, factory):
    """Makes ``factory(group)`` the maker of the engine for arrays of ``kind`` (``"cpu"``:
    NumPy, ``"gpu"``: CuPy) in every :class:`~cuvmap.distributed.ProcessGroup` that has not
    made one yet. The factory reads what it needs from the group (``rank``, ``size``,
    ``comm``, ``bootstrap``, ``watchdog``) and returns an :class:`Engine`; a group calls
    it once, on its first collective of that kind. Returns the previous factory (or
    None), so that a test can put it back.

    Example::

        register_engine("cpu", lambda group: MyEngine(group.rank, group.size))
    """
    if kind not in ("cpu", "gpu"):
        raise ValueError(f"register_engine: kind must be 'cpu' (NumPy arrays) or 'gpu' (CuPy arrays), got {kind!r}")
    if not callable(factory):
        raise TypeError(f"register_engine({kind!r}, ...): the factory must be callable, got {factory!r}")
    previous = _FACTORIES.get(kind)
    _FACTORIES[kind] = factory
    return previous


def engine_factory(kind):
    """The factory registered for arrays of ``kind``; :class:`DistributedError` when none is."""
    factory = _FACTORIES.get(kind)
    if factory is None:
        raise DistributedError(f"no engine is registered for {kind} arrays (cuvmap.distributed.engine.register_engine)")
    return factory


def array_kind(x):
    """The kind of array ``x`` is, as the registry keys engines: ``"gpu"`` for CuPy,
    ``"cpu"`` for anything else."""
    return "gpu" if backend.is_cupy_array(x) else "cpu"
