"""Explorers of layouts that combine axes: expert parallelism, every d·t·p layout of a cluster,
and the axes added one at a time."""

from __future__ import annotations

from dataclasses import replace

from ..._check import MAX_BATCH, MAX_GPUS, integer
from ...analyses import axis_by_axis, layout_sweep
from ...config import ParallelConfig, TrainingSetup
from ...estimate import estimate
from ...hardware import hardware_preset, hardware_presets
from ...model import ModelSpec, presets
from ...units import GIB
from ..plots.layouts import plot_axis_steps, plot_tradeoff
from ..plots.memory import plot_breakdown, plot_compare
from .base import (
    DEFAULT_GPU_GIB,
    checkbox,
    dropdown,
    error_html,
    explorer,
    fit_seq_len,
    float_slider,
    gib,
    int_slider,
    slider,
)

__all__ = ["explore_experts", "explore_3d", "explore_axes"]


def explore_experts(
    model: str = "mixtral-8x7b",
    dp: int = 16,
    tp: int = 1,
    pp: int = 4,
    zero: int = 1,
    seq_len: int = 4096,
    num_microbatches: int = 16,
    imbalance: float = 1.0,
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Expert parallelism: the peak stage's memory for every e that divides both the experts and
    d, under a layout (d, t, p, ZeRO) and a router ``imbalance`` (the busiest rank receives that
    many times its even share of tokens, modelled as ``capacity_factor``).

    Used in chapter 15 (how does expert parallelism cut MoE memory?)."""
    integer("num_microbatches", num_microbatches, 1, MAX_BATCH)
    gib("gpu_gib", gpu_gib)
    moe = [n for n in presets() if ModelSpec.preset(n).is_moe]
    controls = {
        "model": dropdown("model", model, moe, "model"),
        "dp": slider("dp", dp, [8, 16, 32, 64, 128], "d"),
        "tp": slider("tp", tp, [1, 2, 4, 8], "t"),
        "pp": slider("pp", pp, [1, 2, 4, 8], "p"),
        "zero": int_slider("zero", zero, 0, 3, "ZeRO"),
        "seq_len": slider("seq_len", seq_len, [1024, 2048, 4096, 8192, 16384, 32768], "s"),
        "imbalance": float_slider("imbalance", imbalance, 1.0, 4.0, "router imbalance", step=0.25),
    }

    def render(model, dp, tp, pp, zero, seq_len, imbalance):
        spec = ModelSpec.preset(model)
        es = [
            e for e in range(1, spec.num_experts + 1) if spec.num_experts % e == 0 and dp % e == 0
        ]
        setup = TrainingSetup(
            seq_len=seq_len,
            num_microbatches=num_microbatches,
            flash_attention=True,
            dropout=False,
            capacity_factor=imbalance,
        )
        try:
            ests = {
                f"e={e}": estimate(
                    spec, ParallelConfig(dp=dp, tp=tp, pp=pp, ep=e, zero=zero, sp=tp > 1), setup
                )
                for e in es
            }
        except ValueError as e:
            return error_html(e)
        return plot_compare(
            ests,
            capacity=int(gpu_gib * GIB),
            title=f"{model}: d={dp}, t={tp}, p={pp}, ZeRO-{zero}, "
            f"imbalance {imbalance:g}× (peak stage)",
        )

    return explorer(controls, render, static=static)


def _draw_pick(
    ax, spec, setup, row, world: int, tp: int, pp: int, zero: int, capacity: int
) -> None:
    """The stages of the layout ``row`` of :func:`parmem.analyses.layout_sweep` (or, for
    ``row=None``, a note that (t, p) is not a valid layout here)."""
    if row is None:
        ax.text(
            0.5,
            0.5,
            f"t={tp}, p={pp} is not a valid layout\nof {world} GPUs here",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_axis_off()
        return
    est = estimate(
        spec,
        ParallelConfig(dp=row["d"], tp=tp, pp=pp, sp=tp > 1, zero=zero),
        replace(setup, num_microbatches=row["m"]),
    )
    plot_breakdown(
        est,
        ax=ax,
        capacity=capacity,
        title=f"d={row['d']}, t={tp}, p={pp}: {row['comm_bytes'] / GIB:,.0f} GiB "
        f"sent, {row['comm_time_s']:.2f} s",
    )
    if pp > 8:
        ax.set_xticks([])


def explore_3d(
    model: str = "llama-3-70b",
    world: int = 64,
    tp: int = 8,
    pp: int = 4,
    seq_len: int = 4096,
    global_batch: int = 256,
    zero: int = 1,
    gpu: str = "h100-sxm",
    gpus_per_node: int = 8,
    static: bool = True,
):
    """3D parallelism: every d·t·p layout of ``world`` GPUs as peak memory against modelled
    communication time (:func:`parmem.analyses.layout_sweep`), the chosen (t, p) ringed, and the
    chosen layout's memory per pipeline stage.

    Used in chapter 16 (how does 3D parallelism trade memory against communication?)."""
    integer("global_batch", global_batch, 1, MAX_BATCH)
    integer("gpus_per_node", gpus_per_node, 1, MAX_GPUS)
    import matplotlib.pyplot as plt

    powers = [2**k for k in range(0, 11)]
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "world": slider("world", world, [8, 16, 32, 64, 128, 256, 512, 1024], "GPUs"),
        "tp": slider("tp", tp, powers[:7], "t"),
        "pp": slider("pp", pp, powers[:8], "p"),
        "seq_len": slider("seq_len", seq_len, [1024, 2048, 4096, 8192], "s"),
        "zero": int_slider("zero", zero, 0, 1, "ZeRO"),
        "gpu": dropdown("gpu", gpu, hardware_presets(), "GPU"),
    }

    def render(model, world, tp, pp, seq_len, zero, gpu):
        spec = ModelSpec.preset(model)
        hw = hardware_preset(gpu)
        seq = fit_seq_len(spec, seq_len)
        setup = TrainingSetup(seq_len=seq, flash_attention=True, dropout=False)
        batch = max(global_batch, world)
        rows = layout_sweep(
            spec,
            world,
            setup,
            global_batch=batch,
            zero=zero,
            hardware=hw,
            gpus_per_node=gpus_per_node,
        )
        pick = [r for r in rows if r["t"] == tp and r["p"] == pp]
        if not rows:
            return error_html(ValueError(f"no valid d·t·p layout of {world} GPUs for {model}"))
        fig, (ax1, ax2) = plt.subplots(
            1, 2, figsize=(11, 4), layout="constrained", width_ratios=(1.3, 1)
        )
        plot_tradeoff(
            rows,
            ax=ax1,
            capacity=hw.memory_bytes,
            highlight=(pick[0]["d"], tp, pp) if pick else None,
            title=f"{model} on {world} × {gpu}, {batch} sequences of {seq}",
        )
        _draw_pick(
            ax2, spec, setup, pick[0] if pick else None, world, tp, pp, zero, hw.memory_bytes
        )
        return fig

    return explorer(controls, render, static=static)


def explore_axes(
    model: str = "gpt3-175b",
    dp: int = 24,
    tp: int = 8,
    pp: int = 8,
    cp: int = 1,
    zero: int = 1,
    sp: bool = True,
    recompute: str = "selective",
    seq_len: int = 2048,
    num_microbatches: int = 96,
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Which axis removes which term: the peak stage after adding d, ZeRO, t, SP, p, cp and
    recomputation one at a time (:func:`parmem.analyses.axis_by_axis`), against a GPU.

    Used in chapter 17 (why do the largest runs combine DP, TP, PP and ZeRO?)."""
    integer("num_microbatches", num_microbatches, 1, MAX_BATCH)
    gib("gpu_gib", gpu_gib)
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "dp": slider("dp", dp, [1, 2, 4, 6, 8, 16, 24, 32, 64, 128], "d"),
        "tp": slider("tp", tp, [1, 2, 4, 8, 16], "t"),
        "pp": slider("pp", pp, [1, 2, 4, 8, 16, 32, 64], "p"),
        "cp": slider("cp", cp, [1, 2, 4, 8, 16], "cp"),
        "zero": int_slider("zero", zero, 0, 3, "ZeRO"),
        "sp": checkbox("sp", sp, "sequence parallel"),
        "recompute": dropdown("recompute", recompute, ["none", "selective", "full"], "recompute"),
        "seq_len": slider("seq_len", seq_len, [1024, 2048, 4096, 8192, 16384, 32768, 131072], "s"),
    }

    def render(model, dp, tp, pp, cp, zero, sp, recompute, seq_len):
        spec = ModelSpec.preset(model)
        try:
            if spec.position == "learned" and seq_len > spec.max_positions:
                raise ValueError(f"seq_len={seq_len} > {model}'s {spec.max_positions} positions")
            par = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, sp=sp and tp > 1)
            steps = axis_by_axis(
                spec,
                par,
                TrainingSetup(
                    seq_len=seq_len,
                    num_microbatches=num_microbatches,
                    recompute=recompute,
                    flash_attention=seq_len > 8192,
                ),
            )
        except ValueError as e:
            return error_html(e)
        return plot_axis_steps(
            steps,
            capacity=int(gpu_gib * GIB),
            title=f"{model}: adding one axis at a time (peak stage)",
        )

    return explorer(controls, render, static=static)
