"""The KV cache: what each kind of attention keeps per token and per layer.

* Multi-head, grouped-query and multi-query attention keep a key and a value vector of
  kv_heads · head_dim numbers per token and layer: 2 · kv_heads · head_dim (Vaswani et al. 2017
  for the shapes; Shazeer 2019 for MQA and Ainslie et al. 2023 for GQA, which shrink kv_heads).
  Under tensor parallelism each GPU keeps kv_heads/t heads (one head, duplicated, when
  t > kv_heads, as vLLM does: :func:`parmem.sharding.kv_heads_local`).
* Multi-head latent attention keeps only the compressed latent c_kv (kv_lora_rank) and the
  decoupled rotary key (qk_rope_head_dim): kv_lora_rank + qk_rope_head_dim numbers per token
  and layer (DeepSeek-AI 2024, DeepSeek-V2 §2.1.2-2.1.3 and Table 1: (d_c + d_h^R) · l, i.e.
  4.5 d_h · l for DeepSeek-V2). The latent is shared by all heads, so tensor parallelism does
  not split it: every rank of the group keeps all of it (vLLM's MLA backends cache one
  "head" of kv_lora_rank + qk_rope_head_dim per layer and replicate it over TP ranks).
* A sliding-window (local) layer keeps at most its window: min(seq_len, sliding_window) tokens
  (Beltagy et al. 2020; Jiang et al. 2023 §2 "rolling buffer cache"; Gemma 2/3, gpt-oss;
  Llama 4's chunked layers need at most one chunk). Full-attention layers keep every token.

Against Transformers 5.23's DynamicCache (tests/test_hf_families.py, every family's layout of
kv_heads and head_dim checked after a forward pass): equal for full-attention layers; a
sliding-window layer there keeps window - 1 tokens between steps (DynamicSlidingWindowLayer),
the window once the next token is added, which is what parmem counts. Two layouts hold more in
Transformers than a serving engine keeps, and parmem counts the engine's: Falcon's
``new_decoder_architecture`` caches K and V broadcast to every query head (heads/kv_heads times
more; vLLM caches kv_heads), and DeepSeek's MLA caches the up-projected K and V per head (vLLM
caches the latent, as above).
"""

from __future__ import annotations

from ._check import MAX_BATCH, MAX_SEQ_LEN, choice, instance, integer
from .model import ModelSpec
from .sharding import check_heads, kv_heads_local

__all__ = [
    "KV_DTYPES",
    "layer_kv_values",
    "kv_layer_tokens",
    "kv_cache_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_by_layer_kind",
]

KV_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


def _spec(spec: object) -> None:
    instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")


def layer_kv_values(spec: ModelSpec, tp: int = 1) -> int:
    """Numbers one layer caches per token on one GPU of a t-way tensor-parallel group:
    2 · (kv_heads/t) · head_dim, or kv_lora_rank + qk_rope_head_dim for MLA (replicated over
    the t ranks); sources in the module docstring."""
    _spec(spec)
    tp = integer("tp", tp)
    check_heads(spec, tp)
    if spec.attention == "mla":
        return spec.kv_lora_rank + spec.qk_rope_head_dim
    return 2 * kv_heads_local(spec, tp) * spec.head_dim


def kv_layer_tokens(spec: ModelSpec, seq_len: int, start: int = 0, n: int | None = None) -> int:
    """Token slots the layers ``start .. start+n-1`` (default: all) keep for one sequence of
    ``seq_len`` tokens, summed over those layers: ``seq_len`` per full-attention layer,
    min(seq_len, sliding_window) per local one (:meth:`ModelSpec.is_local_layer`)."""
    _spec(spec)
    seq_len = integer("seq_len", seq_len, 0, MAX_SEQ_LEN)
    n = spec.layers - start if n is None else n
    local = sum(spec.is_local_layer(i) for i in range(start, start + n))
    return (n - local) * seq_len + local * min(seq_len, spec.sliding_window)


def kv_cache_bytes_per_token(spec: ModelSpec, dtype: str = "fp16", tp: int = 1) -> int:
    """KV-cache bytes one token occupies on one GPU while every layer keeps it (a context no
    longer than the sliding window): L · :func:`layer_kv_values` · bytes. Beyond the window,
    local layers stop growing: :func:`kv_cache_bytes` at the context length is the total.

    Llama-2-7B in fp16: 2 · 32 · 32 · 128 · 2 = 524,288 bytes = 512 KiB per token.
    DeepSeek-V3 in bf16: 61 · (512 + 64) · 2 = 70,272 bytes.
    """
    _spec(spec)
    choice("dtype", dtype, KV_DTYPES)
    return spec.layers * layer_kv_values(spec, tp) * KV_DTYPES[dtype]


def kv_cache_bytes(
    spec: ModelSpec, seq_len: int, batch: int = 1, dtype: str = "fp16", tp: int = 1
) -> int:
    """KV-cache bytes on one GPU for ``batch`` sequences of ``seq_len`` tokens each:
    batch · :func:`kv_layer_tokens` · :func:`layer_kv_values` · bytes (local layers capped at
    their window)."""
    _spec(spec)
    batch = integer("batch", batch, 0, MAX_BATCH)
    choice("dtype", dtype, KV_DTYPES)
    per = layer_kv_values(spec, tp) * KV_DTYPES[dtype]
    return batch * kv_layer_tokens(spec, seq_len) * per


def kv_cache_by_layer_kind(
    spec: ModelSpec, seq_len: int, batch: int = 1, dtype: str = "fp16", tp: int = 1
) -> dict[str, int]:
    """:func:`kv_cache_bytes` split into the full-attention layers' share and the local
    (sliding-window or chunked) layers' share, each min(seq_len, window) tokens deep; the two
    add up to :func:`kv_cache_bytes`."""
    total = kv_cache_bytes(spec, seq_len, batch, dtype, tp)
    per = batch * layer_kv_values(spec, tp) * KV_DTYPES[dtype]
    local = per * spec.num_local_layers * min(seq_len, spec.sliding_window)
    return {"full-attention layers": total - local, "sliding-window layers": local}
