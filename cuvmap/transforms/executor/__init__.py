"""The planned executor: runs a staged program without tracers.

A program is planned once (:func:`plan`): every value gets a slot, and each equation (or
fused group of them) becomes a :class:`Step`; the plan decides where each result is
written (NOTE [buffer planning]) and compiles the steps into one straight-line Python
function with no tracer objects, no rule lookups and no dictionaries (NOTE [a plan runs
as generated Python]). The first CPU plan asks the C allocator to keep the memory programs free (NOTE
[keeping freed host memory]).

The parts, one module each:

- :mod:`~cuvmap.transforms.executor.host_memory`: the C allocator's settings;
- :mod:`~cuvmap.transforms.executor.buffers`: slots, buffer groups and the steps;
- :mod:`~cuvmap.transforms.executor.peak_memory`: the planned peak of a run;
- :mod:`~cuvmap.transforms.executor.codegen`: the generated Python and its code cache;
- :mod:`~cuvmap.transforms.executor.planner`: :func:`plan` and the plans programs keep.

This package re-exports the names the rest of cuvmap uses.
"""
from cuvmap.transforms.executor.buffers import (  # noqa: F401
    FUSED, IN_PLACE, MIN_REUSE_BYTES, MULTI, PLAIN, POOLED, Step,
)
from cuvmap.transforms.executor.codegen import CODE_CACHE_SIZE, code_of, source, timed_program  # noqa: F401
from cuvmap.transforms.executor.host_memory import (  # noqa: F401
    MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES, host_memory_setting, keep_host_memory, release_host_memory,
)
from cuvmap.transforms.executor.planner import (  # noqa: F401
    Plan, empty_pool, execute, graph_capturable, host_arguments, is_gpu_program, nested_plan, plan, plan_for,
    planned_peak_bytes, pool_bytes, run,
)
