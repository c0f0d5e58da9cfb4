"""The CPU engine: MPI collectives on NumPy arrays through mpi4py's buffer interface.

Every call passes NumPy buffers to mpi4py's upper-case methods (``Allreduce``,
``Allgather``, ``Reduce_scatter_block``, ``Alltoall``, ``Isend``/``Irecv``), which hand
their memory to MPI as it is: no pickling, no copy but the one into a contiguous layout
when an operand is not contiguous. The result is written into a fresh array (the
operand is the caller's); :meth:`MPIEngine.allreduce` with ``in_place=True`` reduces into
the operand itself (``MPI_IN_PLACE``), for buffers the caller owns (a packed pytree).

MPI's reductions are not defined for every dtype: booleans reduce with logical or/and
(``pmax``/``pmin``; ``psum`` sums them as int64 before it gets here), and complex values
have no maximum.
"""
import numpy as np

from cuvmap.distributed import engine as engine_mod
from cuvmap.distributed.engine import LocalEngine
from cuvmap.distributed.watchdog import describe
from cuvmap.core.bfloat16 import kind_of

_PERMUTE_TAG = 7711


def _contiguous(x):
    """``x`` in C order (``numpy.ascontiguousarray`` would make a 0-d array 1-d)."""
    return x if x.flags.c_contiguous else x.copy(order="C")


class MPIEngine:
    """Collectives of one MPI communicator (``comm``, an ``mpi4py.MPI.Comm``) on NumPy
    arrays; ``watchdog`` (or ``None``) times each call. An
    :class:`~cuvmap.distributed.engine.Engine`."""

    def __init__(self, comm, watchdog=None):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.watchdog = watchdog
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
        self._labels = {op: f"all-reduce ({op})" for op in self._ops}
        self._reductions = {}  # (op, dtype) -> MPI op, for the hot path of small all-reduces

    def _op(self, op, dtype, what):
        if dtype == np.bool_:
            if op == "sum":
                raise TypeError(f"{describe(what)}: MPI cannot sum booleans (psum converts them to int64 first)")
            return self.MPI.LOR if op == "max" else self.MPI.LAND
        if kind_of(dtype) == "c" and op != "sum":
            raise TypeError(f"{describe(what)}: complex values have no {op}imum")
        return self._ops[op]

    def _call(self, what, fn, *args, **kwargs):
        watchdog = self.watchdog
        if watchdog is None:
            return fn(*args, **kwargs)
        watchdog.begin(what)
        try:
            return fn(*args, **kwargs)
        finally:
            watchdog.end()

    def allreduce(self, x, op="sum", in_place=False):
        # (the collective check calls this before every collective: the common case
        # costs a dict lookup, not a dtype test, an f-string or a call through _call)
        dtype = x.dtype
        mpi_op = self._reductions.get((op, dtype))
        if mpi_op is None:
            mpi_op = self._reductions[op, dtype] = self._op(op, dtype, (self._labels.get(op, op), dtype, x.shape))
        flags = x.flags
        if in_place and flags.c_contiguous and flags.writeable:
            send, out = self.MPI.IN_PLACE, x
        else:
            send = x if flags.c_contiguous else x.copy(order="C")
            out = np.empty_like(send)
        watchdog = self.watchdog
        if watchdog is None:
            self.comm.Allreduce(send, out, mpi_op)
            return out
        watchdog.begin((self._labels[op], dtype, x.shape))
        try:
            self.comm.Allreduce(send, out, mpi_op)
        finally:
            watchdog.end()
        return out

    def allgather(self, x):
        x = _contiguous(x)
        out = np.empty((self.size,) + x.shape, x.dtype)
        self._call(("all-gather", x.dtype, x.shape), self.comm.Allgather, x, out)
        return out

    def reduce_scatter(self, x):
        x = _contiguous(x)
        what = ("reduce-scatter", x.dtype, x.shape)
        out = np.empty(x.shape[1:], x.dtype)
        self._call(what, self.comm.Reduce_scatter_block, x, out, op=self._op("sum", x.dtype, what))
        return out

    def alltoall(self, x):
        x = _contiguous(x)
        out = np.empty_like(x)
        self._call(("all-to-all", x.dtype, x.shape), self.comm.Alltoall, x, out)
        return out

    def permute(self, x, perm):
        x = _contiguous(x)
        sends = [t for s, t in perm if s == self.rank]
        recvs = [s for s, t in perm if t == self.rank]
        out = np.empty_like(x) if recvs else np.zeros_like(x)
        requests = [self.comm.Isend(x, dest=t, tag=_PERMUTE_TAG) for t in sends]
        requests += [self.comm.Irecv(out, source=s, tag=_PERMUTE_TAG) for s in recvs]
        if requests:
            self._call(("ppermute", x.dtype, x.shape), self.MPI.Request.Waitall, requests)
        return out

    def barrier(self):
        self._call(("barrier", None, None), self.comm.Barrier)

    def abort(self, code=1):
        self.comm.Abort(code)


def _make(group):
    """The ``"cpu"`` engine of a group (NOTE [engines] in :mod:`cuvmap.distributed.engine`)."""
    if group.comm is not None:
        return MPIEngine(group.comm, group.watchdog)
    if group.size > 1:
        raise engine_mod.DistributedError(f"{group.describe()}: the MPI engine needs the group's mpi4py communicator "
                                          "(ProcessGroup(comm)), or give a \"cpu\" engine of your own (engines=)")
    return LocalEngine()


engine_mod.register_engine("cpu", _make)
