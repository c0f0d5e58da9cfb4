"""Code generation: a plan's steps compiled into one straight-line Python function (NOTE [a
plan runs as generated Python]), the code objects kept by their text (NOTE [generated
code is compiled once per text]). The pieces (:func:`namespace_of`, :func:`step_lines`,
:func:`results_of`, :func:`operand`, :func:`code_of`) are also what
:mod:`cuvmap.transforms.loop_plans` builds its loops from.
"""
import numpy as np

from cuvmap import backend, lru
from cuvmap.transforms.executor.buffers import FUSED, IN_PLACE, MULTI, PLAIN

# NOTE [a plan runs as generated Python]
# A call of a staged program should cost little more than the impls it calls. A loop over
# step tuples pays, per step, for unpacking the tuple, building the operand list, a branch on
# the step kind and the release/clear loops; so the plan is compiled once into the source
# of one straight-line Python function (as ``dataclasses`` and ``torch.fx`` do), whose
# locals are the slots: ``r7 = f7(r3, c2)``; a slot's last use is followed by ``del r7``;
# a pooled step pops its buffer from a list bound to the (shape, dtype) key; a released
# root is appended to that list. The steps stay as data on the plan (tests and tools read
# them); :func:`source` shows the generated code.

def operand(s, constant_slots):
    return f"c{s}" if s in constant_slots else f"r{s}"


def _call(k, ins, params, constant_slots, out=None):
    args = [operand(s, constant_slots) for s in ins]
    if params:
        args.append(f"**p{k}")
    if out is not None:  # the step's writer: the ufunc, or the primitive's impl_into
        args.append(f"out={out}")
        return f"w{k}({', '.join(args)})"
    return f"f{k}({', '.join(args)})"


def _fresh(value):
    """A copy of a constant that a program returns (arrays are mutable; numbers are not)."""
    return value.copy() if hasattr(value, "copy") and hasattr(value, "shape") else value


def namespace_of(p):
    """The names every generated function of plan ``p`` reads, and its constants
    (``c{slot}``); returns ``(namespace, constant slots)``."""
    computed = set()
    for step in p.steps:
        computed.update(step.outs)
    constant_slots = {s for s in range(len(p.init)) if s not in computed and s not in p.in_slots}
    namespace = {"ndarray": np.ndarray, "generic": np.generic,
                 # a scalar result becomes a 0-d array of the plan's device (CuPy refuses NumPy operands)
                 "asarray": np.asarray if p.array_types[0] is np.ndarray else backend.xp_for("gpu").asarray,
                 "ARRAY_TYPES": p.array_types, "EMPTY": p.empty, "FRESH": _fresh}
    for s in constant_slots:
        namespace[f"c{s}"] = p.init[s]
    return namespace, constant_slots


def results_of(p, constant_slots):
    """The expressions of ``p``'s results: a constant returned is copied (the caller owns
    its results, and may write into them)."""
    return [f"FRESH(c{s})" if s in constant_slots else f"r{s}" for s in p.out_slots]


def step_lines(p, namespace, constant_slots, pad, direct=None, prepared=None, timed=False):
    """The lines of ``p``'s steps, indented by ``pad``, their names bound in ``namespace``
    (NOTE [a plan runs as generated Python]). ``direct``: ``{step: expression}``, the
    steps whose writer puts the result into that buffer; ``prepared``: ``{step: operand
    names}``, the steps that call their impl's ``prepared`` on those operands (NOTE [a loop
    runs as generated Python] in cuvmap/transforms/loop_plans.py). ``timed``: each step
    reads ``CLOCK()`` before and after and adds the difference to ``TIMES[k]`` (names the
    caller binds: :func:`timed_program`)."""
    direct, prepared = direct or {}, prepared or {}
    out_is_scalar = p.out_is_scalar
    lines = []
    pool_names = {}

    def pool_list(key):
        if key not in pool_names:
            name = f"P{len(pool_names)}"
            pool_names[key] = name
            namespace[name] = p.pool.setdefault(key, [])
        return pool_names[key]

    for k, step in enumerate(p.steps):
        kind, impl, ins, params, aux, writer = step.kind, step.impl, step.ins, step.params, step.aux, step.writer
        if timed:
            lines.append(f"{pad}t = CLOCK()")
        namespace[f"f{k}"] = impl
        if writer is not None:
            namespace[f"w{k}"] = writer
        if params:
            namespace[f"p{k}"] = params
        plain = _call(k, ins, params, constant_slots)
        outs = step.outs
        r = f"r{outs[0]}"
        if k in direct:
            # the step's writer puts its result where the caller asks (a loop's y, into its row)
            namespace[f"w{k}"] = step.direct
            y = direct[k]
            lines += [f"{pad}try:",
                      f"{pad}    {r} = {_call(k, ins, params, constant_slots, out=y)}",
                      f"{pad}except (TypeError, ValueError):",
                      f"{pad}    {r} = {plain}",
                      f"{pad}    {y} = {r}"]
        elif k in prepared:
            lines.append(f"{pad}{r} = G{k}({', '.join(prepared[k])})")
        elif kind in (FUSED, MULTI):
            lines.append(f"{pad}{', '.join(f'r{o}' for o in outs)}, = {plain}")
        elif kind == PLAIN:
            lines.append(f"{pad}{r} = {plain}")
        elif kind == IN_PLACE:
            t = f"r{aux}"
            lines += [f"{pad}if type({t}) in ARRAY_TYPES and {t}.base is None:",
                      f"{pad}    try:",
                      f"{pad}        {r} = {_call(k, ins, params, constant_slots, out=t)}",
                      f"{pad}    except (TypeError, ValueError):",
                      f"{pad}        {r} = {plain}",
                      f"{pad}else:",
                      f"{pad}    {r} = {plain}"]
        else:
            pl = pool_list(aux)
            if writer is not impl and aux[1].kind == "f" and p.array_types[0] is np.ndarray:
                # a writer that is not a ufunc (select's impl_into, for floats) gets a fresh
                # buffer when the pool is empty: its plain impl returns a view, which would
                # never give the pool a buffer. (A ufunc keeps its own result dtype: NumPy's
                # sqrt of uint8 is float16, where the aval says float64.)
                key = f"K{pl[1:]}"
                namespace[key] = aux
                lines += [f"{pad}try:",
                          f"{pad}    {r} = {_call(k, ins, params, constant_slots, out=f'({pl}.pop() if {pl} else EMPTY(*{key}))')}",
                          f"{pad}except (TypeError, ValueError, IndexError):",
                          f"{pad}    {r} = {plain}"]
            else:
                lines += [f"{pad}if {pl}:",
                          f"{pad}    try:",
                          f"{pad}        {r} = {_call(k, ins, params, constant_slots, out=f'{pl}.pop()')}",
                          f"{pad}    except (TypeError, ValueError, IndexError):",
                          f"{pad}        {r} = {plain}",
                          f"{pad}else:",
                          f"{pad}    {r} = {plain}"]
        if out_is_scalar[k]:
            for o in outs:
                lines.append(f"{pad}if type(r{o}) is not ndarray and isinstance(r{o}, generic): r{o} = asarray(r{o})")
        for s, key in step.release:
            lines.append(f"{pad}if type(r{s}) in ARRAY_TYPES and r{s}.base is None: {pool_list(key)}.append(r{s})")
        cleared = [f"r{s}" for s in step.clear if s not in constant_slots]
        if cleared:
            lines.append(f"{pad}del {', '.join(cleared)}")
        if timed:
            lines.append(f"{pad}TIMES[{k}] += CLOCK() - t")
    return lines


def compile_plan(p, timed=False):
    """The source of ``p``'s straight-line function, and the namespace it runs in
    (``timed``: each step timed, :func:`timed_program`)."""
    namespace, constant_slots = namespace_of(p)
    lines = ["def program(args):"]
    if p.in_slots:
        lines.append(f"    {', '.join(f'r{s}' for s in p.in_slots)}, = args")
    lines += step_lines(p, namespace, constant_slots, "    ", timed=timed)
    lines.append(f"    return [{', '.join(results_of(p, constant_slots))}]")
    return "\n".join(lines) + "\n", namespace


def timed_program(p, clock):
    """A function that runs plan ``p`` as its program does (same steps, same buffer pool)
    and adds the time of each step, read by ``clock()`` before and after it, to
    ``times[k]``: returns ``(program, times)``, ``times`` a list of floats (cuvmap.profiler)."""
    source, namespace = compile_plan(p, timed=True)
    times = [0.0] * len(p.steps)
    namespace.update(CLOCK=clock, TIMES=times)
    exec(code_of(source, "<cuvmap timed plan>"), namespace)
    return namespace["program"], times


# NOTE [generated code is compiled once per text]
# Python's ``compile`` is most of the cost of a small plan, and eager transforms make the
# same plans again and again: ``grad`` of a function that calls ``lax.scan`` stages the
# body anew at every call, and derives and plans its forward and backward bodies anew, and
# their text is the same each time (the slots are numbered in program order; the
# functions, params and constants are names bound in the namespace, not text). So the code
# objects are kept by their text, a bounded cache (:data:`CODE_CACHE_SIZE` entries), and a
# plan made again costs its planning and an ``exec`` of code already compiled.
CODE_CACHE_SIZE = 512
_code_cache = lru.LRU(CODE_CACHE_SIZE)


def code_of(source, filename):
    """The code object of ``source`` (NOTE [generated code is compiled once per text])."""
    key = (source, filename)
    code = _code_cache.get(key)
    if code is None:
        code = _code_cache.put(key, compile(source, filename, "exec"))
    return code


def source(p):
    """The generated Python of plan ``p`` (NOTE [a plan runs as generated Python])."""
    return p.source
