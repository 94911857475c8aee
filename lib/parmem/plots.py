"""Matplotlib figures for the book, built on the estimators.

Every function takes library objects (an :class:`~parmem.memory.Estimate`, a
:class:`~parmem.pipeline.PipelineResult`, a list of activation terms) and returns the matplotlib
``Figure``; pass ``ax=`` to draw into an existing axes. Units on axes are GiB (2**30 bytes) unless
the label says otherwise. matplotlib is imported lazily.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .memory import GIB, Estimate, MemoryBreakdown

__all__ = ["COLORS", "plot_breakdown", "plot_compare", "plot_pipeline", "plot_terms",
           "plot_lines"]

#: One colour per memory term, used by every figure in the book.
COLORS = {
    "params": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52", "activations": "#8172B2",
    "logits": "#CCB974", "comm_buffers": "#64B5CD", "cuda_context": "#8C8C8C",
}
LABELS = {
    "params": "parameters", "grads": "gradients", "optimizer": "optimizer states",
    "activations": "activations", "logits": "logits", "comm_buffers": "comm buffers",
    "cuda_context": "CUDA context",
}


def _axes(ax, figsize=(7, 3.6)):
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    return fig, ax


def _stack(ax, labels: Sequence[str], breakdowns: Sequence[MemoryBreakdown],
           capacity: int | None = None, title: str | None = None):
    import numpy as np

    x = np.arange(len(breakdowns))
    bottom = np.zeros(len(breakdowns))
    for f in MemoryBreakdown.FIELDS:
        vals = np.array([getattr(b, f) / GIB for b in breakdowns])
        if not vals.any():
            continue
        ax.bar(x, vals, bottom=bottom, color=COLORS[f], label=LABELS[f], width=0.65)
        bottom += vals
    for xi, total in zip(x, bottom, strict=True):
        ax.annotate(f"{total:.1f}", (xi, total), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    if capacity:
        ax.axhline(capacity / GIB, color="k", ls="--", lw=1)
        ax.annotate(f"{capacity / GIB:.0f} GiB GPU", (x[-1] + 0.4, capacity / GIB), ha="right",
                    va="bottom", fontsize=8)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("GiB per GPU")
    ax.margins(y=0.12)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def plot_breakdown(est: Estimate, ax=None, capacity: int | None = None, title: str | None = None):
    """Stacked bars of every pipeline stage's memory terms for one estimate."""
    fig, ax = _axes(ax)
    labels = [f"stage {s.stage}\n({s.layers} layers)" for s in est.stages]
    _stack(ax, labels, est.stages, capacity, title or f"{est.spec.name}: {est.parallel}")
    return fig


def plot_compare(estimates: Mapping[str, Estimate], ax=None, capacity: int | None = None,
                 title: str | None = None, stage: str | int = "peak"):
    """Stacked bars comparing layouts: the peak stage of each (or a fixed stage index)."""
    fig, ax = _axes(ax, figsize=(max(5.0, 1.1 * len(estimates) + 2.5), 3.6))
    picks = [e.peak if stage == "peak" else e.stages[int(stage)] for e in estimates.values()]
    _stack(ax, list(estimates), picks, capacity, title)
    return fig


def plot_terms(terms, ax=None, title: str | None = None, unit: str = "MiB"):
    """Horizontal bars of named byte terms (e.g. :func:`parmem.activations.layer_terms`)."""
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    fig, ax = _axes(ax, figsize=(7, 0.28 * len(terms) + 1.2))
    names = [t.name for t in terms][::-1]
    vals = [t.bytes / scale for t in terms][::-1]
    colors = ["#C44E52" if getattr(t, "core", False) else "#4C72B0" for t in terms][::-1]
    ax.barh(names, vals, color=colors)
    ax.set_xlabel(f"{unit} per layer per micro-batch")
    ax.tick_params(axis="y", labelsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_pipeline(result, ax=None, title: str | None = None):
    """Gantt chart of a :func:`parmem.pipeline.simulate` result: one row per stage, forwards in
    blue, backwards in green, chunk index shaded, idle time left white."""
    fig, ax = _axes(ax, figsize=(8, 0.45 * result.p + 1.2))
    for ev in result.events:
        fwd = ev.kind == "F"
        shade = 0.55 + 0.45 * (ev.chunk + 1) / max(result.v, 1)
        color = (0.3 * shade, 0.45 * shade, 0.85 * shade) if fwd else \
            (0.3 * shade, 0.7 * shade, 0.35 * shade)
        ax.barh(ev.stage, ev.end - ev.start, left=ev.start, color=color, edgecolor="white",
                height=0.8)
        if ev.end - ev.start >= 0.45:
            ax.text((ev.start + ev.end) / 2, ev.stage, str(ev.microbatch), ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_yticks(range(result.p), [f"stage {i}" for i in range(result.p)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (units of one micro-batch forward)")
    ax.set_title(title or f"{result.schedule}: p={result.p}, m={result.m}, v={result.v}, "
                 f"bubble {result.bubble_fraction:.0%}", fontsize=10)
    return fig


def plot_lines(x, series: Mapping[str, Sequence[float]], ax=None, xlabel: str = "",
               ylabel: str = "GiB per GPU", title: str | None = None, logx: bool = False,
               capacity: float | None = None):
    """Simple line chart of several series against one x axis (values already in display units)."""
    fig, ax = _axes(ax)
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
