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


#: the mime-type prefix under which myst-nb's ``glue`` stores a value (``myst_nb.ext.glue``)
GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the book's text (returns nothing, so a cell that ends
    with a glue call shows no output).

    The output is exactly what ``myst_nb.glue`` displays (the value's mime bundle under
    :data:`GLUE_PREFIX`, ``scrapbook`` metadata naming it), written here because importing
    ``myst_nb``'s glue module imports nbformat and, through jsonschema, compiles the lark grammars
    of rfc3987-syntax: about a second of CPU in every chapter's kernel. As before, nothing is
    displayed where myst-nb is not installed (a reader's kernel)."""
    import importlib.util

    from .prose import record

    record(name, value)
    if importlib.util.find_spec("myst_nb") is None:  # pragma: no cover - a reader's kernel
        return
    from IPython.core.formatters import format_display_data
    from IPython.display import display as show

    bundle, metadata = format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    show({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)
