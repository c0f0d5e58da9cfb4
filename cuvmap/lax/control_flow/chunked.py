"""Maps in chunks: :class:`ChunkedMap`, the machinery behind memory budgets.

``vmap(f, chunk_size="auto", memory_budget=...)`` (and ``jacrev``/``jacfwd``/``hessian``,
``dp.clipped_grad``, ``lax.map(..., batch_size=)``) maps ``f`` over ``B`` examples ``c``
at a time, with ``c`` the largest chunk whose run fits in the budget:

    planned_peak(c) + results(B) <= MARGIN · budget

where ``planned_peak(c)`` is what the staged program of one chunk allocates at its peak
(NOTE [planned peak memory] in cuvmap/transforms/executor/peak_memory.py) and
``results(B)`` the arrays the whole call returns (NOTE [choosing a chunk]). The budget is
an int of bytes, or a float in (0, 1]: that fraction of the memory free on the operands'
device when the choice is made. Nothing here runs a chunk to find out: the chunk comes
from staged programs alone, once per signature, and under an enclosing ``jit`` while it
traces.

:class:`ChunkedMap` is the machinery the transforms share: a body ``body(b, leaves)`` that
maps ``b`` examples, its inputs (mapped along an axis, shared, or generated per chunk: a
Jacobian's basis), and how each output combines over the chunks (stacked along an axis,
summed, or shared); :func:`vmap_combine` says how a budgeted ``vmap``'s outputs combine.
Under a transform the chunks are a ``scan`` (this package's), which is why this is
control flow. The public names are :mod:`cuvmap.memory_budget`'s.
"""
import dataclasses
import os
import threading

import numpy as np

from cuvmap import api_util, backend, core, tree
from cuvmap.api_util import TransformError
from cuvmap.core import Tracer
from cuvmap.lax import elementwise, indexing, shape as lax_shape
from cuvmap.lax.control_flow.scan import scan
from cuvmap.transforms import executor, ir, staging

#: the budget of ``chunk_size="auto"`` without ``memory_budget``: half the free memory
DEFAULT_BUDGET = 0.5
#: a chunk's planned peak is held to this fraction of what the call's results leave of the
#: budget (NOTE [choosing a chunk])
MARGIN = 0.85
#: a divisor of B just above the chunk (at most UP_STEP times it) is taken when its planned
#: peak is within this fraction of what the results leave (NOTE [choosing a chunk])
UP_MARGIN = (1 + MARGIN) / 2
UP_STEP = 9 / 8
#: the chunk sizes the choice stages first: per-example and fixed memory from two points
PROBES = (8, 32)
#: signatures a ChunkedMap keeps (its programs and choices)
KEPT = 8

AUTO = "auto"

# NOTE [choosing a chunk]
# The call allocates two things: the results of all B examples (stacked outputs in arrays
# of their full size, sums in accumulators; the eager loop writes each chunk's results into
# them), and, while a chunk runs, what its program allocates (its own results included).
# The chunk's planned peak is close to affine in c (activations and per-example results
# grow with c; the convolutions' blocked columns, constants and the arguments' views do
# not), so the choice stages the program at two small sizes (PROBES), fits peak(c) =
# fixed + c · per_example, solves for the largest c with peak(c) <= MARGIN · (budget -
# results(B)), stages that c and shrinks it while its planned peak is over (each staging
# is a trace and a plan: nothing runs). MARGIN (0.85) leaves room for what the plan does
# not see: temporaries of impls that declare none, and allocator slack; on the benchmark
# networks the measured peaks are 0.54 to 0.98 of the budget (``python -m benchmarks
# memory``). When even one example at a time does not fit, the call raises
# MemoryBudgetError with the figures. A budget that holds every example runs the program
# of all B in one piece.
#
# The choice is cached per signature (argument structure, avals, axes, the budget as
# given: a fraction is resolved against the free memory once, when the signature is first
# met) with the staged programs, so later calls with that signature stage nothing. Eagerly
# the chunks run on the planned executor, one plan for the chunk size and one for the
# remainder; each plan's buffer pool serves its chunks and is emptied when its last chunk is
# done, so the call holds nothing afterwards (its page faults are the price: NOTE [keeping
# freed host memory] in cuvmap/transforms/executor/host_memory.py). Under a transform (an enclosing
# jit, grad or vmap: traced arguments, or a function closing over traced values) the
# chunks are a ``scan`` over the full chunks plus one call for the remainder (JAX's
# ``lax.map(batch_size=)``): the scan writes each chunk's results into its stacked outputs
# and carries the sums, and the remainder's results are joined by a concatenation, which
# holds the stacked results twice for a moment.
#
# A divisor of B just above the chunk (at most 1/8 above it) is taken when its planned peak
# is within UP_MARGIN (0.925, half of MARGIN's slack) of what the results leave: the budget
# still holds it (the planned peaks of the benchmark networks are at or above their measured
# ones), and it saves the remainder's program and the small last chunk. Without it the
# benchmark CNN's per-example gradients at B = 512 under the memory suite's budget took
# chunk 15 (planned 20.2 MiB of a room of 20.4 MiB; chunk 16 plans 21.0 MiB, measured 19.1
# MiB over the results, within the budget's 24.0 MiB) and ran 34 chunks of 15 and one of 2,
# 1.05-1.4 times chunk 16's time (the eager loop's calls, the remainder's plan, oneDNN's
# kernels for batches of 15 against 16).
#
# Two preferences then trade a smaller chunk for time. A chunk that divides B (no
# remainder program to stage, no small last chunk) is taken when one is within a quarter
# of the largest that fits (a smaller chunk costs more calls: halving the chunk of the
# benchmark CNN's per-example gradients slows them down); under a transform within half
# of it, and there whatever its size when the concatenation would not fit. On the CPU a
# chunk whose arrays stay within glibc's mmap threshold (32 MiB) is taken when it is at
# least half of the largest that fits: a larger array is mapped afresh and faults its
# pages in on every chunk (NOTE [large results are mapped afresh] in
# cuvmap/transforms/executor/host_memory.py), which makes the benchmark CNN's DP step slower in
# chunks of 100 or 128 than of 64. ``python -m benchmarks memory`` sweeps chunk sizes
# beside the choice.


class MemoryBudgetError(TransformError):
    """A memory budget too small for even one example at a time (the message has the
    figures: the budget, the planned peak of one example, the results of the call)."""


def check_chunk_spec(chunk_size, memory_budget, where):
    """Validates ``chunk_size`` (None, a positive int or ``"auto"``) and ``memory_budget``
    (None, a positive int of bytes or a float in (0, 1]); returns the chunk spec: None, an
    int, or ``"auto"`` (a budget without a chunk size means ``"auto"``)."""
    if memory_budget is not None:
        if isinstance(memory_budget, (bool, np.bool_)) or not isinstance(memory_budget, (int, float, np.integer,
                                                                                            np.floating)):
            raise TransformError(f"{where}: memory_budget must be an int of bytes or a float fraction of the free "
                                 f"memory in (0, 1], got {memory_budget!r}")
        if isinstance(memory_budget, (float, np.floating)) and not 0 < memory_budget <= 1:
            raise TransformError(f"{where}: memory_budget={memory_budget!r} is a float, a fraction of the free memory: "
                                 "it must be in (0, 1]; give bytes as an int")
        if isinstance(memory_budget, (int, np.integer)) and memory_budget < 1:
            raise TransformError(f"{where}: memory_budget must be a positive number of bytes, got {memory_budget!r}")
        if chunk_size is not None and chunk_size != AUTO:
            raise TransformError(f"{where}: chunk_size={chunk_size!r} and memory_budget={memory_budget!r} both choose "
                                 "the chunk; give chunk_size='auto' (or leave it out) with a budget, or drop the budget")
        return AUTO
    if chunk_size is None or chunk_size == AUTO:
        return chunk_size
    if not api_util.is_int(chunk_size) or chunk_size < 1:
        raise TransformError(f"{where}: chunk_size must be a positive int or 'auto', got {chunk_size!r}")
    return int(chunk_size)


def free_bytes(device):
    """The memory free on ``device`` (``"cpu"`` or ``"gpu:<id>"``): on the CPU the kernel's
    MemAvailable (what can be allocated without swapping), on the GPU the driver's free
    memory plus the free blocks of CuPy's pool."""
    if device and str(device).startswith("gpu"):
        cp = backend.xp_for("gpu")
        free, _ = cp.cuda.runtime.memGetInfo()
        return int(free) + int(cp.get_default_memory_pool().free_bytes())
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 30


def budget_bytes(memory_budget, device):
    """The budget in bytes: an int as given, a fraction of :func:`free_bytes` (None: the
    default fraction, :data:`DEFAULT_BUDGET`)."""
    if memory_budget is None:
        memory_budget = DEFAULT_BUDGET
    if isinstance(memory_budget, (float, np.floating)):
        return max(1, int(memory_budget * free_bytes(device)))
    return int(memory_budget)


def fmt_bytes(n):
    """``n`` bytes in words: ``'3.2 MiB'``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{int(n)} B"


class Generated:
    """An input made per chunk instead of sliced from an array (a Jacobian's basis):
    ``make(start, stop)`` returns its rows ``start:stop`` (axis 0) as a concrete array;
    ``shape`` and ``dtype`` are those of the whole input, ``device`` its device."""

    __slots__ = ("shape", "dtype", "device", "make")

    def __init__(self, shape, dtype, device, make):
        self.shape, self.dtype, self.device, self.make = tuple(shape), np.dtype(dtype), device, make

    @property
    def aval(self):
        return core.ShapedArray(self.shape, self.dtype, False, self.device)


STACK, SUM, SHARED = "stack", "sum", "shared"


def vmap_combine(out_axes):
    """How the chunks of a budgeted vmap combine: each output stacked along its out axis
    (an output with out_axes None is the same in every chunk)."""

    def combine(out_tree, out_avals):
        placeholder = tree.unflatten(out_tree, list(range(len(out_avals))))
        flat_axes = tree.broadcast_prefix(out_axes, placeholder, api_util.is_axis)
        return [(SHARED,) if oa is None else (STACK, oa % max(1, len(a.shape)))
                for oa, a in zip(flat_axes, out_avals)]

    return combine


@dataclasses.dataclass
class _Program:
    """One chunk size's staged program: the program, its plan (eagerly), the output tree,
    its planned peak."""
    program: object
    out_tree: object
    peak: int
    plan: object = None


class _Choice:
    """A signature's chunk, its programs by chunk size, and the figures of the choice."""

    def __init__(self, chunk, budget, reserve, programs):
        self.chunk, self.budget, self.reserve, self.programs = chunk, budget, reserve, programs

    def info(self, size):
        """The choice as a :class:`ChunkPlan`."""
        chunk = max(1, min(self.chunk, size)) if size else 0
        prog = self.programs.get(chunk)
        return ChunkPlan(chunk, size, self.budget, None if prog is None else prog.peak, self.reserve)


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """What a budgeted call does: ``chunk`` examples at a time out of ``size``, within
    ``budget`` bytes (None for a fixed chunk size); ``planned_peak``: the planned peak of
    one chunk's program (its results included); ``results``: the bytes of the call's
    results besides (NOTE [choosing a chunk])."""
    chunk: int
    size: int
    budget: object
    planned_peak: object
    results: int


class ChunkedMap:
    """A map over ``size`` examples run in chunks (NOTE [choosing a chunk]).

    ``body(b, leaves)`` maps ``b`` examples: ``leaves`` are the inputs, the mapped ones with
    ``b`` along their axis (the shared ones whole); it returns ``(flat outputs, out_tree)``
    and is traced on abstract values (a staged program per chunk size). ``combine(out_tree,
    out_avals)`` says, for each output leaf of a chunk of size ``b`` (``out_avals``), how
    the chunks combine: ``(STACK, axis)`` (the examples along ``axis``), ``(SUM,)`` or
    ``(SHARED,)`` (the same in every chunk). ``where`` names the transform in messages and
    ``cache_programs`` says whether the programs may be kept for later calls (the body reads
    nothing but its inputs, as a jitted function)."""

    def __init__(self, where, combine, cache_programs=True, stager=None):
        self.where, self.combine, self.cache_programs = where, combine, cache_programs
        self.stager = stager or staging.Stager(
            why=f"{where} stages the mapped function on abstract values to plan the memory of a chunk (as jit does)",
            hint=staging.JIT_STAGER.hint)
        self.choices = {}
        self.lock = threading.Lock()

    # -- staging ------------------------------------------------------------------------

    def _avals(self, leaves, axes, b):
        avals = []
        for x, a in zip(leaves, axes):
            aval = x.aval if isinstance(x, (Generated, Tracer)) else core.get_aval(np.asarray(x) if isinstance(
                x, np.generic) else x)
            if a is not None:
                shape = list(aval.shape)
                shape[a] = b
                aval = core.ShapedArray(tuple(shape), aval.dtype, aval.weak_type, aval.device)
            avals.append(aval)
        return avals

    def _stage(self, body, leaves, axes, b):
        box = []

        def flat(*traced):
            outs, out_tree = body(b, list(traced))
            box.append(out_tree)
            return list(outs)

        closed = staging.trace_to_jaxpr(flat, self._avals(leaves, axes, b), name=self.where, stager=self.stager)
        program = ir.optimize(closed)
        p = executor.plan(program, graphs=False)
        # a generated input (a Jacobian's basis) is made for each chunk: its rows are
        # memory of the chunk's that the program's plan does not count (its arguments)
        made = sum(b * int(np.prod(x.shape[1:])) * x.dtype.itemsize for x in leaves if isinstance(x, Generated))
        return _Program(program, box[0], executor.planned_peak_bytes(p) + made, p)

    # -- the choice ---------------------------------------------------------------------

    def _out_bytes(self, prog, b, size):
        """``(stacked, other)``: the bytes of the call's stacked results for ``size``
        examples, and of its sums and shared results."""
        specs = self.combine(prog.out_tree, prog.program.out_avals)
        stacked = other = 0
        for spec, aval in zip(specs, prog.program.out_avals):
            nbytes = aval.size * aval.dtype.itemsize
            if spec[0] == STACK:
                stacked += (nbytes // max(b, 1)) * size
            else:
                other += nbytes
        return stacked, other

    def _choose(self, body, leaves, axes, size, spec, budget_spec, device, traced):
        """The choice for a signature not met before (NOTE [choosing a chunk]); returns
        ``(choice, program)``, ``program(b)`` the staged program of ``b`` examples."""
        programs = {}

        def program(b):
            if b not in programs:
                programs[b] = self._stage(body, leaves, axes, b)
            return programs[b]

        if spec != AUTO:
            return _Choice(min(spec, size), None, 0, programs), program
        budget = budget_bytes(budget_spec, device)
        probe = min(size, PROBES[0])
        first = program(probe)
        stacked, other = self._out_bytes(first, probe, size)
        reserve = stacked + other
        room = MARGIN * (budget - reserve)  # what a chunk's program may plan (its results included)

        def whole_fits():  # one piece: its results are the call's, the rest within the margin
            return program(size).peak - reserve <= room
        if size == probe:
            if whole_fits():
                return _Choice(size, budget, reserve, programs), program
            per, fixed = max(1.0, first.peak / probe), 0.0
        else:
            second_size = min(size, PROBES[1])
            second = program(second_size)
            per = max(1.0, (second.peak - first.peak) / (second_size - probe))
            fixed = first.peak - per * probe
            if fixed + per * size - reserve <= room and whole_fits():
                return _Choice(size, budget, reserve, programs), program
        chunk = int((room - fixed) // per) if room > fixed else 1
        chunk = max(1, min(chunk, size - 1))
        for _ in range(8):
            peak = program(chunk).peak
            if peak <= room or chunk == 1:
                break
            chunk = max(1, min(chunk - 1, int(chunk * room / peak)))
        if program(chunk).peak > room:
            one = program(1).peak
            raise MemoryBudgetError(
                f"memory_budget={budget_spec!r} ({fmt_bytes(budget)}) is too small: one example at a time plans "
                f"{fmt_bytes(one)} at its peak, besides {fmt_bytes(reserve)} for the results of all {size} examples "
                f"(a chunk is planned to {MARGIN:.0%} of what the results leave); give at least "
                f"{fmt_bytes(reserve + one / MARGIN)}")
        chunk = self._divisor_above(chunk, size, program, UP_MARGIN * (budget - reserve))
        if device == "cpu":
            chunk = self._heap_choice(chunk, programs)
        if size % chunk:
            chunk = self._divisor_choice(chunk, size, stacked, other, budget, traced)
        return _Choice(chunk, budget, reserve, programs), program

    @staticmethod
    def _divisor_above(chunk, size, program, room):
        """The smallest divisor of ``size`` above ``chunk`` when it is at most ``UP_STEP``
        times ``chunk``, below ``size`` and its planned peak (``program(d).peak``) within
        ``room``; else ``chunk`` (NOTE [choosing a chunk])."""
        if size % chunk == 0:
            return chunk
        d = next(d for d in range(chunk + 1, size + 1) if size % d == 0)
        if d < size and d <= UP_STEP * chunk and program(d).peak <= room:
            return d
        return chunk

    @staticmethod
    def _heap_choice(chunk, programs):
        """On the CPU, the largest chunk whose arrays stay within glibc's mmap threshold
        (NOTE [large results are mapped afresh] in cuvmap/transforms/executor/host_memory.py:
        a larger array faults its pages in again on every chunk), when that is at least half of
        ``chunk``; the largest array per example from the largest program staged."""
        b, prog = max(programs.items(), key=lambda item: item[0])
        largest = max((v.aval.size * v.aval.dtype.itemsize for e in prog.program.jaxpr.eqns for v in e.outs),
                      default=0)
        if not largest or largest <= executor.MMAP_THRESHOLD_BYTES * b / max(b, chunk):
            return chunk
        fitting = int(executor.MMAP_THRESHOLD_BYTES // (largest / b))
        return fitting if 2 * fitting >= chunk else chunk

    @staticmethod
    def _divisor_choice(chunk, size, stacked, other, budget, traced):
        """A chunk dividing ``size`` (no remainder: one program fewer to stage, no small last
        chunk) when one is within a quarter of ``chunk``; under a transform within half of
        it, or whatever it is when the remainder's concatenation (the stacked results
        twice) would not fit (NOTE [choosing a chunk])."""
        divisor = max(d for d in range(1, chunk + 1) if size % d == 0)
        if 4 * divisor >= 3 * chunk or (traced and (2 * divisor >= chunk or 2 * stacked + other > budget)):
            return divisor
        return chunk

    # -- running ------------------------------------------------------------------------

    def __call__(self, body, leaves, axes, size, chunk_spec, budget_spec, key=None):
        """Maps ``body`` over ``size`` examples in chunks; returns ``(flat outputs,
        out_tree)``. ``leaves``/``axes``: the inputs and their mapped axes (None: shared;
        a :class:`Generated` input is mapped along 0); ``chunk_spec``: an int or ``"auto"``;
        ``key``: what else the body depends on (the caller's argument structure, out_axes),
        for the cache."""
        axes = [0 if isinstance(x, Generated) else a for x, a in zip(leaves, axes)]
        choice, program, traced = self._choice(body, leaves, axes, size, chunk_spec, budget_spec, key)
        if traced:
            return self._run_traced(choice, program, body, leaves, axes, size)
        return self._run_eager(choice, program, leaves, axes, size)

    def plan(self, body, leaves, axes, size, chunk_spec, budget_spec, key=None):
        """The :class:`ChunkPlan` that a call with these arguments follows (nothing runs)."""
        axes = [0 if isinstance(x, Generated) else a for x, a in zip(leaves, axes)]
        choice, program, _ = self._choice(body, leaves, axes, size, chunk_spec, budget_spec, key)
        if size:
            program(max(1, min(choice.chunk, size)))
        return choice.info(size)

    def _choice(self, body, leaves, axes, size, chunk_spec, budget_spec, key):
        """``(choice, program, traced)``: the signature's choice (cached, or made now), a
        function giving the staged program of a chunk size, and whether the chunks run
        under a transform (NOTE [choosing a chunk])."""
        traced = (core._state.staging_main is not None
                  or any(isinstance(x, Tracer) for x in leaves))
        device = next((_device_of(x) for x, a in zip(leaves, axes) if a is not None), None) or "cpu"
        sig = (key, tuple(self._avals(leaves, axes, size)), tuple(axes), chunk_spec,
               budget_spec if not isinstance(budget_spec, np.generic) else budget_spec.item(),
               staging.axis_env_key(), traced)
        with self.lock:
            choice = self.choices.get(sig)
        if choice is not None and not self.cache_programs:
            # the body reads values of its call besides its inputs: fresh programs, same chunk
            choice = _Choice(choice.chunk, choice.budget, choice.reserve, {})
            program = self._program_of(choice, body, leaves, axes)
            if size and _holds_tracers(program(max(1, min(choice.chunk, size)))):
                traced = True
            return choice, program, traced
        if choice is not None:
            return choice, self._program_of(choice, body, leaves, axes), traced
        choice, program = self._choose(body, leaves, axes, size, chunk_spec, budget_spec, device, traced)
        if size and not traced and not choice.programs:
            # a fixed chunk size stages nothing to choose: stage the first chunk's program now,
            # to see whether the function closes over an enclosing transform's values
            program(max(1, min(choice.chunk, size)))
        if any(_holds_tracers(p) for p in choice.programs.values()):
            # the function closes over values of an enclosing transform: its programs are for
            # this call only, and its chunks run as a scan under that transform
            return choice, program, True
        with self.lock:
            while len(self.choices) >= KEPT:
                self.choices.pop(next(iter(self.choices)))
            self.choices[sig] = choice if self.cache_programs else _Choice(
                choice.chunk, choice.budget, choice.reserve, {})
        return choice, (self._program_of(choice, body, leaves, axes) if self.cache_programs else program), traced

    def _program_of(self, choice, body, leaves, axes):
        def program(b):
            with self.lock:
                found = choice.programs.get(b)
            if found is None:
                found = self._stage(body, leaves, axes, b)
                with self.lock:
                    choice.programs.setdefault(b, found)
            return found
        return program

    def _run_eager(self, choice, program, leaves, axes, size):
        chunk = max(1, min(choice.chunk, size)) if size else 0
        if chunk == size:  # one piece (size 0 included)
            prog = program(size)
            outs = executor.execute(prog.plan, [_take(x, a, 0, size) for x, a in zip(leaves, axes)])
            return list(outs), prog.out_tree
        results = specs = None
        previous = None
        for start in range(0, size, chunk):
            stop = min(start + chunk, size)
            prog = program(stop - start)
            if previous is not None and prog is not previous:
                executor.empty_pool(previous.plan)  # its buffers would be held while the remainder runs
            previous = prog
            outs = executor.execute(prog.plan, [_take(x, a, start, stop) for x, a in zip(leaves, axes)])
            if results is None:
                specs = self.combine(prog.out_tree, prog.program.out_avals)
                results = [_start_result(o, s, size) for o, s in zip(outs, specs)]
            for i, (o, s) in enumerate(zip(outs, specs)):
                if s[0] == STACK:
                    results[i][(slice(None),) * s[1] + (slice(start, stop),)] = o
                elif s[0] == SUM and start:
                    results[i] += o
            del outs
        executor.empty_pool(previous.plan)
        return results, previous.out_tree

    def _run_traced(self, choice, program, body, leaves, axes, size):
        chunk = max(1, min(choice.chunk, size)) if size else 0
        leaves = [x.make(0, size) if isinstance(x, Generated) else x for x in leaves]
        if chunk == size:
            return body(size, leaves)
        n_full, rem = divmod(size, chunk)
        out_tree = program(chunk).out_tree
        specs = self.combine(out_tree, program(chunk).program.out_avals)
        mapped = [k for k, a in enumerate(axes) if a is not None]
        xs = [_split_chunks(leaves[k], axes[k], n_full, chunk) for k in mapped]
        sums = [k for k, s in enumerate(specs) if s[0] == SUM]
        others = [k for k, s in enumerate(specs) if s[0] != SUM]
        out_avals = program(chunk).program.out_avals
        init = [_zeros(out_avals[k]) for k in sums]

        def step(carry, x_chunk):
            chunk_leaves = list(leaves)
            for k, x in zip(mapped, x_chunk):
                chunk_leaves[k] = x
            outs, _ = body(chunk, chunk_leaves)
            new_carry = [elementwise.add(c, outs[k]) for c, k in zip(carry, sums)]
            return new_carry, [outs[k] for k in others]

        step.__name__ = self.where
        carry, ys = scan(step, init, xs)
        results = [None] * len(specs)
        for c, k in zip(carry, sums):
            results[k] = c
        for y, k in zip(ys, others):
            results[k] = _merge_chunks(y, specs[k]) if specs[k][0] == STACK else _first(y)
        if rem:
            tail = [indexing.slice_in_dim(x, n_full * chunk, size, a) if a is not None else x
                    for x, a in zip(leaves, axes)]
            outs, _ = body(rem, tail)
            for k, s in enumerate(specs):
                if s[0] == SUM:
                    results[k] = elementwise.add(results[k], outs[k])
                elif s[0] == STACK:
                    results[k] = lax_shape.concatenate([results[k], outs[k]], s[1])
        return results, out_tree


def _holds_tracers(prog):
    return any(isinstance(c, Tracer) for c in prog.program.consts)


def _device_of(x):
    if isinstance(x, Generated):
        return x.device
    if isinstance(x, Tracer):
        return x.aval.device
    return backend.backend_name(x) if hasattr(x, "shape") else None


def _take(x, axis, start, stop):
    """Examples ``start:stop`` of an input: a view along ``axis``, rows of a generated one,
    or a shared input as it is."""
    if axis is None:
        return x
    if isinstance(x, Generated):
        return x.make(start, stop)
    if start == 0 and stop == x.shape[axis]:
        return x
    return x[(slice(None),) * axis + (slice(start, stop),)]


def _start_result(first, spec, size):
    """The result array of an output, from its first chunk's value: stacked outputs get
    their full-size array (filled chunk by chunk), a sum starts as a copy of the first
    chunk's (which may be a view of an argument), a shared output is the first chunk's."""
    if spec[0] == SHARED:
        return first
    xp = backend.xp_of(first)
    if spec[0] == SUM:
        return xp.array(first, copy=True)
    shape = list(first.shape)
    shape[spec[1]] = size
    return xp.empty(tuple(shape), dtype=first.dtype)


def _split_chunks(x, axis, n_full, chunk):
    """``x``'s first ``n_full · chunk`` examples along ``axis`` as ``n_full`` chunks along a
    new leading axis (each chunk keeps its examples at ``axis``), for a scan."""
    shape = tuple(core.shape_of(x))
    body = indexing.slice_in_dim(x, 0, n_full * chunk, axis)
    split = lax_shape.reshape(body, shape[:axis] + (n_full, chunk) + shape[axis + 1:])
    if axis == 0:
        return split
    perm = (axis,) + tuple(i for i in range(len(shape) + 1) if i != axis)
    return lax_shape.transpose(split, perm)


def _merge_chunks(y, spec):
    """A scan's stacked output ``(n_full, ..., chunk at axis, ...)`` as ``(..., n_full ·
    chunk, ...)``."""
    axis = spec[1]
    shape = tuple(core.shape_of(y))
    if axis:
        perm = tuple(range(1, axis + 1)) + (0,) + tuple(range(axis + 1, len(shape)))
        y = lax_shape.transpose(y, perm)
        shape = tuple(shape[i] for i in perm)
    return lax_shape.reshape(y, shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:])


def _first(y):
    """``y[0]``: a shared output, the same in every chunk of a scan."""
    return lax_shape.reshape(indexing.slice_in_dim(y, 0, 1, 0), tuple(core.shape_of(y))[1:])


def _zeros(aval):
    """Zeros of ``aval`` on its device (a sum's initial carry)."""
    gpu = aval.device is not None and str(aval.device).startswith("gpu")
    return (backend.xp_for("gpu") if gpu else np).zeros(aval.shape, aval.dtype)
