"""Make every chapter read live as it reads on the site (issue 16). Idempotent; run it after
editing a chapter's prose: ``python scripts/live_notebooks.py`` (``--check``: change nothing,
exit 1 if a chapter would change; tests/book/test_live_cells.py runs that check).

1. **The setup cell.** Each chapter starts with a code cell, removed from the site
   (tag ``remove-cell``), that installs ``parmem`` when the kernel runs in Colab, from the
   repository address in ``_config.yml`` (``repository.url``, the one place it is written), and
   imports :func:`parmem.book.prose`.
2. **Prose with numbers.** Every Markdown block that quotes a glued number
   (``{glue:text}`name:fmt```) becomes a hidden-input code cell ``prose(r\"\"\"...\"\"\")``
   (tag ``remove-input``, ``jupyter.source_hidden``): its Markdown output carries the text with
   the numbers, on the site (myst-nb) and in JupyterLab (jupyterlab-myst) alike. Headings and
   blocks without numbers or citations stay Markdown cells, so the chapter's sections are
   unchanged.
3. **Prose with citations.** A block that cites (``{cite:t}`key```, ``{cite:p}`key```) becomes
   a prose cell too: the site shows the role as a link into the bibliography, but JupyterLab,
   Binder and Colab have no bibliography and would show the bare key, so in a reader's kernel
   ``prose`` writes it as author-year text (:func:`parmem.book.prose.cite_text`).
4. **The citation table** ``data/citations.toml``: each entry of the book's BibTeX files
   (``bibtex_bibfiles`` of ``_config.yml``) as the authors and year that the site's
   ``author_year`` citations show, read with pybtex (sphinxcontrib-bibtex's own parser), so
   that ``prose`` needs neither pybtex nor the ``.bib`` file in a reader's kernel.

Usage: python scripts/live_notebooks.py [--check] [NOTEBOOK ...]  (no notebook: every chapter,
and the citation table)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
SETUP_TAG = "parmem-setup"
PROSE_CALL = re.compile(r'^prose\(r"""\n(.*)\n"""\)$', re.S)
HEADING = re.compile(r"^#{1,6}\s")
OPEN = re.compile(r"^\s*(:::+|```+)\{")
GLUE = "{glue:text}`"
CITE = "{cite"
CITATIONS = ROOT / "data" / "citations.toml"


def repository_url() -> str:
    """``repository.url`` of ``_config.yml``, without a trailing slash."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return str(config["repository"]["url"]).rstrip("/")


def setup_source(url: str) -> str:
    return (
        "# Live notebooks only (this cell is not on the site). In Colab, install parmem, the\n"
        "# book's library, from the book's repository; Colab's machine gets 2 ranks per demo.\n"
        "import os\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:\n'
        f'    %pip install --quiet "parmem @ git+{url}"\n'
        '    os.environ.setdefault("PARMEM_WORLD_SIZE", "2")\n'
        "from parmem.book import prose\n"
    )


def blocks(source: str) -> list[str]:
    """``source`` split at blank lines outside fenced blocks and directives."""
    out: list[list[str]] = [[]]
    depth = 0
    for line in source.splitlines():
        stripped = line.strip()
        if OPEN.match(line):
            depth += 1
        elif depth and stripped and set(stripped) <= {":", "`"}:
            depth -= 1
        if not stripped and depth == 0:
            if out[-1]:
                out.append([])
            continue
        out[-1].append(line)
    return ["\n".join(b) for b in out if b]


def needs_prose(text: str) -> bool:
    """Whether Markdown ``text`` shows something only the site can: a glued number or a
    citation."""
    return GLUE in text or CITE in text


def split_cell(source: str) -> list[tuple[str, str]]:
    """(kind, text) pieces of a Markdown cell: "prose" for runs of blocks that quote a glued
    number or cite (headings excluded), "markdown" for the rest, in order."""
    pieces: list[tuple[str, list[str]]] = []
    for block in blocks(source):
        kind = "prose" if needs_prose(block) and not HEADING.match(block) else "markdown"
        if pieces and pieces[-1][0] == kind:
            pieces[-1][1].append(block)
        else:
            pieces.append((kind, [block]))
    return [(kind, "\n\n".join(bs)) for kind, bs in pieces]


def prose_cell(text: str):
    if '"""' in text or text.endswith("\\"):
        raise ValueError(f'prose cannot hold """ or end in a backslash: {text[:60]!r}')
    cell = nbformat.v4.new_code_cell(f'prose(r"""\n{text}\n""")')
    cell.id = _cell_id(cell)
    cell.metadata = {"tags": ["remove-input"], "jupyter": {"source_hidden": True}}
    return cell


def setup_cell(url: str):
    cell = nbformat.v4.new_code_cell(setup_source(url))
    cell.id = "parmem-setup"
    cell.metadata = {"tags": ["remove-cell", SETUP_TAG], "jupyter": {"source_hidden": True}}
    return cell


def convert(nb, url: str):
    """The chapter with its setup cell first and its numbered prose in prose cells."""
    cells = [c for c in nb.cells if SETUP_TAG not in c.metadata.get("tags", [])]
    out = [setup_cell(url)]
    for cell in cells:
        if cell.cell_type != "markdown" or not needs_prose(cell.source):
            out.append(cell)
            continue
        keep_id = cell.get("id")  # the first Markdown piece keeps the cell's id (easier merges)
        for kind, text in split_cell(cell.source):
            if kind == "prose":
                out.append(prose_cell(text))
                continue
            md = nbformat.v4.new_markdown_cell(text)
            md.id, keep_id = keep_id or _cell_id(md), None
            md.metadata = dict(cell.metadata)
            out.append(md)
    nb.cells = out
    return nb


def chapters() -> list[Path]:
    return sorted((ROOT / "chapters").glob("p*/ch*.ipynb"))


def bib_files() -> list[Path]:
    """The book's BibTeX files: ``bibtex_bibfiles`` of ``_config.yml``."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return [ROOT / name for name in config["bibtex_bibfiles"]]


def bib_style() -> str:
    """The bibliography's pybtex style: ``bibtex_default_style`` of ``_config.yml``."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return str(config["sphinx"]["config"].get("bibtex_default_style", "alpha"))


def _family(person, text_backend) -> str:
    """A person as sphinxcontrib-bibtex's ``last`` name style writes them: the von part and the
    last names (``sphinxcontrib.bibtex.style.names.last``), LaTeX braces and accents resolved.
    ``text_backend``: pybtex's text backend, looked up once (``render_as("text")`` looks the
    plugin up in the installed entry points on every call: 20 s for the book's .bib)."""
    parts = [*person.rich_prelast_names, *person.rich_last_names]
    return " ".join(part.render(text_backend) for part in parts)


def authors_label(names: list[str]) -> str:
    """Authors as sphinxcontrib-bibtex's ``author_year`` style cites them: one family name,
    two joined by "and", three or more as the first one "et al." (its ``PersonStyle``: sep2
    " and ", ``other`` "et al.")."""
    if len(names) <= 2:
        return " and ".join(names)
    return f"{names[0]} et al."


def citation_table(paths: list[Path]) -> str:
    """``data/citations.toml``'s text: one table per BibTeX entry, its ``authors`` (the author
    list, else the editors, as :func:`authors_label` gives them) and ``year`` ("n.d." without
    one, as sphinxcontrib-bibtex writes it), in the bibliography's order: the sort of its pybtex
    style (:func:`bib_style`; ``plain`` sorts by author, year, title), the order in
    which the site lists the keys of one citation."""
    import json

    import pybtex.plugin
    from pybtex.database import parse_file

    entries = [entry for path in paths for entry in parse_file(str(path)).entries.values()]
    style = pybtex.plugin.find_plugin("pybtex.style.formatting", bib_style())()
    text = pybtex.plugin.find_plugin("pybtex.backends", "text")()
    lines = [
        "# Generated by scripts/live_notebooks.py from the book's BibTeX files: do not edit.",
        "# Each entry's authors and year as the site's author_year citations show them, in the",
        "# bibliography's order, for parmem.book.prose.cite_text (a live notebook's citations).",
    ]
    for entry in style.sort(entries):
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        if not persons:
            raise SystemExit(f"{entry.key} has no author or editor")
        authors = authors_label([_family(p, text) for p in persons])
        year = str(entry.fields.get("year", "n.d."))
        lines += [
            "",
            f"[{json.dumps(entry.key)}]",
            f"authors = {json.dumps(authors, ensure_ascii=False)}",
            f"year = {json.dumps(year)}",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args()
    url = repository_url()
    stale = []
    if not args.notebooks:  # every chapter: the citation table too
        table = citation_table(bib_files())
        if not CITATIONS.is_file() or CITATIONS.read_text(encoding="utf-8") != table:
            stale.append(CITATIONS)
            if not args.check:
                CITATIONS.write_text(table, encoding="utf-8")
    for path in [p.resolve() for p in args.notebooks] or chapters():
        before = path.read_text(encoding="utf-8")
        nb = convert(nbformat.reads(before, as_version=4), url)
        nb.nbformat_minor = max(nb.nbformat_minor, 5)
        after = nbformat.writes(nb) + "\n"
        if after != before:
            stale.append(path)
            if not args.check:
                path.write_text(after, encoding="utf-8")
    verb = "would change" if args.check else "changed"
    for path in stale:
        print(f"{verb}: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 1 if args.check and stale else 0


def _cell_id(cell) -> str:
    """A stable cell id from the cell's content, so a second run changes nothing."""
    import hashlib

    return hashlib.sha1((cell.cell_type + cell.source).encode()).hexdigest()[:8]


if __name__ == "__main__":
    sys.exit(main())
