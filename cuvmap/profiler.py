"""Where a staged program's time goes, by named scope (``cuvmap.named_scope``).

    def loss(params, x, y):
        with cv.named_scope("conv1"):
            h = nn.relu(nn.conv(x, params["w1"], params["b1"]))
        ...

    times = cv.profiler.time_by_scope(cv.vmap(cv.grad(loss), in_axes=(None, 0, 0)), params, xs, ys)
    print(times)                    # a table: scope, steps, median ms per call, share
    times.seconds["conv1"]          # the median time per call of the steps staged in conv1
    times.seconds["transpose(conv1)"]   # ... and of its backward pass
    print(times.table(depth=1))     # nested scopes summed into their outermost one

NOTE [time per scope]
The function is staged and optimized as ``jit`` stages it (the same program), planned
afresh without a CUDA graph (each step must be timed on its own), and run through a copy
of the plan's generated function that reads a clock before and after every step
(:func:`cuvmap.transforms.executor.timed_program`). A step counts for the scope of its
equation (NOTE [named scopes] in :mod:`cuvmap.core`: a backward pass's steps for
``transpose(<scope>)``), a fused group for the scope its equations share, and a call of a
sub-program (a scan, a while loop, a checkpointed region, a custom derivative's rule) for
the scope of its equation as a whole. Rounds alternate a timed call with an untimed one
(the plan's own function), and the table gives medians over the rounds and the untimed
call beside the sum of the steps: the difference is what the clock reads cost. On the GPU
the clock synchronizes the device before it reads the time, so a step's time is that of
its kernels and the launches no longer overlap the host: the sum of the steps is then
larger than the jitted call, and the shares are what each scope's kernels cost.
"""
import statistics
import time

import numpy as np

from cuvmap import api_util, backend, core
from cuvmap.transforms import executor, ir, staging

NO_SCOPE = "(no scope)"


class ScopeTimes:
    """Median time per call of each named scope of a program (NOTE [time per scope]).

    Attributes:
      seconds: ``{scope: median seconds per call}``, scopes as ``"outer/inner"`` in the
        order the program first reaches them; steps staged outside every scope count for
        ``"(no scope)"``.
      steps: ``{scope: number of the plan's steps in it}``.
      total: the median over the rounds of the sum of every step's time.
      call: the median time of the untimed call (the plan's own function).
      rounds: how many rounds were timed.
    """

    def __init__(self, scopes, per_round, call_times, where):
        self._scopes = scopes  # each step's name stack
        self._per_round = per_round  # per round, each step's seconds
        self.where = where
        self.rounds = len(per_round)
        self.call = statistics.median(call_times)
        self.total = statistics.median(sum(r) for r in per_round)
        self.seconds, self.steps = self._aggregate(None)

    def _aggregate(self, depth):
        keys = [_key(stack if depth is None else stack[:depth]) for stack in self._scopes]
        order = list(dict.fromkeys(keys))
        steps = {k: keys.count(k) for k in order}
        sums = [{k: 0.0 for k in order} for _ in self._per_round]
        for r, times in enumerate(self._per_round):
            for k, t in zip(keys, times):
                sums[r][k] += t
        seconds = {k: statistics.median(s[k] for s in sums) for k in order}
        return seconds, steps

    def table(self, depth=None):
        """A markdown table of the scopes (``depth``: nested scopes summed into their
        first ``depth`` names), with the untimed call and the sum of the steps."""
        seconds, steps = (self.seconds, self.steps) if depth is None else self._aggregate(depth)
        total = sum(seconds.values()) or 1.0
        lines = [f"{self.where}: median time per call of each named scope over {self.rounds} rounds",
                 "", "| scope | steps | ms | share |", "|---|---:|---:|---:|"]
        lines += [f"| {k} | {steps[k]} | {seconds[k] * 1e3:.3g} | {seconds[k] / total:.1%} |" for k in seconds]
        lines += [f"| (sum of the steps) | {sum(steps.values())} | {self.total * 1e3:.3g} | |",
                  f"| (the untimed call) | | {self.call * 1e3:.3g} | |"]
        return "\n".join(lines)

    def __str__(self):
        return self.table()

    def __repr__(self):
        return f"ScopeTimes({self.where}, {len(self.seconds)} scopes, call {self.call * 1e3:.3g} ms)"


def _key(stack):
    return "/".join(stack) if stack else NO_SCOPE


def time_by_scope(f, *args, rounds=10, warmup=2, static_argnums=(), static_argnames=(), **kwargs):
    """Times ``f(*args, **kwargs)`` staged as ``jit`` stages it, step by step, and returns
    the median time per call of each named scope: a :class:`ScopeTimes` (NOTE [time per
    scope]). ``f`` is any function a ``jit`` accepts (a ``vmap(grad(...))``, a jitted
    function); the arguments are arrays, pytrees of them and Python numbers.

    Args:
      rounds: rounds timed, each one call with the clock around every step and one call
        without.
      warmup: calls of each kind before the rounds.
      static_argnums, static_argnames: as for ``jit``.
    """
    api_util.check_callable(f, "time_by_scope")
    where = f"time_by_scope({api_util.fun_name(f)})"
    if rounds < 1 or warmup < 0:
        raise ValueError(f"{where}: rounds must be >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    nums, names, _ = api_util.normalize_static(f, static_argnums, static_argnames, (), where)
    _, leaves, paths, avals, rebuild = staging.stage_arguments(f, where, args, kwargs, nums, names)
    for leaf, path in zip(leaves, paths):
        if isinstance(leaf, core.Tracer) or type(leaf) is core.ShapeDtypeStruct:
            raise api_util.TransformError(
                f"{where}: {api_util.describe_arg(f, path)} is a {type(leaf).__name__}; time_by_scope runs the "
                "program, on arrays, outside every transform")
    closed, _ = staging.trace_program(f, where, leaves, paths, avals, rebuild, True)
    program = ir.optimize(closed)
    plan = executor.plan(program, graphs=False)
    gpu = plan.array_types[0] is not np.ndarray
    clock = _synchronized_clock() if gpu else time.perf_counter
    timed, times = executor.timed_program(plan, clock)
    for _ in range(warmup):
        timed(leaves)
        plan.program(leaves)
    per_round, call_times = [], []
    for _ in range(rounds):
        times[:] = [0.0] * len(times)
        timed(leaves)
        per_round.append(list(times))
        start = clock()
        plan.program(leaves)
        call_times.append(clock() - start)
    executor.empty_pool(plan)
    return ScopeTimes(plan.scopes, per_round, call_times, where)


def _synchronized_clock():
    """``perf_counter`` read after the current GPU has finished its work."""
    synchronize = backend.xp_for("gpu").cuda.get_current_stream().synchronize

    def clock():
        synchronize()
        return time.perf_counter()

    return clock
