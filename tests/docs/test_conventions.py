"""The project's writing conventions, checked over its tracked sources (docs/dev/architecture.md's
"Conventions"): NOTEs cited by title exist, NOTEs state conclusions and the command that
measures them rather than logs of timings, and functorch's file is named by its name."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/this file


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


def test_the_transforms_import_no_lax_module():
    """What the planned executor, fusion and the checkpoint policies need to know about a
    primitive are its attributes (cuvmap.core.Primitive), and the rules the transforms
    write call the operations of the ``cuvmap.lax`` package: no module of
    cuvmap/transforms/ imports a lax module by name (NOTE [a registry that fills itself]
    for the registry's side)."""
    import ast
    import importlib
    import inspect
    import pkgutil

    import cuvmap.transforms

    def lax_imports(tree):
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cuvmap.lax"):
                found.append(node.module)
            elif isinstance(node, ast.Import):
                found += [a.name for a in node.names if a.name.startswith("cuvmap.lax")]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuvmap.lax"):
                found.append(node.value)  # importlib.import_module("cuvmap.lax...")
        return found

    names = [m.name for m in pkgutil.iter_modules(cuvmap.transforms.__path__)]
    assert {"executor", "fusion", "remat", "batching", "vjp"} <= set(names)
    for name in names:
        module = importlib.import_module(f"cuvmap.transforms.{name}")
        assert not lax_imports(ast.parse(inspect.getsource(module))), module.__name__
