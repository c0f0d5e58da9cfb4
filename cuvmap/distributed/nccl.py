"""The GPU engine: NCCL collectives on CuPy arrays (``cupy.cuda.nccl``), one process per GPU.

NOTE [NCCL through CuPy]
Each call enqueues NCCL's kernel on the current CuPy stream, reading and writing device
memory directly (no copy through the host), and returns at once; the result is a fresh
CuPy array from CuPy's pool, ordered after the collective by the stream, as any CuPy
result is. The communicator is made on the first collective on a GPU array (every
process reaches it at the same point, since all run the same collectives in the same
order): process 0 draws NCCL's unique id, the group's bootstrap gives it to every process
(MPI's broadcast by default, NOTE [engines] in :mod:`cuvmap.distributed.engine`), and
each process joins with its rank on its current device (``initialize`` makes it GPU ``local_rank`` modulo the
devices it sees, as one process per GPU wants). A job of one needs no bootstrap. Operands on
another device than the communicator's raise. NCCL has no all-to-all or permutation of
its own: they are grouped point-to-point sends and receives (``groupStart``/``groupEnd``).
Booleans reduce as uint8 (max/min are or/and on 0/1), complex sums as pairs of floats.
"""
import numpy as np

from cuvmap.distributed import engine as engine_mod
from cuvmap.distributed.engine import DistributedError, LocalEngine
from cuvmap.distributed.watchdog import describe
from cuvmap.core.bfloat16 import kind_of


def _nccl():
    from cupy.cuda import nccl

    return nccl


_DTYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
           "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
           "int64": "NCCL_INT64", "uint64": "NCCL_UINT64"}


class NCCLEngine:
    """Collectives of a NCCL communicator over the ``size`` processes of a group on CuPy
    arrays (NOTE [NCCL through CuPy]), an :class:`~cuvmap.distributed.engine.Engine`.
    ``bootstrap`` (a :class:`~cuvmap.distributed.engine.Bootstrap`) gives process 0's
    unique id to the others (``None`` for one process); ``watchdog`` (or ``None``) times
    each collective until it completes."""

    def __init__(self, rank, size, bootstrap=None, watchdog=None):
        import cupy

        nccl = _nccl()
        self.cp = cupy
        self.nccl = nccl
        self.rank, self.size = rank, size
        uid = nccl.get_unique_id() if rank == 0 else None
        if size > 1:
            if bootstrap is None:
                raise DistributedError(f"NCCL on {size} processes needs a bootstrap to share its unique id "
                                       "(cuvmap.distributed.engine.Bootstrap), got none")
            uid = bootstrap.broadcast(uid, root=0)
        self.device = cupy.cuda.Device().id
        self.comm = nccl.NcclCommunicator(size, uid, rank)
        self.watchdog = watchdog
        self._ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}

    def _flat(self, x, op, what):
        """``x`` as a contiguous 1-d buffer NCCL can reduce, and its NCCL dtype."""
        cp = self.cp
        if x.device.id != self.device:
            raise ValueError(f"{describe(what)}: the operand is on GPU {x.device.id}, but this process's NCCL "
                             f"communicator is on GPU {self.device} (one process per GPU: move it there)")
        flat = cp.ascontiguousarray(x).reshape(-1)
        dtype = x.dtype
        if dtype == np.bool_:
            return flat.view(np.uint8), self.nccl.NCCL_UINT8
        if kind_of(dtype) == "c":
            if op not in (None, "sum"):
                raise TypeError(f"{describe(what)}: complex values have no {op}imum")
            real = np.dtype(f"float{dtype.itemsize * 4}")
            return flat.view(real), getattr(self.nccl, _DTYPES[real.name])
        name = _DTYPES.get(dtype.name)
        if name is None:
            raise TypeError(f"{describe(what)}: NCCL has no dtype {dtype}")
        return flat, getattr(self.nccl, name)

    @staticmethod
    def _shaped(flat, dtype, shape):
        """A result buffer back in the operands' dtype and the result's shape."""
        return flat.view(dtype).reshape(shape)

    def _stream(self):
        return self.cp.cuda.get_current_stream()

    def _enqueued(self, what, stream):
        watchdog = self.watchdog
        capturing = getattr(stream, "is_capturing", None)  # (an event cannot be recorded into a graph's capture)
        if watchdog is not None and not (capturing is not None and capturing()):
            event = self.cp.cuda.Event(disable_timing=True)
            event.record(stream)
            watchdog.enqueued(what, event)

    def allreduce(self, x, op="sum", in_place=False):
        what = (f"NCCL all-reduce ({op})", x.dtype, x.shape)
        buf, dtype = self._flat(x, op, what)
        out = buf if in_place and buf.data.ptr == x.data.ptr else self.cp.empty_like(buf)
        if buf.size:
            stream = self._stream()
            self.comm.allReduce(buf.data.ptr, out.data.ptr, buf.size, dtype, self._ops[op], stream.ptr)
            self._enqueued(what, stream)
        return self._shaped(out, x.dtype, x.shape)

    def allgather(self, x):
        what = ("NCCL all-gather", x.dtype, x.shape)
        buf, dtype = self._flat(x, None, what)
        out = self.cp.empty(self.size * buf.size, buf.dtype)
        if buf.size:
            stream = self._stream()
            self.comm.allGather(buf.data.ptr, out.data.ptr, buf.size, dtype, stream.ptr)
            self._enqueued(what, stream)
        return self._shaped(out, x.dtype, (self.size,) + tuple(x.shape))

    def reduce_scatter(self, x):
        what = ("NCCL reduce-scatter", x.dtype, x.shape)
        buf, dtype = self._flat(x, "sum", what)
        out = self.cp.empty(buf.size // self.size, buf.dtype)
        if out.size:
            stream = self._stream()
            self.comm.reduceScatter(buf.data.ptr, out.data.ptr, out.size, dtype, self._ops["sum"], stream.ptr)
            self._enqueued(what, stream)
        return self._shaped(out, x.dtype, tuple(x.shape[1:]))

    def _exchange(self, what, dtype, sends, recvs):
        """Grouped point-to-point: ``sends`` and ``recvs`` are ``(peer, 1-d buffer)`` pairs."""
        sends = [(p, b) for p, b in sends if b.size]
        recvs = [(p, b) for p, b in recvs if b.size]
        if not (sends or recvs):
            return
        stream = self._stream()
        nccl = self.nccl
        nccl.groupStart()
        try:
            for peer, src in sends:
                self.comm.send(src.data.ptr, src.size, dtype, peer, stream.ptr)
            for peer, dst in recvs:
                self.comm.recv(dst.data.ptr, dst.size, dtype, peer, stream.ptr)
        finally:
            nccl.groupEnd()
        self._enqueued(what, stream)

    def alltoall(self, x):
        what = ("NCCL all-to-all", x.dtype, x.shape)
        buf, dtype = self._flat(x, None, what)
        out = self.cp.empty_like(buf)
        chunk = buf.size // self.size
        pieces = [slice(p * chunk, (p + 1) * chunk) for p in range(self.size)]
        self._exchange(what, dtype, [(p, buf[c]) for p, c in enumerate(pieces)],
                       [(p, out[c]) for p, c in enumerate(pieces)])
        return self._shaped(out, x.dtype, x.shape)

    def permute(self, x, perm):
        what = ("NCCL ppermute", x.dtype, x.shape)
        buf, dtype = self._flat(x, None, what)
        recvs = [s for s, t in perm if t == self.rank]
        out = self.cp.empty_like(buf) if recvs else self.cp.zeros_like(buf)
        self._exchange(what, dtype, [(t, buf) for s, t in perm if s == self.rank], [(s, out) for s in recvs])
        return self._shaped(out, x.dtype, x.shape)

    def barrier(self):
        """Returns when every process has reached it and this device's work before it is
        done (a one-element all-reduce, waited for)."""
        token = self.cp.zeros(1, np.float32)
        self.allreduce(token, "sum", in_place=True)
        self._stream().synchronize()

    def abort(self, code=1):
        """Stops the communicator (``ncclCommAbort``; NCCL passes no status: the group's
        MPI abort ends the job with ``code``)."""
        self.comm.abort()


def _make(group):
    """The ``"gpu"`` engine of a group (NOTE [engines] in :mod:`cuvmap.distributed.engine`);
    a job of one without NCCL gets the local engine."""
    try:
        return NCCLEngine(group.rank, group.size, group.bootstrap, group.watchdog)
    except (ImportError, OSError) as err:  # CuPy without NCCL, or NCCL's library missing
        if group.size > 1:
            raise DistributedError(f"{group.describe()}: a collective on a CuPy array needs NCCL "
                                   f"(cupy.cuda.nccl: {err}); install CuPy with NCCL (nvidia-nccl-cu12)") from err
        return LocalEngine()


engine_mod.register_engine("gpu", _make)
