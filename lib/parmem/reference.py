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

The tiny models every demo and chapter measure are built here once: :func:`tiny_spec` gives the
:class:`~parmem.model.ModelSpec` (GPT- or Llama-shaped), :class:`TinyGPT` the GPT-shaped model
itself, and :func:`norm_stat_bytes` the LayerNorm/RMSNorm statistics autograd saves, the one term
of the measured activations that the paper's accounting leaves out.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from parmem._check import choice
from parmem.activations import norm_statistics
from parmem.engines import activation_itemsizes

if TYPE_CHECKING:  # pragma: no cover
    from parmem.model import ModelSpec

__all__ = [
    "GPTLayer",
    "MixedPrecisionAdamW",
    "TinyGPT",
    "dropout",
    "norm_stat_bytes",
    "norm_stat_itemsize",
    "tiny_spec",
]

#: the two shapes of :func:`tiny_spec`: GPT-2's (Radford et al. 2019: GeLU MLP, LayerNorm, biases,
#: learned positions) and Llama's (Touvron et al. 2023: SwiGLU, RMSNorm, no biases, rotary)
TINY_SHAPES = {
    "gpt": {"ffn_kind": "gelu", "norm": "layernorm", "bias": True, "position": "learned"},
    "llama": {"ffn_kind": "swiglu", "norm": "rmsnorm", "bias": False, "position": "rotary"},
}


def tiny_spec(
    shape: str = "gpt",
    *,
    vocab: int = 512,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    seq: int = 32,
    kv_heads: int = 0,
    ffn_hidden: int = 0,
    tied: bool = False,
    position: str | None = None,
) -> ModelSpec:
    """The :class:`~parmem.model.ModelSpec` of a tiny model, named ``tiny-gpt`` or ``tiny-llama``.

    ``shape="gpt"`` is the model :class:`TinyGPT` builds (GeLU MLP, LayerNorm, biases, learned
    positions unless ``position="rotary"``: a model without a position table);
    ``shape="llama"`` the one :class:`parmem.distributed.serve.Decoder` builds (SwiGLU, RMSNorm, no
    biases, rotary, grouped-query attention with ``kv_heads``). ``seq`` is ``max_positions``;
    ``ffn_hidden`` defaults to 4h (:class:`~parmem.model.ModelSpec`'s default).
    """
    from parmem.model import ModelSpec

    kw: dict[str, Any] = dict(TINY_SHAPES[choice("shape", shape, tuple(TINY_SHAPES))])
    if position is not None:
        kw["position"] = position
    return ModelSpec(
        name=f"tiny-{shape}",
        vocab_size=vocab,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=ffn_hidden,
        tied_embeddings=tied,
        max_positions=seq,
        **kw,
    )


def norm_stat_itemsize(device="cpu", dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes per token of one statistic (mean or rstd) a LayerNorm or RMSNorm saves for backward:
    4 on CUDA, where the kernels keep them in fp32; on CPU the input's element size (PyTorch's CPU
    ``native_layer_norm`` returns mean and rstd in the input dtype: 2 bytes for bf16).

    This is the per-token size :func:`parmem.activations.layer_terms` takes as
    ``norm_stat_bytes``.
    """
    kind = "cuda" if torch.device(device).type == "cuda" else "cpu"
    act = torch.empty((), dtype=dtype).element_size()
    return activation_itemsizes(kind, act, 0)["lnstat"]  # the one home: data/engines.toml


def norm_stat_bytes(
    tokens: int,
    norms: int = 1,
    norm: str = "layernorm",
    device="cpu",
    dtype: torch.dtype = torch.bfloat16,
) -> int:
    """Bytes of the statistics ``norms`` norms save for backward over ``tokens`` tokens.

    :func:`parmem.activations.norm_statistics` with :func:`norm_stat_itemsize` bytes per
    statistic; a GPT layer has two norms, so one layer on s·b tokens saves
    ``norm_stat_bytes(s * b, 2)``.
    """
    return norm_statistics(norm, tokens, norm_stat_itemsize(device, dtype), norms)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that saves a 1-byte mask for backward (``torch.native_dropout``)."""
    if not training or p == 0.0:
        return x
    out, _mask = torch.native_dropout(x, p, True)
    return out


class GPTLayer(nn.Module):
    """One Megatron-style GPT layer (or its tensor-parallel shard), input of shape [s, b, h].

    :meth:`attention` projects QKV, runs :meth:`core` (scores, softmax, dropout, the product with
    V) and projects back; subclasses swap the projections for parallel ones
    (:class:`parmem.distributed.tp.ParallelGPTLayer`) or recompute the core
    (selective recomputation in :func:`parmem.distributed.sp.demo_recompute`).
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        ffn_hidden: int | None = None,
        dropout_p: float = 0.1,
        dtype: torch.dtype = torch.bfloat16,
        tp_size: int = 1,
        tp_rank: int = 0,
        causal: bool = True,
        max_seq_len: int = 4096,
    ):
        super().__init__()
        ffn_hidden = ffn_hidden or 4 * hidden
        for name, v in (("hidden", hidden), ("heads", heads), ("tp_size", tp_size)):
            if v < 1:
                raise ValueError(f"{name}={v} must be >= 1")
        if hidden % heads:
            raise ValueError(f"heads={heads} must divide hidden={hidden}")
        if heads % tp_size or ffn_hidden % tp_size:
            raise ValueError(
                f"tp_size={tp_size} must divide heads={heads} and ffn_hidden={ffn_hidden}"
            )
        if not 0 <= tp_rank < tp_size:
            raise ValueError(f"tp_rank={tp_rank} must be in [0, tp_size={tp_size})")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.local_heads = heads // tp_size
        self.dropout_p, self.causal = dropout_p, causal
        kw = {"dtype": dtype}
        local_qkv = 3 * self.local_heads * self.head_dim
        self.ln1 = nn.LayerNorm(hidden, **kw)
        self.qkv = nn.Linear(hidden, local_qkv, **kw)  # column parallel
        self.proj = nn.Linear(self.local_heads * self.head_dim, hidden, **kw)  # row parallel
        self.ln2 = nn.LayerNorm(hidden, **kw)
        self.fc1 = nn.Linear(hidden, ffn_hidden // tp_size, **kw)  # column parallel
        self.fc2 = nn.Linear(ffn_hidden // tp_size, hidden, **kw)  # row parallel
        if causal:
            bias = torch.full((max_seq_len, max_seq_len), float("-inf"), dtype=dtype).triu(1)
            self.register_buffer("causal_bias", bias, persistent=False)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(QKᵀ/√d + causal mask) with dropout, times V; q, k, v of shape [b, a, s, d]."""
        s = q.shape[2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        if self.causal:
            scores = scores + self.causal_bias[:s, :s]
        probs = dropout(torch.softmax(scores, dim=-1), self.dropout_p, self.training)
        return torch.matmul(probs, v)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        y = self.qkv(x)  # [s, b, 3 a d]: s is the whole sequence even if x is a slice of it
        s, b, _ = y.shape
        qkv = y.view(s, b, self.local_heads, 3, self.head_dim)
        q, k, v = (z.permute(1, 2, 0, 3) for z in qkv.unbind(dim=3))  # views of one storage
        ctx = self.core(q, k, v)  # [b, a, s, d]
        return self.proj(ctx.permute(2, 0, 1, 3).reshape(s, b, self.local_heads * self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + dropout(self.attention(self.ln1(x)), self.dropout_p, self.training)
        y = self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return x + dropout(y, self.dropout_p, self.training)


class TinyGPT(nn.Module):
    """A whole GPT (Radford et al. 2019 layout) built from :class:`GPTLayer`, for a GPT-shaped
    :class:`~parmem.model.ModelSpec` (:func:`tiny_spec`: GeLU MLP, LayerNorm, biases, MHA).

    Token embedding (plus a learned position table if ``spec.position == "learned"``) →
    embedding dropout → L layers → final LayerNorm → LM head without bias (tied to the token
    embedding if ``spec.tied_embeddings``) → logits cast to fp32, the order Megatron-LM uses.
    With ``spec.position == "rotary"`` there is no position table and no rotation is applied:
    rotary embeddings have no parameters, so parameter, gradient and optimizer bytes are those of
    the spec (the tensor-parallel demos compare those, and one layer's saved bytes). Tensors are
    [s, b, ...]. Its parameter count equals ``spec.num_params()`` exactly.

    ``forward(ids)`` returns the fp32 logits [s, b, V]; ``forward(ids, labels)`` the mean
    cross-entropy loss.
    """

    def __init__(self, spec, dtype: torch.dtype = torch.bfloat16, dropout_p: float = 0.1):
        super().__init__()
        if (
            spec.ffn_kind != "gelu"
            or spec.norm != "layernorm"
            or not spec.bias
            or spec.is_moe
            or spec.kv_heads != spec.heads
            or spec.head_dim * spec.heads != spec.hidden
        ):
            raise ValueError(
                "TinyGPT needs a GPT-shaped spec: ffn_kind='gelu', "
                "norm='layernorm', bias=True, dense, MHA, head_dim = hidden/heads"
            )
        self.spec, self.dropout_p = spec, dropout_p
        kw = {"dtype": dtype}
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden, **kw)
        self.pos = (
            nn.Embedding(spec.max_positions, spec.hidden, **kw)
            if spec.position == "learned"
            else None
        )
        self.layers = nn.ModuleList(
            GPTLayer(
                spec.hidden,
                spec.heads,
                spec.ffn_hidden,
                dropout_p=dropout_p,
                dtype=dtype,
                max_seq_len=spec.max_positions,
            )
            for _ in range(spec.layers)
        )
        self.ln_f = nn.LayerNorm(spec.hidden, **kw)
        self.head = (
            None
            if spec.tied_embeddings
            else nn.Linear(spec.hidden, spec.vocab_size, bias=False, **kw)
        )

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[0], device=ids.device))[:, None, :]
        x = dropout(x, self.dropout_p, self.training)
        for layer in self.layers:
            x = layer(x)
        x = self.ln_f(x)
        weight = self.tok.weight if self.head is None else self.head.weight
        logits = torch.nn.functional.linear(x, weight).float()
        if labels is None:
            return logits
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


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
        return {
            p: {"master": m, **self.inner.state.get(m, {})}
            for p, m in zip(self.params, self.masters, strict=True)
        }

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
