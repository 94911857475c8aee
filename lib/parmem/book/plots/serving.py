"""Figures of serving: KV-cache slots set aside against tokens stored while decoding."""

from __future__ import annotations

from .base import new_axes

__all__ = ["plot_kv_cache_sim"]


def plot_kv_cache_sim(sims, ax=None, title: str | None = None):
    """KV-cache slots set aside (solid) and tokens actually stored (dashed) per decoding step for
    :func:`parmem.inference.simulate_kv_cache` results, with the capacity dashed in grey."""
    fig, ax = new_axes(ax, figsize=(7.5, 4.0))
    cap = 0
    for (name, s), color in zip(sims.items(), ("#C44E52", "#4C72B0", "#55A868"), strict=False):
        ax.plot(
            [a / 1e3 for a in s.allocated],
            color=color,
            lw=1.2,
            label=f"{name}: set aside ({s.utilization:.0%} used, {s.steps:,} steps)",
        )
        ax.plot(
            [x / 1e3 for x in s.stored], color=color, lw=1, ls="--", label=f"{name}: tokens stored"
        )
        cap = max(cap, s.capacity)
    ax.axhline(cap / 1e3, color="0.5", ls=":", lw=1)
    ax.set_xlabel("decoding step")
    ax.set_ylabel("thousand tokens of KV cache")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return fig
