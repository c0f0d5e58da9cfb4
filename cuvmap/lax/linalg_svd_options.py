"""JAX's options of ``jax.lax.linalg.svd`` that choose how, and how much of, the SVD is
computed: ``SvdAlgorithm`` (checked, then served by cuvmap's one driver: NOTE [one SVD
driver]) and ``subset_by_index`` (a range of the singular triplets, sliced from the full
decomposition)."""
import enum
import operator

from cuvmap.core import ShapeError


class SvdAlgorithm(enum.Enum):
    """JAX's ``jax.lax.linalg.SvdAlgorithm``: ``DEFAULT``, ``QR``, ``JACOBI``, ``POLAR``,
    ``DIVIDE_AND_CONQUER``. Every one gives the same decomposition up to rounding (NOTE
    [one SVD driver])."""
    DEFAULT = "default"
    QR = "QR"
    JACOBI = "Jacobi"
    POLAR = "polar"
    DIVIDE_AND_CONQUER = "divide_and_conquer"


# NOTE [one SVD driver]
# JAX lets ``algorithm`` pick the backend routine (LAPACK's gesvd (QR) or gesdd (divide and
# conquer), cuSOLVER's Jacobi, the TPU's polar/QDWH). They compute the same U, s, Vh up to
# rounding and the sign (or, for repeated values, rotation) freedom of the singular vectors.
# cuvmap has one driver per backend (NumPy's gesdd, cuSOLVER's gesvd): the option is
# validated (a misspelt algorithm raises) and then served by that driver.


def check_algorithm(algorithm):
    """``algorithm`` as a :class:`SvdAlgorithm` (or ``None``); its value spelled as a string
    is accepted too; anything else raises ``TypeError`` naming the choices."""
    if algorithm is None or isinstance(algorithm, SvdAlgorithm):
        return algorithm
    try:
        return SvdAlgorithm(algorithm)
    except ValueError:
        names = ", ".join(f"SvdAlgorithm.{a.name}" for a in SvdAlgorithm)
        raise TypeError(f"svd: algorithm must be None or one of {names}, got {algorithm!r}") from None


def check_subset(subset_by_index, shape, full_matrices):
    """``subset_by_index`` as ``(start, end)`` with ``0 ≤ start ≤ end ≤ min(m, n)``, or
    ``None`` where it asks for every singular triplet. It cannot go with
    ``full_matrices=True`` unless it is the whole range (JAX's rule)."""
    if subset_by_index is None:
        return None
    k = min(shape[-2:])
    try:
        start, end = (operator.index(i) for i in subset_by_index)
    except (TypeError, ValueError):
        raise ShapeError(f"svd: subset_by_index must be a pair of ints (start, end), got {subset_by_index!r}") from None
    if not 0 <= start <= end <= k:
        raise ShapeError(f"svd: subset_by_index {(start, end)} is out of range for a matrix of shape {tuple(shape[-2:])}"
                         f" (needs 0 <= start <= end <= {k})")
    if (start, end) == (0, k):
        return None
    if full_matrices:
        raise ValueError("svd: full_matrices and subset_by_index cannot both be set")
    return start, end
