"""Figures of the caching allocator: reserved against requested memory over a replay."""

from __future__ import annotations

from .base import UNIT_BYTES, new_axes

__all__ = ["plot_replay"]


def plot_replay(results, ax=None, title: str | None = None, unit: str = "GiB"):
    """Reserved memory against event index for :func:`parmem.allocator.replay` results of the
    same events (one line each, e.g. ``{"default": r1, "expandable segments": r2}``), with the
    bytes the tensors asked for (``requested``) dashed in black: the gap is the allocator's."""
    scale = UNIT_BYTES[unit]
    fig, ax = new_axes(ax, figsize=(7.5, 3.4))
    first = next(iter(results.values()))
    ax.plot(
        [v / scale for v in first.requested],
        color="k",
        ls="--",
        lw=1,
        label=f"requested (peak {first.peak_requested / scale:,.2f})",
    )
    for (name, r), color in zip(
        results.items(), ("#C44E52", "#4C72B0", "#55A868", "#8172B2"), strict=False
    ):
        ax.plot(
            [v / scale for v in r.reserved],
            color=color,
            lw=1.5,
            label=f"reserved, {name} (peak {r.peak_reserved / scale:,.2f})",
        )
    ax.set_xlabel("allocation event")
    ax.set_ylabel(f"{unit} on the GPU")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    return fig
