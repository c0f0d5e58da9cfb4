"""What an eager bind works out from its operands' avals alone, cached per signature.

NOTE [eager shape rules are cached per signature]
A shape rule is a pure function of its operands' avals and the params: it reads no value,
no setting and no state (Primitive's docstring says so). An eager bind that needs one runs
it on every call with the same avals: the weak-type decision of ``bind_weak`` (the rule
once, and once more per weak operand: NOTE [eager weak arrays] in cuvmap/core/weak.py) and
the check that the convolution and pooling impls make before their kernels
(``Primitive.check``). Eager ``vmap(grad)`` of the benchmark CNN ran 14 such rules per
call (relu's selects with their Python ``0``, each convolution), several times a bind's
own dispatch each (``python -m benchmarks eager`` counts the calls). Both now look the
result up by the operands' *signature*: per operand, its type and, for a host array (a
``numpy.ndarray``, a WeakArray), its shape and dtype, and the params with each value's
type, those in tuples too (``axis=1``, ``axis=True`` and ``axis=1.0`` are different keys,
though Python finds them equal). That is exactly what the rule sees: a host array's aval
is its shape, dtype, weak type (its type says) and the device ``"cpu"``; a Python scalar's
is its type's. Anything else (a CuPy array, whose aval names its device; a NumPy scalar;
unhashable params) has no signature, and the rule runs as before. A rule that raises
caches nothing, so a bad operand raises its ShapeError on every call. The tables are
bounded (cleared past :data:`LIMIT` entries) and shared by threads (dict reads and writes
are atomic; two threads that miss at once both run the pure rule and store the same
result).
"""
import numpy as np

from cuvmap.core.avals import _PY_SCALAR_DTYPES

LIMIT = 4096


def signature(args, params):
    """The signature of ``args`` and ``params`` (NOTE [eager shape rules are cached per
    signature]), or None where an operand or a param has none."""
    key = []
    for a in args:
        t = type(a)
        if t in _PY_SCALAR_DTYPES:
            key.append(t)
        elif isinstance(a, np.ndarray):
            key.append((t, a.shape, a.dtype))
        else:
            return None
    if params:
        try:
            p = tuple([(k, _typed(v)) for k, v in params.items()])
            hash(p)
        except TypeError:
            return None
        key.append(p)
    return tuple(key)


def _typed(v):
    """``v`` with its type, and the types of the items of tuples (within tuples)."""
    t = type(v)
    if t is tuple:
        types = tuple(map(type, v))
        if tuple in types:
            return t, tuple([_typed(x) for x in v])
        return t, v, types
    return t, v


class RuleCache:
    """A table ``(shape rule, signature) -> result``, bounded by :data:`LIMIT`: keyed by
    the primitive's shape rule itself, so a rule replaced after some binds
    (``prim.shape_rule = ...``) is never answered by its predecessor's results."""

    __slots__ = ("table",)

    def __init__(self):
        self.table = {}

    def get(self, primitive, sig):
        return self.table.get((primitive.shape_rule, sig))

    def put(self, primitive, sig, value):
        table = self.table
        if len(table) >= LIMIT:
            table.clear()
        table[(primitive.shape_rule, sig)] = value
        return value

    def clear(self):
        self.table.clear()
