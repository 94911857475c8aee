"""Prose with computed numbers that reads the same on the site and in a live notebook.

A chapter's text quotes numbers its cells compute (``glue("ch00_states_gib", x)``). myst-nb's
``{glue:text}`` role shows them on the site only: JupyterLab, Binder and Colab have no glue,
and myst-nb's ``{eval}`` role needs a live kernel during the build (the book renders from the
execution cache). So a paragraph that quotes a number is a hidden-input code cell::

    prose(r\"\"\"For Llama-2-7B that is {glue:text}`ch00_states_gib:.1f` GiB.\"\"\")

which displays the paragraph as a Markdown output (MyST: myst-nb renders it on the site,
jupyterlab-myst in JupyterLab) with every ``{glue:text}`name:format``` replaced by the value
:func:`parmem.book.glue` recorded under ``name``, formatted with ``format``. A value computed
later in the chapter (the short answer comes first) shows as :data:`PENDING` until its
``glue`` call, which updates the paragraph in place (``update_display``); the executed
notebook, and so the site, keeps the final text. In Colab, which renders CommonMark only, the
MyST directives and roles are turned into plain Markdown (:func:`to_commonmark`).

Citations (``{cite:t}`key``` and ``{cite:p}`key```) are sphinxcontrib-bibtex's roles: the site
turns them into links to the bibliography, but a live notebook has no bibliography and
jupyterlab-myst shows the bare key. So where a reader runs the chapter (:func:`live_kernel`:
Colab, or a kernel started by a Jupyter server, as JupyterLab, Binder and Jupyter Notebook
start theirs) a paragraph's citations are written as author-year text (:func:`cite_text`),
in the form the site gives them (``Rajbhandari et al. [2020]``, ``[Rajbhandari et al.,
2020]``), from the table ``data/citations.toml`` that ``scripts/live_notebooks.py`` writes from
the book's ``references.bib``. The build executes the chapters outside any Jupyter server
(myst-nb's nbclient, nbval), so the executed notebook, and the site, keep the roles.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from typing import Any

__all__ = [
    "PENDING",
    "prose",
    "fill",
    "record",
    "names",
    "to_commonmark",
    "in_colab",
    "live_kernel",
    "cite_text",
    "citations",
]

#: What a value not computed yet shows as.
PENDING = "…"

GLUE_TEXT = re.compile(r"\{glue:text\}`([A-Za-z_]\w*)(?::([^`]*))?`")

_values: dict[str, Any] = {}
_shown: list[tuple[str, str]] = []  # (display id, source) of every paragraph waiting for a value


def names(source: str) -> list[str]:
    """The glue names ``source`` quotes, in order."""
    return [m.group(1) for m in GLUE_TEXT.finditer(source)]


def fill(source: str, values: dict[str, Any]) -> str:
    """``source`` with each ``{glue:text}`name:format``` replaced by ``format(values[name],
    format)`` (:data:`PENDING` for a name not in ``values``)."""

    def one(match: re.Match[str]) -> str:
        name, spec = match.group(1), match.group(2) or ""
        if name not in values:
            return PENDING
        return format(values[name], spec)

    return GLUE_TEXT.sub(one, source)


_ADMONITION = re.compile(r"^(:::+|```+)\{(\w+)\}\s*(.*)$")
_ROLE = re.compile(r"\{([a-z]+(?::[a-z]+)?)\}`([^`]*)`")


def to_commonmark(source: str) -> str:
    """MyST as plain Markdown for a renderer without MyST (Colab): an admonition becomes a
    quoted block under its bold title, ``{sup}``/``{sub}`` HTML, a citation author-year text
    (:func:`cite_text`), any other role its text as code."""
    out: list[str] = []
    quoting = False
    for line in source.splitlines():
        head = _ADMONITION.match(line.strip())
        if head:
            title = head.group(3) or head.group(2).capitalize()
            out.append(f"> **{title}**")
            out.append(">")
            quoting = True
        elif quoting and line.strip() in (":::", "::::", "```"):
            quoting = False
        elif quoting and line.strip().startswith(":class:"):
            continue
        else:
            out.append(f"> {line}" if quoting else line)
    return _ROLE.sub(_plain_role, cite_text("\n".join(out)))


def _plain_role(match: re.Match[str]) -> str:
    role, text = match.group(1), match.group(2)
    if role in ("sup", "sub"):
        return f"<{role}>{text}</{role}>"
    return f"`{text}`"


def in_colab() -> bool:
    """Whether this kernel runs in Google Colab."""
    return "google.colab" in sys.modules


#: the variable a Jupyter server (jupyter_server 2, under JupyterLab, Binder and Jupyter
#: Notebook 7) sets in the environment of every kernel it starts for a notebook: the notebook's
#: path (``jupyter_server.services.sessions.sessionmanager``; ipykernel shows it as ``__session__``)
SESSION_VARIABLE = "JPY_SESSION_NAME"


def live_kernel() -> bool:
    """Whether a reader runs this kernel (Colab, or a kernel a Jupyter server started), where a
    citation role would show its bare key, rather than the book's build (myst-nb's nbclient,
    nbval), whose output the site renders with its bibliography."""
    return in_colab() or bool(os.environ.get(SESSION_VARIABLE))


_CITE = re.compile(r"\{cite(?::([a-z]+))?\}`([^`]*)`")
# sphinxcontrib-bibtex's textual roles (cite:t; with the full author list, capitalised)
_TEXTUAL = {"t", "ts", "ct", "cts"}


def citations() -> dict[str, tuple[str, str]]:
    """The book's references as ``{key: (authors, year)}``, read from ``data/citations.toml``
    (``scripts/live_notebooks.py`` writes it from ``references.bib``): the authors as
    sphinxcontrib-bibtex's ``author_year`` style gives them (family names; one, "A and B", or
    "A et al." for three or more), in the bibliography's order (author, year, title)."""
    from .._data import load_toml

    table = load_toml("citations.toml")
    return {key: (str(row["authors"]), str(row["year"])) for key, row in table.items()}


def cite_text(source: str) -> str:
    """``source`` with each citation role written as the site writes it, from
    :func:`citations`: ``{cite:t}`` (textual) as ``Rajbhandari et al. [2020]``, ``{cite:p}`` and
    ``{cite}`` (parenthetical) as ``[Rajbhandari et al., 2020]``, several keys joined by commas
    (sphinxcontrib-bibtex's ``author_year`` reference style with its default brackets and
    separators; the other variants of the role read as one of these two). The keys of one
    citation come in the bibliography's order, as on the site. A key not in the table (the build
    would fail on it) shows as itself."""
    if "{cite" not in source:
        return source
    table = citations()
    order = {key: i for i, key in enumerate(table)}

    def one(match: re.Match[str]) -> str:
        textual = (match.group(1) or "p") in _TEXTUAL
        keys = sorted(
            (k.strip() for k in match.group(2).split(",")), key=lambda k: order.get(k, len(order))
        )
        parts = []
        for key in keys:
            authors, year = table.get(key, (key, ""))
            if not year:
                parts.append(authors)
            else:
                parts.append(f"{authors} [{year}]" if textual else f"{authors}, {year}")
        joined = ", ".join(parts)
        return joined if textual else f"[{joined}]"

    return _CITE.sub(one, source)


def _bundle(source: str) -> dict[str, str]:
    text = fill(source, _values)
    if in_colab():
        markdown = to_commonmark(text)
    elif live_kernel():
        markdown = cite_text(text)
    else:
        markdown = text
    return {"text/markdown": markdown, "text/plain": text}


def prose(source: str) -> None:
    """Display ``source`` (MyST Markdown) with its glued numbers filled in; a paragraph that
    waits for a value is updated when :func:`record` gets it. Returns nothing, so the cell shows
    the paragraph once."""
    from IPython.display import display

    display_id = uuid.uuid4().hex
    display(_bundle(source), raw=True, display_id=display_id)
    if any(name not in _values for name in names(source)):
        _shown.append((display_id, source))


def record(name: str, value: Any) -> None:
    """Keep ``value`` under ``name`` and update every displayed paragraph that quotes it."""
    _values[name] = value
    waiting = [(i, s) for i, s in _shown if name in names(s)]
    if not waiting:
        return
    from IPython.display import update_display

    for display_id, source in waiting:
        update_display(_bundle(source), raw=True, display_id=display_id)
    _shown[:] = [(i, s) for i, s in _shown if any(n not in _values for n in names(s))]
