"""The conv family's independent references, shared by tests/lax/test_conv.py,
tests/cpu/test_onednn.py and tests/gpu/test_cuda_path.py: naive direct convolutions written
with explicit loops over every output (or input) element in float64, and the table of
configurations (1/2/3-d, stride, padding, dilation, groups 1 / 2 / depthwise, transposed)
with their operands."""
import itertools

import numpy as np

# ---------------------------------------------------------------------------------------
# Naive references: explicit loops over every output (or input) element, float64
# ---------------------------------------------------------------------------------------


def naive_conv(x, w, stride, padding, dilation, groups):
    """out[n, o, y] = Σ_{c,k} x[n, g·Cg + c, y·s − p + k·d] · w[o, c, k] (zero outside)."""
    n_, c_ = x.shape[:2]
    o_ = w.shape[0]
    kernel = w.shape[2:]
    nd = len(kernel)
    cg, og = c_ // groups, o_ // groups
    out_sp = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                   for s, k, st, p, d in zip(x.shape[2:], kernel, stride, padding, dilation))
    out = np.zeros((n_, o_) + out_sp)
    for n in range(n_):
        for o in range(o_):
            g = o // og
            for y in itertools.product(*map(range, out_sp)):
                acc = 0.0
                for c in range(cg):
                    for k in itertools.product(*map(range, kernel)):
                        idx = tuple(y[i] * stride[i] - padding[i] + k[i] * dilation[i] for i in range(nd))
                        if all(0 <= j < s for j, s in zip(idx, x.shape[2:])):
                            acc += x[(n, g * cg + c) + idx] * w[(o, c) + k]
                out[(n, o) + y] = acc
    return out


def naive_conv_transpose(x, w, stride, padding, dilation, output_padding, groups):
    """Scatter form: out[n, g·Og + o, i·s − p + k·d] += x[n, g·Cg + c, i] · w[g·Cg + c, o, k]."""
    n_, c_ = x.shape[:2]
    og = w.shape[1]
    kernel = w.shape[2:]
    nd = len(kernel)
    cg = c_ // groups
    out_sp = tuple((s - 1) * st - 2 * p + d * (k - 1) + op + 1
                   for s, k, st, p, d, op in zip(x.shape[2:], kernel, stride, padding, dilation, output_padding))
    out = np.zeros((n_, og * groups) + out_sp)
    for n in range(n_):
        for ci in range(c_):
            g = ci // cg
            for i in itertools.product(*map(range, x.shape[2:])):
                for o in range(og):
                    for k in itertools.product(*map(range, kernel)):
                        idx = tuple(i[a] * stride[a] - padding[a] + k[a] * dilation[a] for a in range(nd))
                        if all(0 <= j < s for j, s in zip(idx, out_sp)):
                            out[(n, g * og + o) + idx] += x[(n, ci) + i] * w[(ci, o) + k]
    return out


def naive_backward_weight(g, x, weight_shape, stride, padding, dilation, groups):
    """∂⟨conv(x, w), g⟩/∂w[o, c, k] = Σ_{n,y} g[n, o, y] · x[n, g·Cg + c, y·s − p + k·d]."""
    o_, cg = weight_shape[:2]
    kernel = weight_shape[2:]
    nd = len(kernel)
    og = o_ // groups
    gw = np.zeros(weight_shape)
    for o in range(o_):
        grp = o // og
        for c in range(cg):
            for k in itertools.product(*map(range, kernel)):
                acc = 0.0
                for n in range(g.shape[0]):
                    for y in itertools.product(*map(range, g.shape[2:])):
                        idx = tuple(y[i] * stride[i] - padding[i] + k[i] * dilation[i] for i in range(nd))
                        if all(0 <= j < s for j, s in zip(idx, x.shape[2:])):
                            acc += g[(n, o) + y] * x[(n, grp * cg + c) + idx]
                gw[(o, c) + k] = acc
    return gw


# ---------------------------------------------------------------------------------------
# Configurations: 1/2/3-d, stride, padding, dilation, groups 1 / 2 / depthwise, transposed
# ---------------------------------------------------------------------------------------

CONFIGS = [
    # id, nd, N, C, O, spatial, kernel, stride, padding, dilation, groups, transposed, output_padding
    ("1d", 1, 2, 3, 4, (9,), (3,), (1,), (0,), (1,), 1, False, (0,)),
    ("1d-s2-p1-d2-g2", 1, 2, 4, 6, (11,), (3,), (2,), (1,), (2,), 2, False, (0,)),
    ("2d", 2, 2, 3, 4, (6, 5), (3, 2), (1, 1), (0, 0), (1, 1), 1, False, (0, 0)),
    ("2d-s2-p1", 2, 2, 2, 3, (7, 6), (3, 3), (2, 1), (1, 1), (1, 1), 1, False, (0, 0)),
    ("2d-d2-g2", 2, 1, 4, 6, (7, 7), (2, 3), (1, 2), (0, 1), (2, 1), 2, False, (0, 0)),
    ("2d-depthwise", 2, 2, 3, 6, (5, 5), (3, 3), (1, 1), (1, 1), (1, 1), 3, False, (0, 0)),
    ("3d-s2-g2", 3, 1, 4, 2, (4, 5, 4), (2, 2, 3), (2, 1, 1), (1, 0, 1), (1, 1, 1), 2, False, (0, 0, 0)),
    ("1d-transposed", 1, 2, 3, 4, (5,), (3,), (2,), (1,), (1,), 1, True, (1,)),
    ("2d-transposed-g2", 2, 2, 4, 6, (4, 3), (3, 2), (2, 2), (1, 0), (1, 2), 2, True, (1, 1)),
    ("3d-transposed", 3, 1, 2, 3, (3, 2, 3), (2, 2, 2), (2, 1, 2), (0, 0, 1), (1, 1, 1), 1, True, (1, 0, 0)),
    # output_padding >= stride (allowed below the dilation), with and without padding
    ("1d-transposed-op-ge-stride", 1, 2, 3, 2, (5,), (3,), (1,), (2,), (2,), 1, True, (1,)),
    ("2d-transposed-op-ge-stride-g2", 2, 2, 2, 4, (4, 3), (3, 2), (1, 2), (1, 0), (2, 1), 2, True, (1, 0)),
]
CONFIG_IDS = [c[0] for c in CONFIGS]


def make_operands(cfg, rng, dtype=np.float64):
    _, nd, n, c, o, spatial, kernel, stride, padding, dilation, groups, transposed, output_padding = cfg
    x = rng.standard_normal((n, c) + spatial).astype(dtype)
    w_shape = (c, o // groups) + kernel if transposed else (o, c // groups) + kernel
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal((o,)).astype(dtype)
    params = dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                  output_padding=output_padding, groups=groups)
    return x, w, b, params


def reference_conv(x, w, b, params):
    p = params
    if p["transposed"]:
        out = naive_conv_transpose(x, w, p["stride"], p["padding"], p["dilation"], p["output_padding"], p["groups"])
    else:
        out = naive_conv(x, w, p["stride"], p["padding"], p["dilation"], p["groups"])
    if b is not None:
        out = out + b.reshape((1, -1) + (1,) * (x.ndim - 2))
    return out
