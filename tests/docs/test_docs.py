"""The documentation stays true (docs/ and README.md; the site is built by ``mkdocs build
--strict``, which CI runs after the tests):

- every code block marked runnable runs: a line ``<!-- runnable -->`` right before a
  ```` ```python```` block; each page's runnable blocks run in order, in one namespace, and a
  block marked ``<!-- output -->`` right after one holds exactly what it prints;
- every relative link of a page leads to a file that exists (within docs/ for a page of the
  site) and every ``#anchor`` to a heading of its page;
- docs/dev/architecture.md's NOTE index lists every NOTE the code defines, with its file
  (``python tests/docs/test_docs.py --write-note-index`` rewrites it);
- the API reference (docs/api/) renders every public name of cuvmap's public modules.

This file needs no MkDocs: it reads the Markdown itself.
"""
import contextlib
import importlib
import io
import pathlib
import re
import subprocess
import sys
import types
import unicodedata

import pytest


def _root():
    here = pathlib.Path(__file__).resolve().parent
    while not (here / "setup.cfg").exists() and here != here.parent:
        here = here.parent
    return here


ROOT = _root()
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "dev" / "architecture.md"
NOTE_INDEX_BEGIN = "<!-- note-index:begin (generated: python tests/docs/test_docs.py --write-note-index) -->"
NOTE_INDEX_END = "<!-- note-index:end -->"


def _pages():
    """README.md and every page of docs/, as paths relative to the repository's root."""
    return [pathlib.Path("README.md")] + sorted(p.relative_to(ROOT) for p in DOCS.rglob("*.md"))


# ---------------------------------------------------------------------------------------
# Runnable blocks
# ---------------------------------------------------------------------------------------

_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)")


def _fenced_block(lines, start):
    """``(indent, language, code, end)`` of the fenced block whose opening fence is
    ``lines[start]`` (its lines dedented by the fence's indent), ``end`` the index of the
    closing fence."""
    m = _FENCE.match(lines[start])
    if not m:
        return None
    indent, ticks, language = m.group(1), m.group(2), m.group(3)
    for end in range(start + 1, len(lines)):
        if lines[end].strip() == ticks:
            code = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[start + 1:end]]
            return indent, language, "\n".join(code) + "\n", end
    raise AssertionError(f"line {start + 1}: a code block that is never closed")


def runnable_blocks(text):
    """``[(line, code, expected_output or None)]`` of the blocks marked ``<!-- runnable -->``
    in ``text``, in order (``line``: the first line of the code, 1-based)."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        marker = lines[i].strip()
        if marker in ("<!-- runnable -->", "<!-- output -->"):
            block = _fenced_block(lines, i + 1) if i + 1 < len(lines) else None
            if block is None:
                raise AssertionError(f"line {i + 1}: {marker} is not followed by a fenced code block")
            _, language, code, end = block
            if marker == "<!-- runnable -->":
                if language != "python":
                    raise AssertionError(f"line {i + 1}: a runnable block must be a ```python block, not {language!r}")
                blocks.append((i + 3, code, None))
            else:
                if not blocks or blocks[-1][2] is not None:
                    raise AssertionError(f"line {i + 1}: <!-- output --> must follow a runnable block")
                blocks[-1] = (blocks[-1][0], blocks[-1][1], code)
            i = end + 1
        else:
            i += 1
    return blocks


def _normalise(output):
    return "\n".join(line.rstrip() for line in output.strip().splitlines())


PAGES_WITH_BLOCKS = [p for p in _pages() if runnable_blocks((ROOT / p).read_text(encoding="utf-8"))]


def _page_param(page):
    """A page whose blocks take over a second carries a line ``<!-- slow -->``: its test is
    marked ``slow`` (``-m "not slow"`` leaves it out)."""
    slow = "<!-- slow -->" in (ROOT / page).read_text(encoding="utf-8").splitlines()
    return pytest.param(page, marks=pytest.mark.slow) if slow else page


def test_runnable_blocks_are_found():
    assert pathlib.Path("README.md") in PAGES_WITH_BLOCKS
    assert len(PAGES_WITH_BLOCKS) >= 10, PAGES_WITH_BLOCKS


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES_WITH_BLOCKS], ids=str)
def test_runnable_blocks_run(page, monkeypatch):
    """The page's runnable blocks, in order, in one namespace, from the repository's root."""
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": f"docs:{page}"}
    for line, code, expected in runnable_blocks((ROOT / page).read_text(encoding="utf-8")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{page}:{line}", "exec"), namespace)
        if expected is not None:
            assert _normalise(out.getvalue()) == _normalise(expected), \
                f"{page}, the block at line {line} printed\n{out.getvalue()}\ninstead of\n{expected}"


def test_the_block_parser():
    text = "a\n<!-- runnable -->\n```python\nx = 1\nprint(x)\n```\n<!-- output -->\n```text\n1\n```\n" \
           "```python\nnot run\n```\n  <!-- runnable -->\n  ```python\n  y = x\n  ```\n"
    assert runnable_blocks(text) == [(4, "x = 1\nprint(x)\n", "1\n"), (16, "y = x\n", None)]
    with pytest.raises(AssertionError, match="not followed"):
        runnable_blocks("<!-- runnable -->\ntext\n")
    with pytest.raises(AssertionError, match="python"):
        runnable_blocks("<!-- runnable -->\n```bash\nls\n```\n")


# ---------------------------------------------------------------------------------------
# Links and anchors
# ---------------------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def slugify(text):
    """The anchor Python-Markdown's toc extension gives a heading (MkDocs' default)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", text)  # a cross-reference's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(text):
    """The anchors of a page's headings (``{#id}`` where given; a repeated one gets ``_1``, ...)."""
    found, seen = set(), {}
    in_code = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_code = not in_code
            continue
        m = re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if in_code or not m:
            continue
        heading = m.group(2)
        explicit = re.search(r"\{[^}]*#([\w-]+)[^}]*\}\s*$", heading)
        slug = explicit.group(1) if explicit else slugify(heading)
        if slug in seen:
            seen[slug] += 1
            slug = f"{slug}_{seen[slug]}"
        else:
            seen[slug] = 0
        found.add(slug)
    return found


def _prose(text):
    """The page without its code blocks and inline code (links inside them are not links)."""
    out, in_code = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def broken_links(page):
    """``[(target, why)]`` of the relative links of ``page`` (relative to the root) that lead nowhere."""
    text = (ROOT / page).read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(_prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (ROOT / page).parent / path if path else ROOT / page
        if not dest.exists():
            broken.append((target, "no such file"))
            continue
        if page.parts[0] == "docs" and DOCS.resolve() not in dest.resolve().parents:
            broken.append((target, "outside docs/: the site cannot link it"))
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            broken.append((target, "no such heading"))
    return broken


@pytest.mark.parametrize("page", _pages(), ids=str)
def test_links_lead_somewhere(page):
    assert not broken_links(page), f"{page}: broken links {broken_links(page)}"


def test_the_link_checker():
    assert slugify("`jit` and staging: the *plan*") == "jit-and-staging-the-plan"
    assert anchors("# A b\n## A b\n```\n# not a heading\n```\n### C {#see-c}\n") == {"a-b", "a-b_1", "see-c"}
    assert _LINK.findall(_prose("[a](x.md#y) `[b](no.md)` ![img](i.png) [c `d`](e.md)")) == ["x.md#y", "e.md"]


def test_every_page_is_in_the_nav():
    """Each page of docs/ (but the generated performance pages, reached from their
    index) is named in mkdocs.yml's nav, so none is built and left unreachable."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    named = set(re.findall(r"([\w/.-]+\.md)\s*$", config, re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    missing = sorted(p for p in pages - named if not p.startswith("performance/"))
    assert not missing, f"pages mkdocs.yml's nav does not name: {missing}"
    assert not named - pages, f"mkdocs.yml names pages that do not exist: {sorted(named - pages)}"


# ---------------------------------------------------------------------------------------
# The NOTE index
# ---------------------------------------------------------------------------------------

_NOTE = re.compile(r"\s*(?:# )?NOTE \[([^\]]+)\](?::.*)?\s*$")


def _python_sources():
    try:
        out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
        return sorted(out.stdout.split())
    except (OSError, subprocess.CalledProcessError):
        return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if ".git" not in p.parts)


def notes():
    """``{title: [files]}`` of the NOTEs the code defines: a comment line ``# NOTE`` with
    the title in brackets (and maybe a colon and text after it), or a docstring line
    ``NOTE`` and the bracketed title; test modules, which cite NOTEs, are left out (the
    strict CuPy stand-in's are kept)."""
    found = {}
    for path in _python_sources():
        if pathlib.PurePath(path).name.startswith("test_"):
            continue
        for line in (ROOT / path).read_text(encoding="utf-8").splitlines():
            m = _NOTE.match(line)
            if m and path not in found.setdefault(m.group(1), []):
                found[m.group(1)].append(path)
    return found


def note_index():
    """The NOTE index of docs/dev/architecture.md, between its markers."""
    rows = ["| NOTE | defined in |", "|---|---|"]
    defined = notes()
    for title in sorted(defined, key=str.casefold):
        rows.append(f"| {title} | {', '.join(f'`{p}`' for p in defined[title])} |")
    return "\n".join([NOTE_INDEX_BEGIN, *rows, NOTE_INDEX_END])


def _index_in(text):
    start, end = text.find(NOTE_INDEX_BEGIN), text.find(NOTE_INDEX_END)
    assert 0 <= start < end, f"docs/dev/architecture.md has no NOTE index between {NOTE_INDEX_BEGIN} and {NOTE_INDEX_END}"
    return start, end + len(NOTE_INDEX_END)


def test_the_note_index_is_current():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start, end = _index_in(text)
    assert text[start:end] == note_index(), \
        "docs/dev/architecture.md's NOTE index is stale: run `python tests/docs/test_docs.py --write-note-index`"
    assert text[start:end].count("\n| ") > 50


def write_note_index():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start, end = _index_in(text)
    ARCHITECTURE.write_text(text[:start] + note_index() + text[end:], encoding="utf-8")


# ---------------------------------------------------------------------------------------
# The API reference
# ---------------------------------------------------------------------------------------

PUBLIC_MODULES = [
    "cuvmap", "cuvmap.numpy", "cuvmap.numpy.linalg", "cuvmap.lax", "cuvmap.nn", "cuvmap.nn.layers",
    "cuvmap.nn.optim", "cuvmap.dp", "cuvmap.dp.bandmf", "cuvmap.distributed", "cuvmap.random", "cuvmap.tree", "cuvmap.flatten_util",
    "cuvmap.config", "cuvmap.debug", "cuvmap.profiler", "cuvmap.custom_batching", "cuvmap.test_util",
    "cuvmap.custom_derivatives", "cuvmap.dtypes",
    "cuvmap.scipy.special", "cuvmap.scipy.stats.norm",
    "cuvmap.scipy.linalg",
    "cuvmap.numpy.fft",
]


def public_names(module):
    """A module's public names: its ``__all__``, or the functions and classes it defines
    (a package: those of cuvmap it re-exports) whose names have no leading underscore."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    package = hasattr(module, "__path__")
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType) or not callable(value):
            continue
        home = getattr(value, "__module__", None) or ""
        if home == module.__name__ or home.startswith(module.__name__ + "._") or (package and home.startswith("cuvmap")):
            names.append(name)
    return names


def _resolve(path):
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def documented_objects():
    """The objects the API pages render: each ``::: target`` and its ``members:`` list."""
    objects = []
    for page in sorted((DOCS / "api").glob("*.md")):
        target = None
        for line in page.read_text(encoding="utf-8").splitlines():
            m = re.match(r":::\s*(\S+)", line)
            if m:
                target = m.group(1)
                objects.append(_resolve(target))
            elif target and re.match(r"\s+- \w+\s*$", line):
                objects.append(getattr(_resolve(target), line.strip()[2:]))
            elif line.strip() and not line.startswith(" "):
                target = None  # the directive's options end with the first line at the margin
    return objects


def test_the_api_reference_names_every_public_name():
    documented = {id(obj) for obj in documented_objects()}
    missing = []
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        missing += [f"{name}.{n}" for n in public_names(module) if id(getattr(module, n)) not in documented]
    assert not missing, f"public names docs/api/ does not render (add each to its page's members): {missing}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-note-index"]:
        write_note_index()
        print(f"wrote the NOTE index of {ARCHITECTURE.relative_to(ROOT)}: {len(notes())} NOTEs")
    else:
        sys.exit("usage: python tests/docs/test_docs.py --write-note-index")
