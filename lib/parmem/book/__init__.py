"""What the chapters share: ``glue`` numbers into the prose, tables, figures and explorers.

* :func:`glue` (here): a number computed in a cell, shown in the text;
* :func:`~parmem.book.prose.prose`: a paragraph that quotes glued numbers, shown on the site and
  live alike;
* :mod:`parmem.book.tables`: :class:`~parmem.book.tables.Table`, rows shown as HTML or text;
* :mod:`parmem.book.plots`: matplotlib figures that draw data and compute nothing;
* :mod:`parmem.book.widgets`: the "Explore" dashboards, each bound to the library.

Byte formatters (``gib``, ``mib``, ``fmt_bytes``) live in :mod:`parmem.units`.

:func:`glue` stores a value computed in a cell under a name, so the chapter's text can show it
with ``{glue:text}`name:format``` and the number in the prose is always the number the code
computed (myst-nb's glue). It also hands the value to :func:`parmem.book.prose.record`, which
fills it into the chapter's :func:`~parmem.book.prose.prose` paragraphs: they show the number in
JupyterLab, Binder and Colab too. Without myst-nb (a reader's kernel) only that second part runs.
"""

from __future__ import annotations

from .prose import prose

__all__ = ["glue", "prose"]


def glue(name: str, value, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the book's text (returns nothing, so a cell that ends
    with a glue call shows no output)."""
    from .prose import record

    record(name, value)
    try:
        from myst_nb import glue as _glue
    except ImportError:  # pragma: no cover - a reader's kernel without myst-nb
        return
    _glue(name, value, display=display)
