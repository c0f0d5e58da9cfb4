r"""The strategy of banded matrix factorisation: a ``b``-banded lower-triangular Toeplitz
matrix ``C`` from its coefficients ``c₀ … c_{b−1}``, column-normalised, its exact
sensitivity under ``b``-min-separated participation, its expected error on the workload
of SGD with momentum, and the coefficients that minimise that error.

**The factorisation.** Training for ``n`` steps releases (a function of) the prefix sums
``A X`` of the clipped gradient sums ``X`` (``n × d``: row ``t`` is step ``t``'s sum),
with ``A`` the workload (:func:`momentum_workload`). A factorisation ``A = B C`` releases
``B (C X + σ Z) = A X + σ B Z``, ``Z`` i.i.d. ``N(0, 1)``: equivalently, step ``t`` adds
``σ (C⁻¹ Z)_t`` to its gradient sum and the optimiser does the rest (``B = A C⁻¹``). DP-SGD
is ``C = I``. ``C`` is here

* **b-banded lower-triangular Toeplitz**: ``C_{ij} = c_{i−j}`` for ``0 ≤ i − j < b``, else 0;
* **column-normalised**: ``C' = C D⁻¹`` with ``D = diag(d_j)``, ``d_j = ‖C e_j‖ =
  (Σ_{i < min(b, n−j)} c_i²)^{1/2}``, so that every column of ``C'`` has norm 1 (with
  ``‖c‖ = 1`` only the last ``b − 1`` columns change); then ``C'⁻¹ = D C⁻¹`` (the noise
  ``(C⁻¹Z)_t`` scaled by ``d_t``, :mod:`~cuvmap.dp.bandmf.noise`). ``c = [1]`` is DP-SGD.

**Sensitivity.** An example that participates in the steps ``π`` (its clipped gradient
``g_j``, ``‖g_j‖ ≤ 1``, at step ``j``) changes ``C' X`` by ``Σ_{j∈π} C'e_j g_jᵀ``. Under
``s``-min-separated participation (two steps of ``π`` at least ``s`` apart) with ``s ≥ b``
the columns ``C'e_j`` of ``π`` live on the disjoint rows ``j … j+b−1``, so

    ‖Σ_{j∈π} C'e_j g_jᵀ‖_F² = Σ_{j∈π} ‖C'e_j‖² ‖g_j‖²  ≤  Σ_{j∈π} w_j,   w_j = ‖C'e_j‖²,

with equality for unit gradients. ``w`` is non-increasing in ``j`` (1 everywhere when
normalised; ``d_j²`` otherwise), and the ``m``-th step of any pattern is at least ``m·s``,
so the maximum over patterns of at most ``k`` participations is taken at ``0, s, 2s, …``:

    sens²(C'; s, k) = Σ_{m < k'} w_{m s},   k' = min(k, ⌈n / s⌉),

``= k'`` when normalised: 1 per participation. Amplified BandMF (``accounting``) uses the
per-participation value, ``max_j ‖C'e_j‖ = 1``: each participation is its own subsampled
Gaussian mechanism on disjoint rows.

**Expected error.** With unit noise, the error of step ``t``'s output is
``E‖(A C'⁻¹ Z)_t‖² = ‖row_t(A C'⁻¹)‖²`` per coordinate; for the Toeplitz ``C`` it is
``Σ_{k ≤ t} τ_k²``, ``τ = C⁻¹ a`` (``a`` the workload's coefficients: lower-triangular
Toeplitz matrices commute). :func:`optimal_coefficients` minimises the scale-free
``‖c‖² · mean_t Σ_{k≤t} τ_k²`` (the mean squared error at sensitivity ``‖c‖``, McKenna
2024, Eq. 4) over ``c ∈ ℝ^b`` with :func:`cuvmap.value_and_grad` of a ``lax.scan`` for
``τ`` and the L-BFGS of :mod:`~cuvmap.dp.bandmf.lbfgs`, from the square-root coefficients.

References:

* C. A. Choquette-Choo, A. Ganesh, R. McKenna, H. B. McMahan, K. Rush, A. G. Thakurta,
  Z. Xu. *(Amplified) Banded Matrix Factorization: A unified approach to private
  training.* NeurIPS 2023, arXiv:2306.08153.
* R. McKenna. *Scaling up the Banded Matrix Factorization Mechanism for Differentially
  Private ML.* arXiv:2405.15913, 2024.
* H. Fichtenberger, M. Henzinger, J. Upadhyay. *Constant Matters: Fine-grained Error
  Bound on Differentially Private Continual Observation.* ICML 2023, arXiv:2202.11205
  (the square-root factorisation of the prefix sums).
"""
import functools
import math

import numpy as np

from cuvmap import api, jit_api, lax
from cuvmap import numpy as cnp
from cuvmap.dp.bandmf import lbfgs


def sqrt_coefficients(bands):
    """The first ``bands`` Taylor coefficients of ``(1 − x)^{−1/2}``, normalised to unit
    norm: ``r_0 = 1``, ``r_k = r_{k−1} (2k − 1) / (2k)`` (``r_k = C(2k, k) / 4^k``).

    Untruncated, the lower-triangular Toeplitz matrix of ``r`` is the square root of the
    prefix-sum matrix (``r * r = 1, 1, 1, …``): ``A = C C`` (Fichtenberger, Henzinger,
    Upadhyay 2023). Truncated to ``b`` bands it is a good banded strategy and the start
    of :func:`optimal_coefficients` (jax_privacy: ``toeplitz.optimal_max_error_strategy_coefs``,
    not normalised).

    Example::

        sqrt_coefficients(3)   # [1, 0.5, 0.375] / ‖·‖
    """
    bands = _check_bands(bands, "sqrt_coefficients")
    k = np.arange(1, bands)
    r = np.concatenate([[1.0], np.cumprod((2 * k - 1) / (2 * k))])
    return r / np.linalg.norm(r)


def momentum_workload(steps, momentum=0.0):
    """The Toeplitz coefficients ``a_0 … a_{n−1}`` of SGD with momentum ``β``:
    ``a_k = (1 − β^{k+1}) / (1 − β)`` (all ones for ``β = 0``: the prefix sums).

    SGD with momentum, ``m_t = β m_{t−1} + x_t``, ``θ_t = θ_0 − η Σ_{s ≤ t} m_s``, moves
    the parameters by ``−η Σ_{r ≤ t} a_{t−r} x_r``: the workload ``A`` of the noisy
    gradients ``x``.
    """
    steps = _check_positive_int(steps, "steps", "momentum_workload")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum_workload: momentum must be in [0, 1), got {momentum!r}")
    k = np.arange(steps, dtype=np.float64)
    if momentum == 0:
        return np.ones(steps)
    return -np.expm1((k + 1) * math.log(momentum)) / (1 - momentum)


def inverse_coefficients(coefficients, length):
    """The first ``length`` Toeplitz coefficients ``v`` of ``C⁻¹`` (``C`` the
    lower-triangular Toeplitz matrix of ``coefficients``, not normalised): ``v_0 = 1/c_0``,
    ``v_k = −(Σ_{j=1}^{min(k, b−1)} c_j v_{k−j}) / c_0`` (the power series of ``1 / c(x)``)."""
    c = np.asarray(coefficients, dtype=np.float64)
    v = np.zeros(int(length))
    if length == 0:
        return v
    v[0] = 1.0 / c[0]
    tail = c[1:][::-1]  # c_{b−1} … c_1, against v_{k−b+1} … v_{k−1}
    for k in range(1, int(length)):
        lo = max(0, k - (len(c) - 1))
        v[k] = -float(tail[len(tail) - (k - lo):] @ v[lo:k]) / c[0]
    return v


class BandedStrategy:
    """A ``b``-banded lower-triangular Toeplitz strategy ``C'`` over ``n`` steps,
    column-normalised (see the module's docstring for the math).

    Args:
      coefficients: ``c_0 … c_{b−1}`` (``c_0 ≠ 0``), rescaled to unit norm and ``c_0 > 0``
        (the same mechanism: the noise scales with the sensitivity).
      steps: ``n``, the number of steps (rows and columns of ``C'``), ``≥ b``.
      column_normalize: scale every column to norm 1 (the last ``b − 1`` columns of the
        truncated Toeplitz matrix are shorter); ``False`` keeps ``C`` (its largest column
        norm is 1 all the same).

    Attributes:
      coefficients: the normalised ``c`` (float64, length ``b``).
      bands, steps: ``b`` and ``n``.
      column_norms: ``d_j``, the norms of ``C``'s columns (the row scales of ``C'⁻¹``;
        all ones without normalisation).

    Example::

        s = BandedStrategy(sqrt_coefficients(4), 500)
        s.sensitivity()                          # 1.0: one participation
        s.sensitivity(max_participations=None)   # √125: every 4th step
    """

    def __init__(self, coefficients, steps, *, column_normalize=True):
        where = "BandedStrategy"
        c = np.array(coefficients, dtype=np.float64).reshape(-1) if not isinstance(coefficients, str) else None
        if c is None or c.size == 0 or not np.all(np.isfinite(c)) or c[0] == 0:
            raise ValueError(f"{where}: coefficients must be a non-empty vector of finite numbers with c_0 != 0, "
                             f"got {coefficients!r}")
        steps = _check_positive_int(steps, "steps", where)
        if c.size > steps:
            raise ValueError(f"{where}: {c.size} bands for {steps} steps: a strategy has at most as many bands as "
                             "steps")
        c = c / np.linalg.norm(c) * np.sign(c[0])
        self.coefficients, self.bands, self.steps = c, c.size, steps
        self.column_normalize = bool(column_normalize)
        cum = np.sqrt(np.cumsum(c * c))
        norms = cum[np.minimum(self.bands, steps - np.arange(steps)) - 1]   # d_j over min(b, n−j) coefficients
        self._norms = norms
        self.column_norms = norms if self.column_normalize else np.ones(steps)

    def __repr__(self):
        c = ", ".join(f"{x:.4g}" for x in self.coefficients[:6]) + (", …" if self.bands > 6 else "")
        return f"BandedStrategy(bands={self.bands}, steps={self.steps}, coefficients=[{c}])"

    @classmethod
    def dpsgd(cls, steps):
        """``C = I``: DP-SGD as a one-band strategy."""
        return cls([1.0], steps)

    # -- the matrices (dense: for checks at small n) ----------------------------------------

    def matrix(self):
        """The dense ``n × n`` strategy ``C'`` (float64)."""
        i, j = np.indices((self.steps, self.steps))
        lag = i - j
        c = np.where((lag >= 0) & (lag < self.bands), self.coefficients[np.clip(lag, 0, self.bands - 1)], 0.0)
        return c / self.column_norms[None, :] if self.column_normalize else c

    def noise_matrix(self):
        """The dense ``C'⁻¹ = D C⁻¹`` (float64): ``w = C'⁻¹ z`` is the correlated noise."""
        v = inverse_coefficients(self.coefficients, self.steps)
        i, j = np.indices((self.steps, self.steps))
        lag = i - j
        inv = np.where(lag >= 0, v[np.clip(lag, 0, None)], 0.0)
        return inv * self.column_norms[:, None]

    # -- sensitivity -----------------------------------------------------------------------

    def sensitivity(self, min_sep=None, max_participations=1):
        """The L2 sensitivity of ``C' X`` to one example whose clipped gradients have
        norm ≤ 1 and who participates in at most ``max_participations`` steps (``None``:
        as many as fit) at least ``min_sep`` apart (``b`` by default):
        ``(Σ_{m<k'} ‖C'e_{m·s}‖²)^{1/2}``, ``k' = min(k, ⌈n/s⌉)`` (exact; derivation in
        the module's docstring). ``min_sep < b`` is refused: participations' columns
        would overlap, and the maximum over gradients is then another problem.
        (jax_privacy: ``toeplitz.minsep_sensitivity_squared``, squared.)"""
        s = self.bands if min_sep is None else _check_positive_int(min_sep, "min_sep", "BandedStrategy.sensitivity")
        if s < self.bands:
            raise ValueError(f"BandedStrategy.sensitivity: min_sep={s} < bands={self.bands}: the columns of two "
                             "participations overlap; this exact formula holds for min_sep >= bands")
        k = math.ceil(self.steps / s)
        if max_participations is not None:
            k = min(k, _check_positive_int(max_participations, "max_participations", "BandedStrategy.sensitivity"))
        weights = (self._norms / self.column_norms) ** 2   # ‖C'e_j‖²: 1 normalised, d_j² otherwise
        return math.sqrt(float(np.sum(weights[np.arange(k) * s])))

    # -- error -----------------------------------------------------------------------------

    def per_step_error(self, momentum=0.0):
        """``E‖(A C'⁻¹ Z)_t‖²`` for every step ``t`` (unit noise, per coordinate), ``A``
        the workload of SGD with ``momentum`` (:func:`momentum_workload`): exact, in
        ``O(n b + b n²)`` (the Toeplitz rows by a cumulative sum, the ``b − 1`` rows the
        normalisation changes by a convolution each)."""
        a = momentum_workload(self.steps, momentum)
        v = inverse_coefficients(self.coefficients, self.steps)
        tau = np.convolve(a, v)[:self.steps]          # A C⁻¹'s Toeplitz coefficients
        err = np.cumsum(tau * tau)
        d = self.column_norms
        for t in range(max(0, self.steps - self.bands + 1), self.steps):
            # row t of A D C⁻¹: Σ_s a_{t−s} d_s v_{s−k}, a correlation of y_s = a_{t−s} d_s with v
            y = a[t - np.arange(t + 1)] * d[:t + 1]
            row = np.correlate(y, v[:t + 1], mode="full")[t:]
            err[t] = float(row @ row)
        return err

    def expected_error(self, momentum=0.0):
        """The mean over steps of :meth:`per_step_error`: the squared error of the noise
        in the optimiser's trajectory per unit ``σ`` (the sensitivity per participation
        is 1)."""
        return float(np.mean(self.per_step_error(momentum)))


# ---------------------------------------------------------------------------------------
# Optimised coefficients
# ---------------------------------------------------------------------------------------


def _toeplitz_loss(c, a):
    """``‖c‖² · mean_t Σ_{k≤t} τ_k²`` with ``τ = C⁻¹ a`` from the banded recurrence
    ``τ_t = (a_t − Σ_{j≥1} c_j τ_{t−j}) / c_0`` (a ``lax.scan`` over the steps, carrying the
    last ``b − 1`` values, newest first)."""
    head, tail = c[0], c[1:]

    def step(carry, a_t):
        tau = (a_t - cnp.sum(tail * carry)) / head
        return cnp.concatenate([cnp.reshape(tau, (1,)), carry[:-1]]), tau

    _, tau = lax.scan(step, cnp.zeros(tail.shape, dtype=a.dtype), a)
    return cnp.mean(cnp.cumsum(tau * tau)) * cnp.sum(c * c)


_toeplitz_loss_and_grad = jit_api.jit(api.value_and_grad(_toeplitz_loss))


def optimal_coefficients(bands, steps, momentum=0.0, *, max_iterations=300):
    """The ``b`` coefficients that minimise the expected squared error of the strategy
    on the workload of SGD with ``momentum`` over ``steps`` steps, at unit sensitivity:
    ``argmin_c ‖c‖² · mean_t Σ_{k≤t} τ_k²``, ``τ = C(c)⁻¹ a`` (module docstring), by L-BFGS
    from :func:`sqrt_coefficients` with the gradient from ``cuvmap.value_and_grad``;
    returned with unit norm and ``c_0 > 0``. Memoised. (jax_privacy:
    ``toeplitz.optimize_banded_toeplitz(n, bands)``, the prefix sums' case.)

    Example::

        c = optimal_coefficients(4, 500)   # ≈ [0.75, 0.43, 0.36, 0.33]
    """
    bands = _check_bands(bands, "optimal_coefficients")
    steps = _check_positive_int(steps, "steps", "optimal_coefficients")
    if bands > steps:
        raise ValueError(f"optimal_coefficients: {bands} bands for {steps} steps: at most as many bands as steps")
    if not 0 <= momentum < 1:
        raise ValueError(f"optimal_coefficients: momentum must be in [0, 1), got {momentum!r}")
    return np.array(_optimal(bands, steps, float(momentum), int(max_iterations)))


@functools.lru_cache(maxsize=64)
def _optimal(bands, steps, momentum, max_iterations):
    if bands == 1:
        return (1.0,)
    a = momentum_workload(steps, momentum)

    def value_and_grad(x):
        # a trial point whose c(x) has a root inside the unit disc makes τ grow like r^t:
        # it overflows to inf, which the line search rejects
        with np.errstate(over="ignore", invalid="ignore"):
            value, grad = _toeplitz_loss_and_grad(x, a)
        return float(value), np.asarray(grad)

    result = lbfgs.minimize(value_and_grad, sqrt_coefficients(bands), max_iterations=max_iterations)
    c = result.x / np.linalg.norm(result.x)
    return tuple(float(x) for x in c * np.sign(c[0]))


def coefficients_for(spec, bands, steps, where):
    """The coefficients a plan names: ``"optimal"`` (or None), ``"sqrt"``, or a vector of
    ``bands`` numbers."""
    if spec is None or (isinstance(spec, str) and spec == "optimal"):
        return optimal_coefficients(bands, steps)
    if isinstance(spec, str):
        if spec == "sqrt":
            return sqrt_coefficients(bands)
        raise ValueError(f"{where}: coefficients must be 'optimal', 'sqrt' or a vector of {bands} numbers, "
                         f"got {spec!r}")
    c = np.asarray(spec, dtype=np.float64).reshape(-1)
    if c.size != bands:
        raise ValueError(f"{where}: {c.size} coefficients for bands={bands}: a b-banded strategy has b coefficients")
    return c


def _check_bands(bands, where):
    return _check_positive_int(bands, "bands", where)


def _check_positive_int(value, name, where):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{where}: {name} must be a positive int, got {value!r}")
    return int(value)
