"""``checkpoint_name``: a name on an intermediate value, for the checkpoint policies that
choose residuals by name (``jax.ad_checkpoint.checkpoint_name``).

``checkpoint_name(x, name)`` is the identity on the pytree ``x``; each leaf goes through
the primitive :data:`name_p` with ``params = {"name": name}``, an equation of the staged
forward computation that a policy (:data:`cuvmap.checkpoint_policies`
``save_only_these_names``, ``save_any_names_but_these``, ...) recognises, so that
``checkpoint(f, policy=save_only_these_names("hidden"))`` keeps the values named
``"hidden"`` for the backward pass and recomputes the rest. Outside a checkpointed
region the name changes nothing. Derivatives pass through it (it is linear: its JVP and
transpose are itself and the identity), ``vmap`` maps it elementwise.
"""
from cuvmap import core, tree
from cuvmap.core import Primitive, ShapedArray
from cuvmap.transforms import batching, vjp

name_p = Primitive(
    "name", impl=lambda x, *, name: x,
    shape_rule=lambda x, *, name: ShapedArray(x.shape, x.dtype, x.weak_type, x.device))


def checkpoint_name(x, name):
    """``x`` (a pytree of arrays) unchanged, each leaf named ``name`` (a string) for the
    name-based checkpoint policies (``jax.ad_checkpoint.checkpoint_name``).

    Example::

        def layer(w, x):
            h = checkpoint_name(cnp.tanh(x @ w), "hidden")
            return cnp.sin(h)

        cv.grad(lambda w, x: cv.checkpoint(layer, policy=cv.checkpoint_policies.save_only_these_names(
            "hidden"))(w, x).sum())(w, x)      # keeps tanh(x @ w), recomputes the rest
    """
    if not isinstance(name, str):
        raise TypeError(f"checkpoint_name: name must be a string, got {name!r}")
    return tree.map_preserving(lambda leaf: name_p.bind(leaf, name=name) if core.is_value(leaf) else leaf, x)


batching.defunary(name_p)
vjp.deflinear(name_p, lambda ct, x, **params: ct)
