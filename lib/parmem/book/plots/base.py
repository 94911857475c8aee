"""What every figure of the book shares: the colours of the memory terms, a fresh axes, and the
one stacked-bar drawer (:func:`draw_stack`) that the breakdown, comparison, ZeRO, component and
serving figures all use. Units on axes are GiB (2**30 bytes) unless a label says otherwise;
matplotlib is imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...estimate import MemoryBreakdown
from ...units import GIB, KIB, MIB

__all__ = [
    "COLORS",
    "LABELS",
    "UNIT_BYTES",
    "new_axes",
    "draw_stack",
    "stack_breakdowns",
    "size_label",
]

#: One colour per memory term, used by every figure in the book.
COLORS = {
    "params": "#4C72B0",
    "grads": "#55A868",
    "optimizer": "#C44E52",
    "activations": "#8172B2",
    "logits": "#CCB974",
    "comm_buffers": "#64B5CD",
    "cuda_context": "#8C8C8C",
    "loss": "#E5AE38",
    "step_extra": "#DD8452",
}
#: The legend text of each memory term.
LABELS = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "logits": "logits",
    "comm_buffers": "comm buffers",
    "cuda_context": "CUDA context",
    "loss": "loss (transient)",
    "step_extra": "optimizer step (beyond)",
}
#: Bytes per display unit.
UNIT_BYTES = {"B": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB}


def new_axes(ax=None, figsize=(7, 3.6)):
    """``(figure, axes)``: ``ax`` and its figure when given, else a new figure of ``figsize``."""
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    return fig, ax


def draw_stack(
    ax,
    labels: Sequence[str],
    series,
    capacity: int | None = None,
    title: str | None = None,
    capacity_label: str | None = None,
    total_fmt: str | Callable[[float], str] = "{:,.1f}",
    scale: float = GIB,
    ylabel: str = "GiB per GPU",
) -> None:
    """Stacked bars: ``series`` is a list of (legend label, colour, values, one per bar).

    Values are divided by ``scale`` (bytes shown in GiB by default); the total is written above
    each bar with ``total_fmt`` (a format string or a function of the total); ``capacity`` (in
    the values' unit) draws a dashed line, labelled ``capacity_label`` (default "<n> GiB GPU";
    ``""`` for none).
    """
    import numpy as np

    fmt = total_fmt if callable(total_fmt) else total_fmt.format
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for name, color, values in series:
        vals = np.array([v / scale for v in values])
        ax.bar(x, vals, bottom=bottom, color=color, label=name, width=0.65)
        bottom += vals
    for xi, total in zip(x, bottom, strict=True):
        ax.annotate(
            fmt(total),
            (xi, total),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
    if capacity:
        ax.axhline(capacity / scale, color="k", ls="--", lw=1)
        if capacity_label != "":
            ax.annotate(
                capacity_label or f"{capacity / GIB:.0f} GiB GPU",
                (x[-1] + 0.4, capacity / scale),
                ha="right",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.12)
    if title:
        ax.set_title(title, fontsize=10)


def stack_breakdowns(
    ax,
    labels: Sequence[str],
    breakdowns: Sequence[MemoryBreakdown],
    capacity: int | None = None,
    title: str | None = None,
) -> None:
    """One stacked bar per :class:`~parmem.estimate.MemoryBreakdown` (a pipeline stage), a
    segment per non-zero memory term in :data:`COLORS`, legend to the right."""
    series = [
        (LABELS[f], COLORS[f], [getattr(b, f) for b in breakdowns])
        for f in MemoryBreakdown.DRAWN
        if any(getattr(b, f) for b in breakdowns)
    ]
    draw_stack(ax, labels, series, capacity, title, total_fmt="{:.1f}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def size_label(n: int) -> str:
    """A byte count as a short axis label: ``size_label(2**20) == "1 MiB"``."""
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 2**k:
            return f"{n / 2**k:g} {unit}"
    return f"{n} B"
