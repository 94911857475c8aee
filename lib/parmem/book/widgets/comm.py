"""Explorers of communication: one collective's alpha-beta time on two links."""

from __future__ import annotations

from ...analyses import collective_curves
from ...comm import COLLECTIVES, collective_bytes, collective_time
from ...hardware import link_presets
from ..plots.comm import plot_collective_times
from .base import STYLE, explorer

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
    import ipywidgets as w

    controls = {
        "op": w.Dropdown(
            options=list(COLLECTIVES), value=op, description="collective", style=STYLE
        ),
        "n": w.SelectionSlider(
            options=[2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
            value=n,
            description="ranks n",
            style=STYLE,
        ),
        "size_mib": w.SelectionSlider(
            options=_SIZES_MIB, value=size_mib, description="S (MiB)", style=STYLE
        ),
        "fast": w.Dropdown(options=link_presets(), value=fast, description="link 1", style=STYLE),
        "slow": w.Dropdown(options=link_presets(), value=slow, description="link 2", style=STYLE),
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
