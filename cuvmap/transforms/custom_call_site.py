"""One call of a ``custom_jvp`` / ``custom_vjp`` function (:class:`CallSite`): its arguments
resolved to positions and split into the nondiff ones and the leaves of the others, the
flat function and rules over those leaves, and the checks of what the rules return.

The checks are JAX's (``jax._src.custom_derivatives``: ``_flatten_jvp``, ``_flatten_fwd``,
``_flatten_bwd``), raised with JAX's exception types and key phrases ("Custom JVP rule
foo_jvp for function f must produce a pair ...") and cuvmap's context (the argument, the
output, the shapes): a rule that returns the wrong structure, shapes or dtypes raises where
JAX raises, never computes a wrong number.
"""
import functools
import inspect

from cuvmap import api_util, core, tree
from cuvmap.core import CuvmapError, Tracer
from cuvmap.errors import EscapedTracerError
from cuvmap.transforms.symbolic_zeros import CustomVJPPrimal, SymbolicZero, instantiate, is_zero, tangent_aval


class CustomDerivativeError(CuvmapError, TypeError):
    """A custom-derivative function was misused: a rule that returned the wrong structure
    or shapes, forward mode of a ``custom_vjp`` function, arguments that do not bind to
    its signature (a ``TypeError``, as in JAX)."""


class MissingCustomRuleError(CustomDerivativeError, AttributeError):
    """A ``custom_jvp`` / ``custom_vjp`` function was called before its rule was defined
    (JAX raises ``AttributeError``: "No JVP defined for custom_jvp function f using
    defjvp.")."""


class CustomRuleValueError(CustomDerivativeError, ValueError):
    """A ``custom_vjp`` bwd rule returned a cotangent whose shape or dtype is not its
    argument's (JAX raises ``ValueError`` there)."""


class NondiffTracerError(CustomDerivativeError, EscapedTracerError):
    """A traced value among a ``custom_vjp`` function's ``nondiff_argnums`` (JAX's
    ``UnexpectedTracerError``: nondiff arguments of a custom_vjp function are static)."""


class ClosedOverTracerError(CustomDerivativeError, EscapedTracerError):
    """A custom_jvp / custom_vjp function closes over a traced value of a transform that
    differentiates it (JAX's ``UnexpectedTracerError``)."""


def aval_str(x):
    """JAX's short form of a value's (or an aval's) type: ``float32[4,3]``."""
    aval = x if isinstance(x, core.ShapedArray) else core.get_aval(x)
    return f"{aval.dtype.name}[{','.join(str(d) for d in aval.shape)}]"


def type_tree_str(treedef, leaves):
    """A pytree of short types, as JAX prints it in rule errors: ``(float32[], float32[])``."""
    return str(tree.unflatten(treedef, [aval_str(x) for x in leaves])).replace("'", "")


def resolve_args(obj, args, kwargs):
    """The arguments as positional ones, defaults filled in (JAX's ``resolve_kwargs``):
    the rules take positional tuples."""
    sig = obj.__dict__.get("_signature", False)
    if sig is False:
        try:  # a functools.partial's signature is opaque, as in JAX: its keywords stay its own
            sig = None if isinstance(obj.fun, functools.partial) else inspect.signature(obj.fun)
        except (TypeError, ValueError):
            sig = None
        obj._signature = sig
    if sig is None:
        if kwargs:
            raise CustomDerivativeError(
                f"The input arguments to the {obj.kind}-decorated function {obj.__name__} could not be resolved "
                "to positional-only arguments: keyword arguments need a function with a signature; pass them "
                "positionally") from None
        return args
    head = (f"The input arguments to the {obj.kind}-decorated function {obj.__name__} could not be resolved "
            "to positional-only arguments (the rules take positional arguments). Binding failed with the error:\n")
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as err:
        raise CustomDerivativeError(head + str(err)) from None
    bound.apply_defaults()
    passed = [k for k in bound.kwargs if k in kwargs]  # keyword-only ones left at their defaults are fine
    if passed:
        raise CustomDerivativeError(head + "The following keyword arguments could not be resolved to positions: "
                                    f"{', '.join(passed)}")
    return bound.args


_LEAF = object()  # a placeholder leaf: the structure of the arguments without their values


class CallSite:
    """One call of a custom-derivative function: its arguments split into the nondiff
    ones and the leaves of the others, and the flat function and rules over those leaves.
    The output structure is set by whichever of ``f`` and the rules runs first; the others
    are checked against it."""

    def __init__(self, cfun, kind, args):
        self.cfun = cfun
        self.kind = kind
        self.name = api_util.fun_name(cfun.fun)
        n = len(args)
        nums = []
        for i in cfun.nondiff_argnums:
            if not -n <= i < n:
                raise CustomDerivativeError(
                    f"{kind} function {self.name}: nondiff_argnums {cfun.nondiff_argnums} is out of range for "
                    f"a call with {n} argument(s)")
            nums.append(i % n)
        nums = sorted(set(nums))  # the rules get them in the order of the arguments, as in JAX
        # traced values among the nondiff arguments (custom_jvp only): their leaves become
        # extra operands after the others', whose tangents nothing reads (JAX's
        # stop_gradient of them), so that every transform sees them
        self.nondiff = [args[i] for i in nums]
        self.traced_nondiff = {}  # k (index into nondiff) -> treedef of its leaves
        extra = []
        for k, i in enumerate(nums):
            leaves_i, treedef_i = tree.flatten(args[i])
            leaf = next((x for x in leaves_i if isinstance(x, Tracer)), None)
            if leaf is None:
                continue
            if kind != "custom_jvp":
                raise NondiffTracerError(
                    f"{kind} function {self.name}: {self.describe((i,))} is in nondiff_argnums but "
                    f"is a traced value (shape {leaf.shape}) of {leaf._main.name}; nondiff arguments "
                    "of a custom_vjp function are Python values (callables, ints, flags), as in JAX; pass "
                    "arrays as ordinary arguments (with a zero cotangent if they take no derivative)")
            self.traced_nondiff[k] = treedef_i
            self.nondiff[k] = None
            extra.extend(leaves_i)
        self.positions = [i for i in range(n) if i not in nums]
        dyn = tuple(args[i] for i in self.positions)
        paths, self.leaves, self.in_tree = tree.flatten_with_path(dyn)
        self.num_dyn = len(self.leaves)
        self.leaves = self.leaves + extra
        self.in_paths = [(self.positions[p[0]],) + tuple(p[1:]) for p in paths]
        for path, leaf in zip(self.in_paths, self.leaves):
            if not core.is_value(leaf):
                raise CustomDerivativeError(
                    f"{kind} function {self.name}: {self.describe(path)} is a {type(leaf).__name__}; "
                    "arguments are arrays, Python numbers or pytrees of them; give a "
                    "Python value (a callable, a flag) a position in nondiff_argnums")
        self.in_shapes = [core.shape_of(x) for x in self.leaves[:self.num_dyn]]
        self.in_avals = [tangent_aval(x) for x in self.leaves[:self.num_dyn]]
        # the site lives as long as a tape entry or a staged program that holds its rules:
        # it keeps the nondiff arguments and the structure, not the values (NOTE [what the
        # tape keeps]); the caller takes the leaves
        self.args = tuple(a if i in nums and not isinstance(a, Tracer) else None for i, a in enumerate(args))
        self.nums = nums
        self.out_tree = None
        self.out_shapes = None
        self.out_raw_avals = None
        self.out_types = None
        self.out_avals = None
        self.out_by = None

    def describe(self, path):
        """``argument 1 (y)['w']`` for the leaf at ``(position, *subpath)``."""
        return api_util.describe_arg(self.cfun.fun, (0,) + tuple(path))

    def error(self, message):
        return CustomDerivativeError(f"{self.kind} function {self.name}: {message}")

    def split(self, leaves):
        """The operands as ``(dyn leaves, nondiff arguments)``: the traced nondiff
        arguments rebuilt from their extra operands."""
        leaves = list(leaves)
        nondiff = list(self.nondiff)
        at = self.num_dyn
        for k, treedef in self.traced_nondiff.items():
            nondiff[k] = tree.unflatten(treedef, leaves[at:at + treedef.num_leaves])
            at += treedef.num_leaves
        return leaves[:self.num_dyn], nondiff

    def full_args(self, leaves):
        dyn_leaves, nondiff = self.split(leaves)
        dyn = tree.unflatten(self.in_tree, dyn_leaves)
        full = list(self.args)
        for i, x in zip(self.nums, nondiff):
            full[i] = x
        for i, x in zip(self.positions, dyn):
            full[i] = x
        return full

    def set_out(self, out, by, rule=None):
        """Flattens an output of ``f`` or of a rule (``by`` names which; ``rule``: the
        ``(kind, rule function)`` of a JVP / fwd rule's primal output) and checks it against
        the others' (JAX's checks in ``_flatten_jvp`` / ``_flatten_fwd``)."""
        paths, leaves, out_tree = tree.flatten_with_path(out)
        for path, leaf in zip(paths, leaves):
            if not core.is_value(leaf):
                raise self.error(f"{by} returned a {type(leaf).__name__} as {api_util.describe_out(path)}; "
                                 "outputs are arrays, Python numbers or pytrees of them")
        shapes = [core.shape_of(x) for x in leaves]
        if self.out_tree is None:
            self.out_tree, self.out_shapes, self.out_by = out_tree, shapes, by
            self.out_avals = [tangent_aval(x) for x in leaves]
            self.out_raw_avals = [core.get_aval(x) for x in leaves]
            self.out_types = [aval_str(x) for x in leaves]
            return leaves, paths
        same_types = shapes == self.out_shapes and all(
            _dtypes_match(x, a) for x, a in zip(leaves, self.out_raw_avals))
        if out_tree == self.out_tree and same_types:
            return leaves, paths
        if rule is not None and self.out_by == self.name:  # the function ran first: JAX's check of the rule
            raise CustomDerivativeError(self.rule_primal_mismatch(rule, out_tree, leaves, paths, out_tree == self.out_tree))
        if out_tree != self.out_tree:
            raise self.error(f"{by} returned an output of structure {out_tree}, but {self.out_by} "
                             f"returned {self.out_tree}; they must agree")
        j = next(k for k, (x, a) in enumerate(zip(leaves, self.out_raw_avals))
                 if core.shape_of(x) != a.shape or not _dtypes_match(x, a))
        raise self.error(f"{by} returned {api_util.describe_out(paths[j])} of type {aval_str(leaves[j])}, "
                         f"but {self.out_by} returned {self.out_types[j]}; they must agree")

    def rule_primal_mismatch(self, rule, out_tree, leaves, paths, same_structure):
        """JAX's message for a JVP / fwd rule whose primal output is not the function's."""
        kind, fn = rule
        if kind == "jvp":
            head = (f"Custom JVP rule {api_util.fun_name(fn)} for function {self.name} must produce a pair (list or "
                    "tuple of length two) where the first element represents the primal output (equal in value to "
                    f"the output of the custom_jvp-decorated function {self.name}, and in particular ")
            head += "of the same container/pytree structure)" if not same_structure else \
                "with leaves of the same shape/dtype)"
            first = "the JVP rule output's first element"
        else:
            head = (f"Custom VJP fwd rule {api_util.fun_name(fn)} for function {self.name} must produce a pair (list "
                    "or tuple of length two) where the first element represents the primal output (equal to the "
                    f"output of the custom_vjp-decorated function {self.name}) and the second element represents "
                    "residuals (i.e. values stored from the forward pass for use on the backward pass)")
            first = "the fwd rule output's first element"
        what = "container/pytree structure:" if not same_structure else "shapes/dtypes of:"
        msg = (f"{head}, but instead {first} had {what}\n    {type_tree_str(out_tree, leaves)}\n"
               f"while the {self.kind}-decorated function {self.name} had output {what}\n"
               f"    {str(tree.unflatten(self.out_tree, self.out_types)).replace(chr(39), '')}.")
        if same_structure:
            j = next(k for k, (x, a) in enumerate(zip(leaves, self.out_raw_avals))
                     if core.shape_of(x) != a.shape or not _dtypes_match(x, a))
            rule_out = "fwd" if kind == "fwd" else "JVP rule primal"
            msg += (f"\nThe first mismatch: at {tree.keystr(paths[j]) or 'the output'}, got {rule_out} output type "
                    f"{aval_str(leaves[j])} which doesn't match primal output type {self.out_types[j]}.")
        return msg

    # -- the flat function and rules (the params of the call primitives) ----------------

    def flat_fun(self):
        def fun(*leaves):
            out_leaves, _ = self.set_out(self.cfun.fun(*self.full_args(leaves)), f"{self.name}")
            return out_leaves

        fun.__name__ = self.name
        return fun

    def _rule(self, attr, define):
        rule = getattr(self.cfun, attr)
        if rule is None:
            raise self.error(f"it is differentiated, but it has no {attr} rule: define one with "
                             f"{self.name}.{define} before differentiating it")
        return rule

    def flat_jvp(self):
        def jvp(primals, tangents):
            """``(primal_out, tangent_out)`` leaves; ``None`` in ``tangents`` and in the
            result: a zero tangent (NOTE [symbolic zeros in custom rules])."""
            rule = self._rule("jvp", "defjvp(rule)")
            rule_name = api_util.fun_name(rule)
            primals, nondiff = self.split(primals)
            tangents = list(tangents)[:self.num_dyn]  # the traced nondiff arguments take none
            if self.cfun.symbolic_zeros:
                tangents = [SymbolicZero(tangent_aval(p)) if t is None else t for p, t in zip(primals, tangents)]
            else:
                tangents = [instantiate(t, p) for p, t in zip(primals, tangents)]
            p_args = tuple(tree.unflatten(self.in_tree, primals))
            t_args = tuple(tree.unflatten(self.in_tree, tangents))
            result = rule(*nondiff, p_args, t_args)
            if not (isinstance(result, (tuple, list)) and len(result) == 2):
                raise CustomDerivativeError(f"Custom JVP rule {rule_name} for function {self.name} must produce a pair (list "
                                 "or tuple of length two) representing primal and tangent outputs, but got "
                                 f"{result}.")
            primal_out, tangent_out = result
            p_leaves, paths = self.set_out(primal_out, "the JVP rule's primal_out", rule=("jvp", rule))
            try:
                t_leaves = tree.broadcast_prefix(tangent_out, primal_out, lambda x: is_zero(x) or core.is_value(x))
            except (tree.PrefixError, ValueError, TypeError):
                raise CustomDerivativeError(f"Custom JVP rule {rule_name} for function {self.name} must produce primal and "
                                 "tangent outputs with equal container (pytree) structures, but got "
                                 f"{tree.structure(primal_out)} and {tree.structure(tangent_out)} "
                                 "respectively.") from None
            bad = []
            for path, p, t in zip(paths, p_leaves, t_leaves):
                if t is None or (is_zero(t) and not isinstance(t, SymbolicZero)):
                    continue
                t_aval = t.aval if isinstance(t, SymbolicZero) else core.get_aval(t) if core.is_value(t) else None
                if t_aval is None or t_aval.shape != core.shape_of(p) or (
                        core.is_float(p) and not _dtypes_match(t_aval, core.get_aval(p))):
                    got = aval_str(t_aval) if t_aval is not None else f"a {type(t).__name__}"
                    bad.append((path, p, got))
            if bad:
                if len(p_leaves) == 1:
                    (_, p, got), = bad
                    msg = ("Custom JVP rule must produce primal and tangent outputs with corresponding shapes and "
                           f"dtypes. Expected {aval_str(p)} (tangent type of {aval_str(p)}) but got {got}.")
                else:
                    msg = ("Custom JVP rule must produce primal and tangent outputs with corresponding shapes and "
                           "dtypes, but got:\n" + "\n".join(
                               f"  primal {aval_str(p)} with tangent {got}, expecting tangent {aval_str(p)} "
                               f"({api_util.describe_out(path)})" for path, p, got in bad))
                raise CustomDerivativeError(f"{msg} (the JVP rule {rule_name} of {self.name})")
            return p_leaves, [None if is_zero(t) else t for t in t_leaves]

        jvp.__name__ = f"{self.name}_jvp"
        return jvp

    def flat_fwd(self):
        def fwd(*leaves, perturbed=None):
            """``(out leaves, residuals)``; ``perturbed``: which operands' cotangents the
            caller wants (all when not given), for ``symbolic_zeros``."""
            rule = self._rule("fwd", "defvjp(fwd, bwd)")
            if self.cfun.symbolic_zeros:
                wanted = [True] * len(leaves) if perturbed is None else perturbed
                leaves = [CustomVJPPrimal(x, bool(w)) for x, w in zip(leaves, wanted)]
            result = rule(*self.full_args(leaves))
            if not (isinstance(result, (tuple, list)) and len(result) == 2):
                fwd_name = api_util.fun_name(rule)
                raise CustomDerivativeError(
                    f"Custom VJP fwd rule {fwd_name} for function {self.name} must produce a pair (list or tuple "
                    "of length two) where the first element represents the primal output (equal to those of the "
                    f"custom_vjp-decorated function {self.name}) and the second element represents residuals "
                    "(i.e. values stored from the forward pass for use on the backward pass), but instead of a "
                    f"pair the fwd rule {fwd_name} produced {result}.")
            out, residuals = result
            out_leaves, _ = self.set_out(out, "fwd", rule=("fwd", rule))
            return out_leaves, residuals

        fwd.__name__ = f"{self.name}_fwd"
        fwd.optimize_remat = self.cfun.optimize_remat  # (reverse mode then takes f's outputs: JAX's)
        return fwd

    def flat_bwd(self):
        def bwd(residuals, ct_leaves):
            """The input cotangents' leaves (``None``: zero) from the output cotangents'
            (``None``: zero; NOTE [symbolic zeros in custom rules])."""
            rule = self._rule("bwd", "defvjp(fwd, bwd)")
            if self.cfun.symbolic_zeros:
                ct_leaves = [SymbolicZero(a) if c is None else c for c, a in zip(ct_leaves, self.out_avals)]
            else:
                ct_leaves = [core.zeros_like_aval(a) if c is None else c for c, a in zip(ct_leaves, self.out_avals)]
            ct = tree.unflatten(self.out_tree, list(ct_leaves))
            cts = rule(*self.nondiff, residuals, ct)
            head = f"Custom VJP bwd rule {api_util.fun_name(rule)} for function {self.name} must produce"
            names = ", ".join(self.describe((i,)) for i in self.positions)
            if not isinstance(cts, (tuple, list)):
                raise CustomDerivativeError(f"{head} a tuple with one cotangent per differentiable argument ({names}), but got "
                                 f"{tree.describe(cts)}")
            if len(cts) != len(self.positions):
                raise CustomDerivativeError(f"{head} a tuple of length equal to the number of differentiable arguments of the "
                                 f"primal function, {len(self.positions)} ({names}), but got length {len(cts)}; "
                                 "return one per argument not in nondiff_argnums (None for a zero one)")
            flat = []
            dyn = tree.unflatten(self.in_tree, [_LEAF] * len(self.in_shapes))
            for k, (c, arg) in enumerate(zip(cts, dyn)):
                try:
                    flat.extend(tree.broadcast_prefix(c, arg, lambda x: is_zero(x) or core.is_value(x) or x is _LEAF))
                except tree.PrefixError as err:
                    raise CustomDerivativeError(f"{head} an output with the same container (pytree) structure as the args "
                                     "tuple of the primal function, but the cotangent for "
                                     f"{self.describe((self.positions[k],) + err.path)} does not match the "
                                     f"argument's structure: {err.reason}") from None
            for path, c, leaf_aval in zip(self.in_paths, flat, self.in_avals):
                if c is None or (is_zero(c) and not isinstance(c, SymbolicZero)):
                    continue
                c_aval = c.aval if isinstance(c, SymbolicZero) else core.get_aval(c)
                if c_aval.shape == leaf_aval.shape:
                    continue
                where = f"at output{tree.keystr(path)}"
                if isinstance(c, SymbolicZero):
                    raise CustomRuleValueError(
                        f"{self.kind} function {self.name}: Custom VJP bwd rule produced a SymbolicZero with a "
                        "shape/dtype that does not match the corresponding input tangent shape/dtype: "
                        f"{where} the SymbolicZero had shape/dtype {aval_str(c_aval)} while the corresponding input "
                        f"({self.describe(path)}) had shape/dtype {aval_str(leaf_aval)}. Consider just returning a "
                        "None here instead of a SymbolicZero object.")
                raise CustomRuleValueError(
                    f"{self.kind} function {self.name}: {where} the bwd rule attached to {self.name} "
                    f"({api_util.fun_name(rule)}) produced an output of type {aval_str(c_aval)} which doesn't match "
                    f"expected type {aval_str(leaf_aval)}, the type of {self.describe(path)}")
            return [None if is_zero(c) else c for c in flat]

        bwd.__name__ = f"{self.name}_bwd"
        return bwd


def _dtypes_match(x, aval):
    """Whether value ``x`` has ``aval``'s dtype (JAX's ``typematch``); a weakly typed
    side (a Python scalar) matches any dtype of its kind's promotion."""
    x_aval = x if isinstance(x, core.ShapedArray) else core.get_aval(x)
    return x_aval.weak_type or aval.weak_type or x_aval.dtype == aval.dtype
