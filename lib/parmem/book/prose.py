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
"""

from __future__ import annotations

import re
import sys
import uuid
from typing import Any

__all__ = ["PENDING", "prose", "fill", "record", "names", "to_commonmark", "in_colab"]

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
    quoted block under its bold title, ``{sup}``/``{sub}`` HTML, a citation its keys, any other
    role its text as code."""
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
    return _ROLE.sub(_plain_role, "\n".join(out))


def _plain_role(match: re.Match[str]) -> str:
    role, text = match.group(1), match.group(2)
    if role in ("sup", "sub"):
        return f"<{role}>{text}</{role}>"
    if role.startswith("cite"):
        return "[" + ", ".join(k.strip() for k in text.split(",")) + "]"
    return f"`{text}`"


def in_colab() -> bool:
    """Whether this kernel runs in Google Colab."""
    return "google.colab" in sys.modules


def _bundle(source: str) -> dict[str, str]:
    text = fill(source, _values)
    return {"text/markdown": to_commonmark(text) if in_colab() else text, "text/plain": text}


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
