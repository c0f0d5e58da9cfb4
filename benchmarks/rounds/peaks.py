"""Peak memory of one call: NumPy's buffers on the host (tracemalloc), CuPy's memory pool
and torch's CUDA allocator on the GPU. Each counts what the call added over what existed
before it, so that arrays kept across calls (a jitted program's buffers) are not counted."""
import gc
import tracemalloc


def host_peak(fn):
    """Bytes traced by tracemalloc at the peak of one call of ``fn`` over those traced before
    it: NumPy's buffers (NumPy reports them to tracemalloc), not a vendor library's own
    scratch memory nor torch's."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
        del out
        return peak
    finally:
        tracemalloc.stop()


def cupy_pool_peak(fn, cp):
    """Bytes that CuPy's default memory pool had to add to hold one call of ``fn``: the pool
    is emptied of its cached blocks first, so that it grows to the call's peak of live
    memory (rounded up to the pool's blocks). Arrays alive before the call (a jitted
    program's buffers kept across calls) are not counted."""
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    pool.free_all_blocks()
    before = pool.total_bytes()
    out = fn()
    cp.cuda.Device().synchronize()
    peak = pool.total_bytes() - before
    del out
    return peak


def torch_cuda_peak(fn, torch):
    """Bytes above those allocated before the call at the peak of torch's CUDA allocator
    during one call of ``fn``."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak
