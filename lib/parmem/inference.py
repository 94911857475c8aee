"""Serving memory: weights (optionally quantised) plus the KV cache.

* KV cache: every layer keeps a key and a value vector of kv_heads · head_dim numbers per token,
  so a token costs 2 · L · kv_heads · head_dim · bytes (Vaswani et al. 2017 for the attention
  shapes; Shazeer 2019 for multi-query and Ainslie et al. 2023 for grouped-query attention, which
  shrink kv_heads). Under tensor parallelism each GPU keeps kv_heads/t heads (one head, duplicated,
  when t > kv_heads, as vLLM does).
* Weights under int8/int4: every linear weight of the transformer layers is quantised; each group
  of ``group_size`` input values of a row carries one fp16 scale (and one fp16 zero point when
  ``zero_point=True``), as GPTQ (Frantar et al. 2023) and AWQ (Lin et al. 2024) store them.
  Embeddings, the LM head, norms, biases and the MoE router stay 16-bit.
"""

from __future__ import annotations

from .model import ModelSpec

__all__ = ["KV_DTYPES", "WEIGHT_DTYPES", "kv_cache_bytes", "kv_cache_bytes_per_token",
           "weight_bytes", "linear_shapes"]

KV_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
WEIGHT_DTYPES = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4}


def _kv_heads_local(spec: ModelSpec, tp: int) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r} must be an integer >= 1")
    if spec.heads % tp:
        raise ValueError(f"tp={tp} must divide heads={spec.heads}")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        raise ValueError(f"tp={tp} and kv_heads={spec.kv_heads}: one must divide the other")
    return max(spec.kv_heads // tp, 1)


def kv_cache_bytes_per_token(spec: ModelSpec, dtype: str = "fp16", tp: int = 1) -> int:
    """KV-cache bytes one token occupies on one GPU: 2 · L · (kv_heads/t) · head_dim · bytes.

    Llama-2-7B in fp16: 2 · 32 · 32 · 128 · 2 = 524,288 bytes = 512 KiB per token.
    """
    if dtype not in KV_DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {tuple(KV_DTYPES)}")
    return 2 * spec.layers * _kv_heads_local(spec, tp) * spec.head_dim * KV_DTYPES[dtype]


def kv_cache_bytes(spec: ModelSpec, seq_len: int, batch: int = 1, dtype: str = "fp16",
                   tp: int = 1) -> int:
    """KV-cache bytes on one GPU for ``batch`` sequences of ``seq_len`` tokens each."""
    for name, v in (("seq_len", seq_len), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}={v!r} must be an integer >= 0")
    return kv_cache_bytes_per_token(spec, dtype, tp) * seq_len * batch


def linear_shapes(spec: ModelSpec) -> list[tuple[str, int, int, int]]:
    """(name, in_features, out_features, count over all layers) of every transformer-layer
    weight matrix (the ones quantisation touches)."""
    h, L = spec.hidden, spec.layers
    out = [("q", h, spec.q_dim, L), ("k", h, spec.kv_dim, L), ("v", h, spec.kv_dim, L),
           ("o", spec.q_dim, h, L)]

    def mlp(prefix: str, f: int, n: int) -> list[tuple[str, int, int, int]]:
        rows = [(f"{prefix}up", h, f, n), (f"{prefix}down", f, h, n)]
        if spec.ffn_kind == "swiglu":
            rows.insert(0, (f"{prefix}gate", h, f, n))
        return rows

    if spec.is_moe:
        out += mlp("expert_", spec.expert_ffn_hidden, L * spec.num_experts)
        if spec.shared_experts:
            out += mlp("shared_", spec.expert_ffn_hidden, L * spec.shared_experts)
    else:
        out += mlp("", spec.ffn_hidden, L)
    return out


def weight_bytes(spec: ModelSpec, dtype: str = "fp16", group_size: int | None = 128,
                 zero_point: bool | None = None) -> int:
    """Bytes of all model weights for serving (one copy, before any sharding).

    ``dtype`` fp32/fp16/bf16 stores every parameter at that size. int8/int4 quantise the layer
    weight matrices (:func:`linear_shapes`) with one fp16 scale per ``group_size`` input values of
    each row (``group_size=None``: one per row, "per-channel") and, if ``zero_point`` (default:
    True for int4, False for int8), one fp16 zero point too; everything else stays fp16.
    """
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {tuple(WEIGHT_DTYPES)}")
    total = spec.num_params()
    bits = WEIGHT_DTYPES[dtype]
    if bits >= 16:
        return total * bits // 8
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size < 1):
        raise ValueError(f"group_size={group_size!r} must be an integer >= 1 or None")
    zp = (bits == 4) if zero_point is None else zero_point
    per_group = 2 + (2 if zp else 0)
    quant_params = 0
    quant_bytes = 0
    for _, n_in, n_out, count in linear_shapes(spec):
        g = n_in if group_size is None else group_size
        groups_per_row = -(-n_in // g)
        quant_params += n_in * n_out * count
        quant_bytes += count * (-(-n_in * n_out * bits // 8) + n_out * groups_per_row * per_group)
    return quant_bytes + 2 * (total - quant_params)
