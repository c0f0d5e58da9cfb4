"""Memory budgets: a map over examples run in chunks whose size the program chooses.

``vmap(f, chunk_size="auto", memory_budget=...)`` (and ``jacrev``/``jacfwd``/``hessian``,
``dp.clipped_grad``, ``lax.map(..., batch_size=)``) maps ``f`` over ``B`` examples ``c``
at a time, with ``c`` the largest chunk whose run fits in the budget (NOTE [choosing a
chunk]): an int of bytes, or a float in (0, 1], that fraction of the memory free on the
operands' device. A budget too small for one example at a time raises
:class:`MemoryBudgetError`; ``f.memory_plan(*args)`` of a budgeted transform returns the
:class:`ChunkPlan` a call follows.

These are the public names; the machinery (:class:`ChunkedMap`, a map in chunks, which
runs as a ``scan`` under a transform) is control flow, in
``cuvmap/lax/control_flow/chunked.py``.
"""
from cuvmap.lax.control_flow.chunked import (  # noqa: F401
    AUTO, DEFAULT_BUDGET, KEPT, MARGIN, PROBES, SHARED, STACK, SUM, ChunkedMap, ChunkPlan, Generated,
    MemoryBudgetError, budget_bytes, check_chunk_spec, fmt_bytes, free_bytes, vmap_combine,
)
