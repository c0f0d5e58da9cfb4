"""A torchrun-style job without MPI: its processes meet at ``MASTER_ADDR:MASTER_PORT``
(NOTE [launchers] in :mod:`cuvmap.distributed.launcher`) and talk through NCCL.

NOTE [the TCP rendezvous]
Process 0 serves a small key-value store with a barrier (CuPy's ``cupyx.distributed``
store, the one ``cupyx.distributed.init_process_group`` starts, not one of cuvmap's own)
at ``MASTER_ADDR:MASTER_PORT``; every process, process 0 included, talks to it through a
proxy. It carries what the processes must agree on before NCCL exists, NCCL's unique id
above all: :class:`StoreBootstrap` is a :class:`~cuvmap.distributed.engine.Bootstrap`
whose ``broadcast`` writes the root's value (pickled, in pieces: the store's messages hold
256 bytes) under a fresh key, passes the store's barrier, and reads it back on the other
processes; a second barrier lets the root know everyone has read before it moves on. The
store is trusted-network only, as CuPy's documentation says of it.

After that every collective is NCCL's. The group's own bookkeeping (the collective check,
the settings every process shares) all-reduces a few host numbers: without MPI,
:class:`HostThroughDevice` copies them to the GPU, runs the NCCL collective and copies the
result back (a few microseconds on numbers this small). The job's NumPy arrays take the
same path; a job that computes on the CPU is MPI's (``mpiexec`` or ``srun``).
"""
import pickle

import numpy as np

from cuvmap.distributed.engine import DistributedError

_PIECE = 200   # bytes of a pickled value per store entry (the store's messages hold 256)


def _store_module():
    try:
        from cupyx.distributed import _store
    except ImportError as err:
        raise DistributedError(
            "a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) meets through CuPy's "
            "cupyx.distributed store and talks through NCCL, but CuPy (with cupyx.distributed) does not import "
            f"here ({err}): pip install 'cuvmap[gpu]', or start the job with mpiexec or srun") from err
    return _store


class StoreBootstrap:
    """A :class:`~cuvmap.distributed.engine.Bootstrap` through the TCP store process 0
    serves at ``(host, port)`` (NOTE [the TCP rendezvous])."""

    def __init__(self, rank, size, host, port):
        store = _store_module()
        self.rank, self.size, self.host, self.port = rank, size, host, int(port)
        self._server = None
        if rank == 0:
            self._server = store.TCPStore(size)
            self._server.run(host, self.port)
        self._proxy = store.TCPStoreProxy(host, self.port)
        self._count = 0

    def broadcast(self, value, root=0):
        tag = f"cuvmap/bcast/{self._count}"
        self._count += 1
        if self.rank == root:
            data = pickle.dumps(value)
            pieces = [data[i:i + _PIECE] for i in range(0, len(data), _PIECE)]
            self._proxy[f"{tag}/n"] = len(pieces)
            for i, piece in enumerate(pieces):
                self._proxy[f"{tag}/{i}"] = piece
        self._proxy.barrier()           # the root has written
        if self.rank != root:
            n = self._proxy[f"{tag}/n"]
            value = pickle.loads(b"".join(self._proxy[f"{tag}/{i}"] for i in range(n)))
        self._proxy.barrier()           # everyone has read
        return value

    def close(self):
        if self._server is not None:
            self._server.stop()
            self._server = None


class HostThroughDevice:
    """The engine for host (NumPy) arrays of a job without MPI: each collective copies its
    operand to the current GPU, runs ``device_engine``'s (NCCL's) and copies the result
    back (NOTE [the TCP rendezvous])."""

    def __init__(self, device_engine):
        self.device_engine = device_engine
        self.rank, self.size = device_engine.rank, device_engine.size

    def _through(self, method, x, *args):
        cp = self.device_engine.cp
        return cp.asnumpy(getattr(self.device_engine, method)(cp.asarray(np.ascontiguousarray(x)), *args))

    def allreduce(self, x, op="sum", in_place=False):
        out = self._through("allreduce", x, op, False)
        if in_place:
            x[...] = out
            return x
        return out

    def allgather(self, x):
        return self._through("allgather", x)

    def reduce_scatter(self, x):
        return self._through("reduce_scatter", x)

    def alltoall(self, x):
        return self._through("alltoall", x)

    def permute(self, x, perm):
        return self._through("permute", x, perm)

    def barrier(self):
        self.device_engine.barrier()

    def abort(self, code=1):
        self.device_engine.abort(code)
