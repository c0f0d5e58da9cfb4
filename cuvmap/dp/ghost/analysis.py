"""Reading the per-example program: each parameter's uses (a rule of
:data:`~cuvmap.dp.ghost.rules.RULES` at the end of a chain of norm-preserving views), and
the taps, the equations whose inputs and output cotangent the rules read (NOTE [ghost
clipping] in :mod:`cuvmap.dp.ghost`)."""
import numpy as np

from cuvmap import core, lax
from cuvmap.dp.ghost import conv_rules, rules  # noqa: F401  (conv_rules registers the convolutions' rules)
from cuvmap.dp.ghost.rules import shift
from cuvmap.lax import elementwise
from cuvmap.lax import shape as shape_ops
from cuvmap.transforms import ir
from cuvmap.core.bfloat16 import kind_of

# ---------------------------------------------------------------------------------------
# Views: norm-preserving maps from a parameter to the value a rule reads
# ---------------------------------------------------------------------------------------

#: ``{primitive: view class}``: the one-operand equations a parameter's use is followed through
VIEWS = {}


def view(*primitives):
    """Class decorator: a view for each of ``primitives``."""

    def register(cls):
        for p in primitives:
            VIEWS[p] = cls
        return cls

    return register


class View:
    """A view rule: ``applies(eqn)`` says whether the equation is one (the table's key
    matched), ``pull_back(eqn, ct, lead)`` maps the cotangent of its output to that of its
    operand (``lead``: the shape of leading batch dims of ``ct``)."""

    @staticmethod
    def applies(eqn):
        return True


@view(shape_ops.reshape_p, shape_ops.squeeze_p, shape_ops.expand_dims_p)
class Reshape(View):
    """A reshape, squeeze or expand_dims: the cotangent is reshaped back."""

    @staticmethod
    def pull_back(eqn, ct, lead):
        return lax.reshape(ct, lead + eqn.inputs[0].aval.shape)


@view(shape_ops.transpose_p)
class Transpose(View):
    """A transpose: the cotangent takes the inverse permutation."""

    @staticmethod
    def pull_back(eqn, ct, lead):
        inverse = tuple(int(i) for i in np.argsort(eqn.params["permutation"]))
        return lax.transpose(ct, tuple(range(len(lead))) + shift(inverse, len(lead)))


@view(elementwise.convert_element_type_p)
class FloatConversion(View):
    """A conversion between floating dtypes: the cotangent is converted back."""

    @staticmethod
    def applies(eqn):
        return eqn.inputs[0].kind_of(aval.dtype) == "f" and eqn.outs[0].kind_of(aval.dtype) == "f"

    @staticmethod
    def pull_back(eqn, ct, lead):
        return lax.convert_element_type(ct, eqn.inputs[0].aval.dtype)


def view_of(eqn):
    """The view class of ``eqn`` when it is a norm-preserving view of its one operand."""
    if len(eqn.inputs) != 1 or eqn.primitive.multiple_results:
        return None
    cls = VIEWS.get(eqn.primitive)
    return cls if cls is not None and cls.applies(eqn) else None


def pull_back(chain, ct, batched):
    """The cotangent of a parameter from that of its view at the end of ``chain`` (each view
    is linear and its transpose undoes it); ``batched``: ``ct`` has a leading batch dim."""
    lead = tuple(core.shape_of(ct)[:1]) if batched else ()
    for eqn in reversed(chain):
        ct = view_of(eqn).pull_back(eqn, ct, lead)
    return ct


# ---------------------------------------------------------------------------------------
# Uses
# ---------------------------------------------------------------------------------------


class Param:
    """How one parameter leaf is differentiated: ``uses`` (pairs of a rule and the chain of
    view equations from the parameter to the used value), ``fallback`` (used any other way:
    NOTE [ghost clipping]), or neither (unused)."""

    __slots__ = ("uses", "fallback")

    def __init__(self):
        self.uses = []
        self.fallback = False


class _Other(Exception):
    """A use no rule reads (the parameter falls back)."""


def _collect_uses(var, chain, consumers, jaxpr, outvars):
    uses = []
    if var in outvars:
        raise _Other
    for eqn_index, operand in consumers.get(var, ()):
        eqn = jaxpr.eqns[eqn_index]
        if sum(1 for x in eqn.inputs if x is var) > 1:
            raise _Other
        if view_of(eqn) is not None:
            uses += _collect_uses(eqn.outs[0], chain + (eqn,), consumers, jaxpr, outvars)
            continue
        cls = rules.rule_for(eqn, operand)
        if cls is None:
            raise _Other
        uses.append((cls(eqn_index, eqn, operand), chain))
    return uses


def consumers_of(jaxpr):
    """``{var: [(equation index, operand index)]}``: where each variable is read."""
    consumers = {}
    for k, eqn in enumerate(jaxpr.eqns):
        for i, x in enumerate(eqn.inputs):
            if type(x) is ir.Var:
                consumers.setdefault(x, []).append((k, i))
    return consumers


def analyse(jaxpr, num_params, consumers):
    """A :class:`Param` for each of the program's first ``num_params`` inputs."""
    outvars = {v for v in jaxpr.outvars if type(v) is ir.Var}
    plans = []
    for var in jaxpr.invars[:num_params]:
        plan = Param()
        try:
            plan.uses = _collect_uses(var, (), consumers, jaxpr, outvars)
        except _Other:
            plan.fallback = True
        plans.append(plan)
    return plans


# ---------------------------------------------------------------------------------------
# Taps
# ---------------------------------------------------------------------------------------


class Tap:
    """An equation with recognised uses (``layers``). ``operands``: the operands its layers
    read; ``from_batch``: those that are a batch argument or a reshape of one, ``{operand:
    (batch leaf, per-example shape)}``, read from the batch itself instead of being kept;
    ``z``: the index of the zero added to its output, or None where its output's cotangent
    is another tap's (``ct_from``, the equation whose z gives it)."""

    __slots__ = ("layers", "operands", "from_batch", "z", "ct_from")

    def __init__(self):
        self.layers = []
        self.operands = []
        self.from_batch = {}
        self.z = None
        self.ct_from = None


def taps_of(jaxpr, params, consumers, num_params, num_batched):
    """``{equation index: Tap}`` in program order, for the uses of the parameters that do
    not fall back; inputs ``num_params`` to ``num_params + num_batched`` are the batch's."""
    taps = {}
    for plan in params:
        for layer, _ in ([] if plan.fallback else plan.uses):
            tap = taps.setdefault(layer.eqn_index, Tap())
            tap.layers.append(layer)
            tap.operands.extend(i for i in layer.needs if i not in tap.operands)
    taps = dict(sorted(taps.items()))
    _link_taps(jaxpr, taps, consumers, num_params, num_batched)
    return taps


def _link_taps(jaxpr, taps, consumers, num_params, num_batched):
    """Fills in the taps' ``from_batch``, ``ct_from`` and ``z``.

    A layer whose output feeds nothing but a rule with a ``flow`` operand (a bias added to
    it: ``y = a ⋆ W``, then ``y + b``) has the cotangent of that rule's output, so it reads
    the bias tap's: one z and one cotangent for both (NOTE [ghost clipping])."""
    batch_view = {v: j for j, v in enumerate(jaxpr.invars[num_params:num_params + num_batched])}
    for eqn in jaxpr.eqns:
        if eqn.inputs and eqn.inputs[0] in batch_view and view_of(eqn) is Reshape:
            batch_view[eqn.outs[0]] = batch_view[eqn.inputs[0]]
    outvars = {v for v in jaxpr.outvars if type(v) is ir.Var}
    flows = {k: tap.layers[0].flow for k, tap in taps.items()
             if len(tap.layers) == 1 and tap.layers[0].flow is not None}
    num_zs = 0
    for k, tap in taps.items():
        eqn = jaxpr.eqns[k]
        for i in tap.operands:
            x = eqn.inputs[i]
            if type(x) is ir.Var and x in batch_view:
                tap.from_batch[i] = (batch_view[x], x.aval.shape)
        target = k
        while True:
            out = jaxpr.eqns[target].outs[0]
            users = consumers.get(out, [])
            if out in outvars or len(users) != 1 or flows.get(users[0][0]) != users[0][1]:
                break
            target = users[0][0]
        tap.ct_from = target
    for k, tap in taps.items():
        if tap.ct_from == k:
            tap.z = num_zs
            num_zs += 1
