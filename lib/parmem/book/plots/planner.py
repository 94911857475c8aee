"""Figures of the planner: memory against modelled step time for every layout it estimated."""

from __future__ import annotations

from ...units import GIB
from .base import COLORS, new_axes

__all__ = ["plot_pareto"]


def plot_pareto(plan, ax=None, title: str | None = None, label_top: int = 5):
    """Memory per GPU against modelled step time for a :func:`parmem.planner.plan` result.

    Grey dots: every feasible layout the planner estimated; the line: the Pareto front (no other
    layout is both faster and smaller); numbered dots: the ``label_top`` fastest (rank 1 is the
    best); dashed line: the usable memory, ``(1 − headroom)`` of the GPU."""
    fig, ax = new_axes(ax)
    if plan.points:
        ax.scatter(
            [t for _, t in plan.points],
            [m / GIB for m, _ in plan.points],
            s=10,
            color="#B0B0B0",
            label="feasible layouts",
            zorder=1,
        )
    if plan.pareto:
        xs = [c.step_time for c in plan.pareto]
        ys = [c.peak_bytes / GIB for c in plan.pareto]
        ax.step(
            xs, ys, where="post", color=COLORS["params"], lw=1.5, label="Pareto front", zorder=2
        )
        ax.scatter(xs, ys, s=18, color=COLORS["params"], zorder=3)
    for rank, c in enumerate(plan.candidates[:label_top], 1):
        ax.scatter(
            [c.step_time],
            [c.peak_bytes / GIB],
            s=60 if rank == 1 else 30,
            marker="*" if rank == 1 else "o",
            color=COLORS["optimizer"],
            zorder=4,
        )
        ax.annotate(
            str(rank),
            (c.step_time, c.peak_bytes / GIB),
            xytext=(4, 3),
            textcoords="offset points",
            fontsize=8,
        )
    ax.axhline(plan.usable_bytes / GIB, color="k", ls="--", lw=1)
    ax.annotate(
        f"{plan.usable_bytes / GIB:.0f} GiB usable",
        (1.0, plan.usable_bytes / GIB),
        xycoords=("axes fraction", "data"),
        ha="right",
        va="bottom",
        fontsize=8,
    )
    ax.set_xlabel("modelled step time (s)")
    ax.set_ylabel("peak GiB per GPU")
    ax.set_title(
        title
        or f"{plan.spec.name} on {plan.cluster}: "
        f"{plan.global_batch} x {plan.seq_len} tokens per step",
        fontsize=10,
    )
    if plan.points:
        ax.legend(fontsize=7, frameon=False, loc="lower right")
    else:
        ax.text(
            0.5,
            0.5,
            plan.message or "no layout fits",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=8,
            wrap=True,
        )
    ax.grid(alpha=0.3)
    return fig
