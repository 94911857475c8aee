"""Figures of memory: one estimate's stages, layouts side by side, named byte components, the
activation terms of one layer, and plain line charts.

Every function takes data (an :class:`~parmem.estimate.Estimate`, a dict of them, a list of
activation terms, rows of bytes) and returns the matplotlib ``Figure``; pass ``ax=`` to draw
into an existing axes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...estimate import Estimate
from .base import UNIT_BYTES, draw_stack, new_axes, stack_breakdowns

__all__ = [
    "plot_breakdown",
    "plot_compare",
    "plot_breakdowns",
    "plot_stacked",
    "plot_terms",
    "plot_terms_compare",
    "plot_lines",
]


def plot_breakdown(est: Estimate, ax=None, capacity: int | None = None, title: str | None = None):
    """Stacked bars of every pipeline stage's memory terms for one estimate."""
    fig, ax = new_axes(ax)
    labels = [f"stage {s.stage}\n({s.layers} layers)" for s in est.stages]
    stack_breakdowns(ax, labels, est.stages, capacity, title or f"{est.spec.name}: {est.parallel}")
    return fig


def plot_compare(
    estimates: Mapping[str, Estimate],
    ax=None,
    capacity: int | None = None,
    title: str | None = None,
    stage: str | int = "peak",
):
    """Stacked bars comparing layouts: the peak stage of each (or a fixed stage index)."""
    fig, ax = new_axes(ax, figsize=(max(5.0, 1.1 * len(estimates) + 2.5), 3.6))
    picks = [e.peak if stage == "peak" else e.stages[int(stage)] for e in estimates.values()]
    stack_breakdowns(ax, list(estimates), picks, capacity, title)
    return fig


def plot_breakdowns(
    estimates: Mapping[str, Estimate],
    capacity: int | None = None,
    title: str | None = None,
    width: float | None = None,
):
    """Several estimates side by side, each as its per-stage stacked bars (:func:`plot_breakdown`),
    on a shared GiB axis; the dict key titles each panel."""
    import matplotlib.pyplot as plt

    n = len(estimates)
    fig, axes = plt.subplots(
        1,
        n,
        figsize=(width or 3.2 * n + 1.6, 3.6),
        sharey=True,
        layout="constrained",
        squeeze=False,
    )
    for k, (name, est) in enumerate(estimates.items()):
        ax = axes[0][k]
        labels = [f"{s.stage}\n({s.layers} L)" for s in est.stages]
        stack_breakdowns(ax, labels, est.stages, capacity, name)
        if k < n - 1:
            ax.get_legend().remove()
        if k:
            ax.set_ylabel("")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_stacked(
    rows,
    ax=None,
    capacity: int | None = None,
    title: str | None = None,
    colors=None,
    capacity_label: str | None = None,
):
    """Stacked bars of named byte components: ``rows`` maps a bar label to ``{component: bytes}``
    (components in the order of the first row); GiB on the y axis; an optional capacity line,
    labelled ``capacity_label`` (default "<n> GiB GPU")."""
    fig, ax = new_axes(ax, figsize=(max(5.0, 1.2 * len(rows) + 2.5), 3.6))
    labels = list(rows)
    comps = list(dict.fromkeys(c for r in rows.values() for c in r))
    palette = colors or {}
    default = ("#4C72B0", "#C44E52", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#8C8C8C")
    series = [
        (c, palette.get(c, default[i % len(default)]), [rows[k].get(c, 0) for k in labels])
        for i, c in enumerate(comps)
    ]
    draw_stack(ax, labels, series, capacity, title, capacity_label)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def plot_terms(terms, ax=None, title: str | None = None, unit: str = "MiB"):
    """Horizontal bars of named byte terms (e.g. :func:`parmem.activations.layer_terms`)."""
    scale = UNIT_BYTES[unit]
    fig, ax = new_axes(ax, figsize=(7, 0.28 * len(terms) + 1.2))
    names = [t.name for t in terms][::-1]
    vals = [t.bytes / scale for t in terms][::-1]
    colors = ["#C44E52" if getattr(t, "core", False) else "#4C72B0" for t in terms][::-1]
    ax.barh(names, vals, color=colors)
    ax.set_xlabel(f"{unit} per layer per micro-batch")
    ax.tick_params(axis="y", labelsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_terms_compare(named, ax=None, title: str | None = None, unit: str = "MiB"):
    """Grouped horizontal bars: the same named byte terms under several settings.

    ``named`` maps a label (e.g. ``"TP"``, ``"TP + SP"``) to a list of terms with ``name`` and
    ``bytes`` (:func:`parmem.activations.layer_terms`); a term missing from a list counts 0."""
    import numpy as np

    scale = UNIT_BYTES[unit]
    names = list(dict.fromkeys(t.name for terms in named.values() for t in terms))
    k = len(named)
    fig, ax = new_axes(ax, figsize=(7, 0.3 * len(names) * max(k, 2) / 2 + 1.4))
    y = np.arange(len(names))[::-1]
    height = 0.8 / k
    for i, (label, terms) in enumerate(named.items()):
        by = {t.name: t.bytes for t in terms}
        vals = [by.get(n, 0) / scale for n in names]
        total = sum(by.values()) / scale
        ax.barh(
            y + (k / 2 - i - 0.5) * height,
            vals,
            height=height,
            label=f"{label} (total {total:,.1f} {unit})",
        )
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(f"{unit} per layer per micro-batch")
    ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.4, -0.12), ncol=1)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_lines(
    x,
    series: Mapping[str, Sequence[float]],
    ax=None,
    xlabel: str = "",
    ylabel: str = "GiB per GPU",
    title: str | None = None,
    logx: bool = False,
    capacity: float | None = None,
):
    """Simple line chart of several series against one x axis (values already in display units)."""
    fig, ax = new_axes(ax)
    for name, ys in series.items():
        ax.plot(x, ys, marker="o", ms=3, label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if capacity is not None:
        ax.axhline(capacity, color="k", ls="--", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return fig
