"""The README stays true: its two commands (the first runs an example that exists, CI
(.ci/run) runs exactly the second), its Python example, and docs/dev/layout.md, which names every
module of the tree."""
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/<area>/this file


def readme_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.strip() for line in block.strip().splitlines()]


def test_readme_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert text.index("```bash") < text.index("\n## ")  # before any section
    install_and_run, install_and_test = readme_commands()[:2]
    script = re.search(r"python (examples/\S+\.py)", install_and_run).group(1)
    assert (ROOT / script).exists()
    assert install_and_test.startswith("pip install -e \".[test]\"") and "pytest" in install_and_test


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert readme_commands()[1] in ci_lines


def test_readme_python_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "(32, 8, 1, 3, 3)"


def _layout_entries():
    """The paths docs/dev/layout.md block names: a line at the margin names paths (a
    folder ends with ``/``; several are separated by commas), a line indented by two
    spaces names a file of the folder above it, deeper lines continue a description."""
    text = (ROOT / "docs" / "dev" / "layout.md").read_text()
    block = re.search(r"```\n(.*?)```", text, re.S).group(1)
    paths, folder = [], None
    for line in block.splitlines():
        if not line.strip() or line.startswith("   "):
            continue
        names = re.split(r"\s{2,}", line.strip())[0].split(", ")
        if line.startswith("  "):
            paths += [folder + n for n in names]
        else:
            paths += names
            folder = names[-1] if names[-1].endswith("/") else None
    return paths


def test_the_layout_names_every_module_and_nothing_else():
    """Every module of the package has its line in docs/dev/layout.md (a folder's
    ``__init__.py`` is the folder's line), every top-level entry of the tree is named,
    and every path named exists."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    files = tracked.stdout.split()
    named = _layout_entries()
    missing = [f for f in files if f.startswith("cuvmap/") and f.endswith(".py")
               and f not in named and not (f.endswith("/__init__.py") and f[:-len("__init__.py")] in named)]
    assert not missing, f"modules docs/dev/layout.md does not name: {missing}"
    tops = {f.split("/")[0] + ("/" if "/" in f else "") for f in files}
    unnamed = sorted(t for t in tops if not any(n == t or n.startswith(t) for n in named)
                     and t not in ("README.md", ".gitignore"))
    assert not unnamed, f"top-level entries docs/dev/layout.md does not name: {unnamed}"
    stale = [n for n in named if not (ROOT / n).exists()]
    assert not stale, f"docs/dev/layout.md names paths that do not exist: {stale}"
