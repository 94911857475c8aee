"""Explorers of the planner: its Pareto front, one ranked layout's stages, the top layouts."""

from __future__ import annotations

import functools

from ..._check import MAX_GPUS, integer
from ...engines import engines
from ...hardware import hardware_preset, hardware_presets
from ...model import ModelSpec, presets
from ...planner import Cluster, plan
from ..plots.base import stack_breakdowns
from ..plots.planner import plot_pareto
from .base import checkbox, dropdown, error_html, explorer, fit_seq_len, int_slider, slider

__all__ = ["explore_plan"]


def _draw_plan(result, gpu: str, rank: int):
    """The Pareto plot, the stages of the layout ranked ``rank`` and the top layouts as text."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(11, 6.4), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=(1.25, 1))
    plot_pareto(result, ax=fig.add_subplot(grid[0, 0]))
    ax = fig.add_subplot(grid[0, 1])
    text = fig.add_subplot(grid[1, :])
    text.axis("off")
    if not result.candidates:
        ax.axis("off")
        text.text(0, 1, result.message, va="top", fontsize=9, wrap=True)
        return fig
    pick = result.candidates[min(rank, len(result.candidates)) - 1]
    est = pick.estimate
    stack_breakdowns(
        ax,
        [f"stage {s.stage}" for s in est.stages],
        est.stages,
        hardware_preset(gpu).memory_bytes,
        f"rank {result.candidates.index(pick) + 1}: {pick.label()}",
    )
    lines = result.table().splitlines()
    text.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=7.5)
    return fig


def explore_plan(
    model: str = "llama-3-70b",
    gpu: str = "h100-sxm",
    nodes: int = 16,
    global_batch: int = 256,
    seq_len: int = 4096,
    gpus_per_node: int = 8,
    flash: bool = True,
    rank: int = 1,
    top: int = 8,
    static: bool = True,
    engine: str = "paper",
):
    """Model, GPU, node count, global batch, sequence and engine controls bound to
    :func:`parmem.planner.plan`: the Pareto plot of memory against step time, the memory of the
    layout ranked ``rank`` stage by stage, and the top layouts as a table; only the layouts the
    engine runs, sized and timed with its profile. Plans are cached, so moving ``rank`` only
    redraws.

    Used in chapter 18 (how do you choose the parallel degrees for a model and a cluster?)."""
    integer("gpus_per_node", gpus_per_node, 1, MAX_GPUS)
    integer("top", top, 1, 100)
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "gpu": dropdown("gpu", gpu, hardware_presets(), "GPU"),
        "nodes": slider(
            "nodes", nodes, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], f"nodes (x{gpus_per_node})"
        ),
        "global_batch": slider(
            "global_batch",
            global_batch,
            [16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
            "global batch",
        ),
        "seq_len": slider("seq_len", seq_len, [1024, 2048, 4096, 8192, 16384, 32768], "s"),
        "flash": checkbox("flash", flash, "FlashAttention"),
        "engine": dropdown("engine", engine, tuple(engines()), "engine"),
        "rank": int_slider("rank", rank, 1, top, "show rank"),
    }

    @functools.lru_cache(maxsize=64)
    def planned(model, gpu, nodes, global_batch, seq_len, flash, engine):
        spec = ModelSpec.preset(model)
        return plan(
            spec,
            Cluster(gpu, gpus_per_node, nodes),
            global_batch,
            fit_seq_len(spec, seq_len),
            top=top,
            flash_attention=flash,
            engine=engine,
        )

    def render(model, gpu, nodes, global_batch, seq_len, flash, engine, rank):
        try:
            result = planned(model, gpu, nodes, global_batch, seq_len, flash, engine)
        except ValueError as e:  # e.g. no data-parallel size divides the batch
            return error_html(e, "Cannot plan")
        return _draw_plan(result, gpu, rank)

    return explorer(controls, render, static=static, columns=4)
