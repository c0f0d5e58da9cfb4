"""The staged program: cuvmap's jaxpr.

A :class:`Jaxpr` is a list of equations ``outs = primitive(inputs, **params)`` over
variables, in the order they were traced; its inputs are ``constvars`` (values captured
while tracing: arrays a function closed over, or tracers of transforms outside ``jit``)
then ``invars`` (the arguments), and its ``outvars`` are variables or literals. A
:class:`ClosedJaxpr` pairs a jaxpr with the values of its constvars. The text form is
close to JAX's::

    { lambda a:f32[3]; b:f32[3]. let
        c:f32[3] = mul b a
        d:f32[3] = sin c
      in (d,) }

This module knows no transform: :func:`eval_jaxpr` binds each equation's primitive, so it
runs under whatever transforms own its inputs (that is how ``vmap(jit(f))`` and
``grad(jit(f))`` derive their programs), and the passes (:func:`dce`,
:func:`fold_constants`, :func:`cse`) rewrite programs before they are planned.
"""
import itertools
import math

import numpy as np

from cuvmap import core
from cuvmap.core import bfloat16


class Var:
    """A variable of a jaxpr: its aval, and for the arguments the text that names them in
    errors (``origin``: ``"argument 0 (x)"``)."""

    __slots__ = ("aval", "count", "origin")
    _counter = itertools.count()

    def __init__(self, aval, origin=None):
        self.aval = aval
        self.count = next(Var._counter)
        self.origin = origin

    def __repr__(self):
        return f"Var({self.count}, {self.aval})"


class Literal:
    """A scalar written into an equation: a Python number (``mul b 2.0``, weakly typed) or
    a NumPy 0-d array, such as the cotangent seed of ``grad`` (``mul b 1.0:f32[]``)."""

    __slots__ = ("val", "aval")

    def __init__(self, val):
        self.val = val
        self.aval = core.get_aval(val)

    def __repr__(self):
        if isinstance(self.val, np.ndarray):
            return f"{self.val.item()!r}:{pp_aval(self.aval)}"
        return repr(self.val)

    def key(self):
        """What identifies the literal's value (CSE compares equations by it): its type and
        value, and for floats the sign too (0.0 == -0.0, but ``x * -0.0`` is not ``x * 0.0``)."""
        if isinstance(self.val, np.ndarray):
            kind, value = self.val.dtype, self.val.item()
        else:
            kind, value = type(self.val), self.val
        if isinstance(value, float):
            return (kind, value, math.copysign(1.0, value))
        return (kind, value)


# NOTE [an equation with several results]
# Some equations compute several arrays at once and must stay one equation of the program:
# the call primitives (NOTE [call primitives] in :mod:`cuvmap.transforms.call`) — a
# checkpointed region (inlined, its equations would be indistinguishable from the others,
# so partial evaluation would keep its residuals and CSE would merge the backward pass's
# recomputation with the forward computation), a custom-derivative call (it keeps rules
# that its body does not imply), control flow (its body runs many times, or one branch of
# several). Such an equation's ``outs`` holds one variable per result (an ordinary
# equation's holds one), and its primitive's ``bind`` and impl return a list of that
# length (``multiple_results``, which is what tells the two kinds apart). It
# prints as ``b:f32[3] c:f32[] = checkpoint[...] a``. The passes take the results
# together: ``eval_jaxpr`` binds it once and reads the list; DCE drops the results nobody
# reads where the primitive's ``dce`` can (a program call prunes its program) and keeps
# the equation whole otherwise; CSE merges two identical ones result by result; constant
# folding leaves it alone; partial evaluation (:mod:`cuvmap.transforms.partial_eval`)
# makes all its results unknown when an input is, and recomputes or keeps them together;
# fusion never makes it a member of a kernel; the executor runs it as a ``MULTI`` step,
# ``r5, r6, = f3(r2)``, whose results join the buffer groups of its operands (they may be
# views of them: a function returning its argument).
class JaxprEqn:
    """``outs = primitive(inputs, **params)``: ``outs`` is the list of the result
    variables (JAX's ``outvars``), one for an ordinary primitive, one per result for a
    primitive with several (``primitive.multiple_results``: NOTE [an equation with several
    results]). ``name_stack``: the named scopes it was staged in (NOTE [named scopes] in
    cuvmap/core/tracers.py)."""

    __slots__ = ("primitive", "inputs", "outs", "params", "name_stack")

    def __init__(self, primitive, inputs, outs, params, name_stack=()):
        self.primitive = primitive
        self.inputs = inputs
        self.outs = outs
        self.params = params
        self.name_stack = name_stack

    @property
    def invars(self):
        """JAX's name of ``inputs``: the variables and :class:`Literal` s it reads."""
        return self.inputs

    @property
    def outvars(self):
        """JAX's name of ``outs``: the variables it defines."""
        return self.outs


class Jaxpr:
    __slots__ = ("constvars", "invars", "eqns", "outvars")

    def __init__(self, constvars, invars, eqns, outvars):
        self.constvars = list(constvars)
        self.invars = list(invars)
        self.eqns = list(eqns)
        self.outvars = list(outvars)

    def __str__(self):
        return pp_jaxpr(self)

    def pretty_print(self, *, use_color=False, **options):
        """The text form (JAX's ``Jaxpr.pretty_print``; ``use_color`` and JAX's other
        printing options are accepted and change nothing: the text is never colored)."""
        return pp_jaxpr(self)


class ClosedJaxpr:
    """A jaxpr with the values of its constvars. ``derived`` caches the programs the
    transforms derive from it (batched, JVP, forward/backward), keyed by what they depend
    on; ``plans`` holds the executor's plans, made on the first run (one per jit setting)."""

    __slots__ = ("jaxpr", "consts", "derived", "plans", "__weakref__")

    def __init__(self, jaxpr, consts):
        self.jaxpr = jaxpr
        self.consts = list(consts)
        self.derived = {}
        self.plans = {}

    @property
    def in_avals(self):
        return [v.aval for v in self.jaxpr.invars]

    @property
    def out_avals(self):
        return [v.aval for v in self.jaxpr.outvars]

    # JAX's ClosedJaxpr reads these through to its jaxpr
    @property
    def eqns(self):
        return self.jaxpr.eqns

    @property
    def constvars(self):
        return self.jaxpr.constvars

    @property
    def invars(self):
        return self.jaxpr.invars

    @property
    def outvars(self):
        return self.jaxpr.outvars

    @property
    def literals(self):
        """JAX's name of ``consts``: the values of the constvars."""
        return self.consts

    def pretty_print(self, *, use_color=False, **options):
        """The text form (JAX's ``ClosedJaxpr.pretty_print``; ``use_color`` and JAX's other
        printing options are accepted and change nothing)."""
        return pp_jaxpr(self.jaxpr)

    def __str__(self):
        return pp_jaxpr(self.jaxpr)

    __repr__ = __str__


# ---------------------------------------------------------------------------------------
# Text form
# ---------------------------------------------------------------------------------------

_SHORT_DTYPES = {"float16": "f16", "float32": "f32", "float64": "f64", "bfloat16": "bf16",
                 "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
                 "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
                 "bool": "bool", "complex64": "c64", "complex128": "c128"}


def pp_aval(aval):
    dtype = _SHORT_DTYPES.get(aval.dtype.name, aval.dtype.name)
    weak = "~" if aval.weak_type else ""
    return f"{weak}{dtype}[{','.join(str(d) for d in aval.shape)}]"


def _var_names():
    for n in itertools.count(1):
        for chars in itertools.product("abcdefghijklmnopqrstuvwxyz", repeat=n):
            yield "".join(chars)


def _is_program(v):
    return isinstance(v, (ClosedJaxpr, Jaxpr)) or (
        isinstance(v, tuple) and bool(v) and all(isinstance(p, (ClosedJaxpr, Jaxpr)) for p in v))


def _pp_param(v, context):
    if isinstance(v, np.dtype):
        return v.name
    if isinstance(v, (ClosedJaxpr, Jaxpr)):
        return pp_jaxpr(getattr(v, "jaxpr", v), context)
    if isinstance(v, tuple) and v and all(isinstance(p, (ClosedJaxpr, Jaxpr)) for p in v):  # cond's branches
        return "(\n" + "\n".join("  " + _indent(pp_jaxpr(getattr(p, "jaxpr", p), context), "  ") + ","
                                   for p in v) + "\n)"
    if callable(v) and not isinstance(v, type):  # a checkpoint policy; a custom call's function and rules
        return getattr(v, "__name__", None) or type(v).__name__
    return repr(v)


def _indent(text, prefix):
    """``text`` with every line after the first prefixed (the first follows ``name=``)."""
    return text.replace("\n", "\n" + prefix)


# NOTE [the text form of a program]
# JAX's: ``{ lambda consts; args. let`` then one equation per line, ``outs = prim[params]
# ins``, then ``in (outs) }``; avals as ``f32[3,4]`` (``~`` marks a weak type). An equation
# that holds programs (scan's body, cond's branches, a checkpointed region, a custom rule's
# call) prints its params one per line and each program in full, indented under it, with
# variable names continuing from the outer program's, as JAX prints nested jaxprs; a
# named scope follows an equation as a comment.
def pp_jaxpr(jaxpr, _context=None):
    """The text form of ``jaxpr`` (NOTE [the text form of a program])."""
    names, gen = _context if _context is not None else ({}, _var_names())

    def name(v):
        if isinstance(v, Literal):
            return repr(v)
        if v not in names:
            names[v] = next(gen)
        return names[v]

    def decl(v):
        return f"{name(v)}:{pp_aval(v.aval)}"

    consts = " ".join(decl(v) for v in jaxpr.constvars)
    args = " ".join(decl(v) for v in jaxpr.invars)
    lines = [f"{{ lambda {consts}; {args}. let"]
    for eqn in jaxpr.eqns:
        ins = " ".join(name(x) for x in eqn.inputs)
        outs = " ".join(decl(v) for v in eqn.outs)
        scope = f"  # [{'/'.join(eqn.name_stack)}]" if eqn.name_stack else ""
        if any(_is_program(v) for v in eqn.params.values()):
            lines.append(f"    {outs} = {eqn.primitive.name}[")
            for k, v in eqn.params.items():
                lines.append("      " + _indent(f"{k}={_pp_param(v, (names, gen))}", "      "))
            lines.append(f"    ] {ins}".rstrip() + scope)
            continue
        params = " ".join(f"{k}={_pp_param(v, (names, gen))}" for k, v in eqn.params.items())
        head = eqn.primitive.name + (f"[{params}]" if params else "")
        lines.append(f"    {outs} = {head} {ins}".rstrip() + scope)
    outs = ", ".join(name(v) for v in jaxpr.outvars)
    lines.append(f"  in ({outs}{',' if len(jaxpr.outvars) == 1 else ''}) }}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Evaluation under the active transforms
# ---------------------------------------------------------------------------------------


def eval_jaxpr(jaxpr, consts, args, hook=None):
    """Runs ``jaxpr`` by binding each equation's primitive, so that the transforms owning
    ``consts`` and ``args`` (tracers) process it as they would the traced function.

    ``hook(index, eqn, inputs, out)``, when given, sees each equation's index, its input
    values and its result, and returns the result the program goes on with (ghost
    clipping reads a layer's inputs and adds a zero to its output there: NOTE [ghost
    clipping] in :mod:`cuvmap.dp.ghost`)."""
    env = {}
    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x

    def read(v):
        return v.val if type(v) is Literal else env[v]

    for k, eqn in enumerate(jaxpr.eqns):
        ins = list(map(read, eqn.inputs))
        if eqn.name_stack:  # NOTE [named scopes] in cuvmap/core/tracers.py
            with core.extend_name_stack(eqn.name_stack):
                out = eqn.primitive.bind(*ins, **eqn.params)
        else:
            out = eqn.primitive.bind(*ins, **eqn.params)
        if hook is not None:
            out = hook(k, eqn, ins, out)
        if eqn.primitive.multiple_results:
            env.update(zip(eqn.outs, out))
        else:
            env[eqn.outs[0]] = out
    return [read(v) for v in jaxpr.outvars]


# ---------------------------------------------------------------------------------------
# Passes
# ---------------------------------------------------------------------------------------


def dce(jaxpr):
    """Dead-code elimination: drops the equations whose output no output depends on.
    (Every primitive is pure but the ``effectful`` ones: an equation with effects, its
    own or its programs' (:func:`has_effects`), stays whole; a bounds check's failure only
    matters when its checked index is used.) An equation with several results whose
    primitive has a ``dce`` method (a call primitive: NOTE [call primitives] in
    :mod:`cuvmap.transforms.call`) loses its dead results, and the operands only they
    needed."""
    live = {v for v in jaxpr.outvars if type(v) is Var}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        used = [v in live for v in eqn.outs]
        if not all(used) and has_effects(eqn):  # kept whole: its effect runs
            used = None
        elif not any(used):
            continue
        if (used is not None and eqn.primitive.multiple_results and not all(used)
                and getattr(eqn.primitive, "dce", None) is not None):
            eqn = _prune_results(eqn, used)
        kept.append(eqn)
        live.update(x for x in eqn.inputs if type(x) is Var)
    kept.reverse()
    return Jaxpr(jaxpr.constvars, jaxpr.invars, kept, jaxpr.outvars)


def _prune_results(eqn, used):
    """``eqn`` with only the results marked ``used``, if its primitive can drop the others."""
    pruned = eqn.primitive.dce(eqn.params, used)
    if pruned is None:
        return eqn
    params, used_inputs, kept = pruned
    outs = [v for v, k in zip(eqn.outs, kept) if k]
    inputs = [x for x, u in zip(eqn.inputs, used_inputs) if u]
    return JaxprEqn(eqn.primitive, inputs, outs, params, eqn.name_stack)


def has_effects(eqn):
    """Whether running ``eqn`` does something besides computing its results: its
    primitive is ``effectful`` (a debug callback), or a program among its params (a
    ``cond``'s branch, a loop's body, a call's program) has such an equation. The passes
    keep those equations whole, in order, and never merge or fold them."""
    if eqn.primitive.effectful:
        return True
    if not eqn.primitive.multiple_results:
        return False
    for value in eqn.params.values():
        programs = value if isinstance(value, tuple) else (value,)
        for program in programs:
            program = getattr(program, "program", program)  # (a staged custom-derivative function)
            if isinstance(program, ClosedJaxpr) and _program_has_effects(program):
                return True
    return False


def _program_has_effects(closed):
    hit = closed.derived.get("effects")
    if hit is None:
        hit = closed.derived["effects"] = any(has_effects(e) for e in closed.jaxpr.eqns)
    return hit


def consts_as_inputs(closed):
    """``closed``'s jaxpr with its constants as leading arguments (a call primitive's
    operands are the program's constants, then its arguments)."""
    j = closed.jaxpr
    return Jaxpr([], j.constvars + j.invars, j.eqns, j.outvars)


def hoist_consts(closed):
    """``(program, consts)``: ``closed`` as a program without constants that takes them as
    its leading arguments, and their values (what a call primitive's operands start
    with). A program without constants is returned as it is, its derived programs and
    plans kept."""
    if not closed.consts and not closed.jaxpr.constvars:
        return closed, []
    return ClosedJaxpr(consts_as_inputs(closed), []), list(closed.consts)


def dce_closed(closed, used_outputs):
    """``closed`` with only the outputs marked in ``used_outputs``, its dead equations
    dropped, and the constants and arguments nothing reads any more removed. Returns
    ``(program, used_inputs)``, ``used_inputs`` marking, over the constants then the
    arguments, those it keeps."""
    j = closed.jaxpr
    outvars = [v for v, u in zip(j.outvars, used_outputs) if u]
    pruned = dce(Jaxpr(j.constvars, j.invars, j.eqns, outvars))
    reads = {x for e in pruned.eqns for x in e.inputs if type(x) is Var} | {v for v in outvars if type(v) is Var}
    used_consts = [v in reads for v in j.constvars]
    used_args = [v in reads for v in j.invars]
    program = ClosedJaxpr(
        Jaxpr([v for v, u in zip(j.constvars, used_consts) if u], [v for v, u in zip(j.invars, used_args) if u],
              pruned.eqns, outvars),
        [c for c, u in zip(closed.consts, used_consts) if u])
    return program, used_consts + used_args


def _is_concrete_const(x):
    return not isinstance(x, core.Tracer)


# A folded result is kept only when it is no larger than its inputs (or small): folding
# ``broadcast_in_dim(0.0, (10000, 10000))`` would trade one equation for 800 MB of constant.
_FOLD_MAX_GROWTH_ELEMENTS = 4096


def fold_constants(closed):
    """Constant folding: evaluates (once, now) each equation whose inputs are all concrete
    constants or literals, and makes its result a constant of the program."""
    jaxpr = closed.jaxpr
    known = {v: c for v, c in zip(jaxpr.constvars, closed.consts) if _is_concrete_const(c)}
    new_consts = dict(zip(jaxpr.constvars, closed.consts))
    eqns = []
    for eqn in jaxpr.eqns:
        # only single arrays are folded: an equation with several results (NOTE [an
        # equation with several results]) stays an equation
        # a collective is never folded: its value depends on the other members of its axis
        # (a vmap's examples, other processes), which only a run of the program meets
        if (not eqn.primitive.multiple_results and eqn.primitive.axis_mains is None
                and not eqn.primitive.effectful  # an effect runs with the program, not once now
                and all(type(x) is Literal or x in known for x in eqn.inputs)):
            vals = [x.val if type(x) is Literal else known[x] for x in eqn.inputs]
            in_size = sum(int(np.size(v)) for v in vals)
            out = eqn.outs[0]
            out_size = int(np.prod(out.aval.shape, dtype=np.int64))
            if out_size <= max(in_size, _FOLD_MAX_GROWTH_ELEMENTS):
                try:
                    # the impl, not bind: an outer jit may be tracing, and would stage it
                    value = bfloat16.eqn_impl(eqn)(*vals, **eqn.params)
                    if isinstance(value, np.generic):
                        value = np.asarray(value)
                except Exception:
                    value = None  # it fails when run: leave it in the program, to fail there
                if value is not None:
                    known[out] = value
                    new_consts[out] = value
                    continue
        eqns.append(eqn)
    used = {x for e in eqns for x in e.inputs if type(x) is Var} | {v for v in jaxpr.outvars if type(v) is Var}
    constvars = [v for v in new_consts if v in used]
    folded = Jaxpr(constvars, jaxpr.invars, eqns, jaxpr.outvars)
    return ClosedJaxpr(folded, [new_consts[v] for v in constvars])


def _param_key(params):
    try:
        key = tuple(sorted(params.items()))
        hash(key)
        return key
    except TypeError:
        return None


def cse(jaxpr):
    """Common-subexpression elimination: an equation identical to an earlier one (same
    primitive, params and inputs) reuses the earlier output."""
    rename = {}
    seen = {}
    eqns = []

    def sub(x):
        return rename.get(x, x) if type(x) is Var else x

    for eqn in jaxpr.eqns:
        inputs = [sub(x) for x in eqn.inputs]
        params = None if has_effects(eqn) else _param_key(eqn.params)  # each effect runs
        if params is not None:
            key = (eqn.primitive, params, tuple(
                x if type(x) is Var else x.key() for x in inputs))
            try:
                prev = seen.get(key)
            except TypeError:
                key, prev = None, None
            if prev is not None:
                rename.update(zip(eqn.outs, prev))
                continue
            if key is not None:
                seen[key] = eqn.outs
        eqns.append(JaxprEqn(eqn.primitive, inputs, eqn.outs, eqn.params, eqn.name_stack))
    return Jaxpr(jaxpr.constvars, jaxpr.invars, eqns, [sub(v) for v in jaxpr.outvars])


def optimize(closed):
    """The passes run before a program is planned: CSE, constant folding, DCE."""
    closed = ClosedJaxpr(cse(closed.jaxpr), closed.consts)
    closed = fold_constants(closed)
    jaxpr = dce(closed.jaxpr)
    used = {x for e in jaxpr.eqns for x in e.inputs if type(x) is Var} | {v for v in jaxpr.outvars if type(v) is Var}
    keep = [(v, c) for v, c in zip(jaxpr.constvars, closed.consts) if v in used]
    jaxpr = Jaxpr([v for v, _ in keep], jaxpr.invars, jaxpr.eqns, jaxpr.outvars)
    return ClosedJaxpr(jaxpr, [c for _, c in keep])
