"""The project's writing conventions, checked over its tracked sources (docs/dev/architecture.md's
"Conventions"): NOTEs cited by title exist, NOTEs state conclusions and the command that
measures them rather than logs of timings, functorch's file is named by its name; and the
shape of cuvmap/: its import graph (no cycle but the transforms <-> lax rule helpers', the
floors kept), function-local imports that say why, no module over 700 lines."""
import functools
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/this file


@functools.cache
def _sources():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        paths = out.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    texts = {}
    for p in paths:
        if p.endswith((".py", ".md", ".sh", ".cfg")) and p != "tests/docs/test_conventions.py":  # (this file quotes them)
            with open(os.path.join(ROOT, p), encoding="utf-8") as fh:
                texts[p] = fh.read()
    return texts


def _note_blocks(text):
    """``{title: body}`` of the NOTEs a Python file defines: a line ``# NOTE [title]`` (or
    ``# NOTE [title]: text``) and the comment lines after it, or a docstring line
    ``NOTE [title]`` and the lines after it up to a blank one."""
    blocks = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*(# )?NOTE \[([^\]]+)\](?::(.*))?\s*$", line)
        if m:
            comment = m.group(1) is not None
            body = [m.group(3)] if m.group(3) else []
            for follow in lines[i + 1:]:
                stripped = follow.strip()
                if (comment and not stripped.startswith("#")) or (not comment and not stripped):
                    break
                body.append(stripped[1:] if comment else stripped)
            blocks[m.group(2)] = " ".join(body)
    return blocks


def test_every_cited_note_exists():
    texts = _sources()
    defined = set()
    for p, t in texts.items():
        if p.endswith(".py"):
            defined |= set(_note_blocks(t))
    cited = {}
    for p, t in texts.items():
        flat = re.sub(r"\s*\n\s*#?\s*", " ", t)  # citations wrap across comment lines
        for title in re.findall(r"NOTEs? \[([^\]]+)\]", flat):
            cited.setdefault(title, p)
        for pair in re.findall(r"NOTEs \[([^\]]+)\] and \[([^\]]+)\]", flat):
            for title in pair:
                cited.setdefault(title, p)
    missing = {title: p for title, p in cited.items() if title not in defined}
    assert not missing, f"NOTEs cited but defined nowhere: {missing}"


def test_notes_are_not_logs_of_timings():
    """A NOTE keeps its conclusion and the command that measures it; the figures belong to
    the benchmarks' output (docs/dev/architecture.md: performance claims live in benchmarks/)."""
    timed = {}
    for p, t in _sources().items():
        if p.endswith(".py"):
            for title, body in _note_blocks(t).items():
                figures = re.findall(r"\d(?:\.\d+)?\s*(?:ms|µs|us)\b|\d(?:\.\d+)?\s*/\s*\d(?:\.\d+)?\s*ms", body)
                if figures:
                    timed[f"{p}: NOTE [{title}]"] = figures
    assert not timed, f"NOTEs with timing figures: {timed}"


def test_functorchs_file_is_named_not_called_the_seed():
    found = []
    # a random number generator's seed is another word (cuvmap.random, its hash)
    rng_files = ("cuvmap/random.py", "cuvmap/lax/prng.py", "tests/lax/test_random.py")
    for p, t in _sources().items():
        if p.endswith(rng_files):
            continue
        for n, line in enumerate(t.splitlines(), 1):
            if re.search(r"\bthe seed\b|\bseed's\b", line, re.IGNORECASE):
                found.append(f"{p}:{n}: {line.strip()}")
    assert not found, "name functorch's BatchRulesConvolution.cpp instead of 'the seed':\n" + "\n".join(found)


# ---------------------------------------------------------------------------------------
# The import graph of cuvmap/ (the rules are stated here, in the tests' docstrings)
# ---------------------------------------------------------------------------------------

# The rule helpers of the transforms (vmap's moves of a batch dim, the tangent and
# cotangent sums and casts, staging's cast of a weak operand) bind lax primitives, and the
# lax families register their rules with those same transform modules: that is the one
# import cycle cuvmap allows. Its edges into lax are function-local imports of the family
# modules the helper uses (never the cuvmap.lax package), in these modules only.
RULE_HELPERS = {"cuvmap.transforms.batching", "cuvmap.transforms.jvp", "cuvmap.transforms.vjp",
                "cuvmap.transforms.staging", "cuvmap.transforms.linearize", "cuvmap.transforms.custom_derivatives",
                "cuvmap.transforms.custom_batching_rules"}


@functools.cache
def _cuvmap_modules():
    """``{dotted name: path}`` of every module of cuvmap/ (a package by its ``__init__.py``)."""
    base = os.path.join(ROOT, "cuvmap")
    modules = {}
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules[".".join(parts)] = os.path.join(folder, f)
    return modules


@functools.cache
def _import_graph():
    """``{module: [(imported module, line, local)]}`` over cuvmap/'s modules: every
    ``import``/``from ... import`` statement that names a module of cuvmap (``from P
    import n`` names ``P.n`` when that is a module, else ``P``), ``local`` when the
    statement is inside a function. An edge goes to the module named, not to the packages
    above it (importing ``cuvmap.lax.shape`` runs ``cuvmap/lax/__init__.py`` as well, but
    that is the package's re-export, not a dependency of the importer)."""
    import ast

    modules = _cuvmap_modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        edges = []

        def visit(node, local):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    edges.extend((a.name, child.lineno, local) for a in child.names if a.name in modules)
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        up = package.split(".")[:len(package.split(".")) - (child.level - 1)]
                        base = ".".join(up + ([child.module] if child.module else []))
                    for a in child.names:
                        target = f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                        if target in modules:
                            edges.append((target, child.lineno, local))
                visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(tree, False)
        graph[name] = [e for e in edges if e[0] != name]
    return graph


def _strongly_connected(graph, keep=lambda edge: True):
    """The strongly connected components of ``graph`` (Tarjan's, iterative) over the edges
    ``keep`` accepts: a list of sets, those of more than one module only."""
    succ = {v: sorted({e[0] for e in edges if keep(e)}) for v, edges in graph.items()}
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            for w in succ[v]:
                if w in on_stack:
                    low[v] = min(low[v], low[w])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _in_rule_helper_cycle(module):
    """The modules the one allowed cycle may hold: the transforms and the lax families
    (control flow, which the transforms never import, and the lax package aside)."""
    return (module.startswith("cuvmap.transforms.")
            or (module.startswith("cuvmap.lax.") and not module.startswith("cuvmap.lax.control_flow")))


def test_the_module_level_imports_have_no_cycle():
    """Imports at module top never form a cycle: a module can always be imported first."""
    cycles = _strongly_connected(_import_graph(), keep=lambda edge: not edge[2])
    assert not cycles, f"import cycles through module-level imports: {[sorted(c) for c in cycles]}"


def test_no_import_cycle_but_the_transforms_and_their_rule_helpers_families():
    """Counting function-local imports too, the only cycle is the transforms <-> lax
    rule-helper families' (RULE_HELPERS): one strongly connected component, of modules of
    cuvmap/transforms/ and lax family modules only. Every other function-local import into
    cuvmap (optional code: CuPy's, a vendor binding) closes no cycle."""
    cycles = _strongly_connected(_import_graph())
    assert len(cycles) <= 1, f"more than one import cycle: {[sorted(c) for c in cycles]}"
    for cycle in cycles:
        outside = sorted(m for m in cycle if not _in_rule_helper_cycle(m))
        assert not outside, f"modules in the transforms <-> lax cycle that do not belong there: {outside}"


def test_the_lower_floors_never_reach_up_to_the_api():
    """core, the transforms, the primitive families and the vendor bindings import nothing
    of the API layer above them (the floors: core -> transforms -> lax -> numpy, api -> nn,
    dp), not even inside a function: ``lax.map`` in chunks runs vmap's flat core
    (transforms/batching.py) and ChunkedMap (lax/control_flow/chunked.py) rather than
    ``cuvmap.api`` and ``cuvmap.memory_budget``."""
    above = ("cuvmap.api", "cuvmap.jit_api", "cuvmap.memory_budget", "cuvmap.profiler", "cuvmap.nn", "cuvmap.dp",
             "cuvmap.numpy")
    below = ("cuvmap.core", "cuvmap.transforms", "cuvmap.lax", "cuvmap.cpu", "cuvmap.cuda")
    found = [f"{module}:{line}: {target}" for module, edges in _import_graph().items()
             if module in below or module.startswith(tuple(b + "." for b in below))
             for target, line, _ in edges
             if target in above or target.startswith(tuple(a + "." for a in above))]
    assert not found, "imports from below the API layer up into it:\n" + "\n".join(found)


def test_the_transforms_import_lax_only_in_their_rule_helpers():
    """What the planned executor, fusion and the checkpoint policies need to know about a
    primitive are its attributes (cuvmap.core.Primitive, NOTE [a registry that fills
    itself]); only the rule helpers bind lax primitives, and they import the family
    modules they use inside the helper (lax imports the transforms: the one allowed
    cycle), never the cuvmap.lax package."""
    bad = []
    for module, edges in _import_graph().items():
        if not module.startswith("cuvmap.transforms."):
            continue
        for target, line, local in edges:
            if target == "cuvmap.lax" or (target.startswith("cuvmap.lax.") and (
                    not local or module not in RULE_HELPERS)):
                bad.append(f"{module}:{line}: {target}{'' if local else ' (at module level)'}")
    assert not bad, "the transforms import lax outside their rule helpers:\n" + "\n".join(bad)


def test_function_local_imports_say_why():
    """A function-local import into cuvmap is for optional code or a documented cycle, and
    its comment says which (tools/count_local_imports.py lists them with their reasons; this
    test reads the import graph's function-local edges and the tool's reading of a reason)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("count_local_imports",
                                                  os.path.join(ROOT, "tools", "count_local_imports.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    modules = _cuvmap_modules()
    silent = []
    for module, edges in _import_graph().items():
        local = sorted({(line, target) for target, line, is_local in edges if is_local})
        if not local:
            continue
        with open(modules[module], encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        silent += [f"{os.path.relpath(modules[module], ROOT)}:{line}: {target}"
                   for line, target in local if not tool._reason(lines, line)]
    assert not silent, "function-local imports without a comment saying why:\n" + "\n".join(silent)


def test_no_module_over_700_lines():
    """A module past 700 lines holds more than one idea: split it along them."""
    long = {name: n for name, path in _cuvmap_modules().items()
            if (n := sum(1 for _ in open(path, encoding="utf-8"))) > 700}
    assert not long, f"modules of cuvmap/ over 700 lines: {long}"
