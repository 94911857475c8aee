"""Explorers of communication: one collective's alpha-beta time on two links."""

from __future__ import annotations

from ...analyses import collective_curves
from ...comm import COLLECTIVES, collective_bytes, collective_time
from ...hardware import link_presets
from ..plots.comm import plot_collective_times
from .base import dropdown, explorer, slider

__all__ = ["explore_collectives"]

_SIZES_MIB = [2.0**k for k in range(-10, 16)]  # 1 KiB … 32 GiB, in MiB


def explore_collectives(
    op: str = "all_reduce",
    n: int = 8,
    size_mib: float = 64.0,
    slow: str = "ib-ndr",
    fast: str = "nvlink4",
    static: bool = True,
):
    """Collective, ranks n and message size → alpha-beta time on two links
    (:func:`parmem.analyses.collective_curves`, drawn by
    :func:`parmem.book.plots.comm.plot_collective_times`); the title gives the bytes each rank
    sends.

    Used in chapter 1 (how many bytes does each collective move?)."""
    controls = {
        "op": dropdown("op", op, list(COLLECTIVES), "collective"),
        "n": slider("n", n, [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], "ranks n"),
        "size_mib": slider("size_mib", size_mib, _SIZES_MIB, "S (MiB)"),
        "fast": dropdown("fast", fast, link_presets(), "link 1"),
        "slow": dropdown("slow", slow, link_presets(), "link 2"),
    }

    def render(op, n, size_mib, fast, slow):
        size = int(size_mib * 2**20)
        sent = collective_bytes(op, size, n)
        times = ", ".join(
            f"{name} {collective_time(op, size, n, name) * 1e3:.3g} ms" for name in (fast, slow)
        )
        return plot_collective_times(
            collective_curves(op, n, (fast, slow), mark=size),
            title=f"{op.replace('_', '-')}, n={n}, S={size_mib:g} MiB: "
            f"each rank sends {sent / 2**20:.4g} MiB; {times}",
        )

    return explorer(controls, render, static=static)
