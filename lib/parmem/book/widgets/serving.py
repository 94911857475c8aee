"""Explorers of serving: weights and KV cache per GPU for each tensor-parallel size."""

from __future__ import annotations

from ..._check import number
from ...hardware import hardware_preset, hardware_presets
from ...inference import (
    KV_DTYPES,
    WEIGHT_DTYPES,
    kv_cache_bytes,
    max_concurrency,
    serving_weight_bytes,
)
from ...kvcache import kv_cache_by_layer_kind
from ...model import ModelSpec, presets
from ..plots.memory import plot_stacked
from .base import dropdown, explorer, slider

__all__ = ["explore_serving", "explore_kv_cache"]


def explore_serving(
    model: str = "llama-3-70b",
    weight_dtype: str = "fp16",
    kv_dtype: str = "fp16",
    seq_len: int = 8192,
    batch: int = 32,
    gpu: str = "h100-sxm",
    utilization: float = 0.9,
    static: bool = True,
):
    """Serving memory per GPU for every tensor-parallel size t in 1, 2, 4, 8: weights
    (:func:`parmem.inference.serving_weight_bytes`) and the KV cache of ``batch`` sequences of
    ``seq_len`` tokens, against the usable memory; each bar's label says how many such sequences
    fit (:func:`parmem.inference.max_concurrency`).

    Used in chapter 21 (how does inference memory differ from training memory?)."""
    number("utilization", utilization, 0, 1, lo_open=True)
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "gpu": dropdown("gpu", gpu, hardware_presets(), "GPU"),
        "weight_dtype": dropdown(
            "weight_dtype", weight_dtype, [k for k in WEIGHT_DTYPES if k != "fp32"], "weights"
        ),
        "kv_dtype": dropdown("kv_dtype", kv_dtype, list(KV_DTYPES), "KV cache"),
        "seq_len": slider(
            "seq_len", seq_len, [1024, 2048, 4096, 8192, 16384, 32768, 131072], "context"
        ),
        "batch": slider("batch", batch, [1, 4, 8, 16, 32, 64, 128, 256], "sequences"),
    }

    def render(model, gpu, weight_dtype, kv_dtype, seq_len, batch):
        spec = ModelSpec.preset(model)
        rows = {}
        for t in (1, 2, 4, 8):
            try:
                wb = serving_weight_bytes(spec, weight_dtype, t)
                kv = kv_cache_bytes(spec, seq_len, batch, kv_dtype, t)
                n = max_concurrency(spec, seq_len, gpu, t, weight_dtype, kv_dtype, utilization)
            except ValueError:
                continue
            rows[f"t={t}\n{n:,} fit"] = {"weights": wb, f"KV cache ({batch} seqs)": kv}
        cap = int(hardware_preset(gpu).memory_bytes * utilization)
        return plot_stacked(
            rows,
            capacity=cap,
            capacity_label=f"{utilization:.0%} of {gpu}",
            title=f"{model} serving on {gpu}: {weight_dtype} weights, "
            f"{kv_dtype} KV, {seq_len:,} tokens per sequence",
        )

    return explorer(controls, render, static=static, columns=3)


#: the models :func:`explore_kv_cache` compares: GQA, MLA, sliding windows (and both with MoE)
KV_MODELS = ("llama-3-70b", "qwen3-235b-a22b", "deepseek-v3", "gemma-3-27b", "gpt-oss-120b")


def explore_kv_cache(
    seq_len: int = 32768, kv_dtype: str = "bf16", batch: int = 1, static: bool = True
):
    """KV cache of ``batch`` sequences of ``seq_len`` tokens for GQA (Llama-3-70B,
    Qwen3-235B), MLA (DeepSeek-V3) and sliding-window models (Gemma-3-27B, gpt-oss-120b) at the
    same context, split into full-attention and sliding-window layers
    (:func:`parmem.kvcache.kv_cache_by_layer_kind`).

    Used in chapter 21 (how does inference memory differ from training memory?)."""
    controls = {
        "seq_len": slider("seq_len", seq_len, [1024, 4096, 8192, 32768, 131072], "context"),
        "kv_dtype": dropdown("kv_dtype", kv_dtype, list(KV_DTYPES), "KV cache"),
        "batch": slider("batch", batch, [1, 8, 32, 128], "sequences"),
    }

    def render(seq_len, kv_dtype, batch):
        rows = {}
        for name in KV_MODELS:
            spec = ModelSpec.preset(name)
            kind = "MLA" if spec.attention == "mla" else f"GQA {spec.heads}/{spec.kv_heads}"
            if spec.sliding_window:
                kind += f", window {spec.sliding_window:,}"
            rows[f"{name}\n{kind}"] = kv_cache_by_layer_kind(spec, seq_len, batch, kv_dtype)
        return plot_stacked(
            rows, title=f"KV cache of {batch} x {seq_len:,} tokens, {kv_dtype}, one copy"
        )

    return explorer(controls, render, static=static, columns=3)
