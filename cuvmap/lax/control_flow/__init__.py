"""Control flow as primitives: ``cond``, ``switch``, ``scan``, ``while_loop``, and
``fori_loop`` and ``map`` built on them (JAX's names, signatures and semantics).

A Python ``if`` or loop inside a traced function runs while tracing: a loop unrolls into
one equation per iteration, and a branch on a traced value is impossible (under ``vmap``
the value differs per example; under ``jit`` it has none yet). These primitives take the
branch or the loop body as a function, stage it once into a program (a
:class:`~cuvmap.transforms.ir.ClosedJaxpr` in the primitive's params, whatever transforms
are active: the values the function closes over become operands) and are call primitives
(NOTE [call primitives] in :mod:`cuvmap.transforms.call`) whose methods give every
transform its rule (NOTE [the rules of a control-flow primitive] in :mod:`.common`).

The package, as JAX's ``lax/control_flow``:

- :mod:`.common`: the base class :class:`~.common.ControlFlowPrimitive`, staging a user's
  function into a body, the carry's rules, the surgery on programs the rules share;
- :mod:`.conditionals`: ``cond``, ``switch`` (``cond_p``, and ``quiet_cond_p``, the form a
  cond takes under vmap with a batched predicate);
- :mod:`.scan`: ``scan`` (``scan_p``);
- :mod:`.loops`: ``while_loop`` (``while_p``), ``fori_loop``, ``map``.

Eagerly, each runs its programs on the planned executor, a body's plan reused (with its
buffer pool) from one iteration to the next; staged (``jit``), each is one equation.
"""
from cuvmap.lax.control_flow.common import ControlFlowError, ControlFlowPrimitive  # noqa: F401
from cuvmap.lax.control_flow.conditionals import (  # noqa: F401
    CondPrimitive, QuietCondPrimitive, cond, cond_p, quiet_cond_p, switch)
from cuvmap.lax.control_flow.loops import WhilePrimitive, fori_loop, map, while_loop, while_p  # noqa: F401, A004
from cuvmap.lax.control_flow.scan import ScanPrimitive, scan, scan_p  # noqa: F401
