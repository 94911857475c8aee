"""Explorers of data parallelism and ZeRO: a fixed global batch over d GPUs, the ZeRO stages,
and ZeRO-3 against tensor parallelism."""

from __future__ import annotations

from ...analyses import zero3_vs_tp, zero_stages
from ...config import ParallelConfig, TrainingSetup
from ...estimate import estimate
from ...model import ModelSpec, presets
from ...units import GIB
from ..plots.data_parallel import plot_zero3_vs_tp, plot_zero_stages
from ..plots.memory import plot_compare
from .base import (
    DEFAULT_GPU_GIB,
    checkbox,
    dropdown,
    error_html,
    explorer,
    fit_seq_len,
    gib,
    int_slider,
    slider,
)

__all__ = ["explore_data_parallel", "explore_zero", "explore_zero3_tp"]


def explore_data_parallel(
    model: str = "llama-2-7b",
    global_batch: int = 8,
    seq_len: int = 4096,
    grad_buckets: str = "copy",
    flash: bool = True,
    zero: int = 0,
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Fixed global batch B, data-parallel sizes d = 1, 2, 4, … ≤ B: per-GPU memory of each
    (b = B/d sequences per GPU, one micro-batch, no dropout), from :func:`parmem.estimate`.

    Used in chapter 2 (does data parallelism lower per-GPU memory?)."""
    gib("gpu_gib", gpu_gib)
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "global_batch": slider(
            "global_batch", global_batch, [1, 2, 4, 8, 16, 32, 64], "global batch B"
        ),
        "seq_len": slider("seq_len", seq_len, [512, 1024, 2048, 4096, 8192, 16384], "s"),
        "grad_buckets": dropdown("grad_buckets", grad_buckets, ["copy", "view"], "DDP buckets"),
        "zero": int_slider("zero", zero, 0, 3, "ZeRO"),
        "flash": checkbox("flash", flash, "FlashAttention"),
    }

    def render(model, global_batch, seq_len, grad_buckets, zero, flash):
        spec = ModelSpec.preset(model)
        seq_len = fit_seq_len(spec, seq_len)
        ests = {}
        d = 1
        while d <= global_batch and d <= 64:
            ests[f"d={d}\nb={global_batch // d}"] = estimate(
                spec,
                ParallelConfig(dp=d, zero=zero),
                TrainingSetup(
                    seq_len=seq_len,
                    micro_batch=global_batch // d,
                    dropout=False,
                    flash_attention=flash,
                    grad_buckets=grad_buckets,
                ),
            )
            d *= 2
        return plot_compare(
            ests,
            capacity=int(gpu_gib * GIB),
            title=f"{model}: global batch {global_batch} × {seq_len} tokens",
        )

    return explorer(controls, render, static=static)


def explore_zero(
    params_b: float = 7.5, dp: int = 64, num_microbatches: int = 1, static: bool = True
):
    """Ψ (billions), d and micro-batches m → per-GPU model states and DP communication of ZeRO
    stages 0–3 (:func:`parmem.analyses.zero_stages`, mixed-precision AdamW, drawn by
    :func:`parmem.book.plots.data_parallel.plot_zero_stages`).

    Used in chapter 3 (why is DP + ZeRO a balance point?)."""
    controls = {
        "params_b": slider(
            "params_b",
            params_b,
            [1.0, 3.0, 7.0, 7.5, 13.0, 34.0, 70.0, 175.0, 405.0],
            "Ψ (billions)",
        ),
        "dp": slider("dp", dp, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], "d"),
        "num_microbatches": slider(
            "num_microbatches", num_microbatches, [1, 2, 4, 8, 16, 32], "micro-batches m"
        ),
    }

    def render(params_b, dp, num_microbatches):
        return plot_zero_stages(zero_stages(int(params_b * 1e9), dp, num_microbatches))

    return explorer(controls, render, static=static)


def explore_zero3_tp(
    model: str = "llama-3-70b",
    seq_len: int = 8192,
    tp: int = 8,
    recompute: str = "none",
    flash: bool = True,
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Model, sequence length, t and recomputation → per-GPU model states and activations under
    ZeRO-3 against d, with and without TP+SP (:func:`parmem.analyses.zero3_vs_tp`, drawn by
    :func:`parmem.book.plots.data_parallel.plot_zero3_vs_tp`).

    Used in chapter 4 (with ZeRO-3, is tensor parallelism still needed?)."""
    gib("gpu_gib", gpu_gib)
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "seq_len": slider("seq_len", seq_len, [2048, 4096, 8192, 16384, 32768, 65536, 131072], "s"),
        "tp": slider("tp", tp, [2, 4, 8, 16], "t"),
        "recompute": dropdown("recompute", recompute, ["none", "selective", "full"], "recompute"),
        "flash": checkbox("flash", flash, "FlashAttention"),
    }

    def render(model, seq_len, tp, recompute, flash):
        spec = ModelSpec.preset(model)
        try:
            if spec.position == "learned" and seq_len > spec.max_positions:
                raise ValueError(f"{model} has learned positions up to {spec.max_positions}")
            rows = zero3_vs_tp(spec, seq_len, tp, flash=flash, recompute=recompute)
            return plot_zero3_vs_tp(rows, capacity=gpu_gib)
        except ValueError as e:
            return error_html(e)

    return explorer(controls, render, static=static)
