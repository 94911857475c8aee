"""Small tables for notebooks and the terminal: rows of dicts shown as HTML or aligned text.

No pandas needed: a :class:`Table` renders itself with ``_repr_html_`` in a notebook and with
``str()`` elsewhere. Byte columns can be shown in GiB (2**30), MiB (2**20) or exact bytes with the
formatters of :mod:`parmem.units` (``formats={"peak": gib}``).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence

__all__ = ["Table"]


class Table:
    """A table of ``rows`` (dicts sharing keys). ``formats`` maps a column to a function that
    turns a value into text (e.g. :func:`parmem.units.gib`); other values use ``str`` (ints
    with separators).
    """

    def __init__(
        self,
        rows: Sequence[Mapping],
        title: str | None = None,
        formats: Mapping[str, Callable] | None = None,
        columns: Sequence[str] | None = None,
        note: str | None = None,
    ):
        self.rows = [dict(r) for r in rows]
        self.title, self.note = title, note
        self.formats = dict(formats or {})
        self.columns = list(columns) if columns else (list(self.rows[0]) if self.rows else [])

    def _cell(self, col: str, value) -> str:
        if col in self.formats and value is not None:
            return self.formats[col](value)
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        return "" if value is None else str(value)

    def text_rows(self) -> list[list[str]]:
        """Every row as the text of its cells, in column order."""
        return [[self._cell(c, r.get(c)) for c in self.columns] for r in self.rows]

    def __str__(self) -> str:
        body = self.text_rows()
        widths = [
            max(len(c), *(len(r[i]) for r in body)) if body else len(c)
            for i, c in enumerate(self.columns)
        ]
        line = "  ".join(f"{{:>{w}}}" for w in widths)
        out = [self.title] if self.title else []
        out.append(line.format(*self.columns))
        out += [line.format(*r) for r in body]
        if self.note:
            out.append(self.note)
        return "\n".join(out)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>"
            + "".join(f'<td style="text-align:right">{html.escape(x)}</td>' for x in r)
            + "</tr>"
            for r in self.text_rows()
        )
        cap = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        note = f"<p><small>{html.escape(self.note)}</small></p>" if self.note else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"

    def __repr__(self) -> str:
        return str(self)
