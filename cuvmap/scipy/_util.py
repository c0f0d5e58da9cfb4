"""What cuvmap.scipy's modules share: JAX's promotion of their operands to floats."""
import numpy as np

from cuvmap import core
from cuvmap import numpy as cnp
from cuvmap.core.bfloat16 import kind_of


def promote_inexact(*xs):
    """Lists as arrays, Python numbers as (weakly typed) Python floats, integer and boolean
    arrays as float64 (JAX's ``promote_args_inexact``); one operand in, one out."""
    out = []
    for x in xs:
        if isinstance(x, (bool, int, float)):
            out.append(float(x))
            continue
        if isinstance(x, (list, tuple)):
            x = cnp.asarray(x)
        out.append(x if kind_of(core.dtype_of(x)) in "fc" else cnp.astype(x, np.float64))
    return out if len(out) > 1 else out[0]
