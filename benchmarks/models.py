"""The networks the benchmarks run, written once per framework with the same parameters.

The benchmark CNN (float32, one example is ``(1, 28, 28)``; the suites call it so: the
README's first snippet is another, smaller network)::

    conv 1→16, 5×5, no padding  + relu     (16, 24, 24)
    conv 16→32, 5×5, no padding + relu     (32, 20, 20)
    flatten                                 12800
    dense 12800 → 10                        logits
    cross entropy with an integer label

Parameters are a dict of NumPy arrays (``w1 b1 w2 b2 w3 b3``) in torch's layouts: conv
weights ``(O, I, kh, kw)``, the dense weight ``(12800, 10)`` used as ``h @ w3 + b3``. The
cuvmap, torch.func and JAX versions below take the same dict (converted to their arrays),
so their gradients can be compared leaf by leaf.

The MLP of the DP benchmark (float32, one example is ``(784,)``): dense 784 → 1024, relu,
dense 1024 → 1024, relu, dense 1024 → 10, cross entropy (parameters ``w1 b1 w2 b2 w3 b3``,
dense weights ``(in, out)``; :func:`mlp_params`).

Each framework gets two losses: ``per_example_loss(params, x, y)`` on one example (what
``vmap(grad)`` maps), and ``batch_loss(params, xs, ys)``, the mean over a batch (its
gradient is the ordinary batched backward pass, the floor ``vmap(grad)`` is measured
against). Both go through the same ``forward`` on an ``(N, 1, 28, 28)`` input.
"""
import numpy as np

# name, in channels, out channels, kernel (square, stride 1, no padding)
CNN_CONVS = (("conv1", 1, 16, 5), ("conv2", 16, 32, 5))
CNN_INPUT = (1, 28, 28)
CNN_CLASSES = 10
PARAM_NAMES = ("w1", "b1", "w2", "b2", "w3", "b3")


def _cnn_shapes():
    c, h, w = CNN_INPUT
    layers = []
    for name, cin, cout, k in CNN_CONVS:
        assert cin == c
        h, w = h - k + 1, w - k + 1
        layers.append(dict(name=name, kind="conv", cin=cin, cout=cout, k=k, out_hw=(h, w)))
        c = cout
    flat = c * h * w
    layers.append(dict(name="dense", kind="dense", fan_in=flat, fan_out=CNN_CLASSES))
    return layers


CNN_LAYERS = _cnn_shapes()
CNN_FLAT = CNN_LAYERS[-1]["fan_in"]  # 12800


def cnn_params(seed=0, dtype=np.float32):
    """He-initialised parameters (NumPy, ``dtype``), the same for every framework."""
    rng = np.random.default_rng(seed)
    params = {}
    i = 1
    for layer in CNN_LAYERS:
        if layer["kind"] == "conv":
            shape = (layer["cout"], layer["cin"], layer["k"], layer["k"])
            fan_in = layer["cin"] * layer["k"] ** 2
            n_out = layer["cout"]
        else:
            shape = (layer["fan_in"], layer["fan_out"])
            fan_in = layer["fan_in"]
            n_out = layer["fan_out"]
        params[f"w{i}"] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)
        params[f"b{i}"] = (rng.standard_normal(n_out) * 0.1).astype(dtype)
        i += 1
    return params


def cnn_data(batch, seed=1, dtype=np.float32):
    """``xs`` ``(batch, 1, 28, 28)`` standard normal and integer labels ``ys`` ``(batch,)``."""
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((batch,) + CNN_INPUT).astype(dtype)
    ys = rng.integers(0, CNN_CLASSES, batch).astype(np.int64)
    return xs, ys


def cnn_flops():
    """FLOP counts per example. Returns a dict with

    - ``macs``: multiply-adds of the forward pass, conv ``O·I·k²·out_h·out_w`` plus dense
      ``fan_in·fan_out`` (biases, relu and the softmax are left out: they are < 0.5 %);
    - ``forward``: ``2 · macs``;
    - ``train``: ``3 · forward = 6 · macs``, the usual estimate for forward + backward
      (the backward pass computes a weight gradient and an input gradient per layer, each
      as costly as the forward);
    - ``train_exact``: the same without the input gradient of the first layer, which a
      parameter gradient does not need;
    - ``per_layer``: the forward MACs of each layer.
    """
    per_layer = {}
    for layer in CNN_LAYERS:
        if layer["kind"] == "conv":
            oh, ow = layer["out_hw"]
            per_layer[layer["name"]] = layer["cout"] * layer["cin"] * layer["k"] ** 2 * oh * ow
        else:
            per_layer[layer["name"]] = layer["fan_in"] * layer["fan_out"]
    macs = sum(per_layer.values())
    first = per_layer[CNN_LAYERS[0]["name"]]
    return dict(macs=macs, forward=2 * macs, train=6 * macs, train_exact=6 * macs - 2 * first,
                per_layer=per_layer)


MLP_WIDTHS = (784, 1024, 1024, 10)


def mlp_params(widths=MLP_WIDTHS, seed=0, dtype=np.float32):
    """He-initialised dense weights ``w{i}`` ``(in, out)`` and small biases ``b{i}``."""
    rng = np.random.default_rng(seed)
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:]), 1):
        params[f"w{i}"] = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(dtype)
        params[f"b{i}"] = (rng.standard_normal(fan_out) * 0.1).astype(dtype)
    return params


def mlp_data(batch, widths=MLP_WIDTHS, seed=1, dtype=np.float32):
    """``xs`` ``(batch, widths[0])`` standard normal and integer labels ``ys`` ``(batch,)``."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, widths[0])).astype(dtype), rng.integers(0, widths[-1], batch).astype(np.int64)


# ---------------------------------------------------------------------------------------
# cuvmap
# ---------------------------------------------------------------------------------------


# The cuvmap networks name their layers (cuvmap.named_scope: free when not staged) so that
# ``--scopes`` can report the time per layer (cuvmap.profiler).


def cuvmap_forward(params, x):
    """Logits ``(N, 10)`` of ``x`` ``(N, 1, 28, 28)``."""
    from cuvmap import named_scope, nn

    with named_scope("conv1"):
        h = nn.relu(nn.conv(x, params["w1"], params["b1"]))
    with named_scope("conv2"):
        h = nn.relu(nn.conv(h, params["w2"], params["b2"]))
    with named_scope("dense"):
        h = h.reshape(h.shape[0], -1)
        return h @ params["w3"] + params["b3"]


def _cross_entropy(logits, labels):
    from cuvmap import named_scope, nn

    with named_scope("loss"):
        return nn.cross_entropy(logits, labels)


def cuvmap_per_example_loss(params, x, y):
    """Cross entropy of one example: ``x`` ``(1, 28, 28)``, ``y`` a 0-d integer."""
    return _cross_entropy(cuvmap_forward(params, x[None]), y[None])


def cuvmap_batch_loss(params, xs, ys):
    """Mean cross entropy over a batch: ``xs`` ``(N, 1, 28, 28)``, ``ys`` ``(N,)``."""
    return _cross_entropy(cuvmap_forward(params, xs), ys)


def cuvmap_mlp_forward(params, x):
    """Logits ``(N, out)`` of ``x`` ``(N, in)``: dense layers with relu between them."""
    from cuvmap import named_scope, nn

    n = len(params) // 2
    for i in range(1, n + 1):
        with named_scope(f"dense{i}"):
            x = x @ params[f"w{i}"] + params[f"b{i}"]
            if i < n:
                x = nn.relu(x)
    return x


def cuvmap_mlp_per_example_loss(params, x, y):
    return _cross_entropy(cuvmap_mlp_forward(params, x[None]), y[None])


def cuvmap_mlp_batch_loss(params, xs, ys):
    return _cross_entropy(cuvmap_mlp_forward(params, xs), ys)


# ---------------------------------------------------------------------------------------
# torch.func (a hand-written functional net on torch.nn.functional)
# ---------------------------------------------------------------------------------------


def torch_forward(params, x):
    import torch.nn.functional as F

    h = F.relu(F.conv2d(x, params["w1"], params["b1"]))
    h = F.relu(F.conv2d(h, params["w2"], params["b2"]))
    h = h.reshape(h.shape[0], -1)
    return h @ params["w3"] + params["b3"]


def torch_per_example_loss(params, x, y):
    import torch.nn.functional as F

    return F.cross_entropy(torch_forward(params, x.unsqueeze(0)), y.unsqueeze(0))


def torch_batch_loss(params, xs, ys):
    import torch.nn.functional as F

    return F.cross_entropy(torch_forward(params, xs), ys)


def torch_mlp_forward(params, x):
    import torch.nn.functional as F

    n = len(params) // 2
    for i in range(1, n + 1):
        x = x @ params[f"w{i}"] + params[f"b{i}"]
        if i < n:
            x = F.relu(x)
    return x


def torch_mlp_per_example_loss(params, x, y):
    import torch.nn.functional as F

    return F.cross_entropy(torch_mlp_forward(params, x.unsqueeze(0)), y.unsqueeze(0))


def torch_cnn_module(params):
    """The benchmark CNN as a ``torch.nn.Sequential`` holding ``params`` (for Opacus, whose
    hooks need modules): its Linear weight is ``w3ᵀ``."""
    import torch

    c1, c2 = CNN_CONVS
    net = torch.nn.Sequential(
        torch.nn.Conv2d(c1[1], c1[2], c1[3]), torch.nn.ReLU(), torch.nn.Conv2d(c2[1], c2[2], c2[3]), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(CNN_FLAT, CNN_CLASSES))
    _load_torch(net, [params["w1"], params["b1"], params["w2"], params["b2"], params["w3"].T, params["b3"]])
    return net


def torch_mlp_module(params):
    """The MLP as a ``torch.nn.Sequential`` of Linear and ReLU layers (weights ``w{i}ᵀ``)."""
    import torch

    n = len(params) // 2
    layers, values = [], []
    for i in range(1, n + 1):
        w = params[f"w{i}"]
        layers.append(torch.nn.Linear(w.shape[0], w.shape[1]))
        if i < n:
            layers.append(torch.nn.ReLU())
        values += [w.T, params[f"b{i}"]]
    net = torch.nn.Sequential(*layers)
    _load_torch(net, values)
    return net


def _load_torch(net, values):
    import torch

    with torch.no_grad():
        for p, v in zip(net.parameters(), values):
            p.copy_(torch.tensor(np.ascontiguousarray(v)))


# ---------------------------------------------------------------------------------------
# JAX (lax.conv_general_dilated)
# ---------------------------------------------------------------------------------------


def jax_forward(params, x):
    import jax
    from jax import lax

    def conv(h, w, b):
        out = lax.conv_general_dilated(h, w, window_strides=(1, 1), padding="VALID",
                                       dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return out + b[None, :, None, None]

    h = jax.nn.relu(conv(x, params["w1"], params["b1"]))
    h = jax.nn.relu(conv(h, params["w2"], params["b2"]))
    h = h.reshape(h.shape[0], -1)
    return h @ params["w3"] + params["b3"]


def _jax_xent(logits, ys):
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, ys[:, None], axis=-1))


def jax_per_example_loss(params, x, y):
    return _jax_xent(jax_forward(params, x[None]), y[None])


def jax_batch_loss(params, xs, ys):
    return _jax_xent(jax_forward(params, xs), ys)


# ---------------------------------------------------------------------------------------
# Tramèr & Boneh's tanh CNN (examples/dp_fashion_mnist.py's network, issue 37)
# ---------------------------------------------------------------------------------------
# conv 1→16 (8×8, stride 2, padding 2), tanh, max pool 2 stride 1, conv 16→32 (4×4, stride 2),
# tanh, max pool 2 stride 1, dense 512 → 32, tanh, dense 32 → 10: 26,010 parameters, the
# same dict layout as the benchmark CNN's (conv weights (O, I, kh, kw), dense (in, out)).
TANH_CNN_SHAPES = {"w1": (16, 1, 8, 8), "b1": (16,), "w2": (32, 16, 4, 4), "b2": (32,),
                   "w3": (512, 32), "b3": (32,), "w4": (32, 10), "b4": (10,)}


def tanh_cnn_params(seed=0, dtype=np.float32):
    """torch's default initialisation (uniform in ±1/√fan_in) of the tanh CNN."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in TANH_CNN_SHAPES.items():
        weight = TANH_CNN_SHAPES["w" + name[1:]]
        fan_in = int(np.prod(weight[1:])) if len(weight) == 4 else weight[0]
        params[name] = rng.uniform(-1, 1, shape).astype(dtype) / np.sqrt(fan_in).astype(dtype)
    return params


def tanh_cnn_data(batch, seed=1, dtype=np.float32):
    """Images in [0, 1] ``(batch, 1, 28, 28)`` and labels, as Fashion-MNIST's."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, (batch,) + CNN_INPUT).astype(dtype), rng.integers(0, CNN_CLASSES, batch).astype(np.int64)


def cuvmap_tanh_cnn_forward(params, x):
    from cuvmap import named_scope, nn

    with named_scope("conv1"):
        h = nn.max_pool2d(nn.tanh(nn.conv(x, params["w1"], params["b1"], stride=2, padding=2)), 2, stride=1)
    with named_scope("conv2"):
        h = nn.max_pool2d(nn.tanh(nn.conv(h, params["w2"], params["b2"], stride=2)), 2, stride=1)
    with named_scope("dense"):
        h = nn.tanh(h.reshape(h.shape[0], -1) @ params["w3"] + params["b3"])
        return h @ params["w4"] + params["b4"]


def cuvmap_tanh_cnn_per_example_loss(params, x, y):
    return _cross_entropy(cuvmap_tanh_cnn_forward(params, x[None]), y[None])


def cuvmap_tanh_cnn_batch_loss(params, xs, ys):
    return _cross_entropy(cuvmap_tanh_cnn_forward(params, xs), ys)


def torch_tanh_cnn_forward(params, x):
    import torch
    import torch.nn.functional as F

    h = F.max_pool2d(torch.tanh(F.conv2d(x, params["w1"], params["b1"], stride=2, padding=2)), 2, 1)
    h = F.max_pool2d(torch.tanh(F.conv2d(h, params["w2"], params["b2"], stride=2)), 2, 1)
    h = torch.tanh(h.reshape(h.shape[0], -1) @ params["w3"] + params["b3"])
    return h @ params["w4"] + params["b4"]


def torch_tanh_cnn_per_example_loss(params, x, y):
    import torch.nn.functional as F

    return F.cross_entropy(torch_tanh_cnn_forward(params, x.unsqueeze(0)), y.unsqueeze(0))


def torch_tanh_cnn_module(params):
    """The tanh CNN as a ``torch.nn.Sequential`` (Tramèr & Boneh's ``MNIST_CNN``) holding ``params``."""
    import torch

    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(1, 16, 8, stride=2, padding=2), nn.Tanh(), nn.MaxPool2d(2, 1),
                        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, 1), nn.Flatten(),
                        nn.Linear(512, 32), nn.Tanh(), nn.Linear(32, 10))
    _load_torch(net, [params["w1"], params["b1"], params["w2"], params["b2"], params["w3"].T, params["b3"],
                      params["w4"].T, params["b4"]])
    return net
