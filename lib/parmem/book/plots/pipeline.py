"""Figures of pipeline parallelism: schedule timelines, the micro-batches each stage holds over
time, and memory and bubble against the micro-batch size."""

from __future__ import annotations

from ...pipeline import in_flight_timeline
from ...units import GIB
from .base import COLORS, new_axes

__all__ = ["plot_pipeline", "plot_in_flight", "plot_schedules", "plot_microbatch_sweep"]


def plot_pipeline(result, ax=None, title: str | None = None):
    """Gantt chart of a :func:`parmem.pipeline.simulate` result: one row per stage, forwards in
    blue, backwards in green (ZB-V's weight backwards in orange), chunk index shaded, idle time
    left white."""
    fig, ax = new_axes(ax, figsize=(8, 0.45 * result.p + 1.2))
    base = {"F": (0.3, 0.45, 0.85), "B": (0.3, 0.7, 0.35), "W": (0.85, 0.55, 0.2)}
    for ev in result.events:
        shade = 0.55 + 0.45 * (ev.chunk + 1) / max(result.v, 1)
        color = tuple(shade * c for c in base[ev.kind])
        ax.barh(
            ev.stage, ev.end - ev.start, left=ev.start, color=color, edgecolor="white", height=0.8
        )
        if ev.end - ev.start >= 0.45:
            ax.text(
                (ev.start + ev.end) / 2,
                ev.stage,
                str(ev.microbatch),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    ax.set_yticks(range(result.p), [f"stage {i}" for i in range(result.p)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (units of one micro-batch forward)")
    ax.set_title(
        title
        or f"{result.schedule}: p={result.p}, m={result.m}, v={result.v}, "
        f"bubble {result.bubble_fraction:.0%}",
        fontsize=10,
    )
    return fig


def plot_in_flight(result, ax=None, title: str | None = None, stages=None):
    """Micro-batches each stage holds against time (:func:`parmem.pipeline.in_flight_timeline`
    of a :func:`parmem.pipeline.simulate` result), one step line per stage; the activations a
    stage keeps are this count times one micro-batch's activations for its layers."""
    fig, ax = new_axes(ax, figsize=(8, 2.4))
    stages = range(result.p) if stages is None else stages
    for i in stages:
        pts = in_flight_timeline(result, i)
        ax.step(
            [t for t, _ in pts],
            [c for _, c in pts],
            where="post",
            lw=1.4,
            label=f"stage {i} (peak {result.peak_in_flight[i]:g})",
        )
    ax.set_xlim(0, result.step_time)
    ax.set_ylim(0, max(result.peak_in_flight) * 1.15 + 0.2)
    ax.set_xlabel("time (units of one micro-batch forward)")
    ax.set_ylabel("micro-batches held")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_schedules(results, titles=None, width: float = 9.0):
    """For each :func:`parmem.pipeline.simulate` result, its Gantt chart
    (:func:`plot_pipeline`) above the micro-batches each stage holds over time
    (:func:`plot_in_flight`), all on one time axis so that schedules compare at a glance."""
    import matplotlib.pyplot as plt

    results = list(results)
    titles = list(titles) if titles is not None else [None] * len(results)
    ratios = []
    for r in results:
        ratios += [0.45 * r.p + 0.6, 1.9]
    fig, axes = plt.subplots(
        len(ratios),
        1,
        figsize=(width, sum(ratios) + 0.4),
        height_ratios=ratios,
        sharex=True,
        layout="constrained",
    )
    for k, (r, t) in enumerate(zip(results, titles, strict=True)):
        plot_pipeline(r, ax=axes[2 * k], title=t)
        axes[2 * k].set_xlabel("")
        plot_in_flight(r, ax=axes[2 * k + 1])
        if k < len(results) - 1:
            axes[2 * k + 1].set_xlabel("")
    return fig


def plot_microbatch_sweep(rows, axes=None, title: str | None = None, highlight: int | None = None):
    """Rows of :func:`parmem.analyses.microbatch_sweep` against the micro-batch size b: the peak
    stage's memory and stage 0's activations (left, GiB) and the bubble fraction (right).
    ``highlight`` marks one b."""
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
    fig = axes[0].figure
    bs = [r["b"] for r in rows]
    axes[0].plot(
        bs, [r["peak_total"] / GIB for r in rows], marker="o", ms=3, label="peak stage, total"
    )
    axes[0].plot(
        bs,
        [r["activations"] / GIB for r in rows],
        marker="o",
        ms=3,
        color=COLORS["activations"],
        label="stage 0 activations",
    )
    axes[1].plot(bs, [r["bubble_fraction"] for r in rows], marker="o", ms=3, color="#C44E52")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [f"{b}\nm={r['m']}" for b, r in zip(bs, rows, strict=True)], fontsize=7)
        ax.set_xlabel("micro-batch size b (and micro-batches m)")
        ax.grid(alpha=0.3)
        if highlight is not None:
            ax.axvline(highlight, color="k", lw=1, ls=":")
    axes[0].set_ylabel("GiB per GPU")
    axes[0].legend(fontsize=8, frameon=False)
    axes[1].set_ylabel("bubble fraction of the step")
    axes[1].set_ylim(0, 1)
    if title:
        axes[0].set_title(title, fontsize=10)
    axes[1].set_title("pipeline bubble", fontsize=10)
    return fig
