"""Helpers the chapters share: ``glue`` numbers into the prose.

:func:`glue` stores a value computed in a cell under a name, so the chapter's text can show it
with ``{glue:text}`name:format``` and the number in the prose is always the number the code
computed (myst-nb's glue). Outside a Jupyter Book build (Colab, a plain kernel) it still works
when myst-nb is installed, and is a silent no-op when it is not.
"""

from __future__ import annotations

__all__ = ["glue"]


def glue(name: str, value, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the book's text (returns nothing, so a cell that ends
    with a glue call shows no output)."""
    try:
        from myst_nb import glue as _glue
    except ImportError:  # pragma: no cover - a reader's kernel without myst-nb
        return
    _glue(name, value, display=display)
