"""Figures of communication: the alpha-beta time of a collective against its message size."""

from __future__ import annotations

from .base import new_axes, size_label

__all__ = ["plot_collective_times"]


def plot_collective_times(curves, ax=None, title: str | None = None):
    """Alpha-beta time of one collective against message size on each link (log-log).

    ``curves``: the rows of :func:`parmem.analyses.collective_curves`, one per link. Each link's
    dotted line is its ``crossover``, where the latency term equals the bandwidth term: smaller
    messages are latency-bound. A row's ``mark`` is drawn as a point on its curve.
    """
    fig, ax = new_axes(ax)
    for c in curves:
        (line,) = ax.plot(
            c["sizes"],
            c["times"],
            label=f"{c['link']} ({c['bandwidth'] / 1e9:.0f} GB/s, {c['latency'] * 1e6:.0f} µs)",
        )
        if c["crossover"] is not None:
            ax.axvline(c["crossover"], color=line.get_color(), ls=":", lw=1)
        if c["mark"] is not None:
            ax.plot([c["mark"][0]], [c["mark"][1]], "o", color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [2**k for k in range(10, 37, 5)]
    ax.set_xticks(ticks, [size_label(t) for t in ticks])
    ax.set_xlabel("message size S")
    ax.set_ylabel("seconds (alpha-beta model)")
    op, n = curves[0]["op"], curves[0]["n"]
    ax.set_title(title or f"{op.replace('_', '-')} on n={n} ranks", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3, which="both")
    return fig
