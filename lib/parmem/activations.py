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
GPT-shaped layer its sum equals :func:`per_layer_bytes` exactly (tested). The terms are data: the
``paper`` table of saved tensors in ``data/engines.toml``; the other engine profiles
(:mod:`parmem.engines`) list what Megatron-Core, Transformers and torchtitan layers keep.

The estimator multiplies per-layer bytes by the micro-batches a stage holds at once, which is
the schedule's business: :func:`parmem.pipeline.in_flight_units`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from ._check import boolean, choice, integer
from .config import RECOMPUTE
from .engines import ACT_DTYPES, SavedTensor, engine, engines
from .model import NORM_KINDS, ModelSpec

__all__ = [
    "per_layer_bytes",
    "layer_terms",
    "kept_terms",
    "saved_tensor_bytes",
    "norm_statistics",
    "Term",
]


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


class _Ctx(NamedTuple):
    """What one evaluation of a saved-tensor table needs: tokens on this rank, the divisor of
    the norm region, the per-token widths, the element sizes and the expert scale."""

    tokens: int
    rep: int
    widths: dict[str, int]
    act: int
    stat: int
    k: float


def _widths(spec: ModelSpec, tp: int, s_full: int) -> dict[str, int]:
    """Per-token widths on one rank (the ``width`` keys of ``data/engines.toml``)."""
    t = tp
    q_local = spec.heads // t
    f = spec.ffn_hidden // t
    ef = spec.expert_ffn_hidden // t
    return {
        "h": spec.hidden,
        "q": q_local * spec.head_dim,
        "kv": max(spec.kv_heads // t, 1) * spec.head_dim,  # replicated when t > kv_heads
        "f": f,
        "f2": 2 * f,
        "ef": ef,
        "sf": ef * spec.shared_experts,
        "E": spec.num_experts,
        "scores": q_local * s_full,  # (s/cp) queries x s keys per head
        "heads": q_local,
        "one": 1,
    }


@lru_cache(maxsize=256)
def _conditions(
    ffn_kind: str, moe: bool, shared: bool, norm: str, flash: bool, dropout: bool, act: int
) -> frozenset[str]:
    out = {ffn_kind, norm, "moe" if moe else "dense", "flash" if flash else "no_flash"}
    out.add("act32" if act == 4 else "act16")
    if shared:
        out.add("shared")
    if dropout:
        out.add("dropout")
    return frozenset(out)


@lru_cache(maxsize=512)
def _active(engine_name: str, place: str, conds: frozenset[str]) -> tuple[SavedTensor, ...]:
    """The entries of a profile's ``layer``, ``first`` or ``last`` table whose conditions
    hold."""
    table: tuple[SavedTensor, ...] = getattr(engine(engine_name), place)
    return tuple(x for x in table if x.when <= conds)


def _entry_bytes(x: SavedTensor, c: _Ctx) -> int:
    """Bytes of one saved tensor: itemsize × copies × tokens × width (× top_k·capacity for
    tokens sent to experts), the norm region divided by t under sequence parallelism."""
    size = c.act if x.dtype == "act" else c.stat if x.dtype == "stat" else ACT_DTYPES[x.dtype]
    n = size * x.times * c.tokens * c.widths[x.width]
    if x.scale:
        n = int(n * c.k)
    return n // c.rep if x.region == "norm" else n


def _context(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sp: bool,
    cp: int,
    act_bytes: int,
    norm_stat_bytes: int,
    capacity_factor: float,
) -> _Ctx:
    s = seq_len // cp
    return _Ctx(
        tokens=s * micro_batch,
        rep=tp if sp else 1,
        widths=_widths(spec, tp, s * cp),
        act=act_bytes,
        stat=norm_stat_bytes,
        k=spec.top_k * capacity_factor,
    )


def saved_tensor_bytes(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    *,
    places: tuple[str, ...] = ("layer",),
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    flash: bool = False,
    dropout: bool = True,
    act_bytes: int = 2,
    norm_stat_bytes: int = 0,
    capacity_factor: float = 1.0,
    engine: str = "paper",
) -> list[list[tuple[SavedTensor, int]]]:
    """For each of ``places`` (``"layer"``, ``"first"``, ``"last"``: a layer, the first and the
    last pipeline stage's own tensors), (entry, bytes) of every saved tensor of the profile's
    table that applies to ``spec``, for one micro-batch on one rank. The layout is taken as
    checked: this is the estimator's fast path; :func:`layer_terms` is the checked, named
    view."""
    conds = _conditions(
        spec.ffn_kind,
        spec.is_moe,
        spec.shared_experts > 0,
        spec.norm,
        flash,
        dropout,
        act_bytes,
    )
    c = _context(
        spec, seq_len, micro_batch, tp, sp, cp, act_bytes, norm_stat_bytes, capacity_factor
    )
    return [
        [
            (x, _entry_bytes(x, c))
            for x in _active(engine, place, conds)
            if norm_stat_bytes or x.dtype != "stat"  # statistics left out, as the paper does
        ]
        for place in places
    ]


def layer_terms(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    flash: bool = False,
    dropout: bool | None = None,
    act_bytes: int = 2,
    norm_stat_bytes: int = 0,
    capacity_factor: float = 1.0,
    engine: str = "paper",
) -> list[Term]:
    """Per-layer, per-micro-batch activation terms for any :class:`~parmem.model.ModelSpec`.

    The terms are the saved-tensor table of the engine profile ``engine`` (``data/engines.toml``,
    :mod:`parmem.engines`). The ``paper`` table (the default) is Korthikanti et al. 2022 §4.1,
    term by term, with the shapes generalised:

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

    Other profiles list their own tensors (Megatron-Core's fused SwiGLU keeps only its 2f-wide
    input and its f-wide output, 6sbf; Transformers' RMSNorm keeps an fp32 copy of its input …).

    Sharding: ``tp`` divides every term inside the column/row-parallel region; ``sp`` also divides
    the norm/dropout region; ``cp`` divides the sequence (queries); the score matrix is (s/cp)×s.
    ``act_bytes`` is the activation element size (2 for 16-bit, 4 for fp32); masks are 1 byte.
    ``dropout=None`` follows the model (:attr:`~parmem.model.ModelSpec.has_dropout`).
    """
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    _check_pos(seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, act_bytes=act_bytes)
    integer("norm_stat_bytes", norm_stat_bytes, 0)
    choice("engine", engine, engines())
    if seq_len % cp:
        raise ValueError(f"cp={cp} must divide seq_len={seq_len}")
    if spec.heads % tp:
        raise ValueError(f"tp={tp} must divide heads={spec.heads}")
    if sp and tp == 1:
        raise ValueError("sp=True needs tp >= 2 (sequence parallelism splits over the TP group)")
    if dropout is None:
        dropout = spec.has_dropout
    boolean("dropout", dropout)
    (pairs,) = saved_tensor_bytes(
        spec,
        seq_len,
        micro_batch,
        tp=tp,
        sp=sp,
        cp=cp,
        flash=flash,
        dropout=dropout,
        act_bytes=act_bytes,
        norm_stat_bytes=norm_stat_bytes,
        capacity_factor=capacity_factor,
        engine=engine,
    )
    return [Term(x.name, n, x.note, x.core) for x, n in pairs]


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
    Korthikanti et al. 2022 §5; other profiles say what their selective mode drops);
    ``"full"`` keeps only the layer's 16-bit input, 2sbh bytes (2sbh/t with sequence
    parallelism, Table 2), and recomputes the whole layer. Other keyword arguments go to
    :func:`layer_terms`. For a GPT-shaped layer the sum equals :func:`per_layer_bytes` in all six
    cases of Table 2 (tested).
    """
    choice("recompute", recompute, RECOMPUTE)
    engine(kw.get("engine", "paper")).check_recompute(recompute)
    terms = layer_terms(spec, seq_len, micro_batch, tp=tp, sp=sp, **kw)
    if recompute == "none":
        return terms
    if recompute == "selective":
        return [x for x in terms if not x.core]
    e = kw.get("act_bytes", 2)
    s = seq_len // kw.get("cp", 1)
    n = e * s * micro_batch * spec.hidden // (tp if sp else 1)
    return [Term("layer input", n, "the only tensor kept; the layer runs again in backward")]


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
