"""Where a staged program's time goes, by named scope (``cuvmap.named_scope``).

    def loss(params, x, y):
        with cv.named_scope("conv1"):
            h = nn.relu(nn.conv(x, params["w1"], params["b1"]))
        ...

    times = cv.profiler.time_by_scope(cv.vmap(cv.grad(loss), in_axes=(None, 0, 0)), params, xs, ys)
    print(times)                    # a table: scope, steps, median ms per call, share
    times.seconds["conv1"]          # the median time per call of the steps staged in conv1
    times.seconds["transpose(conv1)"]   # ... and of its backward pass
    print(times.table(depth=1))     # a row per outermost scope, its backward folded in
    times.by_scope(depth=1)["conv1"]    # (forward seconds, backward seconds) of conv1

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

NOTE [a scope's backward folds into its row]
A backward step's name stack ends in one name, ``transpose(outer/inner)`` (NOTE [named
scopes] in :mod:`cuvmap.core`), so cutting stacks at a depth would leave
``transpose(outer/inner)`` whole beside ``outer``. ``by_scope(depth)`` and
``table(depth)`` read each stack as a path of plain names (a ``transpose(...)`` name opens
into its names, nested ones too) and a direction, cut the path at ``depth`` and sum the
forward and the backward steps of a path into one row with both columns: at depth 1 the
row ``outer`` holds ``outer/inner``, ``outer/other``, ``transpose(outer/inner)`` and
``transpose(outer/other)``, and a backward pass started inside a scope
(``("outer", "transpose(inner)")``) counts for ``outer/inner``. ``seconds`` keeps each
stack as it is (``seconds["transpose(conv1)"]``).
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
        self.seconds, self.steps = self._aggregate()

    def _aggregate(self):
        keys = [_key(stack) for stack in self._scopes]
        order = list(dict.fromkeys(keys))
        steps = {k: keys.count(k) for k in order}
        sums = [{k: 0.0 for k in order} for _ in self._per_round]
        for r, times in enumerate(self._per_round):
            for k, t in zip(keys, times):
                sums[r][k] += t
        seconds = {k: statistics.median(s[k] for s in sums) for k in order}
        return seconds, steps

    def by_scope(self, depth=None):
        """``{scope: (forward seconds, backward seconds)}``, medians per call over the
        rounds: each scope's backward (``transpose(scope)``) folded into its row, and with
        ``depth`` nested scopes summed into their first ``depth`` names (NOTE [a scope's
        backward folds into its row])."""
        return self._fold(depth)[0]

    def _fold(self, depth):
        keyed = [_fold_key(stack, depth) for stack in self._scopes]
        order = list(dict.fromkeys(k for k, _ in keyed))
        steps = {k: 0 for k in order}
        for k, _ in keyed:
            steps[k] += 1
        fwd = [{k: 0.0 for k in order} for _ in self._per_round]
        bwd = [{k: 0.0 for k in order} for _ in self._per_round]
        for r, times in enumerate(self._per_round):
            for (k, backward), t in zip(keyed, times):
                (bwd if backward else fwd)[r][k] += t
        med = statistics.median
        return {k: (med(f[k] for f in fwd), med(b[k] for b in bwd)) for k in order}, steps

    def table(self, depth=None):
        """A markdown table of the scopes with the untimed call and the sum of the steps.
        Without ``depth`` a row per name stack as staged (``transpose(<scope>)``: a
        scope's backward); with ``depth`` a row per scope cut to its first ``depth`` names,
        its backward folded in, forward and backward columns beside the sum (NOTE [a
        scope's backward folds into its row])."""
        head = f"{self.where}: median time per call of each named scope over {self.rounds} rounds"
        skip = "" if depth is None else " | |"  # the forward and backward columns
        tail = [f"| (sum of the steps) | {len(self._scopes)}{skip} | {self.total * 1e3:.3g} | |",
                f"| (the untimed call) |{skip} | {self.call * 1e3:.3g} | |"]
        if depth is None:
            seconds, steps = self.seconds, self.steps
            total = sum(seconds.values()) or 1.0
            lines = [head, "", "| scope | steps | ms | share |", "|---|---:|---:|---:|"]
            lines += [f"| {k} | {steps[k]} | {seconds[k] * 1e3:.3g} | {seconds[k] / total:.1%} |" for k in seconds]
            return "\n".join(lines + tail)
        folded, steps = self._fold(depth)
        total = sum(f + b for f, b in folded.values()) or 1.0
        lines = [head + f", depth {depth}, backward folded in", "",
                 "| scope | steps | forward ms | backward ms | ms | share |", "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {k} | {steps[k]} | {f * 1e3:.3g} | {b * 1e3:.3g} | {(f + b) * 1e3:.3g} | {(f + b) / total:.1%} |"
                  for k, (f, b) in folded.items()]
        return "\n".join(lines + tail)

    def __str__(self):
        return self.table()

    def __repr__(self):
        return f"ScopeTimes({self.where}, {len(self.seconds)} scopes, call {self.call * 1e3:.3g} ms)"


def _key(stack):
    return "/".join(stack) if stack else NO_SCOPE


def _split_path(text):
    """``"a/transpose(b/c)/d"`` -> ``["a", "transpose(b/c)", "d"]`` (slashes outside
    parentheses)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "/" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def _plain_path(names):
    """A name stack as ``(plain names, backward)``: each ``transpose(<path>)`` name opened
    into its path's names (NOTE [a scope's backward folds into its row])."""
    path, backward = [], False
    for name in names:
        if name.startswith("transpose(") and name.endswith(")"):
            inner, _ = _plain_path(_split_path(name[len("transpose("):-1]))
            path += inner
            backward = True
        else:
            path.append(name)
    return path, backward


def _fold_key(stack, depth):
    path, backward = _plain_path(stack)
    return _key(path if depth is None else path[:depth]), backward


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
