"""The README's two commands stay true: the first runs an example that exists, and CI
(.ci/run) runs exactly the second."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
