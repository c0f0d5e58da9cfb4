"""Loop references for ``lax.gather`` and the scatters, written from XLA's definition one
output (update) element at a time, independent of cuvmap's vectorised impls."""
import numpy as np


def _windows(rank, dropped, batching):
    return [d for d in range(rank) if d not in dropped and d not in batching]


def _start(operand_shape, indices, G, start_map, operand_batching, indices_batching, window, clip):
    """The window's start for batch position ``G`` and whether the window lies in bounds."""
    start = [0] * len(operand_shape)
    in_bounds = True
    for k, d in enumerate(start_map):
        s = int(indices[tuple(G) + (k,)])
        hi = operand_shape[d] - window[d]
        in_bounds &= 0 <= s <= hi
        start[d] = min(max(s, 0), hi) if clip else s
    for od, bd in zip(operand_batching, indices_batching):
        start[od] = G[bd]
    return start, in_bounds


def gather_reference(operand, indices, dnums, slice_sizes, mode="clip", fill_value=None):
    """``lax.gather`` by a loop over the output; ``mode`` "clip" (also the promise) or "fill"."""
    operand, indices = np.asarray(operand), np.asarray(indices)
    offset_dims = tuple(dnums.offset_dims)
    windows = _windows(operand.ndim, dnums.collapsed_slice_dims, dnums.operand_batching_dims)
    batch_shape = indices.shape[:-1]
    out_rank = len(batch_shape) + len(offset_dims)
    out_shape, bi, wi = [], 0, 0
    for p in range(out_rank):
        if p in offset_dims:
            out_shape.append(slice_sizes[windows[wi]])
            wi += 1
        else:
            out_shape.append(batch_shape[bi])
            bi += 1
    out = np.empty(out_shape, operand.dtype)
    for pos in np.ndindex(*out_shape):
        G = [pos[p] for p in range(out_rank) if p not in offset_dims]
        O = [pos[p] for p in offset_dims]
        start, in_bounds = _start(operand.shape, indices, G, dnums.start_index_map, dnums.operand_batching_dims,
                                  dnums.start_indices_batching_dims, slice_sizes, clip=True)
        if mode == "fill" and not in_bounds:
            out[pos] = fill_value
            continue
        for j, d in enumerate(windows):
            start[d] += O[j]
        out[pos] = operand[tuple(start)]
    return out


_COMBINE = {"replace": lambda old, new: new, "add": lambda old, new: old + new, "mul": lambda old, new: old * new,
            "min": min, "max": max}


def scatter_reference(kind, operand, indices, updates, dnums, mode="drop"):
    """A scatter by a loop over the updates, in row-major order (so the last of several
    updates of one element wins a "replace"); ``mode`` "clip" or "drop"."""
    operand, indices, updates = np.asarray(operand), np.asarray(indices), np.asarray(updates)
    out = operand.copy()
    uwd = tuple(dnums.update_window_dims)
    windows = _windows(operand.ndim, dnums.inserted_window_dims, dnums.operand_batching_dims)
    window = [1] * operand.ndim
    for j, d in enumerate(windows):
        window[d] = updates.shape[uwd[j]]
    for pos in np.ndindex(*updates.shape):
        G = [pos[p] for p in range(updates.ndim) if p not in uwd]
        W = [pos[p] for p in uwd]
        start, in_bounds = _start(operand.shape, indices, G, dnums.scatter_dims_to_operand_dims,
                                  dnums.operand_batching_dims, dnums.scatter_indices_batching_dims, window,
                                  clip=mode == "clip")
        if mode != "clip" and not in_bounds:
            continue
        for j, d in enumerate(windows):
            start[d] += W[j]
        out[tuple(start)] = _COMBINE[kind](out[tuple(start)], updates[pos])
    return out
