"""Counts the function-local imports into cuvmap.

A function-local import is an ``import``/``from ... import`` statement inside a function
body (at any depth below a ``def``/``async def``/``lambda``); it is *into cuvmap* when its
module is ``cuvmap`` or below it, or relative (``from . import x``). Module-level imports,
those under ``if TYPE_CHECKING:`` at the top, and imports of other packages are not counted.

Usage: ``python tools/count_local_imports.py [--list] [--all] [ROOT]`` (ROOT defaults to
``cuvmap/`` beside this folder). Prints ``N function-local imports into cuvmap (M in
all)``; ``--list`` prints each one as ``path:line: statement  # reason`` (the reason is the
comment on the import's line or the comment lines right above it); ``--all`` lists the others too.
"""
import ast
import pathlib
import sys


def _module_of(node):
    if isinstance(node, ast.ImportFrom):
        return "." * node.level + (node.module or "")
    return ", ".join(a.name for a in node.names)


def _into_cuvmap(node):
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "cuvmap"
    return any(a.name.split(".")[0] == "cuvmap" for a in node.names)


def local_imports(path):
    """``(line, into_cuvmap, module)`` for each function-local import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                found.append((child.lineno, _into_cuvmap(child), _module_of(child)))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def _reason(lines, lineno):
    """The comment that gives an import's reason: on its line, or the comment lines
    right above it."""
    line = lines[lineno - 1]
    if "#" in line:
        return line.split("#", 1)[1].strip()
    above = []
    k = lineno - 2
    while k >= 0 and lines[k].strip().startswith("#"):
        above.insert(0, lines[k].strip().lstrip("#").strip())
        k -= 1
    return " ".join(above)


def main(argv):
    show = "--list" in argv
    show_all = "--all" in argv
    rest = [a for a in argv if not a.startswith("--")]
    root = pathlib.Path(rest[0]) if rest else pathlib.Path(__file__).resolve().parent.parent / "cuvmap"
    into = total = 0
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for lineno, inside, module in local_imports(path):
            total += 1
            into += inside
            if (show and inside) or show_all:
                print(f"{path.relative_to(root.parent)}:{lineno}: {module}  # {_reason(lines, lineno)}")
    print(f"{into} function-local imports into cuvmap ({total} in all)")


if __name__ == "__main__":
    main(sys.argv[1:])
