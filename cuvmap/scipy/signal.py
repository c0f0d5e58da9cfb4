"""``jax.scipy.signal``'s convolutions: ``convolve``, ``correlate``, ``convolve2d``,
``correlate2d``, with JAX's signatures, and autograd's generalization of ``convolve``
(``axes=`` and ``dot_axes=``). NOTE [convolution as a gather and a contraction].
"""
import numpy as np

from cuvmap import backend, core
from cuvmap import numpy as cnp
from cuvmap.scipy._util import promote_inexact

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_MODES = ("full", "valid", "same")

# NOTE [convolution as a gather and a contraction]
# The full convolution along one axis, out[l] = Σ_i a[i] b[l − i] (l < n + m − 1), is b padded
# by n − 1 zeros on each side and gathered at the static windows idx[l, i] = l + n − 1 − i, which
# replaces b's axis by two, (l, i); one einsum then contracts i with a's axis — and, for
# autograd's ``dot_axes``, the paired axes of a and b — leaving a's other axes, then b's, then
# the convolved ones (autograd's layout). 'valid' and 'same' slice the full result (SciPy's
# centering: 'same' is in1's size). The operand with the fewer convolved entries is the one
# windowed (the convolution is symmetric), so the gather holds (n + m − 1) · min(n, m) entries
# per axis. Gather and einsum carry every transform, so the result is differentiable in both
# operands (both modes), batchable and jittable; ``method`` ('auto', 'direct', 'fft') is
# checked and the direct sum is always taken.


def _axes_list(axes, ndim, what, name):
    out = [int(a) for a in axes]
    for a in out:
        if not -ndim <= a < ndim:
            raise ValueError(f"{name}: axis {a} of {what} is out of range for its {ndim} dimensions")
    out = [a % ndim for a in out]
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: repeated axis in {what}'s axes {list(axes)}")
    return out


def _window_gather(b, axis, n, xp):
    """b's ``axis`` (length m) replaced by (n + m − 1, n): entry (l, i) is b[l − i] (0 outside)."""
    m = cnp.shape(b)[axis]
    widths = [(0, 0)] * cnp.ndim(b)
    widths[axis] = (n - 1, n - 1)
    padded = cnp.pad(b, widths)
    idx = (np.arange(n + m - 1)[:, None] + (n - 1) - np.arange(n)[None, :]).astype(np.int64)
    return cnp.take(padded, xp.asarray(idx), axis=axis)


def _full(a, b, conv_a, conv_b, dot_a, dot_b):
    """The full convolution in autograd's layout: a's free axes, b's free axes, the convolved."""
    xp = backend.xp_of(*(x for x in (a, b) if not isinstance(x, (int, float, complex))))
    free_a = [k for k in range(cnp.ndim(a)) if k not in conv_a and k not in dot_a]
    free_b = [k for k in range(cnp.ndim(b)) if k not in conv_b and k not in dot_b]
    letters = iter(_LETTERS)
    sub_a = [""] * cnp.ndim(a)
    sub_b = [""] * cnp.ndim(b)
    out_free_a, out_free_b, out_conv = [], [], []
    for k in free_a:
        sub_a[k] = next(letters)
        out_free_a.append(sub_a[k])
    for k in free_b:
        sub_b[k] = next(letters)
        out_free_b.append(sub_b[k])
    for ka, kb in zip(dot_a, dot_b):
        sub_a[ka] = sub_b[kb] = next(letters)
    for ka, kb in zip(conv_a, conv_b):
        i, l = next(letters), next(letters)
        sub_a[ka] = i
        sub_b[kb] = l + i
        out_conv.append(l)
    # gather b's convolved axes, the highest first so that the lower positions stay valid
    for ka, kb in sorted(zip(conv_a, conv_b), key=lambda p: -p[1]):
        b = _window_gather(b, kb, cnp.shape(a)[ka], xp)
    spec = f"{''.join(sub_a)},{''.join(sub_b)}->{''.join(out_free_a + out_free_b + out_conv)}"
    return cnp.einsum(spec, a, b)


def _general(in1, in2, mode, axes, dot_axes, name):
    if mode not in _MODES:
        raise ValueError(f"{name}: mode must be one of {_MODES}, got {mode!r}")
    a, b = promote_inexact(cnp.asarray(in1), cnp.asarray(in2))
    dtype = np.result_type(core.dtype_of(a), core.dtype_of(b))
    a, b = cnp.astype(a, dtype), cnp.astype(b, dtype)
    if axes is None:
        if cnp.ndim(a) != cnp.ndim(b):
            raise ValueError(f"{name}: in1 and in2 must have the same number of dimensions, got shapes "
                             f"{cnp.shape(a)} and {cnp.shape(b)}")
        axes = (tuple(range(cnp.ndim(a))), tuple(range(cnp.ndim(b))))
    conv_a = _axes_list(axes[0], cnp.ndim(a), "in1", name)
    conv_b = _axes_list(axes[1], cnp.ndim(b), "in2", name)
    dot_a = _axes_list(dot_axes[0], cnp.ndim(a), "in1", name)
    dot_b = _axes_list(dot_axes[1], cnp.ndim(b), "in2", name)
    if len(conv_a) != len(conv_b) or len(dot_a) != len(dot_b):
        raise ValueError(f"{name}: axes and dot_axes must pair as many axes of in1 as of in2, got axes={axes}, "
                         f"dot_axes={dot_axes}")
    if set(conv_a) & set(dot_a) or set(conv_b) & set(dot_b):
        raise ValueError(f"{name}: an axis cannot be both convolved and contracted (axes={axes}, "
                         f"dot_axes={dot_axes})")
    for ka, kb in zip(dot_a, dot_b):
        if cnp.shape(a)[ka] != cnp.shape(b)[kb]:
            raise ValueError(f"{name}: contracted axes {ka} of in1 and {kb} of in2 differ in length: shapes "
                             f"{cnp.shape(a)} and {cnp.shape(b)}")
    n = [cnp.shape(a)[k] for k in conv_a]
    m = [cnp.shape(b)[k] for k in conv_b]
    if any(s == 0 for s in n + m):
        raise ValueError(f"{name}: the convolved axes must not be empty, got shapes {cnp.shape(a)} and "
                         f"{cnp.shape(b)}")
    if mode == "valid" and not (all(p >= q for p, q in zip(n, m)) or all(p <= q for p, q in zip(n, m))):
        raise ValueError(f"{name}: mode 'valid' needs one input at least as large as the other in every "
                         f"convolved axis, got lengths {n} and {m}")
    if int(np.prod(n)) <= int(np.prod(m)):
        out = _full(a, b, conv_a, conv_b, dot_a, dot_b)
    else:  # window the smaller one: out(b, a) has b's free axes first
        out = _full(b, a, conv_b, conv_a, dot_b, dot_a)
        nfa = cnp.ndim(a) - len(conv_a) - len(dot_a)
        nfb = cnp.ndim(b) - len(conv_b) - len(dot_b)
        order = list(range(nfb, nfb + nfa)) + list(range(nfb)) + list(range(nfa + nfb, cnp.ndim(out)))
        out = cnp.transpose(out, order)
    if mode == "full":
        return out
    lead = cnp.ndim(out) - len(n)
    index = [slice(None)] * lead
    for p, q in zip(n, m):
        if mode == "valid":
            index.append(slice(min(p, q) - 1, max(p, q)))
        else:
            start = (q - 1) // 2
            index.append(slice(start, start + p))
    return out[tuple(index)]


def _check_method(method, name):
    if method not in ("auto", "direct", "fft"):
        raise ValueError(f"{name}: method must be 'auto', 'direct' or 'fft', got {method!r}")


def convolve(in1, in2, mode="full", method="auto", precision=None, *, axes=None, dot_axes=((), ())):
    """The N-dimensional discrete convolution ``out[l] = Σ_i in1[i] · in2[l − i]`` (summed
    over every index where both are defined), over all axes (``in1`` and ``in2`` of the same
    rank); ``mode`` 'full' (``n + m − 1`` per axis), 'valid' (``|n − m| + 1``, one input at
    least as large as the other in every axis) or 'same' (``in1``'s size, centered as SciPy).
    ``method`` is checked (the direct sum is always computed: NOTE [convolution as a gather and
    a contraction]); ``precision`` is accepted, as JAX's on the CPU. autograd's
    generalization: ``axes=(axes_of_in1, axes_of_in2)`` convolves only those pairs and
    ``dot_axes`` pairs are summed over (a tensordot), the result laid out as in1's other
    axes, in2's other axes, then the convolved axes. JAX: ``jax.scipy.signal.convolve``."""
    _check_method(method, "convolve")
    return _general(in1, in2, mode, axes, dot_axes, "convolve")


def correlate(in1, in2, mode="full", method="auto", precision=None):
    """The N-dimensional cross-correlation ``out[l] = Σ_i in1[i + l] · conj(in2[i])``, i.e.
    :func:`convolve` of ``in1`` with ``in2`` reversed in every axis and conjugated; ``mode`` as
    in :func:`convolve` ('same' is ``in1``'s size). JAX: ``jax.scipy.signal.correlate``."""
    _check_method(method, "correlate")
    b = cnp.asarray(in2)
    b = cnp.conj(cnp.flip(b)) if cnp.iscomplexobj(b) else cnp.flip(b)
    return _general(in1, b, mode, None, ((), ()), "correlate")


def _check_2d(in1, in2, boundary, fillvalue, name):
    if cnp.ndim(in1) != 2 or cnp.ndim(in2) != 2:
        raise ValueError(f"{name}: in1 and in2 must be two-dimensional, got shapes {cnp.shape(in1)} and "
                         f"{cnp.shape(in2)}")
    if boundary != "fill" or fillvalue != 0:
        raise NotImplementedError(f"{name}: only boundary='fill' with fillvalue=0 is supported (as in JAX), got "
                                  f"boundary={boundary!r}, fillvalue={fillvalue!r}")


def convolve2d(in1, in2, mode="full", boundary="fill", fillvalue=0, precision=None):
    """:func:`convolve` of two 2-D arrays (``boundary='fill'``, ``fillvalue=0`` only, as JAX).
    JAX: ``jax.scipy.signal.convolve2d``."""
    _check_2d(in1, in2, boundary, fillvalue, "convolve2d")
    return convolve(in1, in2, mode)


def correlate2d(in1, in2, mode="full", boundary="fill", fillvalue=0, precision=None):
    """:func:`correlate` of two 2-D arrays (``boundary='fill'``, ``fillvalue=0`` only, as JAX).
    JAX: ``jax.scipy.signal.correlate2d``."""
    _check_2d(in1, in2, boundary, fillvalue, "correlate2d")
    return correlate(in1, in2, mode)
