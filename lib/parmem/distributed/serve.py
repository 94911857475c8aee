"""Serving memory, measured: a tiny Llama-style decoder that generates with a real KV cache,
tensor-parallel over its key/value heads.

:class:`Decoder` has the shapes of a :class:`~parmem.model.ModelSpec` with RMSNorm, rotary
positions, a SwiGLU MLP and grouped-query attention (``kv_heads`` < ``heads``; 1 is multi-query):
``parmem.reference.tiny_spec("llama", ...)``.
:class:`KVCache` keeps, for every layer, the keys and values of every token generated so far, one
tensor each of shape [b, kv_heads_local, tokens, head_dim]; it grows by one token per decoding
step. Its measured bytes (the storages of those tensors) must equal
:func:`parmem.inference.kv_cache_bytes`: 2 · L · kv_heads/t · head_dim · bytes per token.

Tensor parallelism (Shoeybi et al. 2019 §3, as vLLM serves): rank r of t holds a/t query heads
and the key/value heads they read, max(kv_heads/t, 1) of them - when t > kv_heads each kv head is
duplicated on t/kv_heads ranks, so the cache per GPU stops shrinking at one head; the output
projection and the MLP's down projection are row-parallel (one all-reduce each); the embedding
and the LM head split the vocabulary (vocab-parallel lookup with an all-reduce, logits gathered).
So each rank's weight bytes equal :func:`parmem.inference.serving_weight_bytes`.

:func:`demo` runs on a :class:`~parmem.distributed.Pool`: every rank decodes greedily with its shard and
its share of the cache, and compares the tokens and logits with a single-process decoder that
recomputes the whole sequence at every step without a cache.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from parmem.distributed.launcher import device, rank, world_size

__all__ = ["Decoder", "KVCache", "generate", "generate_without_cache", "demo"]

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _rope(x: torch.Tensor, start: int, theta: float = 10000.0) -> torch.Tensor:
    """Rotary positions (Su et al. 2021) for x [b, heads, s, d] at positions start..start+s-1."""
    d = x.shape[-1]
    half = d // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    pos = torch.arange(start, start + x.shape[2], dtype=torch.float32, device=x.device)
    ang = pos[:, None] * freq[None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class KVCache:
    """Keys and values of every layer, [b, kv_heads_local, tokens, head_dim] each, stored in
    ``dtype`` and grown by concatenation (each step the old tensors are replaced, so the live
    storages always hold exactly the tokens seen)."""

    def __init__(self, layers: int, dtype: torch.dtype = torch.float32):
        self.dtype = dtype
        self.k: list[torch.Tensor | None] = [None] * layers
        self.v: list[torch.Tensor | None] = [None] * layers

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Add the new tokens' keys and values; returns all of them (in the compute dtype)."""
        k, v = k.to(self.dtype), v.to(self.dtype)
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    @property
    def tokens(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]

    @property
    def nbytes(self) -> int:
        """Measured bytes: the distinct storages behind the cached tensors."""
        from parmem.measure import tensor_storage_bytes

        return tensor_storage_bytes([t for t in self.k + self.v if t is not None])


class Decoder(nn.Module):
    """The decoder of ``spec`` (or its rank-``tp_rank`` shard of ``tp_size``), built from one seed
    so that every rank slices the same full weights. Input ids [b, s]; returns fp32 logits of the
    whole vocabulary for every input position."""

    def __init__(
        self,
        spec,
        tp_size: int = 1,
        tp_rank: int = 0,
        dtype=torch.float32,
        group=None,
        seed: int = 0,
    ):
        super().__init__()
        from parmem.sharding import check_heads, kv_heads_local

        t, r = tp_size, tp_rank
        if (
            spec.ffn_kind != "swiglu"
            or spec.norm != "rmsnorm"
            or spec.position != "rotary"
            or spec.is_moe
            or spec.bias
            or spec.tied_embeddings
        ):
            raise ValueError(
                "Decoder needs a Llama-shaped spec: swiglu, rmsnorm, rotary, dense, "
                "no biases, untied embeddings"
            )
        check_heads(spec, t)
        kv_local = kv_heads_local(spec, t)
        for name, n in (("ffn_hidden", spec.ffn_hidden), ("vocab_size", spec.vocab_size)):
            if n % t:
                raise ValueError(f"tp={t} must divide {name}={n}")
        self.spec, self.t, self.r, self.group = spec, t, r, group
        self.a_local, self.kv_local, self.d = spec.heads // t, kv_local, spec.head_dim
        h, f, V, d = spec.hidden, spec.ffn_hidden, spec.vocab_size, spec.head_dim
        g = torch.Generator().manual_seed(seed)

        def full(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])

        # kv heads this rank reads: its own slice, or the one head its query heads share
        first_kv = r * kv_local if spec.kv_heads >= t else r * spec.kv_heads // t
        qs = slice(r * self.a_local * d, (r + 1) * self.a_local * d)
        kvs = slice(first_kv * d, (first_kv + kv_local) * d)
        fs, vs = slice(r * f // t, (r + 1) * f // t), slice(r * V // t, (r + 1) * V // t)

        def param(x):
            return nn.Parameter(x.to(dtype).clone(), requires_grad=False)  # own storage

        self.embed = param(full(V, h)[vs])
        self.layers = nn.ModuleList()
        for _ in range(spec.layers):
            layer = nn.Module()
            wq, wk, wv, wo = (
                full(spec.heads * d, h),
                full(spec.kv_heads * d, h),
                full(spec.kv_heads * d, h),
                full(h, spec.heads * d),
            )
            gate, up, down = full(f, h), full(f, h), full(h, f)
            layer.norm1, layer.norm2 = param(torch.ones(h)), param(torch.ones(h))
            layer.wq, layer.wk, layer.wv = param(wq[qs]), param(wk[kvs]), param(wv[kvs])
            layer.wo = param(wo[:, qs])
            layer.gate, layer.up, layer.down = param(gate[fs]), param(up[fs]), param(down[:, fs])
            self.layers.append(layer)
        self.norm = param(torch.ones(h))
        self.head = param(full(V, h)[vs])

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.t > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        b, s = ids.shape
        start = cache.tokens if cache is not None else 0
        V_local = self.embed.shape[0]
        local = ids - self.r * V_local
        hit = (local >= 0) & (local < V_local)
        x = self._reduce(self.embed[local.clamp(0, V_local - 1)] * hit[..., None])
        group = self.a_local // self.kv_local
        for i, layer in enumerate(self.layers):
            y = _rms(x, layer.norm1)
            q = (y @ layer.wq.T).view(b, s, self.a_local, self.d).transpose(1, 2)
            k = (y @ layer.wk.T).view(b, s, self.kv_local, self.d).transpose(1, 2)
            v = (y @ layer.wv.T).view(b, s, self.kv_local, self.d).transpose(1, 2)
            q, k = _rope(q, start), _rope(k, start)
            if cache is not None:
                k, v = cache.append(i, k, v)
                k, v = k.to(q.dtype), v.to(q.dtype)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.d)
            n = k.shape[2]
            mask = torch.ones(s, n, dtype=torch.bool, device=ids.device).tril(n - s)
            att = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            att = att.transpose(1, 2).reshape(b, s, self.a_local * self.d)
            x = x + self._reduce(att @ layer.wo.T)
            y = _rms(x, layer.norm2)
            mlp = (torch.nn.functional.silu(y @ layer.gate.T) * (y @ layer.up.T)) @ layer.down.T
            x = x + self._reduce(mlp)
        logits = (_rms(x, self.norm) @ self.head.T).float()
        if self.t > 1:
            parts = [torch.empty_like(logits) for _ in range(self.t)]
            dist.all_gather(parts, logits.contiguous(), group=self.group)
            logits = torch.cat(parts, dim=-1)
        return logits

    @property
    def weight_bytes(self) -> int:
        """Measured bytes of this rank's weights."""
        from parmem.measure import tensor_storage_bytes

        return tensor_storage_bytes(list(self.parameters()))


@torch.no_grad()
def generate(
    model: Decoder, prompt: torch.Tensor, new_tokens: int, cache_dtype=torch.float32
) -> tuple[torch.Tensor, KVCache, list, torch.Tensor]:
    """Greedy decoding with a KV cache: one forward over the prompt (prefill), then one token per
    step. Returns (all tokens, the cache, [(tokens cached, measured cache bytes)] after each
    step, the logits of the last step)."""
    cache = KVCache(len(model.layers), cache_dtype)
    ids = prompt
    logits = model(ids, cache)[:, -1]
    sizes = [(cache.tokens, cache.nbytes)]
    for _ in range(new_tokens - 1):
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        logits = model(nxt, cache)[:, -1]
        sizes.append((cache.tokens, cache.nbytes))
    ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids, cache, sizes, logits


@torch.no_grad()
def generate_without_cache(
    model: Decoder, prompt: torch.Tensor, new_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: every step recomputes the whole sequence (no cache)."""
    ids = prompt
    logits = None
    for _ in range(new_tokens):
        logits = model(ids)[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids, logits


def demo(
    heads: int = 8,
    kv_heads: int = 2,
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 256,
    ffn: int = 128,
    batch: int = 2,
    prompt: int = 8,
    new_tokens: int = 8,
    cache_dtype: str = "fp32",
) -> dict:
    """Greedy generation with a tensor-parallel KV cache on every rank of the pool.

    Returns per rank: ``kv_heads_local``; ``kv_bytes`` (measured after each step, a list of
    ``(tokens, bytes)``) and ``kv_bytes_estimate`` (:func:`parmem.inference.kv_cache_bytes` for
    the same tokens, t = world size); ``weight_bytes`` and ``weight_bytes_estimate``
    (:func:`parmem.inference.serving_weight_bytes`, fp32); ``same_tokens`` (the TP decoder with
    its cache generated exactly the tokens of the single-process decoder without a cache) and
    ``max_logit_err`` (last step, fp32 logits).
    """
    from parmem.inference import kv_cache_bytes, serving_weight_bytes
    from parmem.reference import tiny_spec

    if cache_dtype not in _DTYPES:
        raise ValueError(f"cache_dtype={cache_dtype!r} must be one of {tuple(_DTYPES)}")
    t, r, dev = world_size(), rank(), device()
    spec = tiny_spec(
        "llama",
        vocab=vocab,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=ffn,
        seq=prompt + new_tokens,
    )
    ids = torch.randint(0, vocab, (batch, prompt), generator=torch.Generator().manual_seed(1))
    ids = ids.to(dev)
    ref = Decoder(spec).to(dev)
    ref_ids, ref_logits = generate_without_cache(ref, ids, new_tokens)
    model = Decoder(spec, tp_size=t, tp_rank=r).to(dev)
    out, cache, sizes, logits = generate(model, ids, new_tokens, _DTYPES[cache_dtype])
    return {
        "rank": r,
        "tp": t,
        "kv_heads": kv_heads,
        "kv_heads_local": model.kv_local,
        "cache_dtype": cache_dtype,
        "kv_bytes": sizes,
        "kv_bytes_estimate": [kv_cache_bytes(spec, n, batch, cache_dtype, tp=t) for n, _ in sizes],
        "weight_bytes": model.weight_bytes,
        "weight_bytes_estimate": serving_weight_bytes(spec, "fp32", tp=t),
        "same_tokens": bool(torch.equal(out, ref_ids)),
        "max_logit_err": float((logits - ref_logits).abs().max()),
        "tokens": out[0].tolist(),
    }
