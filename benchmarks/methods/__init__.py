"""The methods a suite times side by side — cuvmap's and its peers' (torch.func, Opacus,
JAX) — as rows of one kind, and the comparison of their outputs.

A :class:`Method` is one row: a function of no arguments that runs the method on the
suite's weights and data, the timer for its device, and how its output compares with
cuvmap's. The adapters that make them live beside this file, one per framework
(:mod:`~benchmarks.methods.cuvmap_methods`, :mod:`~benchmarks.methods.torch_methods`,
:mod:`~benchmarks.methods.opacus_methods`, :mod:`~benchmarks.methods.jax_methods`,
:mod:`~benchmarks.methods.dp_accounting_methods`); each peer's ``setup`` imports it when
installed and says in the run's notes why a peer was skipped.
"""
import numpy as np

from cuvmap import backend

from benchmarks.rounds import peaks
from benchmarks.rounds.runner import Case


class Method:
    """One row: ``fn()`` runs the method; ``leaf_to_numpy`` turns a leaf of its output into a
    NumPy array (:meth:`numpy`); ``kind`` says what the output is (``per_example``
    gradients, a ``loop`` over the first examples, ``batched`` gradients of the mean loss,
    a ``clipped`` sum with its norms); ``scale`` multiplies its times (a loop timed on a
    subset of the batch); ``memory``: whether the suite measures its peak memory."""

    def __init__(self, key, label, framework, fn, timer, kind, leaf_to_numpy=np.asarray, scale=1.0, note=None,
                 memory=True):
        self.key, self.label, self.framework, self.fn, self.timer = key, label, framework, fn, timer
        self.kind, self.leaf_to_numpy, self.scale, self.note, self.memory = kind, leaf_to_numpy, scale, note, memory

    def case(self, fn=None):
        """The :class:`~benchmarks.rounds.runner.Case` the rounds time (``fn`` in place of the
        method's own function: a wrapper that counts page faults, say)."""
        return Case(self.key, self.label, fn or self.fn, self.timer, self.scale)

    def peak_mib(self, device, torch=None):
        """MiB one call needed at its peak: on the CPU tracemalloc's (NumPy's buffers: None for
        rows whose ``memory`` is off, torch's buffers are not traced), on the GPU what CuPy's
        pool (cuvmap) or torch's allocator (torch, Opacus) had to add; None for JAX."""
        if device == "cpu":
            return peaks.host_peak(self.fn) / 2 ** 20 if self.memory else None
        if self.framework == "cuvmap":
            return peaks.cupy_pool_peak(self.fn, backend.cupy_module()) / 2 ** 20
        if self.framework in ("torch", "opacus"):
            return peaks.torch_cuda_peak(self.fn, torch) / 2 ** 20
        return None

    def numpy(self, out):
        """The output ``out`` of ``fn()`` with every leaf a NumPy array (dicts, lists and
        tuples kept; a clipped sum as the pair ``(summed, norms)``, as cuvmap's
        ``ClippedGradient`` unpacks)."""
        if self.kind == "clipped":
            summed, norms = out
            out = (summed, norms)
        return tree_numpy(out, self.leaf_to_numpy)


def tree_numpy(tree, leaf_to_numpy=np.asarray):
    if isinstance(tree, dict):
        return {k: tree_numpy(v, leaf_to_numpy) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_numpy(v, leaf_to_numpy) for v in tree)
    return leaf_to_numpy(tree)


def _leaves(tree):
    """The leaves as float64 arrays, a dict's by its sorted keys (so that two dicts of the
    same names pair leaf by leaf, whatever their order)."""
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in _leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [leaf for v in tree for leaf in _leaves(v)]
    return [np.asarray(tree, dtype=np.float64)]


def max_abs_diff(got, want):
    """The largest |difference| over the leaves of two trees of NumPy arrays."""
    return max(float(np.max(np.abs(a - b))) for a, b in zip(_leaves(got), _leaves(want)))


def max_relative_diff(got, want):
    """The largest |difference| of a leaf, relative to the largest |value| of that leaf of
    ``want``, over the leaves of two trees of NumPy arrays."""
    return max(float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-30)
               for a, b in zip(_leaves(got), _leaves(want)))
