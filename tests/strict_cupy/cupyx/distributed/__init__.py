"""``cupyx.distributed`` of the strict CuPy stand-in: only the rendezvous store (``_store``)
that cuvmap's torchrun-style jobs meet through (NCCL itself is not in the stand-in)."""
