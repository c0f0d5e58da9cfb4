"""Partial evaluation: a program split into what its known inputs determine and the rest.

For a program ``f(k, u)`` whose inputs ``k`` are known now and ``u`` later, partial
evaluation finds two programs with

    f(k, u) == f_staged(k_read, r, u)   where   (f(k, u)_known, r) = f_known(k)

``f_known`` holds the equations that depend on known inputs only and returns the known
outputs and the *residuals* ``r``: the values of known equations that the rest reads;
``f_staged`` holds the equations that depend on an unknown input, and reads the known
inputs ``k_read`` directly. A policy (JAX's ``partial_eval_jaxpr_custom`` with a saveable
policy) decides for each known equation whose value the staged part reads whether that
value is a residual or is recomputed in the staged part from the known inputs and the
other residuals: ``saveable(prim, *avals, **params) -> bool``.

The one partial evaluator serves:

- reverse mode through a staged program (``grad(jit(f))``): the joint forward-and-backward
  program split with the output cotangents unknown and every residual saved
  (:func:`cuvmap.transforms.vjp.vjp_programs`): ``f_known`` is the forward program,
  ``f_staged`` the backward one;
- ``checkpoint``: the same split with the region's policy (nothing saved by default: the
  backward program recomputes the forward computation from the inputs);
- ``linearize`` of a checkpointed region: the tangents unknown, the policy deciding what
  the linear map keeps;
- control flow's bodies (a scan's known iterations save their residuals as outputs).
"""
import dataclasses

from cuvmap.transforms import ir
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, Var


def everything_saveable(prim, *avals, **params):
    """Keeps every residual: nothing is recomputed."""
    return True


def nothing_saveable(prim, *avals, **params):
    """Keeps nothing but the known inputs: everything else is recomputed."""
    return False


@dataclasses.dataclass(frozen=True, slots=True)
class PartialEval:
    """The result of :func:`partial_eval_jaxpr`.

    ``known``: known inputs -> known outputs, then the ``num_res`` residuals.
    ``staged``: the known inputs listed in ``known_read`` (indices among the known
    inputs), the residuals, then the unknown inputs -> the outputs marked in
    ``out_unknown``."""

    known: ClosedJaxpr
    staged: ClosedJaxpr
    out_unknown: list
    known_read: list
    num_res: int


def split_by_unknown(eqns, unknown_vars):
    """The equations that read (transitively) a variable of ``unknown_vars`` are unknown,
    the others known. An equation with several results is split as a whole (NOTE [an
    equation with several results] in ir.py). Returns ``(known_eqns, unknown_eqns,
    unknown)``, ``unknown`` the set of unknown variables."""
    unknown = set(unknown_vars)
    known_eqns, unknown_eqns = [], []
    for eqn in eqns:
        if any(type(x) is Var and x in unknown for x in eqn.inputs):
            unknown.update(eqn.outs)
            unknown_eqns.append(eqn)
        else:
            known_eqns.append(eqn)
    return known_eqns, unknown_eqns, unknown


def partial_eval_jaxpr(closed, unknown_ins, instantiate=None, saveable=everything_saveable):
    """Splits ``closed`` by partial evaluation (see the module docstring).

    Args:
      closed: the program.
      unknown_ins: for each argument (``closed.jaxpr.invars``), whether it is unknown.
      instantiate: for each output, whether the staged program returns it even when it is
        known (reverse mode: every input cotangent); default none.
      saveable: the policy, ``saveable(prim, *avals, **params) -> bool``.
    Returns:
      a :class:`PartialEval`.
    """
    j = closed.jaxpr
    instantiate = instantiate or [False] * len(j.outvars)
    known_invars = [v for v, u in zip(j.invars, unknown_ins) if not u]
    unknown_invars = [v for v, u in zip(j.invars, unknown_ins) if u]
    known_eqns, unknown_eqns, unknown = split_by_unknown(j.eqns, unknown_invars)
    out_unknown = [inst or (type(v) is Var and v in unknown) for v, inst in zip(j.outvars, instantiate)]
    defined_by = {v: e for e in known_eqns for v in e.outs}

    # walk back from what the staged part reads of the known values, through the known
    # equations the policy does not save (those are recomputed)
    residuals, recompute = [], set()
    seen = set()
    stack = [x for e in unknown_eqns for x in e.inputs]
    stack += [v for v, u in zip(j.outvars, out_unknown) if u]
    stack.reverse()
    while stack:
        v = stack.pop()
        if type(v) is not Var or v in unknown or v in seen:
            continue
        seen.add(v)
        eqn = defined_by.get(v)
        if eqn is None:  # a known input or a constant
            continue
        if saveable(eqn.primitive, *(x.aval for x in eqn.inputs), **eqn.params):
            residuals.append(v)  # only the results the staged part reads
            continue
        recompute.add(eqn)
        stack.extend(reversed(eqn.inputs))
    recompute_eqns = [e for e in known_eqns if e in recompute]

    known = ir.optimize(ClosedJaxpr(
        Jaxpr(j.constvars, known_invars, known_eqns,
              [v for v, u in zip(j.outvars, out_unknown) if not u] + residuals),
        closed.consts))
    body = recompute_eqns + unknown_eqns
    reads = {x for e in body for x in e.inputs if type(x) is Var}
    reads |= {v for v, u in zip(j.outvars, out_unknown) if u and type(v) is Var}
    known_read = [i for i, v in enumerate(known_invars) if v in reads]
    # the residuals enter the staged program as variables of their own (a variable is
    # defined once per program)
    res_vars = [Var(v.aval) for v in residuals]
    rename = dict(zip(residuals, res_vars))

    def sub(x):
        return rename.get(x, x) if type(x) is Var else x

    staged_eqns = [ir.JaxprEqn(e.primitive, [sub(x) for x in e.inputs], e.outs, e.params, e.name_stack) for e in body]
    staged = ir.optimize(ClosedJaxpr(
        Jaxpr(j.constvars, [known_invars[i] for i in known_read] + res_vars + unknown_invars, staged_eqns,
              [sub(v) for v, u in zip(j.outvars, out_unknown) if u]),
        closed.consts))
    return PartialEval(known, staged, out_unknown, known_read, len(residuals))
