"""Figures of whole layouts: every d·t·p layout as memory against communication, and the peak
stage's terms as parallel axes are added one at a time."""

from __future__ import annotations

from collections.abc import Mapping

from ...estimate import Estimate
from ...units import GIB
from .base import COLORS, LABELS, new_axes

__all__ = ["plot_tradeoff", "plot_axis_steps"]


def plot_tradeoff(
    rows,
    x: str = "comm_time_s",
    y: str = "peak_bytes",
    ax=None,
    capacity: int | None = None,
    highlight=None,
    title: str | None = None,
    logx: bool = True,
    xlabel: str | None = None,
):
    """Scatter of layouts (rows of :func:`parmem.analyses.layout_sweep`): communication against
    peak memory per GPU, one colour per tensor-parallel size t, each point labelled t·p.

    ``y`` is in bytes and drawn in GiB; ``x`` is drawn as given (seconds, or bytes shown in GiB
    when the column name ends in ``bytes``). Layouts over ``capacity`` are drawn hollow;
    ``highlight`` = (d, t, p) rings one layout.
    """
    import matplotlib

    fig, ax = new_axes(ax, figsize=(7, 4))
    scale_x = GIB if x.endswith("bytes") else 1
    ts = sorted({r["t"] for r in rows})
    cmap = matplotlib.colormaps["viridis"]
    for k, t in enumerate(ts):
        color = cmap(k / max(len(ts) - 1, 1))
        pts = [r for r in rows if r["t"] == t]
        for r in pts:
            over = capacity is not None and r[y] > capacity
            ax.scatter(
                r[x] / scale_x,
                r[y] / GIB,
                s=28,
                color=color,
                facecolors="none" if over else color,
                label=f"t={t}" if r is pts[0] else None,
            )
            ax.annotate(
                f"{r['t']}·{r['p']}",
                (r[x] / scale_x, r[y] / GIB),
                fontsize=6,
                xytext=(3, 2),
                textcoords="offset points",
            )
    if highlight is not None:
        for r in rows:
            if (r["d"], r["t"], r["p"]) == tuple(highlight):
                ax.scatter(
                    r[x] / scale_x,
                    r[y] / GIB,
                    s=160,
                    facecolors="none",
                    edgecolors="#C44E52",
                    linewidths=2,
                )
    if capacity is not None:
        ax.axhline(capacity / GIB, color="k", ls="--", lw=1)
    if logx:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(
        xlabel
        or (
            "communication per GPU per step (GiB)"
            if scale_x == GIB
            else "communication time per step (s, alpha-beta, no overlap)"
        )
    )
    ax.set_ylabel("peak memory per GPU (GiB)")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, frameon=False, loc="upper right", title="labels: t·p", title_fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return fig


def plot_axis_steps(
    estimates: Mapping[str, Estimate],
    ax=None,
    capacity: int | None = None,
    title: str | None = None,
):
    """One line per memory term of the peak stage across a sequence of layouts (for example
    :func:`parmem.analyses.axis_by_axis`), on a log scale, with the total in black: a term's line
    drops at the step whose axis shards it."""
    fig, ax = new_axes(ax, figsize=(max(6.0, 0.9 * len(estimates) + 3), 3.8))
    labels = list(estimates)
    peaks = [e.peak for e in estimates.values()]
    x = range(len(labels))
    for f in ("params", "grads", "optimizer", "activations", "logits"):
        vals = [getattr(b, f) / GIB for b in peaks]
        if any(vals):
            ax.plot(
                x,
                [v if v > 0 else float("nan") for v in vals],
                marker="o",
                ms=4,
                color=COLORS[f],
                label=LABELS[f],
            )
    totals = [b.total / GIB for b in peaks]
    ax.plot(x, totals, marker="s", ms=5, color="k", lw=2, label="total")
    for xi, v in zip(x, totals, strict=True):
        ax.annotate(
            f"{v:,.0f}" if v >= 100 else f"{v:.1f}",
            (xi, v),
            fontsize=7,
            ha="center",
            xytext=(0, 5),
            textcoords="offset points",
        )
    if capacity:
        ax.axhline(capacity / GIB, color="k", ls="--", lw=1)
        ax.annotate(
            f"{capacity / GIB:.0f} GiB GPU",
            (len(labels) - 1, capacity / GIB),
            ha="right",
            va="bottom",
            fontsize=8,
        )
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, fontsize=8, rotation=20)
    ax.set_ylabel("GiB per GPU (log scale)")
    ax.grid(alpha=0.3, which="both", axis="y")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig
