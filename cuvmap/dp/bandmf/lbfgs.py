r"""A small L-BFGS minimiser for smooth problems over a few numbers (the strategy's
coefficients): NumPy on the host, the gradient from the caller (``cuvmap.value_and_grad``).

L-BFGS (Nocedal 1980; Liu and Nocedal 1989) keeps the last ``m`` pairs
``s_k = x_{k+1} − x_k``, ``y_k = ∇f(x_{k+1}) − ∇f(x_k)`` and applies the inverse-Hessian
approximation they define to the gradient by the two-loop recursion::

    q = ∇f(x)
    for k newest → oldest:  α_k = ρ_k s_kᵀq,  q ← q − α_k y_k          (ρ_k = 1 / y_kᵀs_k)
    r = γ q,  γ = s_newestᵀy_newest / y_newestᵀy_newest
    for k oldest → newest:  β = ρ_k y_kᵀr,   r ← r + s_k (α_k − β)
    direction = −r

The step along the direction is found by backtracking from 1 until the Armijo condition
``f(x + t d) ≤ f(x) + 10⁻⁴ t ∇f(x)ᵀd`` holds; a pair with ``y_kᵀs_k ≤ 10⁻¹⁰ ‖s_k‖‖y_k‖``
(no positive curvature) is not kept, and a direction that is not a descent direction
falls back on the steepest one. SciPy is not a dependency: this is the whole solver.

Reference: J. Nocedal, S. Wright. *Numerical Optimization*, 2nd ed., Springer 2006,
Algorithm 7.4 (the two-loop recursion) and Algorithm 7.5.
"""
import math

import numpy as np


class LBFGSResult:
    """What :func:`minimize` found: ``x``, ``value`` (``f(x)``), ``grad_norm``
    (``‖∇f(x)‖``), ``iterations``, ``evaluations`` and ``converged`` (the gradient test
    met before ``max_iterations``)."""

    def __init__(self, x, value, grad_norm, iterations, evaluations, converged):
        self.x, self.value, self.grad_norm = x, value, grad_norm
        self.iterations, self.evaluations, self.converged = iterations, evaluations, converged

    def __repr__(self):
        return (f"LBFGSResult(value={self.value:.6g}, grad_norm={self.grad_norm:.3g}, "
                f"iterations={self.iterations}, evaluations={self.evaluations}, converged={self.converged})")


def minimize(value_and_grad, x0, *, max_iterations=500, history=10, gtol=1e-9, ftol=1e-15):
    """Minimises a smooth ``f`` by L-BFGS from ``x0``.

    Args:
      value_and_grad: ``x -> (f(x), ∇f(x))`` for a float64 vector ``x`` (a float and an
        array of ``x``'s shape).
      x0: the starting point (a vector).
      max_iterations: the most L-BFGS steps taken.
      history: ``m``, the number of ``(s, y)`` pairs kept.
      gtol: stop when ``‖∇f(x)‖_∞ ≤ gtol · max(1, |f(x)|)``.
      ftol: stop when a step lowers ``f`` by less than ``ftol · max(1, |f(x)|)``.

    Returns:
      an :class:`LBFGSResult`.

    Example::

        result = minimize(lambda x: (float(x @ x), 2 * x), np.ones(3))   # result.x ≈ 0
    """
    x = np.array(x0, dtype=np.float64).reshape(-1)
    f, g = _evaluate(value_and_grad, x)
    evaluations = 1
    pairs = []
    converged = False
    iteration = 0
    for iteration in range(1, max_iterations + 1):
        if np.max(np.abs(g)) <= gtol * max(1.0, abs(f)):
            converged = True
            iteration -= 1
            break
        d = _direction(g, pairs)
        slope = float(g @ d)
        if not slope < 0:  # not a descent direction: forget the curvature pairs
            pairs.clear()
            d, slope = -g, -float(g @ g)
        t = 1.0 if pairs else min(1.0, 1.0 / max(np.linalg.norm(g), 1e-300))
        while True:
            x_new = x + t * d
            f_new, g_new = _evaluate(value_and_grad, x_new)
            evaluations += 1
            if np.isfinite(f_new) and f_new <= f + 1e-4 * t * slope:
                break
            t *= 0.5
            if t < 1e-20:
                return LBFGSResult(x, f, float(np.linalg.norm(g)), iteration, evaluations, False)
        s, y = x_new - x, g_new - g
        if float(y @ s) > 1e-10 * np.linalg.norm(s) * np.linalg.norm(y):
            pairs.append((s, y, 1.0 / float(y @ s)))
            if len(pairs) > history:
                pairs.pop(0)
        decrease = f - f_new
        x, f, g = x_new, f_new, g_new
        if decrease <= ftol * max(1.0, abs(f)):
            converged = np.max(np.abs(g)) <= math.sqrt(gtol) * max(1.0, abs(f))
            break
    return LBFGSResult(x, f, float(np.linalg.norm(g)), iteration, evaluations, converged)


def _evaluate(value_and_grad, x):
    f, g = value_and_grad(x)
    return float(f), np.asarray(g, dtype=np.float64).reshape(-1)


def _direction(g, pairs):
    """``−H g`` by the two-loop recursion over the kept ``(s, y, ρ)`` pairs."""
    q = g.copy()
    alphas = []
    for s, y, rho in reversed(pairs):
        a = rho * float(s @ q)
        alphas.append(a)
        q -= a * y
    if pairs:
        s, y, _ = pairs[-1]
        q *= float(s @ y) / float(y @ y)
    for (s, y, rho), a in zip(pairs, reversed(alphas)):
        b = rho * float(y @ q)
        q += s * (a - b)
    return -q
