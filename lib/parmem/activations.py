"""Activation memory: the bytes autograd keeps between forward and backward.

The reference is Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", §4 and Table 2. For one transformer layer, one micro-batch, 16-bit
activations and 1-byte dropout masks:

=========================================  ==========================
case                                       bytes per layer
=========================================  ==========================
no parallelism                             sbh(34 + 5as/h)
tensor parallel (t)                        sbh(10 + 24/t + 5as/(ht))
tensor + sequence parallel                 sbh/t · (34 + 5as/h)
tensor parallel + selective recompute      sbh(10 + 24/t)
tensor + sequence + selective recompute    sbh · 34/t
full recompute                             2sbh  (2sbh/t with sequence parallel)
=========================================  ==========================

:func:`per_layer_bytes` is that table. :func:`layer_terms` is the same accounting, term by
term, generalised to the shapes of a :class:`~parmem.model.ModelSpec` (grouped-query attention,
SwiGLU MLPs, RMSNorm, no dropout, mixture of experts, context parallelism, FlashAttention); for a
GPT-shaped layer its sum equals :func:`per_layer_bytes` exactly (tested).

The estimator multiplies per-layer bytes by the micro-batches a stage holds at once, which is
the schedule's business: :func:`parmem.pipeline.in_flight_units`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._check import boolean, choice, integer
from .config import RECOMPUTE
from .model import NORM_KINDS, ModelSpec

__all__ = ["per_layer_bytes", "layer_terms", "kept_terms", "norm_statistics", "Term"]


def _check_pos(**kw: int) -> None:
    for k, v in kw.items():
        integer(k, v)


def per_layer_bytes(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sp: bool = False,
    recompute: str = "none",
    flash: bool = False,
) -> int:
    """Activation bytes of one GPT layer for one micro-batch (Korthikanti et al. 2022, Table 2).

    ``s = seq_len``, ``b = micro_batch``, ``h = hidden``, ``a = heads``, ``t = tp``.
    16-bit activations, 1-byte dropout masks, a 4h MLP with GeLU, multi-head attention that
    materialises the s×s score matrix.

    ``flash=True`` models an attention kernel that keeps no s×s matrix (Dao et al. 2022): the
    5as²b/t term is replaced by the kernel's fp32 log-sum-exp, 4asb/t bytes, and attention dropout
    is regenerated from the RNG state instead of stored. ``recompute="selective"`` drops exactly
    the attention-core terms (§5, the 5as/h part), so ``flash`` makes it equal to ``"none"`` minus
    the log-sum-exp.
    """
    _check_pos(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, heads=heads, tp=tp)
    choice("recompute", recompute, RECOMPUTE)
    boolean("sp", sp)
    boolean("flash", flash)
    if heads % tp:
        raise ValueError(f"tp={tp} must divide heads={heads}")
    if sp and tp == 1:
        raise ValueError("sp=True needs tp >= 2 (sequence parallelism splits over the TP group)")
    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh // t if sp else 2 * sbh
    replicated = 10 * sbh  # LayerNorm inputs, QKV/FC1 inputs, dropout masks (Table 2)
    sharded = 24 * sbh  # Q, K, V, projection input, GeLU input and output
    if recompute == "selective":
        core = 0
    elif flash:
        core = 4 * a * s * b  # fp32 log-sum-exp per query and head
    else:
        core = 5 * a * s * s * b  # softmax output 2, dropout mask 1, dropout output 2
    if sp:
        return (replicated + sharded + core) // t
    return replicated + (sharded + core) // t


@dataclass(frozen=True)
class Term:
    """One named piece of a layer's activation memory."""

    name: str
    bytes: int
    note: str = ""
    core: bool = False  # part of the attention core that selective recompute drops


def layer_terms(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    flash: bool = False,
    dropout: bool = True,
    act_bytes: int = 2,
    norm_stat_bytes: int = 0,
    capacity_factor: float = 1.0,
) -> list[Term]:
    """Per-layer, per-micro-batch activation terms for any :class:`~parmem.model.ModelSpec`.

    The accounting is Korthikanti et al. 2022 §4.1, term by term, with the shapes generalised:

    * attention: norm input and QKV input (2sbh each), Q (2sb·a·d), K and V (2sb·kv·d each),
      scores softmax output and dropout (5as²b for MHA; no dropout: 2as²b), projection input
      (2sb·a·d), projection dropout mask (sbh);
    * dense MLP: norm input, FC1 input (2sbh each); GeLU: its input and output (2sbf each);
      SwiGLU: gate, up and SiLU outputs and the down-projection input (2sbf each); dropout mask;
    * MoE: the MLP terms for ``top_k`` experts per token times ``capacity_factor``, plus the
      router's fp32 logits and probabilities (8·sb·E);
    * ``norm_stat_bytes``: per-token statistics a norm saves (LayerNorm mean and rstd, RMSNorm
      rstd); 4 on CUDA (fp32), 2 for 16-bit input on CPU; 0 (the default) leaves them out as the
      paper does.

    Sharding: ``tp`` divides every term inside the column/row-parallel region; ``sp`` also divides
    the norm/dropout region; ``cp`` divides the sequence (queries); the score matrix is (s/cp)×s.
    ``act_bytes`` is the activation element size (2 for 16-bit, 4 for fp32); masks are 1 byte.
    """
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    _check_pos(seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, act_bytes=act_bytes)
    if seq_len % cp:
        raise ValueError(f"cp={cp} must divide seq_len={seq_len}")
    if spec.heads % tp:
        raise ValueError(f"tp={tp} must divide heads={spec.heads}")
    if sp and tp == 1:
        raise ValueError("sp=True needs tp >= 2 (sequence parallelism splits over the TP group)")
    s, b, h, t = seq_len // cp, micro_batch, spec.hidden, tp
    sb = s * b
    e = act_bytes
    kv_local = max(spec.kv_heads // t, 1)  # kv heads are replicated when t > kv_heads
    q_local = spec.heads // t
    d = spec.head_dim
    rep = t if sp else 1  # divisor for the norm/dropout ("replicated") region
    terms = [
        Term("attn norm input", e * sb * h // rep, "saved by the norm"),
        Term("qkv input", e * sb * h // rep, "norm output, saved by the QKV GEMM"),
        Term("q", e * sb * q_local * d),
        Term("k, v", 2 * e * sb * kv_local * d),
    ]
    terms += _core_terms(q_local, s, cp, b, e, flash, dropout)
    terms.append(Term("projection input", e * sb * q_local * d))
    if dropout:
        terms.append(Term("attention output dropout mask", sb * h // rep, "1 byte"))
    terms.append(Term("mlp norm input", e * sb * h // rep, "saved by the norm"))
    terms.append(Term("fc1 input", e * sb * h // rep, "norm output, saved by FC1"))
    terms += _mlp_terms(spec, sb, t, rep, e, capacity_factor)
    if dropout:
        terms.append(Term("mlp dropout mask", sb * h // rep, "1 byte"))
    if norm_stat_bytes:
        stats = norm_statistics(spec.norm, sb, norm_stat_bytes, norms=2)
        terms.append(Term("norm statistics", stats // rep, "mean/rstd per token"))
    return terms


def kept_terms(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sp: bool = False,
    recompute: str = "none",
    **kw: Any,
) -> list[Term]:
    """The :func:`layer_terms` one layer keeps for backward under activation recomputation.

    ``"none"`` keeps every term; ``"selective"`` drops the attention core (the ``core`` terms:
    the s×s softmax output and attention dropout, recomputed from Q, K and V in backward,
    Korthikanti et al. 2022 §5); ``"full"`` keeps only the layer's 16-bit input, 2sbh bytes
    (2sbh/t with sequence parallelism, Table 2), and recomputes the whole layer. Other keyword
    arguments go to :func:`layer_terms`. For a GPT-shaped layer the sum equals
    :func:`per_layer_bytes` in all six cases of Table 2 (tested).
    """
    choice("recompute", recompute, RECOMPUTE)
    terms = layer_terms(spec, seq_len, micro_batch, tp=tp, sp=sp, **kw)
    if recompute == "none":
        return terms
    if recompute == "selective":
        return [x for x in terms if not x.core]
    e = kw.get("act_bytes", 2)
    s = seq_len // kw.get("cp", 1)
    n = e * s * micro_batch * spec.hidden // (tp if sp else 1)
    return [Term("layer input", n, "the only tensor kept; the layer runs again in backward")]


def _core_terms(
    q_local: int, s: int, cp: int, b: int, e: int, flash: bool, dropout: bool
) -> list[Term]:
    """The attention core (what selective recomputation drops): the (s/cp)×s softmax output per
    local head, its dropout mask and output (Korthikanti et al. 2022 §4.1, 5as²b); with
    FlashAttention only the fp32 log-sum-exp per query and head (Dao et al. 2022)."""
    if flash:
        return [
            Term("attention log-sum-exp", 4 * q_local * s * b, "fp32, FlashAttention", core=True)
        ]
    score = q_local * s * (s * cp) * b  # (s/cp) queries x s keys per head
    out = [Term("softmax output", e * score, "s×s per head", core=True)]
    if dropout:
        out += [
            Term("attention dropout mask", score, "1 byte", core=True),
            Term("attention dropout output", e * score, core=True),
        ]
    return out


def _mlp_terms(
    spec: ModelSpec, sb: int, t: int, rep: int, e: int, capacity_factor: float
) -> list[Term]:
    """The MLP's inner tensors: GeLU input and output (2·2sbf/t), or SwiGLU's gate, up,
    SiLU(gate) and down-projection input (4·2sbf/t); for MoE the tokens dispatched to
    ``top_k`` experts (times the capacity factor), their hidden tensors, the shared experts' and
    the router's fp32 logits and probabilities."""

    def inner(ffn: int, scale: float) -> int:
        return int((2 if spec.ffn_kind == "gelu" else 4) * e * sb * (ffn // t) * scale)

    h = spec.hidden
    if not spec.is_moe:
        return [
            Term(
                "mlp hidden",
                inner(spec.ffn_hidden, 1.0),
                "GeLU input/output"
                if spec.ffn_kind == "gelu"
                else "gate, up, SiLU(gate), down input",
            )
        ]
    k = spec.top_k * capacity_factor
    out = [
        Term("expert inputs", int(e * sb * h * k), "tokens dispatched to top_k experts"),
        Term("expert hidden", inner(spec.expert_ffn_hidden, k)),
    ]
    if spec.shared_experts:
        out.append(Term("shared expert hidden", inner(spec.expert_ffn_hidden, spec.shared_experts)))
    out.append(
        Term(
            "router logits and probabilities",
            8 * sb * spec.num_experts // rep,
            "fp32; each rank routes its own s/t tokens under SP",
        )
    )
    return out


def norm_statistics(norm: str, tokens: int, itemsize: int, norms: int = 1) -> int:
    """Bytes of the statistics ``norms`` norms save for backward over ``tokens`` tokens, each
    ``itemsize`` bytes: a LayerNorm keeps its mean and reciprocal standard deviation per token, an
    RMSNorm the reciprocal root mean square only (PyTorch's ``native_layer_norm`` and
    ``rms_norm`` backward). Korthikanti et al. 2022 (§4.1, Table 2) leave them out; the measured
    layers of the book include them (:func:`parmem.reference.norm_stat_bytes` gives the item size
    of a device and dtype)."""
    choice("norm", norm, NORM_KINDS)
    integer("tokens", tokens, 0)
    integer("norms", norms, 0)
    integer("itemsize", itemsize)
    return (2 if norm == "layernorm" else 1) * tokens * norms * itemsize
