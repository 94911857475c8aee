"""Explorers of one layout's memory: every stage's terms against a GPU."""

from __future__ import annotations

from ..._check import MAX_BATCH, choice, integer
from ...config import ParallelConfig, TrainingSetup
from ...estimate import estimate
from ...hardware import hardware_preset, hardware_presets
from ...model import ModelSpec, presets
from ...units import GIB
from ..plots.memory import plot_breakdown
from .base import (
    DEFAULT_GPU_GIB,
    checkbox,
    divisors,
    dropdown,
    error_html,
    explorer,
    fit_seq_len,
    gib,
    int_slider,
    slider,
)

__all__ = ["explore_estimate", "explore_remedies"]


def explore_estimate(
    model: str = "llama-2-7b",
    tp: int = 1,
    pp: int = 1,
    dp: int = 8,
    zero: int = 1,
    seq_len: int = 4096,
    micro_batch: int = 1,
    num_microbatches: int = 8,
    recompute: str = "none",
    sp: bool = False,
    flash: bool = False,
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Model, layout and batch controls bound to :func:`parmem.estimate`; shows every stage's
    memory as stacked bars against a GPU of ``gpu_gib`` GiB.

    Used in chapter 0 (where does GPU memory go?) and chapter 9 (Megatron's sequence and tensor
    parallelism)."""
    integer("num_microbatches", num_microbatches, 1, MAX_BATCH)
    gib("gpu_gib", gpu_gib)
    spec0 = ModelSpec.preset(choice("model", model, presets()))
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "tp": slider("tp", tp, divisors(spec0.heads, 16), "t"),
        "pp": slider("pp", pp, divisors(spec0.layers, 16), "p"),
        "dp": slider("dp", dp, [1, 2, 4, 8, 16, 32, 64, 128], "d"),
        "zero": int_slider("zero", zero, 0, 3, "ZeRO"),
        "seq_len": slider("seq_len", seq_len, [512, 1024, 2048, 4096, 8192, 16384, 32768], "s"),
        "micro_batch": slider("micro_batch", micro_batch, [1, 2, 4, 8, 16], "b"),
        "recompute": dropdown("recompute", recompute, ["none", "selective", "full"], "recompute"),
        "sp": checkbox("sp", sp, "sequence parallel"),
        "flash": checkbox("flash", flash, "FlashAttention"),
    }

    def render(model, tp, pp, dp, zero, seq_len, micro_batch, recompute, sp, flash):
        spec = ModelSpec.preset(model)
        try:
            est = estimate(
                spec,
                ParallelConfig(dp=dp, tp=tp, pp=pp, zero=zero, sp=sp and tp > 1),
                TrainingSetup(
                    seq_len=fit_seq_len(spec, seq_len),
                    micro_batch=micro_batch,
                    num_microbatches=num_microbatches,
                    recompute=recompute,
                    flash_attention=flash,
                ),
            )
        except ValueError as e:  # an invalid combination: say why instead of drawing
            return error_html(e)
        return plot_breakdown(est, capacity=int(gpu_gib * GIB))

    calc = {"model": model, "d": dp, "t": tp, "p": pp, "zero": zero, "sp": sp and tp > 1,
            "recompute": recompute, "seq": seq_len, "b": micro_batch, "m": num_microbatches,
            "flash": flash}  # fmt: skip
    return explorer(controls, render, static=static, calculator=calc)


def explore_remedies(
    model: str = "llama-3-70b",
    seq_len: int = 32768,
    tp: int = 8,
    pp: int = 4,
    dp: int = 8,
    micro_batch: int = 2,
    tokens_per_step: int = 16,
    zero: int = 0,
    sp: bool = False,
    cp: int = 1,
    recompute: str = "none",
    gpu: str = "h100-sxm",
    static: bool = True,
):
    """A long-sequence layout and the remedies of chapter 20 as controls: ZeRO stage
    (distributed optimizer), sequence parallelism, context parallelism, recomputation and the
    micro-batch size b (with m = ``tokens_per_step``/b micro-batches, so the batch per step is
    fixed); FlashAttention on, no dropout. Draws every stage against the GPU's memory.

    Used in chapter 20 (why is memory still tight with TP and PP?)."""
    integer("tokens_per_step", tokens_per_step, 1, MAX_BATCH)
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "gpu": dropdown("gpu", gpu, hardware_presets(), "GPU"),
        "seq_len": slider("seq_len", seq_len, [4096, 8192, 16384, 32768, 65536, 131072], "s"),
        "tp": slider("tp", tp, [1, 2, 4, 8], "t"),
        "pp": slider("pp", pp, [1, 2, 4, 8, 16], "p"),
        "dp": slider("dp", dp, [1, 2, 4, 8, 16, 32], "d"),
        "micro_batch": slider("micro_batch", micro_batch, [1, 2, 4, 8], "b"),
        "zero": int_slider("zero", zero, 0, 3, "ZeRO"),
        "cp": slider("cp", cp, [1, 2, 4, 8], "cp"),
        "sp": checkbox("sp", sp, "sequence parallel"),
        "recompute": dropdown("recompute", recompute, ["none", "selective", "full"], "recompute"),
    }

    def render(model, gpu, seq_len, tp, pp, dp, micro_batch, zero, cp, sp, recompute):
        spec = ModelSpec.preset(model)
        try:
            if spec.position == "learned" and seq_len > spec.max_positions:
                raise ValueError(f"seq_len={seq_len} > {model}'s {spec.max_positions} positions")
            m = max(tokens_per_step // micro_batch, pp)
            est = estimate(
                spec,
                ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, sp=sp and tp > 1),
                TrainingSetup(
                    seq_len=seq_len,
                    micro_batch=micro_batch,
                    num_microbatches=m,
                    recompute=recompute,
                    flash_attention=True,
                    dropout=False,
                ),
            )
        except ValueError as e:
            return error_html(e)
        cap = hardware_preset(gpu).memory_bytes
        verdict = "fits" if est.peak_bytes <= cap else "does not fit"
        return plot_breakdown(
            est,
            capacity=cap,
            title=f"{model}, {est.parallel}, s={seq_len}, b={micro_batch}, "
            f"m={m}: peak {est.peak_bytes / GIB:.0f} GiB, {verdict}",
        )

    return explorer(controls, render, static=static, columns=4)
