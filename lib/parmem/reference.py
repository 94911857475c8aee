"""A reference GPT layer built like Megatron-LM's, to measure activation memory against theory.

:class:`GPTLayer` is one pre-LayerNorm transformer layer exactly as Korthikanti et al. 2022 §4.1
count it: LayerNorm → QKV projection → explicit attention (scores, softmax, dropout, weighted
sum) → output projection → dropout → residual; LayerNorm → FC1 → GeLU → FC2 → dropout → residual.
Measuring it with :class:`parmem.measure.SavedTensorsMeter` gives sbh(34 + 5as/h) bytes plus the
LayerNorm statistics, which the paper leaves out (``tests/test_measure.py`` asserts both).

Choices that keep the measurement equal to the paper's accounting (each one documented):

* attention is computed explicitly, not with ``scaled_dot_product_attention``: on CPU, SDPA with
  dropout upcasts 16-bit inputs to fp32, and fused kernels hide what they save;
* dropout uses ``torch.native_dropout``, which saves a 1-byte boolean mask (``F.dropout`` on CPU
  saves a 16-bit mask);
* the 1/sqrt(d) scale multiplies the scores by a Python float and the causal mask is *added* as a
  constant tensor: neither operation saves anything for backward (scaling Q first would save an
  extra copy of Q, and ``masked_fill`` would save the s×s mask);
* Q, K and V are views of one QKV output, so they are one saved storage of 6sbh bytes (the paper's
  4sbh for QK^T plus 2sbh for V).

Tensor parallelism: ``tp_size``/``tp_rank`` build the layer's shard on one rank (heads and the MLP
split as Megatron's column/row-parallel layers, norms replicated) without communication, so the
per-rank saved bytes of a TP layer can be measured in one process.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["GPTLayer", "MixedPrecisionAdamW", "TinyGPT", "dropout"]


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that saves a 1-byte mask for backward (``torch.native_dropout``)."""
    if not training or p == 0.0:
        return x
    out, _mask = torch.native_dropout(x, p, True)
    return out


class GPTLayer(nn.Module):
    """One Megatron-style GPT layer (or its tensor-parallel shard), input of shape [s, b, h]."""

    def __init__(self, hidden: int, heads: int, ffn_hidden: int | None = None,
                 dropout_p: float = 0.1, dtype: torch.dtype = torch.bfloat16,
                 tp_size: int = 1, tp_rank: int = 0, causal: bool = True,
                 max_seq_len: int = 4096):
        super().__init__()
        ffn_hidden = ffn_hidden or 4 * hidden
        for name, v in (("hidden", hidden), ("heads", heads), ("tp_size", tp_size)):
            if v < 1:
                raise ValueError(f"{name}={v} must be >= 1")
        if hidden % heads:
            raise ValueError(f"heads={heads} must divide hidden={hidden}")
        if heads % tp_size or ffn_hidden % tp_size:
            raise ValueError(f"tp_size={tp_size} must divide heads={heads} and "
                             f"ffn_hidden={ffn_hidden}")
        if not 0 <= tp_rank < tp_size:
            raise ValueError(f"tp_rank={tp_rank} must be in [0, tp_size={tp_size})")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.local_heads = heads // tp_size
        self.dropout_p, self.causal = dropout_p, causal
        kw = {"dtype": dtype}
        local_qkv = 3 * self.local_heads * self.head_dim
        self.ln1 = nn.LayerNorm(hidden, **kw)
        self.qkv = nn.Linear(hidden, local_qkv, **kw)                     # column parallel
        self.proj = nn.Linear(self.local_heads * self.head_dim, hidden, **kw)  # row parallel
        self.ln2 = nn.LayerNorm(hidden, **kw)
        self.fc1 = nn.Linear(hidden, ffn_hidden // tp_size, **kw)        # column parallel
        self.fc2 = nn.Linear(ffn_hidden // tp_size, hidden, **kw)        # row parallel
        if causal:
            bias = torch.full((max_seq_len, max_seq_len), float("-inf"), dtype=dtype).triu(1)
            self.register_buffer("causal_bias", bias, persistent=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        s, b, _ = x.shape
        qkv = self.qkv(x).view(s, b, self.local_heads, 3, self.head_dim)
        q, k, v = qkv.unbind(dim=3)                          # views of one storage
        q, k, v = (y.permute(1, 2, 0, 3) for y in (q, k, v))  # [b, a, s, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        if self.causal:
            scores = scores + self.causal_bias[:s, :s]
        probs = torch.softmax(scores, dim=-1)
        probs = dropout(probs, self.dropout_p, self.training)
        ctx = torch.matmul(probs, v)                          # [b, a, s, d]
        ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, self.local_heads * self.head_dim)
        return self.proj(ctx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + dropout(self.attention(self.ln1(x)), self.dropout_p, self.training)
        y = self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return x + dropout(y, self.dropout_p, self.training)


class TinyGPT(nn.Module):
    """A whole GPT (Radford et al. 2019 layout) built from :class:`GPTLayer`, for a GPT-shaped
    :class:`~parmem.model.ModelSpec` (GeLU MLP, LayerNorm, biases, learned positions).

    Token and position embeddings → embedding dropout → L layers → final LayerNorm → LM head
    (tied to the token embedding if the spec says so) → logits cast to fp32 → cross-entropy, the
    order Megatron-LM uses. Tensors are [s, b, ...]. Its parameter count equals
    ``spec.num_params()`` exactly.
    """

    def __init__(self, spec, dtype: torch.dtype = torch.bfloat16, dropout_p: float = 0.1):
        super().__init__()
        if spec.ffn_kind != "gelu" or spec.norm != "layernorm" or not spec.bias \
                or spec.position != "learned" or spec.is_moe or spec.kv_heads != spec.heads:
            raise ValueError("TinyGPT needs a GPT-shaped spec: ffn_kind='gelu', "
                             "norm='layernorm', bias=True, position='learned', dense, MHA")
        self.spec, self.dropout_p = spec, dropout_p
        kw = {"dtype": dtype}
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden, **kw)
        self.pos = nn.Embedding(spec.max_positions, spec.hidden, **kw)
        self.layers = nn.ModuleList(
            GPTLayer(spec.hidden, spec.heads, spec.ffn_hidden, dropout_p=dropout_p, dtype=dtype,
                     max_seq_len=spec.max_positions) for _ in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.hidden, **kw)
        self.head = None if spec.tied_embeddings else nn.Linear(spec.hidden, spec.vocab_size,
                                                                bias=False, **kw)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = ids.shape[0]
        pos = torch.arange(s, device=ids.device)
        x = self.tok(ids) + self.pos(pos)[:, None, :]
        x = dropout(x, self.dropout_p, self.training)
        for layer in self.layers:
            x = layer(x)
        x = self.ln_f(x)
        weight = self.tok.weight if self.head is None else self.head.weight
        logits = torch.nn.functional.linear(x, weight).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                                 labels.view(-1))


class MixedPrecisionAdamW:
    """AdamW with fp32 master weights for a 16-bit model (Micikevicius et al. 2018; the ZeRO
    paper's K = 12: master copy, first and second moments, 4 bytes each).

    ``state`` maps each 16-bit parameter to ``{"master": fp32 copy, "exp_avg", "exp_avg_sq",
    "step"}``, so :func:`parmem.measure.state_bytes` counts the master copy as optimizer state.
    """

    def __init__(self, params, lr: float = 1e-3, **kw):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.inner = torch.optim.AdamW(self.masters, lr=lr, **kw)

    @property
    def state(self) -> dict:
        return {p: {"master": m, **self.inner.state.get(m, {})}
                for p, m in zip(self.params, self.masters, strict=True)}

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters, strict=True):
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for p, m in zip(self.params, self.masters, strict=True):
            p.copy_(m)
            m.grad = None
