"""The book's frame: chapters are committed clean, follow the recipe, and match the toc.

* Every ``chapters/**/*.ipynb`` has no outputs and null execution counts (outputs come from the
  build, never from the repository), is valid nbformat 4 with the ``python3`` kernel, has one
  title, and has the recipe's sections in order (``../shared/DESIGN.md``, "A chapter"): each is
  a heading, or for the short answer an admonition titled so (``:::{admonition} Short answer``).
* Every notebook is listed in ``_toc.yml``, and every ``_toc.yml`` entry exists.
* The API page documents exactly the modules of ``parmem`` that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
RECIPE = [
    "Short answer",
    "Why",
    "Compute it",
    "See it run",
    "Explore",
    "Fact check",
    "Takeaways",
    "Exercises",
    "References",
]
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~|:::)")
ADMONITION = re.compile(r"^\s*(?:```|~~~|:::)\{admonition\}\s+(.*?)\s*$")


def notebooks() -> list[Path]:
    return sorted(p for p in CHAPTERS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


PROSE = re.compile(r'^prose\(r"""\n(.*)\n"""\)$', re.S)


def markdown_sources(nb) -> list[str]:
    """The Markdown of every Markdown cell and of every prose cell (``prose(r\"\"\"...\"\"\")``,
    prose that quotes computed numbers, see ``scripts/live_notebooks.py``), in order."""
    found = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            found.append(cell.source)
        elif cell.cell_type == "code" and (match := PROSE.match(cell.source)):
            found.append(match.group(1))
    return found


def headings(nb) -> list[tuple[int, str]]:
    """(level, text) of every Markdown heading outside code fences and directives, in order;
    an admonition's title counts as a heading of level 0."""
    found = []
    for source in markdown_sources(nb):
        fenced = False
        for line in source.splitlines():
            admonition = None if fenced else ADMONITION.match(line)
            if admonition:
                found.append((0, admonition.group(1)))
            if FENCE.match(line):
                fenced = not fenced
                continue
            match = None if fenced else HEADING.match(line)
            if match:
                found.append((len(match.group(1)), match.group(2)))
    return found


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files: list[str] = [toc["root"]]

    def walk(node) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(str(node["file"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return files


NOTEBOOKS = notebooks()


def test_there_are_chapters():
    assert NOTEBOOKS, "no chapters/**/*.ipynb: the book has no chapter"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=rel)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [
        i for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, (
        f"{rel(path)}: code cells {dirty} have outputs or execution counts; clear them "
        "(JupyterLab: Edit > Clear Outputs of All Cells, then save)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=rel)
def test_valid_notebook_with_python3_kernel(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    assert kernel == "python3", f"{rel(path)}: kernelspec name is {kernel!r}, expected 'python3'"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=rel)
def test_follows_the_recipe(path):
    found = headings(nbformat.read(path, as_version=4))
    titles = [text for level, text in found if level == 1]
    assert len(titles) == 1, f"{rel(path)}: needs exactly one '# ' title, found {titles}"
    assert found[0][0] == 1, f"{rel(path)}: the title must come first, found {found[0]}"
    texts = [text.strip().rstrip(":") for _, text in found]
    missing = [name for name in RECIPE if name not in texts]
    assert not missing, f"{rel(path)}: missing recipe sections (headings) {missing}"
    order = [texts.index(name) for name in RECIPE]
    assert order == sorted(order), (
        f"{rel(path)}: recipe headings out of order; expected {RECIPE}, "
        f"found {[texts[i] for i in sorted(order)]}"
    )


def test_every_toc_entry_exists():
    missing = [
        f for f in toc_files()
        if not any((ROOT / f"{f}{ext}").is_file() for ext in (".md", ".ipynb"))
    ]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_every_notebook_is_in_the_toc():
    listed = set(toc_files())
    unlisted = [rel(p) for p in NOTEBOOKS if rel(p.with_suffix("")) not in listed]
    assert not unlisted, f"notebooks missing from _toc.yml (the site would not show them): {unlisted}"


def test_toc_has_no_duplicates():
    files = toc_files()
    dupes = sorted({f for f in files if files.count(f) > 1})
    assert not dupes, f"_toc.yml lists these more than once: {dupes}"


def parmem_modules() -> set[str]:
    lib = ROOT / "lib"
    found = set()
    for path in (lib / "parmem").rglob("*.py"):
        parts = path.relative_to(lib).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts) or parts[-1] == "__main__":
            continue
        found.add(".".join(parts))
    return found


def test_api_page_lists_every_module():
    listed = set(re.findall(r"^\.\. automodule:: (\S+)", (CHAPTERS / "api.md").read_text(), re.M))
    modules = parmem_modules()
    assert not listed - modules, f"chapters/api.md documents missing modules: {sorted(listed - modules)}; run `python scripts/api_page.py`"
    assert not modules - listed, (
        f"chapters/api.md does not document {sorted(modules - listed)}: run `python scripts/api_page.py`"
    )


CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")


def test_bibliography_parses_strictly_and_has_every_cited_key():
    """references.bib parses without pybtex's complaints (a repeated entry makes sphinxcontrib-
    bibtex drop the file, and then every citation in the book is "not found"), and each key a
    chapter or page cites is in it."""
    from pybtex import errors
    from pybtex.database import parse_file

    errors.set_strict_mode(True)
    entries = set(parse_file(ROOT / "references.bib").entries)
    pages = [*CHAPTERS.rglob("*.ipynb"), *CHAPTERS.glob("*.md"), ROOT / "intro.md"]
    cited = {
        (rel(page), key.strip())
        for page in pages
        for match in CITE.finditer(page.read_text(encoding="utf-8"))
        for key in match.group(1).split(",")
    }
    assert cited, "no citation found: the pattern no longer matches the book's cite roles"
    missing = sorted(f"{where}: {key}" for where, key in cited if key not in entries)
    assert not missing, "cited keys missing from references.bib:\n" + "\n".join(missing)


#: a glued number at the start of a prose line, followed by ". " or ") ": once the number is
#: filled in ("1. Read the difference"), CommonMark may read the line as an ordered list item
#: and split the paragraph (a list starting at 1 interrupts a paragraph; the catalog then holds
#: two messages, and the page shows a list)
_GLUE_AT_LINE_START = re.compile(r"^\s*\{glue:text\}`[^`]*`[.)](\s|$)", re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=rel)
def test_no_glued_number_starts_a_prose_line_as_a_list_marker(path):
    nb = nbformat.read(path, as_version=4)
    bad = [
        (i, m.group(0).strip())
        for i, cell in enumerate(nb.cells)
        for m in _GLUE_AT_LINE_START.finditer(cell.source)
    ]
    assert not bad, f"{rel(path)}: move these to the middle of a line: {bad}"
