"""Loops as generated Python: a plan of a loop's body compiled, with the loop around it,
into one function (NOTE [a loop runs as generated Python]).

``scan`` runs its body ``length`` times, ``for i in indices``; ``while_loop`` runs its
predicate's plan and its body's plan one after the other, ``while True``. Either way the
per-step work is the body's straight-line code (:mod:`cuvmap.transforms.executor.codegen`) and a
few bytecodes: no argument lists, no calls of a plan's function, no copies beyond the ys'
rows. The loops are compiled once per plan (and their code once per text: NOTE
[generated code is compiled once per text] in executor/codegen.py) and kept on the plan.
"""
import re

from cuvmap.transforms.executor import codegen
from cuvmap.transforms.executor.buffers import FUSED, MULTI, PLAIN


# NOTE [a loop runs as generated Python]
# A scan calls its body once per step. Calling the body's plan each time pays, per step,
# for building the argument list, the call, unpacking, and copying each ``y`` into its row
# of the stacked result. So a plan also compiles into a loop (:func:`loop_of`): the same
# straight-line body inside ``for i in indices:``, its arguments split into the constants
# (bound once, before the loop), the carries and the rows of ``xs`` (``r3 = X0[i]``, a
# view). A ``y`` computed by a step with a direct writer (``Step.direct``: a ufunc whose
# operands have the result's dtype) is written into its row of the stacked result
# (``out=Y0[i]``), the others are copied there (``Y1[i] = r2``); then the carries' slots
# take the new carries, all at once (``r2, r5, = r9, r2,``), and the next step begins. The
# pool is the plan's: the buffers a step releases serve the next one, so a steady state
# allocates only what the impls allocate themselves (and the new carries, which are the
# next step's arguments and so never written over). A step whose impl (from ``impl_for``)
# carries ``prepare`` and ``prepared`` and whose prepared operands are constants of the
# body calls ``prepare`` on them once, before the loop, and ``prepared`` at every step
# (NOTE [a loop's constant operand transposed once] in cuvmap/lax/linalg.py).
#
# A while loop (:func:`while_of`) puts its predicate's code and its body's code in one
# ``while True:``: the predicate's names get the prefix ``a_`` (its slots are numbered
# like the body's), its carries are the body's, ``if not a_r5: break`` reads its result
# (on the host, as before), and the body's constants are prepared once as a scan's are.


def _prepared_steps(p, invariant, constant_slots, namespace, pad):
    """The lines that prepare, once, the loop-invariant operands (slots ``invariant``) of
    the steps whose impl asks for it, and those steps: ``(lines, {step: operand names})``."""
    lines, prepared = [], {}
    invariant = set(invariant) | set(constant_slots)
    for k, step in enumerate(p.steps):
        prepare = getattr(step.impl, "prepare", None)
        if step.kind != PLAIN or step.params or prepare is None:
            continue
        if not all(f is None or s in invariant for f, s in zip(prepare, step.ins)):
            continue
        operands = [codegen.operand(s, constant_slots) for s in step.ins]
        for j, f in enumerate(prepare):
            if f is not None:
                namespace[f"PR{k}_{j}"] = f
                lines.append(f"{pad}q{k}_{j} = PR{k}_{j}({operands[j]})")
                operands[j] = f"q{k}_{j}"
        namespace[f"G{k}"] = step.impl.prepared
        prepared[k] = operands
    return lines, prepared


def _names(slots):
    return ", ".join(f"r{s}" for s in slots)


def _scan_source(p, num_consts, num_carry):
    """The source of the scan loop of plan ``p`` and its namespace."""
    namespace, constant_slots = codegen.namespace_of(p)
    nc, ncar = num_consts, num_carry
    c_slots, carry_slots, x_slots = p.in_slots[:nc], p.in_slots[nc:nc + ncar], p.in_slots[nc + ncar:]
    y_slots = p.out_slots[ncar:]
    lines = ["def loop(consts, carry, xs, ys, indices):"]
    for names, source in ((_names(c_slots), "consts"), (_names(carry_slots), "carry"),
                          (", ".join(f"X{j}" for j in range(len(x_slots))), "xs"),
                          (", ".join(f"Y{m}" for m in range(len(y_slots))), "ys")):
        if names:
            lines.append(f"    {names}, = {source}")
    head, prepared = _prepared_steps(p, c_slots, constant_slots, namespace, "    ")
    lines += head
    lines.append("    for i in indices:")
    lines += [f"        r{s} = X{j}[i]" for j, s in enumerate(x_slots)]
    # the ys a step's direct writer puts into their rows
    writes = {step.out: k for k, step in enumerate(p.steps)
              if step.direct is not None and step.kind not in (FUSED, MULTI)}
    direct = {writes[s]: m for m, s in enumerate(y_slots)
              if s in writes and p.out_slots.count(s) == 1 and s not in constant_slots}
    lines += codegen.step_lines(p, namespace, constant_slots, "        ",
                                 {k: f"Y{m}[i]" for k, m in direct.items()}, prepared)
    results = codegen.results_of(p, constant_slots)
    written = set(direct.values())
    lines += [f"        Y{m}[i] = {r[6:-1] if r.startswith('FRESH(') else r}"
              for m, r in enumerate(results[ncar:]) if m not in written]
    if ncar:
        lines.append(f"        {_names(carry_slots)}, = {', '.join(results[:ncar])},")
    if lines[-1] == "    for i in indices:":  # a body with nothing to do (no steps, xs, ys or carries)
        lines.append("        pass")
    lines.append(f"    return [{_names(carry_slots)}]")
    return "\n".join(lines) + "\n", namespace


def loop_of(p, num_consts, num_carry):
    """Plan ``p`` compiled as a scan's loop (NOTE [a loop runs as generated Python]):
    ``loop(consts, carry, xs, ys, indices)`` runs the program once for each ``i`` of
    ``indices`` on ``consts``, the carries and the rows ``x[i]`` of ``xs``, writes its
    ``y``\\ s into the rows ``y[i]`` of ``ys`` (arrays the caller made, one per output after
    the carries) and passes its first ``num_carry`` outputs on as the next carries; it
    returns the last carries. Compiled once per plan and shape."""
    key = ("scan", num_consts, num_carry)
    hit = p.loops.get(key)
    if hit is None:
        source, namespace = _scan_source(p, num_consts, num_carry)
        exec(codegen.code_of(source, "<cuvmap scan loop>"), namespace)
        hit = p.loops.setdefault(key, (source, namespace["loop"]))
    return hit[1]


_NAME = re.compile(r"\b(PR\d+_\d+|q\d+_\d+|[rcfwpPKG]\d+)\b")


def _prefixed(lines, namespace, prefix):
    """``lines`` and ``namespace`` with the generated names (slots, impls, pools) given
    ``prefix``, so that two plans' code can share one function."""
    lines = [_NAME.sub(lambda m: prefix + m.group(1), line) for line in lines]
    return lines, {(prefix + k if _NAME.fullmatch(k) else k): v for k, v in namespace.items()}


def _while_source(cond_p, body_p, cond_nconsts, body_nconsts):
    namespace, constant_slots = codegen.namespace_of(body_p)
    c_namespace, c_constant_slots = codegen.namespace_of(cond_p)
    cc_slots, c_carry_slots = cond_p.in_slots[:cond_nconsts], cond_p.in_slots[cond_nconsts:]
    bc_slots, carry_slots = body_p.in_slots[:body_nconsts], body_p.in_slots[body_nconsts:]
    # the predicate's code, its names prefixed; its carries are the body's (the names
    # assigned at the top of each iteration, after the prefixing)
    cond_lines = []
    if cc_slots:
        cond_lines.append(f"    {_names(cc_slots)}, = cond_consts")
    cond_lines += codegen.step_lines(cond_p, c_namespace, c_constant_slots, "        ")
    (keep_going,) = codegen.results_of(cond_p, c_constant_slots)
    cond_lines += [f"        if not {keep_going}:", "            break"]
    cond_lines, c_namespace = _prefixed(cond_lines, c_namespace, "a_")
    top = ["    while True:"]
    if c_carry_slots:
        top.append(f"        {', '.join(f'a_r{s}' for s in c_carry_slots)}, = {_names(carry_slots)},")
    k = 1 if cc_slots else 0
    cond_lines = cond_lines[:k] + top + cond_lines[k:]
    lines = ["def loop(cond_consts, body_consts, carry):"]
    if bc_slots:
        lines.append(f"    {_names(bc_slots)}, = body_consts")
    if carry_slots:
        lines.append(f"    {_names(carry_slots)}, = carry")
    head, prepared = _prepared_steps(body_p, bc_slots, constant_slots, namespace, "    ")
    lines += head + cond_lines
    lines += codegen.step_lines(body_p, namespace, constant_slots, "        ", None, prepared)
    results = codegen.results_of(body_p, constant_slots)
    if carry_slots:
        lines.append(f"        {_names(carry_slots)}, = {', '.join(results)},")
    lines.append(f"    return [{_names(carry_slots)}]")
    namespace.update({k: v for k, v in c_namespace.items() if k.startswith("a_")})
    return "\n".join(lines) + "\n", namespace


def while_of(cond_p, body_p, cond_nconsts, body_nconsts):
    """The plans of a while loop's predicate and body compiled as one loop (NOTE [a loop
    runs as generated Python]): ``loop(cond_consts, body_consts, carry)`` runs the body
    while the predicate (a boolean scalar, read on the host) holds, and returns the last
    carries. Compiled once per pair of plans, kept on the body's plan."""
    key = ("while", id(cond_p), cond_nconsts, body_nconsts)
    hit = body_p.loops.get(key)
    if hit is None or hit[0] is not cond_p:
        source, namespace = _while_source(cond_p, body_p, cond_nconsts, body_nconsts)
        exec(codegen.code_of(source, "<cuvmap while loop>"), namespace)
        hit = body_p.loops[key] = (cond_p, source, namespace["loop"])
    return hit[2]
