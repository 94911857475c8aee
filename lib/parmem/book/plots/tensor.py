"""Figures of tensor parallelism: which rank holds which slice of each weight, one rank's bytes by
model component, and memory against TP traffic for each t."""

from __future__ import annotations

from ...units import GIB, MIB
from .base import draw_stack, new_axes, stack_breakdowns

__all__ = ["COMPONENT_COLORS", "plot_tp_shards", "plot_tp_components", "plot_tp_tradeoff"]

#: one colour per model component (:func:`parmem.sharding.tp_param_counts`)
COMPONENT_COLORS = {
    "embedding": "#4C72B0",
    "positions": "#64B5CD",
    "attention Q, O": "#DD8452",
    "attention K, V": "#C44E52",
    "MLP": "#55A868",
    "experts": "#55A868",
    "shared experts": "#8DBF8B",
    "router": "#CCB974",
    "row-parallel biases": "#8172B2",
    "norms": "#8C8C8C",
    "LM head": "#937860",
}


def _rank_colors(t: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if t <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(t)]


def _draw_panel(ax, panel: dict, t: int, colors: list) -> None:
    """One weight matrix to scale (the longer side is the panel's size; very thin sides are
    widened), a rectangle per part along the split axis (rank 0 first: left, or on top)."""
    from matplotlib.patches import Rectangle

    rows, cols, axis = panel["rows"], panel["cols"], panel["axis"]
    big = max(rows, cols)
    w, hgt = max(cols / big, 0.06), max(rows / big, 0.06)
    x0, y0 = (1 - w) / 2, (1 - hgt) / 2
    pos = 0.0
    for frac, owners in panel["parts"]:
        color = "#BBBBBB" if len(owners) == t and t > 1 else colors[owners[0]]
        if axis == "cols":
            rect = Rectangle((x0 + pos * w, y0), frac * w, hgt)
        else:  # rows: rank 0 on top
            rect = Rectangle((x0, y0 + hgt - (pos + frac) * hgt), w, frac * hgt)
        rect.set(
            facecolor=color,
            edgecolor="white",
            linewidth=0.6,
            hatch="///" if len(owners) > 1 else None,
        )
        ax.add_patch(rect)
        pos += frac
    ax.add_patch(Rectangle((x0, y0), w, hgt, fill=False, edgecolor="black", lw=0.8))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(panel["title"], fontsize=7)


def plot_tp_shards(layout: dict, title: str | None = None):
    """Which rank holds which slice of each weight matrix under Megatron tensor parallelism.

    ``layout``: :func:`parmem.analyses.tp_shard_layout` (one panel per matrix). A colour is a
    rank; hatching marks a slice more than one rank keeps (K and V heads when t > kv_heads; a
    whole replicated tensor, drawn grey). Shapes are drawn to scale within a panel."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t, kv, panels = layout["tp"], layout["kv_heads"], layout["panels"]
    colors = _rank_colors(t)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(1.35 * len(panels) + 1.6, 2.5), layout="constrained"
    )
    for ax, panel in zip(axes, panels, strict=True):
        _draw_panel(ax, panel, t, colors)
    handles = [Patch(color=colors[r], label=f"rank {r}") for r in range(min(t, 8))]
    if t > 8:
        handles.append(Patch(color="white", label=f"... rank {t - 1}"))
    handles.append(Patch(facecolor="#BBBBBB", hatch="///", label="every rank"))
    if t > kv:
        handles.append(
            Patch(
                facecolor="white",
                edgecolor="black",
                hatch="///",
                label=f"K/V head on {t // kv} ranks",
            )
        )
    fig.legend(handles=handles, loc="outside right center", fontsize=7, frameon=False)
    fig.suptitle(title or f"{layout['model']}: which rank holds which slice, t = {t}", fontsize=10)
    return fig


def plot_tp_components(rows, ax=None, capacity: int | None = None, title: str | None = None):
    """Stacked bars: bytes one tensor-parallel rank holds, by model component, for each t
    (rows of :func:`parmem.analyses.tp_component_bytes`); ``capacity`` draws a GPU's memory."""
    fig, ax = new_axes(ax, figsize=(max(5.0, 0.9 * len(rows) + 3.5), 3.6))
    names = list(dict.fromkeys(c for r in rows for c in r["components"]))
    series = [
        (name, COMPONENT_COLORS.get(name, "#AAAAAA"), [r["components"].get(name, 0) for r in rows])
        for name in names
    ]
    first = rows[0]
    draw_stack(
        ax,
        [f"t={r['t']}" for r in rows],
        series,
        capacity,
        capacity_label="",
        total_fmt=lambda total: f"{total:.2f}" if total < 10 else f"{total:.1f}",
        title=title
        or f"{first['model']}: {first['bytes_per_param']} bytes per parameter on one rank",
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def plot_tp_tradeoff(rows, capacity: int | None = None, title: str | None = None):
    """What tensor parallelism buys and what it costs, per GPU, for each t (rows of
    :func:`parmem.analyses.tp_tradeoff`).

    Top: the memory of one GPU (stacked memory terms). Bottom: the bytes that GPU sends for
    tensor-parallel all-reduces in one step, labelled with the size of one all-reduce buffer."""
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(7, 5.6), layout="constrained", height_ratios=(3, 2)
    )
    labels = [f"t={r['t']}" for r in rows]
    est = rows[0]["estimate"]
    stack_breakdowns(
        top,
        labels,
        [r["estimate"].stages[0] for r in rows],
        capacity,
        title or f"{est.spec.name}: s={est.setup.seq_len}, b={est.setup.micro_batch}",
    )
    sent = [r["tp_bytes"] / GIB for r in rows]
    bars = bottom.bar(labels, sent, color="#64B5CD", width=0.65)
    for bar, r, val in zip(bars, rows, sent, strict=True):
        if r["comm_buffer"]:
            bottom.annotate(
                f"{val:.1f} GiB\nbuffer {r['comm_buffer'] / MIB:.0f} MiB",
                (bar.get_x() + bar.get_width() / 2, val),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    bottom.set_ylabel("GiB sent per GPU\nper step (TP)")
    bottom.margins(y=0.3)
    return fig
