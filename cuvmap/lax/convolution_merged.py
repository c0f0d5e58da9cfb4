"""``conv_backward``: a convolution's input, weight and bias gradients of one output
gradient as one equation with several results, made by the plan only (NOTE [a
convolution's gradients merged for the plan]; NOTE [equations merged for the plan] in
cuvmap/transforms/executor/merges.py) and run in one call (NOTE [the gradients of one
output gradient in one call] in cuvmap/lax/conv_strategy.py).
"""
from cuvmap import core
from cuvmap.core import Primitive, ShapedArray
from cuvmap.lax.conv_strategy import run_backward
from cuvmap.lax.convolution import (
    _conv_backward_input_batch, _conv_backward_input_shape_rule, _conv_backward_weight_batch,
    _conv_backward_weight_shape_rule, _conv_workspace, channels_last_fact, conv_backward_input_p, conv_backward_weight_p,
)
from cuvmap.lax.reduction import reduce_sum_p
from cuvmap.transforms import batching, ir
from cuvmap.transforms.batching import not_mapped
from cuvmap.transforms.executor import merges


def _bias_axes(ndim):
    """The axes a bias's cotangent sums: every dim of ``N C S...`` but the channels."""
    return (0,) + tuple(range(2, ndim))


def _conv_backward_split(operands, input_shape, weight_shape):
    """``(g, w, x)`` of ``conv_backward``'s operands (``w``, ``x`` None when not there)."""
    g, rest = operands[0], list(operands[1:])
    w = rest.pop(0) if input_shape is not None else None
    x = rest.pop(0) if weight_shape is not None else None
    return g, w, x


def _conv_backward_shape_rule(*operands, input_shape, weight_shape, bias, **params):
    g, w, x = _conv_backward_split(operands, input_shape, weight_shape)
    outs = []
    if w is not None:
        outs.append(_conv_backward_input_shape_rule(g, w, input_shape=input_shape, **params))
    if x is not None:
        outs.append(_conv_backward_weight_shape_rule(g, x, weight_shape=weight_shape, **params))
    if bias:
        outs.append(ShapedArray((g.shape[1],), g.dtype))
    return outs


def _conv_backward_impl(*operands, input_shape, weight_shape, bias, stride, padding, dilation, transposed,
                        output_padding, groups):
    g, w, x = _conv_backward_split(operands, input_shape, weight_shape)
    dx, dw, db = run_backward(
        g, x=x, w=w, input_shape=input_shape, weight_shape=weight_shape, bias=bias,
        bias_sum=lambda g: reduce_sum_p.impl(g, axes=_bias_axes(g.ndim)),
        stride=stride, padding=padding, dilation=dilation, groups=groups)
    return [out for out in (dx, dw, db) if out is not None]


def _conv_backward_workspace(in_avals, out_avals, params, strided):
    """The larger of its kernels' workspaces (they run one after the other)."""
    conv = {k: params[k] for k in ("stride", "padding", "dilation", "transposed", "output_padding", "groups")}
    g, w, x = _conv_backward_split(in_avals, params["input_shape"], params["weight_shape"])
    outs, sizes = list(out_avals), [0]
    if params["input_shape"] is not None:
        sizes.append(_conv_workspace([g, w], [outs.pop(0)], dict(conv, input_shape=params["input_shape"]), strided))
    if params["weight_shape"] is not None:
        sizes.append(_conv_workspace([g, x], [outs.pop(0)], dict(conv, weight_shape=params["weight_shape"]),
                                     strided))
    return max(sizes)


def _conv_backward_batch(axis_size, vals, dims, *, input_shape, weight_shape, bias, **params):
    """Each result batched by its own primitive's rule (a planned program is not batched
    again; the rule keeps the primitive whole under any transform that does)."""
    (g, w, x), (g_b, w_b, x_b) = (_conv_backward_split(vals, input_shape, weight_shape),
                                  _conv_backward_split(dims, input_shape, weight_shape))
    parts = []
    if w is not None:
        parts.append((conv_backward_input_p, _conv_backward_input_batch, (g, w), (g_b, w_b),
                      dict(params, input_shape=input_shape)))
    if x is not None:
        parts.append((conv_backward_weight_p, _conv_backward_weight_batch, (g, x), (g_b, x_b),
                      dict(params, weight_shape=weight_shape)))
    if bias:
        parts.append((reduce_sum_p, batching.primitive_batchers[reduce_sum_p], (g,), (g_b,),
                      dict(axes=_bias_axes(len(core.shape_of(g)) - (g_b is not not_mapped)))))
    outs, out_dims = [], []
    for primitive, rule, part_vals, part_dims, part_params in parts:
        if all(d is not_mapped for d in part_dims):   # (a part none of whose operands is batched)
            out, d = primitive.bind(*part_vals, **part_params), not_mapped
        else:
            out, d = rule(axis_size, part_vals, part_dims, **part_params)
        outs.append(out), out_dims.append(d)
    return outs, out_dims


conv_backward_p = Primitive("conv_backward", differentiable=False, owns_output=True,
                            workspace=_conv_backward_workspace)
conv_backward_p.multiple_results = True
conv_backward_p.impl = _conv_backward_impl
conv_backward_p.shape_rule = _conv_backward_shape_rule
batching.primitive_batchers[conv_backward_p] = _conv_backward_batch
# reads g and x (the operand after w when the input gradient is asked) in either layout,
# writes the input gradient (its first result) channels-last when asked
conv_backward_p.channels_last = channels_last_fact(
    conv_backward_p,
    lambda params: (0,) + ((1 + (params["input_shape"] is not None),) if params["weight_shape"] is not None else ()),
    lambda params: (0,) if params["input_shape"] is not None else ())


# NOTE [a convolution's gradients merged for the plan]
# ``conv_backward(g, [w], [x], input_shape, weight_shape, bias, ...)`` is the input
# gradient ``conv_backward_input(g, w)`` (when ``input_shape`` is given), the weight
# gradient ``conv_backward_weight(g, x)`` (when ``weight_shape`` is) and the bias gradient
# ``reduce_sum(g, (0, 2, ...))`` (when ``bias``), in that order: the equations a planned
# program holds side by side after ``grad`` of ``conv(x, w) + b``, merged by the rule
# below (NOTE [equations merged for the plan] in cuvmap/transforms/executor/merges.py) and
# run in one call (NOTE [the gradients of one output gradient in one call] in
# cuvmap/lax/conv_strategy.py): the transforms never see it (it has no derivative rules;
# its batching rule batches each part). The rule merges the regular (not transposed)
# members with the same parameters whose first operand is the same ``g``: at least two
# of them, the bias sum only beside a weight gradient (oneDNN sums it in that pass). On
# oneDNN the bias gradient is summed in oneDNN's order (it agrees with NumPy's pairwise
# sum to float32 rounding); anywhere else each part is computed as before.
_CONV_PARAMS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def _merge_conv_backward(eqns):
    found = {}   # conv params -> {"input": eqn, "weight": eqn}
    sums = []
    for e in eqns:
        if e.primitive in (conv_backward_input_p, conv_backward_weight_p) and not e.params["transposed"]:
            slot = "input" if e.primitive is conv_backward_input_p else "weight"
            params = tuple((k, e.params[k]) for k in _CONV_PARAMS)
            found.setdefault(params, {}).setdefault(slot, e)
        elif e.primitive is reduce_sum_p and len(e.inputs[0].aval.shape) >= 3 \
                and e.params["axes"] == _bias_axes(len(e.inputs[0].aval.shape)):
            sums.append(e)
    merged = []
    for params, members in found.items():
        weight, inputs = members.get("weight"), members.get("input")
        bias = sums.pop(0) if weight is not None and sums else None
        group = [e for e in (inputs, weight, bias) if e is not None]
        if len(group) < 2:
            continue
        g = group[0].inputs[0]
        operands = [g] + ([inputs.inputs[1]] if inputs else []) + ([weight.inputs[1]] if weight else [])
        outs = [e.outs[0] for e in group]
        merged.append((group, ir.JaxprEqn(
            conv_backward_p, operands, outs,
            dict(dict(params), input_shape=inputs.params["input_shape"] if inputs else None,
                 weight_shape=weight.params["weight_shape"] if weight else None, bias=bias is not None),
            group[0].name_stack)))
    return merged


merges.register(_merge_conv_backward)
