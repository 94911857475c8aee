"""Figures of data parallelism and ZeRO: model states and traffic of the ZeRO stages, and ZeRO-3
against tensor parallelism as d grows."""

from __future__ import annotations

from ...units import GIB
from .base import COLORS, LABELS, draw_stack
from .memory import plot_lines

__all__ = ["plot_zero_stages", "plot_zero3_vs_tp"]


def plot_zero_stages(rows, axes=None, title: str | None = None):
    """ZeRO stages 0–3 side by side: per-GPU model states (left, GiB) and the bytes each GPU sends
    per optimizer step for data parallelism (right, in units of Ψ 16-bit values, 2Ψ bytes, the
    unit in which Rajbhandari et al. 2020 §7 count DP's 2Ψ and ZeRO-3's 3Ψ).

    ``rows``: :func:`parmem.analyses.zero_stages`. ``axes``: two matplotlib axes to draw into.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
    fig = axes[0].figure
    labels = [f"ZeRO-{r['zero']}" for r in rows]
    draw_stack(
        axes[0],
        labels,
        [(LABELS[f], COLORS[f], [r[f] for r in rows]) for f in ("params", "grads", "optimizer")],
        total_fmt="{:.1f}",
    )
    axes[0].legend(fontsize=7, frameon=False)
    draw_stack(
        axes[1],
        labels,
        [("", "#64B5CD", [r["dp_values"] for r in rows])],
        scale=1,
        total_fmt="{:.2f}",
        ylabel="sent per GPU per step (Ψ values)",
        title=f"communication, m={rows[0]['num_microbatches']}",
    )
    first = rows[0]
    axes[0].set_title(
        title or f"model states, Ψ={first['num_params'] / 1e9:g}B, d={first['dp']}", fontsize=10
    )
    return fig


def plot_zero3_vs_tp(rows, ax=None, capacity: float | None = 80.0, title: str | None = None):
    """Per-GPU model states and activations (with the logits) under ZeRO-3 against d, one pair of
    lines per tensor-parallel size (rows of :func:`parmem.analyses.zero3_vs_tp`), log-log: model
    states fall as 1/d; activations are flat in d and divided by t only by TP+SP. Solid lines
    for t = 1, dashed with TP. ``capacity`` draws a GPU's memory in GiB."""
    series: dict[str, list[float]] = {}
    dps: list[int] = []
    for r in rows:
        tag = f"t={r['t']}" + (" + SP" if r["sp"] else "")
        series.setdefault(f"model states, {tag}", []).append(r["model_states"] / GIB)
        series.setdefault(f"activations + logits, {tag}", []).append(
            (r["activations"] + r["logits"]) / GIB
        )
        if r["t"] == rows[0]["t"]:
            dps.append(r["d"])
    first = rows[0]
    fig = plot_lines(
        dps,
        series,
        ax=ax,
        xlabel="data-parallel size d (ZeRO-3)",
        title=title or f"{first['model']}, s={first['seq_len']}, b=1",
        logx=True,
        capacity=capacity,
    )
    ax = ax or fig.axes[0]
    for line in ax.get_lines():  # colour by term, dashes for the TP curves
        label = line.get_label()
        if label.startswith("model states") or label.startswith("activations"):
            line.set_color(COLORS["optimizer" if label.startswith("model") else "activations"])
            line.set_linestyle("-" if "t=1" in label else "--")
    ax.legend(fontsize=8, frameon=False)
    ax.set_yscale("log")
    return fig
