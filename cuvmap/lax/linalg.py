"""Linear algebra: ``dot_general``, the contraction behind matmul, batched matmul,
tensordot and einsum; and ``svd``, the singular value decomposition of a stack of matrices
(NOTE [svd's one output], NOTE [svd's derivatives], below).

``dot_general(x, y, ((x_contract, y_contract), (x_batch, y_batch)))`` contracts the
paired ``contract`` dims and pairs the ``batch`` dims; the output's dims are the batch
dims, then the free dims of ``x``, then those of ``y``:

    out[b, i, j] = Σ_k x[b, i, k] · y[b, k, j]     (dims grouped and flattened)

The impl transposes and reshapes both operands to ``(B, M, K)`` and ``(B, K, N)`` and calls
one (batched) BLAS matmul. The batching rule turns a batch dim of one operand into a free
dim of it, and a batch dim of both into one more paired batch dim. It is bilinear, so the
JVP is the sum of ``dot_general(t_x, y)`` and ``dot_general(x, t_y)``, and each VJP is a
``dot_general`` of the cotangent with the other operand followed by a transpose (the
derivation follows JAX's ``_dot_general_transpose_lhs``; the right operand's contracts the
left operand with the cotangent, so that for ``x @ y`` it is ``x.T @ ct`` with no transpose
after it).
"""
import functools
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.cpu import onednn_matmul
from cuvmap.cpu import threads as cpu_threads
from cuvmap.core import Primitive, ShapedArray, ShapeError, bfloat16
from cuvmap.errors import ShapeTypeError
from cuvmap.cuda import cublas
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax import linalg_svd_options as svd_options
from cuvmap.lax.linalg_svd_options import SvdAlgorithm  # noqa: F401 - jax.lax.linalg.SvdAlgorithm
from cuvmap.lax.reduction import reduce_sum
from cuvmap.lax.shape import argsort_ints, concatenate, expand_dims, reshape, transpose
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.transforms.batching import move_bdim, not_mapped, physical_axis
from cuvmap.core.bfloat16 import kind_of


def _free_dims(ndim, contract, batch):
    return [i for i in range(ndim) if i not in contract and i not in batch]


def _dot_general_shape_rule(x, y, *, dimension_numbers, precision=None, preferred_element_type=None):
    (xc, yc), (xb, yb) = dimension_numbers
    if len(xc) != len(yc) or len(xb) != len(yb):
        raise ShapeError(f"dimension_numbers {dimension_numbers} pair unequal numbers of dims")
    for dims, a in ((xc + xb, x), (yc + yb, y)):
        if any(not 0 <= d < a.ndim for d in dims) or len(set(dims)) != len(dims):
            raise ShapeError(f"dimension_numbers {dimension_numbers} out of range or repeated for {x.shape} and {y.shape}")
    for kind, pairs in (("contracting dimensions", list(zip(xc, yc))),
                        ("lhs batch dimensions and rhs batch dimensions", list(zip(xb, yb)))):
        for i, j in pairs:
            if x.shape[i] != y.shape[j]:
                raise ShapeTypeError(
                    f"dim {i} of {x.shape} (size {x.shape[i]}) does not match dim {j} of {y.shape} (size "
                    f"{y.shape[j]}) (dot_general requires {kind} to have the same shape, got "
                    f"{tuple(x.shape[a] for a, _ in pairs)} and {tuple(y.shape[b] for _, b in pairs)}.)"
                )
    if kind_of(x.dtype) == "b" or kind_of(y.dtype) == "b":
        raise ShapeError("boolean operands")
    shape = (
        tuple(x.shape[i] for i in xb)
        + tuple(x.shape[i] for i in _free_dims(x.ndim, xc, xb))
        + tuple(y.shape[i] for i in _free_dims(y.ndim, yc, yb))
    )
    dtype = preferred_element_type if preferred_element_type is not None else bfloat16.result_type(x.dtype, y.dtype)
    return ShapedArray(shape, dtype)


# NOTE [a product's layout is worked out once]
# The impl's bookkeeping (which dims are free, the permutations, the products of sizes)
# costs more in Python than a small GEMM (a 32×64 by 64×64 product in float32 is a few
# microseconds), and a loop body pays it at every step. It depends only on the operands'
# shapes and the dimension numbers, so :func:`_dot_layout` works it out once per
# combination (a bounded cache) and returns the function that does the rest: for a
# product of two matrices, ``x @ y`` on the views ``x.T``/``y.T`` that the contraction
# asks for, nothing else. The planned executor asks for that function when it plans the
# step (``impl_for``), so a jitted program does not even look it up.
@functools.lru_cache(maxsize=4096)
def _dot_layout(x_shape, y_shape, dimension_numbers, gpu=False):
    """The function ``f(x, y)`` that computes ``dot_general(x, y, dimension_numbers)`` for
    operands of these shapes (NOTE [a product's layout is worked out once]), NumPy arrays
    or with ``gpu`` CuPy ones, whose GEMMs go through :func:`cuvmap.cuda.cublas.matmul`
    (which a CUDA graph can capture: NOTE [cuBLAS in a capture])."""
    mm = cublas.matmul if gpu else onednn_matmul.product   # (OpenBLAS, or oneDNN on a spinning team)
    (xc, yc), (xb, yb) = dimension_numbers
    x_ndim, y_ndim = len(x_shape), len(y_shape)
    x_free = _free_dims(x_ndim, xc, xb)
    y_free = _free_dims(y_ndim, yc, yb)
    batch_shape = tuple(x_shape[i] for i in xb)
    m_shape = tuple(x_shape[i] for i in x_free)
    n_shape = tuple(y_shape[i] for i in y_free)
    b, m, n = math.prod(batch_shape), math.prod(m_shape), math.prod(n_shape)
    k = math.prod(x_shape[i] for i in xc)
    out_shape = batch_shape + m_shape + n_shape
    x_perm = tuple(xb) + tuple(x_free) + tuple(xc)
    y_perm = tuple(yb) + tuple(yc) + tuple(y_free)
    if k != 1 and not xb and len(xc) == 1 and x_ndim == 2 and y_ndim == 2:
        # a product of two matrices: the transposes are views, no reshape
        # (cuBLAS takes a transposed operand as it is: only OpenBLAS's is prepared)
        x_t, y_t = x_perm != (0, 1), y_perm != (0, 1)
        if x_t and y_t:
            fn = lambda x, y: mm(x.T, y.T)  # noqa: E731
            if not gpu:
                _prepared(fn, (None, _transposed), lambda x, y: mm(x.T, y))
        elif x_t:
            fn = lambda x, y: mm(x.T, y)  # noqa: E731
        elif y_t:
            fn = lambda x, y: mm(x, y.T)  # noqa: E731
            if not gpu:
                _prepared(fn, (None, _transposed), mm)
        else:
            fn = mm
        return fn if gpu else _with_threads(fn, m, n, k)
    if k == 1:
        # an outer product (per-example gradients of a dense layer): a broadcast multiply
        # writes the output once (a stack of rank-1 GEMMs is several times slower), along
        # the last axis, so the longer of m and n goes last: with n < m it is written as
        # (b, n, m) and returned as its transposed view. A large float32 one runs on
        # oneDNN's matmul, same layout, same bits (NOTE [outer products on the team] in
        # cuvmap/cpu/onednn_matmul.py).
        def outer(x, y):
            xt, yt = x.transpose(x_perm).reshape(b, m), y.transpose(y_perm).reshape(b, n)
            first, last = (yt, xt) if n < m else (xt, yt)
            if onednn_matmul.outer_usable(first, last):
                c = onednn_matmul.outer(first, last)
            else:
                c = first[:, :, None] * last[:, None, :]
            return (c.transpose(0, 2, 1) if n < m else c).reshape(out_shape)
        return outer
    x_mat = (b, m, k) if xb else (m, k)
    y_mat = (b, k, n) if xb else (k, n)

    def product(x, y):
        return mm(x.transpose(x_perm).reshape(x_mat), y.transpose(y_perm).reshape(y_mat)).reshape(out_shape)

    return product if gpu else _with_threads(product, m, n, k)


# NOTE [a loop's constant operand transposed once]
# OpenBLAS multiplies ``x @ w.T`` (the right operand transposed) about twice as slowly as
# ``x @ w`` for the small matrices of a recurrent cell (32×64 by 64×64 in float32 on the
# project's CPU; a transposed left operand costs little: ``python -m benchmarks
# control_flow`` times the three), and the backward pass of ``h @ w`` is exactly that
# product, ``ct @ w.T``. When ``w`` is a constant of a loop's body, the loop transposes it
# into a contiguous copy once, before its first step: the function of such a product
# carries ``prepare`` (per operand, None or the function applied once to a loop-invariant
# operand) and ``prepared`` (the function that takes the prepared operand in its place):
# NOTE [a loop runs as generated Python] in cuvmap/transforms/loop_plans.py.
def _transposed(w):
    return w.T.copy()


def _prepared(fn, prepare, prepared):
    fn.prepare, fn.prepared = prepare, prepared
    return fn


def _with_threads(fn, m, n, k):
    """``fn``, a GEMM of ``m × k`` by ``k × n``, run on NumPy operands with the thread count
    that NOTE [threads under a busy machine] (cuvmap/cpu/threads.py) asks for; ``fn`` itself
    where OpenBLAS would use one thread anyway (the small GEMMs of a loop's body pay
    nothing)."""
    if m * n * k < cpu_threads.MIN_PARALLEL_MNK:
        return fn

    def threaded(x, y):
        limit = cpu_threads.gemm_limit(m, n, k)
        if limit is None:  # (a quiet machine: no context manager)
            cpu_threads.blas_pool_used()  # NOTE [two thread pools]
            return fn(x, y)
        with cpu_threads.limited(limit):
            return fn(x, y)

    if hasattr(fn, "prepare"):
        _prepared(threaded, fn.prepare, _with_threads(fn.prepared, m, n, k))
    return threaded


def _dot_general_impl(x, y, *, dimension_numbers, precision=None, preferred_element_type=None):
    out = _dot_layout(x.shape, y.shape, dimension_numbers, backend.is_cupy_array(x))(x, y)
    if preferred_element_type is not None and out.dtype != preferred_element_type:
        out = out.astype(preferred_element_type)
    return out


def _dot_general_impl_for(x, y, *, dimension_numbers, precision=None, preferred_element_type=None):
    """The impl for operands of avals ``x`` and ``y`` (the executor's ``impl_for``); None
    while ``impl`` is not the one above (a test counting its calls patched it)."""
    if dot_general_p.impl is not _dot_general_impl:
        return None
    gpu = bool(x.device and x.device.startswith("gpu"))
    if preferred_element_type is not None and preferred_element_type != bfloat16.result_type(x.dtype, y.dtype):
        return None  # (a cast after the product: the impl's)
    return _dot_layout(tuple(x.shape), tuple(y.shape), dimension_numbers, gpu)


def _gemm_order(ndim, contract, batch, contract_last):
    free = _free_dims(ndim, contract, batch)
    return tuple(batch) + ((tuple(free) + tuple(contract)) if contract_last else (tuple(contract) + tuple(free)))


def _dot_general_workspace(in_avals, out_avals, params, strided):
    """The impl's transposes reshaped into GEMM operands: a copy of each operand that is not
    in C order or whose axes the GEMM wants in another order (NOTE [planned peak memory]
    in cuvmap/transforms/executor/peak_memory.py)."""
    (xc, yc), (xb, yb) = params["dimension_numbers"]
    avals = [in_avals[0], in_avals[1] if in_avals[1] is not None else in_avals[0]]  # (x · x: both sides copy)
    # a product of two matrices passes its transposes to the GEMM as views (_dot_layout)
    matrices = not xb and len(xc) == 1 and all(len(a.shape) == 2 for a in avals)
    copies = 0
    for i, (contract, batch, last) in enumerate(((xc, xb, True), (yc, yb, False))):
        a = avals[i]
        moved = [d for d in _gemm_order(len(a.shape), contract, batch, last) if a.shape[d] != 1]
        if strided[i] or (moved != sorted(moved) and not matrices):  # (moving size-1 axes copies nothing)
            copies += a.size * a.dtype.itemsize
    return copies


def _dot_general_layout(strided, in_avals, out_avals, params):
    """A new array, in C order but for an outer product with fewer columns than rows, which
    the impl writes transposed (``_dot_general_impl``)."""
    (xc, yc), (xb, yb) = params["dimension_numbers"]
    x, y = in_avals[0], in_avals[1]
    k = int(np.prod([x.shape[i] for i in xc], dtype=np.int64))
    m = int(np.prod([x.shape[i] for i in _free_dims(len(x.shape), xc, xb)], dtype=np.int64))
    n = int(np.prod([y.shape[i] for i in _free_dims(len(y.shape), yc, yb)], dtype=np.int64))
    return True, k == 1 and n < m


dot_general_p = Primitive("dot_general", owns_output=True, kind="dot", workspace=_dot_general_workspace,
                          impl_for=_dot_general_impl_for, layout=_dot_general_layout)
dot_general_p.impl = _dot_general_impl
dot_general_p.shape_rule = _dot_general_shape_rule


def dot_general(x, y, dimension_numbers, precision=None, preferred_element_type=None):
    """General tensor contraction (see the module docstring).

    Args:
      x, y: arrays.
      dimension_numbers: ``((x_contract, y_contract), (x_batch, y_batch))``, tuples of dims.
      precision: None or a pair of ``lax.Precision`` (JAX's canonical form: the front end
        ``lax.dot_general`` makes it), recorded in the equation and unused by the kernels.
      preferred_element_type: the result's dtype; None: the operands' promoted dtype. The
        equation records the dtype either way, as JAX's ``jnp`` products do.
    Returns:
      an array of shape ``batch + x_free + y_free``.

    Example: ``dot_general(a, b, (((1,), (0,)), ((), ())))`` is ``a @ b`` for matrices.
    """
    (xc, yc), (xb, yb) = dimension_numbers
    dn = ((tuple(map(int, xc)), tuple(map(int, yc))), (tuple(map(int, xb)), tuple(map(int, yb))))
    if preferred_element_type is None:
        preferred_element_type = bfloat16.result_type(core.dtype_of(x), core.dtype_of(y))
    return dot_general_p.bind(x, y, dimension_numbers=dn, precision=precision,
                              preferred_element_type=np.dtype(preferred_element_type))


# ---------------------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------------------


def _dot_general_batch(axis_size, vals, dims, *, dimension_numbers, precision=None, preferred_element_type=None):
    x, y = vals
    dx, dy = dims
    (xc, yc), (xb, yb) = dimension_numbers
    if dx is not not_mapped and dy is not not_mapped:
        x = move_bdim(x, dx, 0)
        y = move_bdim(y, dy, 0)
        shift = lambda ds: tuple(d + 1 for d in ds)  # noqa: E731
        dn = ((shift(xc), shift(yc)), ((0,) + shift(xb), (0,) + shift(yb)))
        return dot_general(x, y, dn, precision, preferred_element_type), 0
    if dx is not not_mapped:
        xc2 = tuple(physical_axis(d, dx) for d in xc)
        xb2 = tuple(physical_axis(d, dx) for d in xb)
        x_free = _free_dims(len(x.shape), xc2, xb2)
        out_dim = len(xb) + x_free.index(dx)
        return dot_general(x, y, ((xc2, yc), (xb2, yb)), precision, preferred_element_type), out_dim
    yc2 = tuple(physical_axis(d, dy) for d in yc)
    yb2 = tuple(physical_axis(d, dy) for d in yb)
    y_free = _free_dims(len(y.shape), yc2, yb2)
    x_ndim = len(core.shape_of(x))
    out_dim = len(xb) + len(_free_dims(x_ndim, xc, xb)) + y_free.index(dy)
    return dot_general(x, y, ((xc, yc2), (xb, yb2)), precision, preferred_element_type), out_dim


batching.primitive_batchers[dot_general_p] = _dot_general_batch


# ---------------------------------------------------------------------------------------
# JVP and VJP
# ---------------------------------------------------------------------------------------


def _ranges_like(*xs):
    start = 0
    for x in xs:
        yield tuple(range(start, start + len(x)))
        start += len(x)


def _transpose_lhs(ct, x_ndim, y, dimension_numbers, swap_ans=False, precision=None):
    """Cotangent of ``x`` in ``dot_general(x, y)`` (or of ``y`` with ``swap_ans``)."""
    (xc, yc), (xb, yb) = dimension_numbers
    x_kept = _free_dims(x_ndim, xc, xb)
    y_kept = _free_dims(len(core.shape_of(y)), yc, yb)
    if swap_ans:
        ans_batch, ans_y, _ = _ranges_like(xb, y_kept, x_kept)
    else:
        ans_batch, _, ans_y = _ranges_like(xb, x_kept, y_kept)
    dims = ((ans_y, tuple(y_kept)), (ans_batch, tuple(yb)))
    xc_sorted_by_y = tuple(xc[i] for i in argsort_ints(yc))
    out_axes = argsort_ints(tuple(xb) + tuple(x_kept) + xc_sorted_by_y)
    return transpose(dot_general(ct, y, dims, precision), out_axes)


def _dot_general_vjp_lhs(ct, out, x, y, *, dimension_numbers, precision=None, preferred_element_type=None):
    return _transpose_lhs(ct, len(core.shape_of(x)), y, dimension_numbers, precision=precision)


def _dot_general_vjp_rhs(ct, out, x, y, *, dimension_numbers, precision=None, preferred_element_type=None):
    """Cotangent of ``y``: ``dot_general(x, ct)`` contracting ``x``'s free dims with the
    cotangent's, so that for ``x @ y`` it is ``x.T @ ct`` in ``y``'s layout, with no
    transpose after the product (JAX's rule, which contracts ``ct`` with ``x``, yields
    ``(ct.T @ x).T``: a strided view that every later sum reads slowly)."""
    (xc, yc), (xb, yb) = dimension_numbers
    x_kept = _free_dims(len(core.shape_of(x)), xc, xb)
    y_kept = _free_dims(len(core.shape_of(y)), yc, yb)
    ans_batch, ans_x, ans_y = _ranges_like(xb, x_kept, y_kept)
    dims = ((tuple(x_kept), ans_x), (tuple(xb), ans_batch))
    # the product's dims: the batch dims (y's yb), x's contracted dims in x's order (y's
    # paired yc), then the cotangent's y dims (y's free dims)
    yc_by_x = tuple(yc[xc.index(d)] for d in sorted(xc))
    out_axes = argsort_ints(tuple(yb) + yc_by_x + tuple(y_kept))
    return transpose(dot_general(x, ct, dims, precision), out_axes)


jvp.defjvp(
    dot_general_p,
    lambda t, out, x, y, *, dimension_numbers, precision=None, preferred_element_type=None:
        dot_general(t, y, dimension_numbers, precision),
    lambda t, out, x, y, *, dimension_numbers, precision=None, preferred_element_type=None:
        dot_general(x, t, dimension_numbers, precision),
)
vjp.defvjp(dot_general_p, _dot_general_vjp_lhs, _dot_general_vjp_rhs, reads=(0, 1))


# =======================================================================================
# svd: the singular value decomposition of a stack of matrices
# =======================================================================================

# NOTE [svd's one output]
# A cuvmap primitive has one output (a staged equation binds one variable) and the SVD
# has three. ``svd_p(x, full_matrices, compute_uv)`` returns the singular values alone with
# ``compute_uv=False``; with ``compute_uv=True`` it returns U, s and Vh packed along one last
# axis, ``(..., m·p + k + q·n)`` for ``x`` of shape ``(..., m, n)``, ``k = min(m, n)`` and
# ``p = m, q = n`` (``full_matrices``) or ``p = q = k``. The wrapper :func:`svd` slices them
# apart with slices and reshapes, themselves transformable: one decomposition serves all
# three, and the derivative rules read U, s and V from the packed output instead of
# decomposing again. The singular-values-only JVP and VJP need U and V too: they bind the
# packed reduced SVD of their operand (as JAX's rule does), so second derivatives of the
# singular values go through the packed rules.

# NOTE [svd's derivatives]
# With A = U S Vᵀ (the reduced SVD, U: m×k, V: n×k, s descending) and dS = Uᵀ dA V:
#   ds = diag(dS)                                         ds_i = u_iᵀ dA v_i
#   dU = U (F ∘ (dS S + S dSᵀ)) + (I − U Uᵀ) dA V S⁻¹      (the second term for m > k)
#   dV = V (F ∘ (S dS + dSᵀ S)) + (I − V Vᵀ) dAᵀ U S⁻¹     (the second term for n > k)
# with F_ij = 1 / (s_j² − s_i²) off the diagonal and 0 on it (JAX's svd_jvp_rule, real
# case). The VJP is its transpose: for cotangents Ū, s̄ and V̄ (= V̄hᵀ),
#   Ā = U [diag(s̄) + (F ∘ (UᵀŪ − ŪᵀU)) S + S (F ∘ (VᵀV̄ − V̄ᵀV))] Vᵀ
#       + (I − U Uᵀ) Ū S⁻¹ Vᵀ + U S⁻¹ V̄ᵀ (I − V Vᵀ).
# The singular vectors are defined up to a common sign flip of u_i and v_i, and for a
# repeated singular value only up to a rotation within its subspace: there F is infinite
# and the derivatives of U and V are undefined (they come out inf or NaN), as they are for
# a zero singular value of a non-square matrix (S⁻¹). Derivatives of functions invariant
# under those choices (the singular values of distinct ones, U S Vᵀ, projectors u_i u_iᵀ)
# are what finite differences see. With ``full_matrices=True`` and m ≠ n the extra columns
# of U (or rows of Vh) are any orthonormal completion, with no derivative at all: the
# rules raise, and ask for ``full_matrices=False``.

# NOTE [svd of complex matrices]
# A complex A = U S Vᴴ (s real) follows JAX's svd_jvp_rule: the rules above with ᴴ for ᵀ,
# ds = re(diag(dS)) with dS = Uᴴ dA V, and one more term in dU, the phase term
# U·diag(i·im(dS_ii)/s_i) (0 where s_i = 0): u_i and v_i are defined up to a common phase
# e^{iθ}, and JAX's gauge puts the whole phase change of the pair into u_i. The VJP is the
# transpose under ⟨u, v⟩ = re Σ u·v (NOTE [complex convention]): conj of the textbook
# adjoint (the formula of NOTE [svd's derivatives] with ᴴ for ᵀ and the term
# U·diag(i·im((UᴴŪ)_ii)/s_i)·Vᴴ) applied to the conjugated cotangents. The packed output
# holds s as complex numbers with no imaginary part (the wrapper takes their real part).
# Functions invariant under the phases (s, U S Vᴴ, |u_iᴴ A v_i|, u_i u_iᴴ) are what finite
# differences see.

svd_p = Primitive("svd", capturable=False)  # cuSOLVER: CuPy refuses it inside a stream capture


def svd(x, full_matrices=True, compute_uv=True, *, subset_by_index=None, algorithm=None):
    """The singular value decomposition ``x = u @ diag(s) @ vh`` of each matrix of a stack.

    Args:
      x: a float32, float64, complex64 or complex128 array ``(..., m, n)`` (complex:
        ``x = u @ diag(s) @ vh`` with unitary ``u``, ``vh`` and real ``s``, NOTE [svd of
        complex matrices]).
      full_matrices: square ``u`` ``(..., m, m)`` and ``vh`` ``(..., n, n)``, or, with
        ``False``, the reduced ``(..., m, k)`` and ``(..., k, n)``, ``k = min(m, n)``.
      compute_uv: return ``(u, s, vh)``, or the singular values alone.
      subset_by_index: JAX's ``(start, end)``: only the singular values ``s[start:end]``
        (descending order) and their vectors; needs ``full_matrices=False`` unless it is
        the whole range. Sliced from the whole decomposition.
      algorithm: JAX's :class:`SvdAlgorithm` (or ``None``): checked, then computed by
        cuvmap's one driver (NOTE [one SVD driver] in ``cuvmap/lax/linalg_svd_options.py``).
    Returns:
      ``(u, s, vh)`` (``s``: ``(..., k)``, descending, nonnegative), or ``s``.

    Derivatives: NOTE [svd's derivatives]; those of ``u`` and ``vh`` are undefined for
    repeated singular values, and for ``full_matrices=True`` of a non-square matrix.

    Example: ``s = svd(a, compute_uv=False)``; ``s[..., 0]`` is the spectral norm.
    """
    svd_options.check_algorithm(algorithm)
    subset = svd_options.check_subset(subset_by_index, core.shape_of(x), bool(full_matrices) and bool(compute_uv))
    if subset is not None:  # the triplets start..end-1, sliced from the reduced decomposition
        start, end = subset
        last = len(core.shape_of(x)) - 1
        if not compute_uv:
            return slice_in_dim(svd(x, compute_uv=False), start, end, last - 1)
        u, s, vh = svd(x, full_matrices=False)
        return (slice_in_dim(u, start, end, last), slice_in_dim(s, start, end, last - 1),
                slice_in_dim(vh, start, end, last - 1))
    if not compute_uv:
        return svd_p.bind(x, full_matrices=False, compute_uv=False)
    packed = svd_p.bind(x, full_matrices=bool(full_matrices), compute_uv=True)
    u, s, vh = _svd_unpack(packed, core.shape_of(x), bool(full_matrices))
    return u, (ew.real(s) if _is_complex(s) else s), vh


def _svd_sizes(shape, full_matrices):
    m, n = shape[-2:]
    k = min(m, n)
    return m, n, k, (m if full_matrices else k), (n if full_matrices else k)


def _svd_unpack(packed, shape, full_matrices):
    """``(u, s, vh)`` from the packed output (NOTE [svd's one output])."""
    lead = tuple(shape[:-2])
    m, n, k, p, q = _svd_sizes(shape, full_matrices)
    axis = len(lead)
    u = reshape(slice_in_dim(packed, 0, m * p, axis), lead + (m, p))
    s = slice_in_dim(packed, m * p, m * p + k, axis)
    vh = reshape(slice_in_dim(packed, m * p + k, m * p + k + q * n, axis), lead + (q, n))
    return u, s, vh


def _svd_pack(u, s, vh):
    lead = tuple(core.shape_of(s)[:-1])
    flat = [reshape(a, lead + (math.prod(core.shape_of(a)[-2:]),)) for a in (u, vh)]
    return concatenate([flat[0], s, flat[1]], len(lead))


# ---------------------------------------------------------------------------------------
# Shape rule and impl
# ---------------------------------------------------------------------------------------


_SVD_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))


def _svd_shape_rule(x, *, full_matrices, compute_uv):
    if x.ndim < 2:
        raise ShapeError(f"the operand must be a matrix or a stack of them (at least 2 dims), got shape {x.shape}")
    if x.dtype not in _SVD_DTYPES:
        raise ShapeTypeError(f"svd does not accept dtype {x.dtype.name}: the operand must be float32, float64, "
                             "complex64 or complex128")
    m, n, k, p, q = _svd_sizes(x.shape, full_matrices)
    lead = tuple(x.shape[:-2])
    if not compute_uv:  # (the singular values are real)
        return ShapedArray(lead + (k,), np.empty(0, x.dtype).real.dtype)
    return ShapedArray(lead + (m * p + k + q * n,), x.dtype)


def _svd_impl(x, *, full_matrices, compute_uv):
    x = core.as_array(x)
    xp = backend.xp_of(x)
    if not compute_uv:
        return xp.linalg.svd(x, compute_uv=False)
    u, s, vh = xp.linalg.svd(x, full_matrices=full_matrices)
    lead = x.shape[:-2]
    m, n, k, p, q = _svd_sizes(x.shape, full_matrices)
    return xp.concatenate([u.reshape(lead + (m * p,)), s.astype(x.dtype), vh.reshape(lead + (q * n,))], axis=-1)


# ---------------------------------------------------------------------------------------
# Batching: the decomposition is stacked over leading dims
# ---------------------------------------------------------------------------------------


def _svd_batch(axis_size, vals, dims, *, full_matrices, compute_uv):
    (x,), (d,) = vals, dims
    if d >= len(x.shape) - 2:  # the batch dim among the matrix dims: make it a leading one
        x, d = move_bdim(x, d, 0), 0
    return svd_p.bind(x, full_matrices=full_matrices, compute_uv=compute_uv), d


# ---------------------------------------------------------------------------------------
# JVP and VJP (NOTE [svd's derivatives])
# ---------------------------------------------------------------------------------------


def _mm(a, b):
    """``a @ b`` for stacks of matrices with the same leading dims."""
    nd = len(core.shape_of(a))
    batch = tuple(range(nd - 2))
    return dot_general(a, b, (((nd - 1,), (nd - 2,)), (batch, batch)))


def _mT(a):
    nd = len(core.shape_of(a))
    return transpose(a, tuple(range(nd - 2)) + (nd - 1, nd - 2))


def _row(s):
    """``s`` ``(..., k)`` as ``(..., 1, k)``: scales the columns of what it multiplies."""
    return expand_dims(s, (len(core.shape_of(s)) - 1,))


def _col(s):
    """``s`` ``(..., k)`` as ``(..., k, 1)``: scales the rows."""
    return expand_dims(s, (len(core.shape_of(s)),))


def _is_complex(x):
    return kind_of(core.dtype_of(x)) == "c"


def _conj(x):
    """``conj(x)``; a real ``x`` as it is."""
    return ew.conj(x) if _is_complex(x) else x


def _mH(a):
    """``aᴴ``: the conjugate transpose (``aᵀ`` for a real ``a``)."""
    return _conj(_mT(a))


def _phase_term(ds_mat, s):
    """``diag(i·im(dS_ii)/s_i)`` (0 where ``s_i = 0``, and for a real ``dS``): NOTE [svd of
    complex matrices]."""
    if not _is_complex(ds_mat):
        return None
    eye = backend.xp_of(s).eye(core.shape_of(s)[-1], dtype=core.dtype_of(s))
    diag = ew.mul(ds_mat, eye)
    im_diag = ew.mul(ew.sub(diag, ew.conj(diag)), 0.5)
    zero = ew.eq(s, 0)
    s_inv = ew.select(zero, ew.mul(s, 0), ew.div(1, ew.select(zero, ew.add(ew.mul(s, 0), 1), s)))
    return ew.mul(im_diag, _row(s_inv))


def _zero_safe_mul(f, x):
    """``f ∘ x`` with 0 wherever ``x`` is 0, also where ``f`` is infinite: the stand-in for
    JAX's symbolic zeros (a zero cotangent of U or Vh contributes nothing to the VJP, even
    at repeated or zero singular values)."""
    return ew.select(ew.eq(x, 0), ew.mul(x, 0), ew.mul(f, x))


def _svd_f(s):
    """``F_ij = 1 / (s_j² − s_i²)`` off the diagonal, 0 on it."""
    k = core.shape_of(s)[-1]
    eye = backend.xp_of(s).eye(k, dtype=bool)
    s2 = ew.mul(s, s)
    diff = ew.sub(_row(s2), _col(s2))
    return ew.select(eye, 0, ew.div(1, ew.select(eye, 1, diff)))


def _check_full(x_shape, full_matrices, what):
    m, n = x_shape[-2:]
    if full_matrices and m != n:
        extra = "columns of u" if m > n else "rows of vh"
        raise ShapeError(
            f"the {what} of the full_matrices=True decomposition of a {m}×{n} matrix is not defined: its last "
            f"{abs(m - n)} {extra} are any orthonormal completion; use full_matrices=False "
            "(NOTE [svd's derivatives])")


def _svd_tangents(u, s, vh, t):
    """``(du, ds, dvh)`` of the reduced SVD along the tangent ``t`` of ``x`` (``s`` real;
    NOTE [svd's derivatives], NOTE [svd of complex matrices])."""
    m, k = core.shape_of(u)[-2:]
    n = core.shape_of(vh)[-1]
    v = _mH(vh)
    tv = _mm(t, v)
    ds_mat = _mm(_mH(u), tv)  # Uᴴ dA V
    ds = reduce_sum(ew.mul(_conj(u), tv), (len(core.shape_of(u)) - 2,))
    ds = ew.real(ds) if _is_complex(ds) else ds
    f = _svd_f(s)
    dss = ew.mul(ds_mat, _row(s))
    sds = ew.mul(_col(s), ds_mat)
    inner_u = ew.mul(f, ew.add(dss, _mH(dss)))
    phase = _phase_term(ds_mat, s)
    if phase is not None:
        inner_u = ew.add(inner_u, phase)
    du = _mm(u, inner_u)
    dv = _mm(v, ew.mul(f, ew.add(sds, _mH(sds))))
    if m > k:
        du = ew.add(du, ew.div(ew.sub(tv, _mm(u, ds_mat)), _row(s)))
    if n > k:
        tu = _mm(_mH(t), u)
        dv = ew.add(dv, ew.div(ew.sub(tu, _mm(v, _mH(ds_mat))), _row(s)))
    return du, ds, _mH(dv)


def _svd_jvp(t, out, x, *, full_matrices, compute_uv):
    shape = core.shape_of(x)
    if not compute_uv:
        u, _, vh = svd(x, full_matrices=False, compute_uv=True)
        ds = reduce_sum(ew.mul(_conj(u), _mm(t, _mH(vh))), (len(shape) - 2,))
        return ew.real(ds) if _is_complex(ds) else ds
    _check_full(shape, full_matrices, "derivative")
    u, s, vh = _svd_unpack(out, shape, full_matrices)
    s = ew.real(s) if _is_complex(s) else s
    du, ds, dvh = _svd_tangents(u, s, vh, t)
    return _svd_pack(du, ew.convert_element_type(ds, core.dtype_of(du)) if _is_complex(du) else ds, dvh)


def _svd_vjp(ct, out, x, *, full_matrices, compute_uv):
    """The transpose of :func:`_svd_jvp`: conj of the adjoint under the Hermitian pairing,
    applied to the conjugated cotangents (NOTE [svd of complex matrices])."""
    shape = core.shape_of(x)
    if not compute_uv:
        u, _, vh = svd(x, full_matrices=False, compute_uv=True)
        return _conj(_mm(ew.mul(u, _row(ct)), vh))
    _check_full(shape, full_matrices, "gradient")
    u, s, vh = _svd_unpack(out, shape, full_matrices)
    ct_u, ct_s, ct_vh = _svd_unpack(_conj(ct), shape, full_matrices)
    if _is_complex(s):
        s, ct_s = ew.real(s), ew.real(ct_s)
    m, n = shape[-2:]
    k = min(m, n)
    v, ct_v = _mH(vh), _mH(ct_vh)
    f = _svd_f(s)
    eye = backend.xp_of(s).eye(k, dtype=core.dtype_of(s))
    ut_ctu = _mm(_mH(u), ct_u)
    vt_ctv = _mm(_mH(v), ct_v)
    middle = ew.add(ew.mul(_row(ct_s), eye),
                    ew.add(ew.mul(_zero_safe_mul(f, ew.sub(ut_ctu, _mH(ut_ctu))), _row(s)),
                           ew.mul(_col(s), _zero_safe_mul(f, ew.sub(vt_ctv, _mH(vt_ctv))))))
    phase = _phase_term(ut_ctu, s)
    if phase is not None:
        middle = ew.add(middle, phase)
    ct_x = _mm(_mm(u, middle), vh)
    zero = ew.eq(s, 0)  # (1/s without NumPy's warning: inf where s = 0)
    s_inv = _row(ew.select(zero, ew.add(ew.mul(s, 0), np.inf), ew.div(1, ew.select(zero, ew.add(ew.mul(s, 0), 1), s))))
    if m > k:
        ct_x = ew.add(ct_x, _mm(_zero_safe_mul(s_inv, ew.sub(ct_u, _mm(u, ut_ctu))), vh))
    if n > k:
        ct_vt = _mH(ct_v)
        ct_x = ew.add(ct_x, _mm(u, _zero_safe_mul(_mT(s_inv), ew.sub(ct_vt, _mm(_mH(vt_ctv), vh)))))
    return _conj(ct_x)


# ---------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------

svd_p.impl = _svd_impl
svd_p.shape_rule = _svd_shape_rule
batching.primitive_batchers[svd_p] = _svd_batch
jvp.defjvp(svd_p, _svd_jvp)
vjp.defvjp(svd_p, _svd_vjp, reads=(0, "out"))


# bilinear: its transposes are products without a conjugate (NOTE [complex convention])
complex_rules.defcomplex(dot_general_p)
complex_rules.defcomplex(svd_p)  # NOTE [svd of complex matrices]

# JAX's lax.linalg names, here as in jax.lax.linalg: ``cuvmap.lax.linalg.cholesky`` and the
# others are looked up on first use (a documented cycle: linalg_solve.py and
# linalg_decompositions.py import this module's helpers, so this module cannot import them
# at its top).
_LAX_LINALG_NAMES = {"cholesky": "linalg_decompositions", "eigh": "linalg_decompositions",
                     "qr": "linalg_decompositions", "lu": "linalg_solve",
                     "lu_pivots_to_permutation": "linalg_solve", "triangular_solve": "linalg_solve"}
_LAX_LINALG_NAMES.update({  # issue 32
    "eig": "linalg_eig", "tridiagonal_solve": "linalg_tridiagonal", "schur": "linalg_schur",
    "hessenberg": "linalg_householder", "householder_product": "linalg_householder",
    "tridiagonal": "linalg_householder", "symmetric_product": "linalg_symmetric_product"})


def __getattr__(name):
    module = _LAX_LINALG_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'cuvmap.lax.linalg' has no attribute {name!r}")
    import importlib  # (the documented cycle above)
    return getattr(importlib.import_module(f"cuvmap.lax.{module}"), name)
