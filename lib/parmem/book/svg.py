"""Plain SVG charts for the book's in-browser pages (:mod:`parmem.book.web`): drawn from numbers
computed elsewhere, standard library only (no matplotlib in Pyodide).

:func:`stacked_bars` draws the calculator's per-stage breakdown: one horizontal bar per
pipeline stage, one segment per memory term, and a line at the GPU's memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

# the colour and the name of each memory term are the book's figures' own (one home,
# parmem.book.plots.base, which imports matplotlib only when it draws)
from .plots.base import COLORS, LABELS

__all__ = ["COLORS", "LABELS", "stacked_bars"]

_LEFT, _RIGHT, _BAR, _GAP, _TOP = 70, 20, 22, 8, 10


def _ticks(top: float) -> list[float]:
    """Round tick values from 0 to at least ``top``."""
    step = 1.0
    while top / step > 8:
        for factor in (2, 2.5, 2):
            step *= factor
            if top / step <= 8:
                break
    count = int(top // step) + 1
    return [i * step for i in range(count + 1)]


def stacked_bars(
    stages: Sequence[Mapping[str, Any]],
    components: Sequence[str],
    memory_bytes: int,
    unit: int,
    width: int = 640,
    *,
    colors: Mapping[str, str] = COLORS,
    labels: Mapping[str, str] = LABELS,
    row_label: str = "stage {stage}",
    title: str = "memory per GPU by pipeline stage",
    marks: Sequence[tuple[int, str]] = (),
) -> str:
    """An SVG of one bar per stage (``stages``: dicts with ``stage`` and a byte count per name
    of ``components``), stacked in that order, with a dashed line at ``memory_bytes``; the axis
    is in ``unit`` bytes (GiB).

    ``colors`` and ``labels`` give each component's colour and legend text (the book's memory
    terms by default), ``row_label`` each bar's name (``{stage}`` is its ``stage``), ``title``
    the chart's accessible name, and ``marks`` further dotted lines as (bytes, name): the
    serving calculator's engine budget."""
    top = max([memory_bytes, *(sum(max(s[c], 0) for c in components) for s in stages)]) / unit

    def name_of(stage: Mapping[str, Any]) -> str:
        return row_label.format(stage=stage["stage"])

    ticks = _ticks(top)
    scale = (width - _LEFT - _RIGHT) / ticks[-1]
    height = _TOP + len(stages) * (_BAR + _GAP) + 66
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="parmem-bars" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}" font-family="sans-serif" font-size="11">'
    ]
    axis_y = _TOP + len(stages) * (_BAR + _GAP)
    for tick in ticks:
        x = _LEFT + tick * scale
        out.append(
            f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{axis_y}" stroke="#ddd"/>'
            f'<text x="{x:.1f}" y="{axis_y + 13}" text-anchor="middle">{tick:g}</text>'
        )
    out.append(
        f'<text x="{_LEFT + (width - _LEFT - _RIGHT) / 2:.0f}" y="{axis_y + 27}" '
        'text-anchor="middle">GiB per GPU</text>'
    )
    for i, stage in enumerate(stages):
        y = _TOP + i * (_BAR + _GAP)
        out.append(
            f'<text x="{_LEFT - 6}" y="{y + 15}" text-anchor="end">{escape(name_of(stage))}</text>'
        )
        x = float(_LEFT)
        for name in components:
            w = stage[name] / unit * scale
            if w <= 0:
                continue
            label = f"{name_of(stage)}: {labels.get(name, name)} {stage[name] / unit:.2f} GiB"
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{_BAR}" '
                f'fill="{colors.get(name, "#444")}" data-term="{escape(name)}" '
                f'data-bytes="{stage[name]}"><title>{escape(label)}</title></rect>'
            )
            x += w
    mx = _LEFT + memory_bytes / unit * scale
    out.append(
        f'<line x1="{mx:.1f}" y1="{_TOP - 4}" x2="{mx:.1f}" y2="{axis_y}" stroke="#000" '
        f'stroke-dasharray="4 3" data-bytes="{memory_bytes}"><title>GPU memory '
        f"{memory_bytes / unit:.2f} GiB</title></line>"
    )
    for mark, name in marks:
        mx = _LEFT + mark / unit * scale
        out.append(
            f'<line x1="{mx:.1f}" y1="{_TOP - 4}" x2="{mx:.1f}" y2="{axis_y}" stroke="#000" '
            f'stroke-dasharray="1 2" data-bytes="{mark}" data-mark="{escape(name)}"><title>'
            f"{escape(name)} {mark / unit:.2f} GiB</title></line>"
        )
    x, y = float(_LEFT), axis_y + 35
    for name in components:
        label = labels.get(name, name)
        step = 13 + 6.5 * len(label) + 12
        if x + step > width:  # the legend wraps
            x, y = float(_LEFT), y + 16
        out.append(
            f'<rect x="{x:.0f}" y="{y}" width="10" height="10" '
            f'fill="{colors.get(name, "#444")}"/><text x="{x + 13:.0f}" y="{y + 9}">'
            f"{escape(label)}</text>"
        )
        x += step
    out.append("</svg>")
    return "".join(out)
