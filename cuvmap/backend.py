"""Backend selection: NumPy on the CPU, CuPy on an NVIDIA GPU.

The operands decide the device: :func:`xp_of` returns ``cupy`` when any operand is a CuPy
array and ``numpy`` otherwise. CuPy is imported lazily, only when a CuPy array is seen or
the GPU is asked for, so importing cuvmap never requires it.
"""
import numpy as np

from cuvmap import dtypes, transfer_guards, tree

_cupy = None
_cupy_probed = False


def cupy_module():
    """Returns the ``cupy`` module, or ``None`` when CuPy is not installed or sees no GPU."""
    global _cupy, _cupy_probed
    if not _cupy_probed:
        _cupy_probed = True
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                _cupy = cupy
        except Exception:  # not installed, no driver, no device
            _cupy = None
    return _cupy


def gpu_available():
    """True when CuPy is importable and sees at least one CUDA device."""
    return cupy_module() is not None


def is_cupy_array(x):
    return type(x).__module__.startswith("cupy")


def concrete(x):
    """The concrete array underneath any stack of tracers (for backend and dtype queries)."""
    while hasattr(x, "_concrete_value"):
        x = x._concrete_value()
    return x


def device_of(x):
    """``"cpu"`` for a NumPy array, ``"gpu:<id>"`` for a CuPy array, ``None`` for a Python
    scalar (which has no device); tracers are looked through."""
    x = concrete(x)
    if is_cupy_array(x):
        return f"gpu:{x.device.id}"
    return "cpu" if hasattr(x, "shape") else None


def xp_of(*operands):
    """The array module (numpy or cupy) of the operands; tracers are looked through."""
    for x in operands:
        if is_cupy_array(concrete(x)):
            return cupy_module() or _import_cupy()
    return np


def backend_name(x):
    return "gpu" if is_cupy_array(concrete(x)) else "cpu"


def xp_for(name):
    """The array module for a backend name, ``'cpu'`` or ``'gpu'``."""
    if name == "cpu":
        return np
    if name == "gpu":
        cp = cupy_module()
        if cp is None:
            raise RuntimeError("device_put(..., 'gpu'): CuPy is not installed or sees no CUDA device")
        return cp
    raise ValueError(f"unknown device {name!r}; expected 'cpu' or 'gpu'")


def _import_cupy():
    import cupy

    return cupy


def device_put(x, device="cpu", *, src=None, donate=False, may_alias=None):
    """Moves every array leaf of the pytree ``x`` to ``device`` (``'cpu'`` or ``'gpu'``).

    ``device`` may also be one of :func:`cuvmap.devices`' devices (its platform), or None
    (the CPU), as JAX's ``device_put`` takes them. JAX's keywords: an array already on
    ``device`` is returned as it is unless ``may_alias=False`` or ``donate=True``, which
    give a copy (``may_alias`` and ``donate`` both True is JAX's ValueError); ``src`` is
    accepted and unused (an array knows its device).

    Example::

        xs_gpu = cuvmap.device_put(xs, "gpu")
    """
    if may_alias and donate:
        raise ValueError("may_alias and donate cannot be True at the same time.")
    copy = may_alias is False or bool(donate)
    device = "cpu" if device is None else getattr(device, "platform", device)
    xp = xp_for(device)

    def put(leaf):
        if hasattr(leaf, "_concrete_value"):  # a tracer: it stays where its value lives
            if backend_name(leaf) == device:
                return leaf
            raise ValueError(
                f"device_put(..., {device!r}): a traced value on the {backend_name(leaf)} cannot change "
                "device inside a transform; move the inputs before transforming"
            )
        if device == "cpu":
            if is_cupy_array(leaf):
                transfer_guards.check("device_to_host", True, f"device_put of an array of shape {leaf.shape}")
                return leaf.get()
            return np.array(leaf, copy=True) if copy else np.asarray(leaf)
        if not is_cupy_array(leaf):
            transfer_guards.check("host_to_device", True, f"device_put of an array of shape {np.shape(leaf)}")
            _refuse_bfloat16_on_device(leaf, "device_put")
            return xp.asarray(leaf)
        return leaf.copy() if copy else leaf

    return tree.map_preserving(put, x)


# NOTE [host arrays meet device arrays]
# A NumPy array that meets CuPy arrays in an operation (``x_gpu + cnp.zeros(3)``, a weight
# closed over as a NumPy array, ``cnp.arange(n)`` inside a model) goes to their device, as
# JAX moves a NumPy array to the device of the computation: CuPy itself refuses NumPy
# operands. Eagerly, an op whose impl fails on such a mix is run again with the NumPy
# operands put on the CuPy operands' device (nothing is checked on the way of an op that
# succeeds); a staged program's result takes the GPU device of any operand, and a GPU
# program's NumPy constants are put on its device once, when it is planned
# (cuvmap/transforms/executor/planner.py). NumPy scalars and Python numbers are CuPy operands as
# they are. Only in this direction: a CuPy array never goes to the host without
# ``device_put`` (a silent device-to-host copy would stall the GPU).
def host_operands_on_device(operands):
    """``operands`` with each NumPy array put on the device of the CuPy arrays among them,
    or None when they do not mix the two (NOTE [host arrays meet device arrays])."""
    device = next((x.device.id for x in operands if is_cupy_array(x)), None)
    if device is None or not any(isinstance(x, np.ndarray) for x in operands):  # (weak arrays too)
        return None
    for x in operands:
        if isinstance(x, np.ndarray):  # NOTE [transfer guard levels] in cuvmap/transfer_guards.py
            transfer_guards.check("host_to_device", False, f"a NumPy operand of shape {x.shape} meets CuPy arrays")
    cp = xp_for("gpu")
    for x in operands:
        _refuse_bfloat16_on_device(x, "a NumPy operand meeting CuPy arrays")
    with cp.cuda.Device(device):
        return [cp.asarray(x) if isinstance(x, np.ndarray) else x for x in operands]


def _refuse_bfloat16_on_device(x, what):
    """bfloat16 stays on the host: CuPy has no bfloat16 (NOTE [bfloat16 computes in
    float32] in cuvmap/core/bfloat16.py)."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and dtypes.has_bfloat16() and dtype == dtypes.bfloat16:
        raise TypeError(f"{what}: an array of shape {tuple(np.shape(x))} has dtype bfloat16, which CuPy does not "
                        "support; cuvmap computes bfloat16 on the CPU only (cast it to float32 for the GPU)")


def arguments_on_device(leaves, indices, device):
    """``leaves`` with each NumPy array at ``indices`` put on ``device`` (``"gpu:<id>"``):
    a jitted GPU program's host arguments (NOTE [host arrays meet device arrays])."""
    cp = xp_for("gpu")
    leaves = list(leaves)
    with cp.cuda.Device(int(device.split(":")[1])):
        for i in indices:
            if isinstance(leaves[i], np.ndarray):
                transfer_guards.check("host_to_device", False,
                                     f"a NumPy argument of shape {leaves[i].shape} of a jitted GPU program")
                leaves[i] = cp.asarray(leaves[i])
    return leaves


def device_mismatch(what, operands, current):
    """The error text when an operand is not on the current GPU, else None.

    Args:
      what: the operation, e.g. ``"conv forward"``.
      operands: ``(name, shape, device id)`` of each GPU operand.
      current: the current device's id.
    """
    devices = sorted({dev for _, _, dev in operands})
    if devices in ([], [current]):
        return None
    where = ", ".join(f"the {name} {list(shape)} on GPU {dev}" for name, shape, dev in operands)
    if len(devices) > 1:
        hint = ("move them to one GPU (cupy.asarray under `with cupy.cuda.Device(i):`) and call it under that "
                "device")
    else:
        hint = f"call it under `with cupy.cuda.Device({devices[0]}):`, or move the operands to GPU {current}"
    return f"{what}: operands on another GPU than the current one (GPU {current}): {where}; {hint}"


def check_current_device(what, named):
    """Raises ValueError (:func:`device_mismatch`'s text) when a CuPy array among the
    ``(name, array)`` pairs ``named`` lives on another GPU than the current one."""
    operands = [(name, tuple(a.shape), a.device.id) for name, a in named if is_cupy_array(a)]
    if not operands:
        return
    message = device_mismatch(what, operands, cupy_module().cuda.runtime.getDevice())
    if message is not None:
        raise ValueError(message)
