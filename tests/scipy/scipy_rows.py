"""What the scipy name tables share (tests/scipy/test_special.py, test_bessel_betainc.py,
test_stats_distributions.py): a row of the table and the checks every row gets — the value
against its reference, and vmap over all arguments and over each one alone."""
from dataclasses import dataclass

import numpy as np

from cuvmap.test_util import check_batching


@dataclass
class Row:
    name: str
    fun: object
    ref: object
    args: tuple  # float64 operands
    argnums: tuple = None  # the arguments differentiated (None: every one)
    rtol: float = 1e-13
    atol: float = 1e-15
    grad: bool = True
    grad_tol: float = 1e-5
    order: int = 2


def check_value(row):
    np.testing.assert_allclose(row.fun(*row.args), row.ref(*row.args), rtol=row.rtol, atol=row.atol,
                               err_msg=row.name)


def check_vmap_over_each_argument(row, batched):
    """vmap over every argument at once (``batched``: each argument stacked three times),
    then over each one alone, the others whole."""
    check_batching(row.fun, batched, in_axes=0, atol=1e-12, rtol=1e-12)
    for i in range(len(row.args)):
        args = tuple(batched[j] if j == i else row.args[j] for j in range(len(row.args)))
        axes = tuple(0 if j == i else None for j in range(len(row.args)))
        check_batching(row.fun, args, in_axes=axes, atol=1e-12, rtol=1e-12)
