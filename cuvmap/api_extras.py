"""JAX's smaller public names around the transforms (issue 32, "JAX code runs unchanged"):
``Array`` (the type of arrays and traced values), ``ensure_compile_time_eval``,
``named_call``, ``device_get`` and ``pmap`` (on one device).
"""
import contextlib
import functools

import numpy as np

from cuvmap import api, api_util, backend, core, tree
from cuvmap.jit_api import jit
from cuvmap.scope import named_scope


from cuvmap.array_type import Array  # noqa: E402, F401  (defined below the API layer: cuvmap.numpy names it ndarray)


@contextlib.contextmanager
def ensure_compile_time_eval():
    """Inside the block, operations on concrete values run now, eagerly, even under
    ``jit`` (JAX's ``jax.ensure_compile_time_eval``): ``cnp.sin(2.0)`` is a concrete
    array, not a staged equation, so Python control flow, ``float()`` and printing work on
    values that do not depend on the traced arguments. Operations on traced values are
    staged as always. Example::

        @cuvmap.jit
        def f(x):
            with cuvmap.ensure_compile_time_eval():
                y = cnp.sin(3.0)                 # a concrete array
            return x * y if y > 0 else x         # Python control flow on y

    (The innermost staging transform owns the values made from nothing — NOTE [staging owns
    the values made from nothing] in cuvmap/core/primitive.py — and the block sets none.)
    """
    with core.staging(None):
        yield


def named_call(fun, *, name=None):
    """``fun`` with its equations staged under the named scope ``name`` (default: its
    ``__name__``), JAX's ``jax.named_call``; the values are ``fun``'s. The name shows in
    the text of staged programs (:func:`cuvmap.named_scope`)."""
    api_util.check_callable(fun, "named_call")
    scope = name if name is not None else api_util.fun_name(fun)

    @functools.wraps(fun)
    def named(*args, **kwargs):
        with named_scope(scope):
            return fun(*args, **kwargs)

    return named


def device_get(x):
    """Every array leaf of the pytree ``x`` as a NumPy array on the host (JAX's
    ``jax.device_get``): CuPy arrays are copied to the host, NumPy arrays and Python
    scalars are returned as they are; a traced value raises (its value is not known yet:
    return it from the transformed function first)."""

    def get(leaf):
        if isinstance(leaf, core.Tracer):
            raise core.ConcretizationError(
                f"device_get: a traced value (shape {leaf.shape}) has no value yet; return it from the transformed "
                "function and call device_get on the result")
        if backend.is_cupy_array(leaf):
            return leaf.get()
        return leaf

    return tree.map_preserving(get, x)


# NOTE [pmap on one device]
# JAX's pmap runs ``f`` once per device, each on one slice of the leading axis, with
# ``axis_name`` binding the devices for the collectives. cuvmap runs on one device (and
# across processes with cuvmap.distributed.data_parallel), so ``pmap`` computes the same
# values as ``jit(vmap(f, in_axes, out_axes, axis_name=axis_name))``: each slice is one
# example of a batched program, and ``psum(x, axis_name)`` sums over the mapped axis as it
# sums over devices. What differs is only where it runs: the mapped size is not limited by
# the number of devices (JAX raises when it exceeds them), ``devices`` and ``backend`` are
# accepted and the program runs where its operands are, and the result is one array (JAX's
# is sharded over the devices), with the mapped axis where out_axes says.
def pmap(fun, axis_name=None, *, in_axes=0, out_axes=0, static_broadcasted_argnums=(), devices=None, backend=None,
         axis_size=None, donate_argnums=()):  # noqa: A002 - JAX's keyword backend=
    """Maps ``fun`` over the leading axis (or ``in_axes``) of its arguments, as JAX's
    ``jax.pmap`` does over devices, on one device: the values of
    ``jit(vmap(fun, in_axes, out_axes, axis_name=axis_name))`` (NOTE [pmap on one
    device]), ``pmap(f)(xs)[i] == f(xs[i])``, collectives over ``axis_name`` reducing over
    the mapped axis.

    Args:
      fun: the function to map; keyword arguments are mapped along their axis 0.
      axis_name: the name of the mapped axis for collectives (``lax.psum(x, axis_name)``).
      in_axes, out_axes: as :func:`cuvmap.vmap`'s (ints or None, or pytrees of them).
      static_broadcasted_argnums: positional arguments passed to ``fun`` unmapped and
        untraced (hashable Python values; each new value stages again).
      devices, backend, donate_argnums: JAX's options for devices, accepted; the program
        runs where the operands are.
      axis_size: the mapped size, needed only when no argument is mapped.
    """
    api_util.check_callable(fun, "pmap")
    where = f"pmap({api_util.fun_name(fun)})"
    static = (static_broadcasted_argnums,) if isinstance(static_broadcasted_argnums, int) \
        else tuple(static_broadcasted_argnums)
    for leaf in tree.leaves(in_axes):
        if isinstance(leaf, bool) or not isinstance(leaf, int):
            raise TypeError(f"{where}: pmap in_axes must be an int, None, or (nested) container with those types as "
                            f"leaves, but got {in_axes!r}")
    mapped = {}  # static values -> the jitted, vmapped function

    @functools.wraps(fun)
    def pmapped(*args, **kwargs):
        if static and max(static) >= len(args):
            raise ValueError(f"{where}: pmapped function has static_broadcasted_argnums={static} but was called with "
                             f"only {len(args)} positional argument{'s' if len(args) != 1 else ''}. All static "
                             "broadcasted arguments must be passed positionally.")
        statics = tuple(args[i] for i in static)
        dynamic = [a for i, a in enumerate(args) if i not in static]
        axes = in_axes
        if isinstance(in_axes, (tuple, list)) and static and len(in_axes) == len(args):
            axes = type(in_axes)(a for i, a in enumerate(in_axes) if i not in static)
        if axis_size is None and not tree.leaves((dynamic, kwargs)):
            raise ValueError(f"{where}: pmap requires at least one argument with a mapped axis.")
        g = mapped.get(statics)
        if g is None:
            def with_statics(*dyn, **kw):
                full, it = [], iter(dyn)
                for i in range(len(dyn) + len(statics)):
                    full.append(statics[static.index(i)] if i in static else next(it))
                return fun(*full, **kw)

            functools.update_wrapper(with_statics, fun)
            g = mapped[statics] = jit(api.vmap(with_statics, in_axes=axes if not isinstance(axes, list) else tuple(axes),
                                               out_axes=out_axes, axis_size=axis_size, axis_name=axis_name))
        return g(*dynamic, **kwargs)

    return pmapped


def print_environment_info(return_string=False):
    """Prints (or, with ``return_string=True``, returns) the versions cuvmap runs on: cuvmap,
    NumPy, CuPy and the GPU it sees (when installed), Python and the platform (JAX's
    ``jax.print_environment_info``)."""
    import platform
    import sys

    cuvmap_version = sys.modules["cuvmap"].__version__  # (the package imports this module: no import back)

    lines = [f"cuvmap:    {cuvmap_version}", f"numpy:     {np.__version__}"]
    cupy = backend.cupy_module()
    if cupy is not None:
        lines.append(f"cupy:      {cupy.__version__} ({cupy.cuda.runtime.getDeviceCount()} GPU(s))")
    else:
        lines.append("cupy:      not available (the CPU backend only)")
    lines += [f"python:    {sys.version}", f"platform:  {platform.uname()}"]
    text = "\n".join(lines)
    if return_string:
        return text
    print(text)
