"""Explorers of tensor and sequence parallelism: the shards of every weight, one rank's bytes by
component, memory against TP traffic, and the activation terms one layer keeps."""

from __future__ import annotations

from ...activations import kept_terms
from ...analyses import tp_component_bytes, tp_shard_layout, tp_tradeoff
from ...config import TrainingSetup
from ...model import ModelSpec, presets
from ...sharding import tp_param_counts
from ...units import GIB
from ..plots.memory import plot_terms_compare
from ..plots.tensor import plot_tp_components, plot_tp_shards, plot_tp_tradeoff
from .base import (
    DEFAULT_GPU_GIB,
    checkbox,
    dropdown,
    error_html,
    explorer,
    fit_seq_len,
    gib,
    slider,
)

__all__ = [
    "explore_tp_shards",
    "explore_tp_weights",
    "explore_tp_tradeoff",
    "explore_layer_activations",
]


def explore_tp_shards(model: str = "llama-3-70b", tp: int = 8, static: bool = True):
    """Model and t → which rank holds which slice of every weight
    (:func:`parmem.analyses.tp_shard_layout`, drawn by
    :func:`parmem.book.plots.tensor.plot_tp_shards`), with the parameters one rank holds in the
    title.

    Used in chapter 5 (how does tensor parallelism shard the weights?)."""
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "tp": slider("tp", tp, [1, 2, 4, 8, 16, 32], "t"),
    }

    def render(model, tp):
        spec = ModelSpec.preset(model)
        try:
            rows = tp_param_counts(spec, tp)
        except ValueError as e:
            return error_html(e)
        mine = sum(r.per_rank for r in rows)
        rep = sum(r.per_rank for r in rows if r.replicated)
        return plot_tp_shards(
            tp_shard_layout(spec, tp),
            title=f"{model}, t={tp}: {mine / 1e9:.3g}B parameters "
            f"per rank ({rep / 1e6:.3g}M replicated)",
        )

    return explorer(controls, render, static=static, columns=2)


def explore_tp_weights(
    model: str = "llama-2-7b",
    max_tp: int = 8,
    what: str = "weights",
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Model, largest t and which state → stacked bars of what one tensor-parallel rank holds,
    component by component, for t = 1, 2, 4, … (:func:`parmem.analyses.tp_component_bytes`,
    drawn by :func:`parmem.book.plots.tensor.plot_tp_components`).

    Used in chapter 6 (a 7B model at TP = 4: how much weight memory per GPU?)."""
    gib("gpu_gib", gpu_gib)
    per_param = {"weights": 2, "gradients": 2, "optimizer states": 12, "model states": 16}
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "max_tp": slider("max_tp", max_tp, [2, 4, 8, 16, 32], "largest t"),
        "what": dropdown("what", what, list(per_param), "bf16-mixed AdamW"),
    }

    def render(model, max_tp, what):
        spec = ModelSpec.preset(model)
        tps = [
            t
            for t in (1, 2, 4, 8, 16, 32)
            if t <= max_tp
            and spec.heads % t == 0
            and spec.ffn_hidden % t == 0
            and (spec.kv_heads % t == 0 or t % spec.kv_heads == 0)
        ]
        return plot_tp_components(
            tp_component_bytes(spec, tps, per_param[what]),
            capacity=int(gpu_gib * GIB),
            title=f"{model}: {what} ({per_param[what]} B/param) per GPU",
        )

    return explorer(controls, render, static=static)


def explore_tp_tradeoff(
    model: str = "llama-2-7b",
    seq_len: int = 4096,
    micro_batch: int = 1,
    flash: bool = False,
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Model, s, b → per-GPU memory and tensor-parallel bytes sent per step for t = 1 … 8
    (:func:`parmem.analyses.tp_tradeoff`, drawn by
    :func:`parmem.book.plots.tensor.plot_tp_tradeoff`; no dropout, one micro-batch).

    Used in chapter 7 (TP communicates a lot; why is its memory saving immediate?)."""
    gib("gpu_gib", gpu_gib)
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "seq_len": slider("seq_len", seq_len, [512, 1024, 2048, 4096, 8192, 16384, 32768], "s"),
        "micro_batch": slider("micro_batch", micro_batch, [1, 2, 4, 8], "b"),
        "flash": checkbox("flash", flash, "FlashAttention"),
    }

    def render(model, seq_len, micro_batch, flash):
        spec = ModelSpec.preset(model)
        tps = [t for t in (1, 2, 4, 8) if spec.heads % t == 0 and spec.ffn_hidden % t == 0]
        try:
            setup = TrainingSetup(
                seq_len=fit_seq_len(spec, seq_len),
                micro_batch=micro_batch,
                dropout=False,
                flash_attention=flash,
            )
            return plot_tp_tradeoff(tp_tradeoff(spec, setup, tps), capacity=int(gpu_gib * GIB))
        except ValueError as e:
            return error_html(e)

    return explorer(controls, render, static=static, columns=2)


def explore_layer_activations(
    model: str = "gpt3-175b",
    seq_len: int = 2048,
    tp: int = 8,
    sp: bool = True,
    recompute: str = "none",
    flash: bool = False,
    static: bool = True,
):
    """Model, s, t, SP, recomputation and FlashAttention → the activation terms one layer keeps
    per micro-batch on one rank (:func:`parmem.activations.kept_terms`), TP alone beside the
    chosen setting. Dropout is on for GPT-shaped presets (GeLU MLP) and off for Llama-shaped
    ones, as each family was trained.

    Used in chapter 8 (which memory does sequence parallelism remove?)."""
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "seq_len": slider(
            "seq_len", seq_len, [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072], "s"
        ),
        "tp": slider("tp", tp, [1, 2, 4, 8, 16], "t"),
        "sp": checkbox("sp", sp, "sequence parallel"),
        "recompute": dropdown("recompute", recompute, ["none", "selective", "full"], "recompute"),
        "flash": checkbox("flash", flash, "FlashAttention"),
    }

    def render(model, seq_len, tp, sp, recompute, flash):
        spec = ModelSpec.preset(model)
        kw = {"flash": flash, "dropout": spec.ffn_kind == "gelu"}  # Llama-style: no dropout
        try:
            base = kept_terms(spec, seq_len, 1, tp=tp, **kw)
            mine = kept_terms(spec, seq_len, 1, tp=tp, sp=sp and tp > 1, recompute=recompute, **kw)
        except ValueError as e:
            return error_html(e)
        label = f"t={tp}{' + SP' if sp and tp > 1 else ''}, recompute={recompute}"
        return plot_terms_compare(
            {f"t={tp}, no SP, no recompute": base, label: mine},
            title=f"{model}, s={seq_len}, b=1: one layer on one rank",
        )

    return explorer(controls, render, static=static)
