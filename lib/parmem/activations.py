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
from .engines import SavedTensor, activation_itemsizes, devices, engine, engines
from .model import NORM_KINDS, ModelSpec
from .sharding import layer_tensors

__all__ = [
    "per_layer_bytes",
    "layer_terms",
    "kept_terms",
    "saved_tensor_bytes",
    "check_family",
    "spec_features",
    "FEATURES",
    "norm_statistics",
    "Term",
    "autocast_weight_cast_bytes",
]


#: The saved-tensor tables of a profile (see :func:`saved_tensor_bytes`).
PLACES: tuple[str, ...] = ("layer", "stage", "first", "last")


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
    only_selective: bool = False  # kept only under the profile's selective recompute


class _Ctx(NamedTuple):
    """What one evaluation of a saved-tensor table needs: the counts a ``per`` multiplies
    (tokens and positions on this rank, 1 per layer), the divisor of the norm region, the
    per-token widths, the element size of each dtype symbol and the expert scale."""

    counts: dict[str, int]
    rep: int
    widths: dict[str, int]
    sizes: dict[str, int]
    k: float


def _widths(spec: ModelSpec, tp: int, s_full: int) -> dict[str, int]:
    """Per-token widths on one rank (the ``width`` keys of ``data/engines.toml``)."""
    t = tp
    q_local = spec.heads // t
    kv_local = max(spec.kv_heads // t, 1)  # replicated when t > kv_heads
    f = spec.ffn_hidden // t
    ef = spec.expert_ffn_hidden // t
    # MLA (DeepSeek-V2 §2.1): K is a·head_dim and V a·v_head_dim wide, so the "k, v" pair is
    # 2 · a·(head_dim + v_head_dim)/2; the latents (q_lora_rank, kv_lora_rank + rope) are
    # computed whole on every TP rank (replicated down-projections)
    kv = kv_local * spec.head_dim
    if spec.attention == "mla":
        kv = q_local * (spec.head_dim + spec.v_head_dim) // 2
    return {
        "h": spec.hidden,
        "q": q_local * spec.head_dim,
        "kv": kv,
        "o": spec.o_dim // t,
        "qa": spec.q_lora_rank,
        "kva": spec.kv_lora_rank + spec.qk_rope_head_dim,
        "kvl": spec.kv_lora_rank,
        "hd": spec.head_dim,
        "f": f,
        "f2": 2 * f,
        "ef": ef,
        "sf": ef * spec.shared_experts,
        "E": spec.num_experts,
        "scores": q_local * s_full,  # (s/cp) queries x s keys per head
        "heads": q_local,
        "kvheads": kv_local,
        "one": 1,
        "vocab": spec.vocab_size // t,  # the logits' row on one rank (the hf profile: t = 1)
        "wlin": _linear_weights(spec) // t,
    }


def _linear_weights(spec: ModelSpec) -> int:
    """The weight elements of one layer's matrix multiplies (attention and MLP projections, the
    router; not the norms, not the biases): what autocast casts to 16 bits and the matmuls keep
    (:func:`parmem.sharding.layer_tensors`, kind ``linear``, experts left out)."""
    return sum(
        x.rows * x.cols * x.count
        for x in layer_tensors(spec)
        if x.kind == "linear" and x.place == "layer" and not x.expert
    )


def autocast_weight_cast_bytes(spec: ModelSpec, tp: int = 1) -> int:
    """Bytes of the bf16 copies of the transformer layers' matmul weights that ``torch.autocast``
    makes in the forward pass and the matmuls save for backward (PyTorch's autocast op list:
    ``linear`` runs in the lower precision, casting an fp32 weight; the cast is what autograd
    keeps): 2 bytes per weight of every layer's attention and MLP projections, on one
    tensor-parallel rank. All of them are alive when the backward pass starts; the backward
    frees them layer by layer. The embedding (a lookup, not cast) and the output layer are not
    counted."""
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    tp = integer("tp", tp)
    return 2 * spec.layers * (_linear_weights(spec) // tp)


@lru_cache(maxsize=256)
def _conditions(
    spec_kinds: tuple[str, ...], flash: bool, dropout: bool, act: int, autocast: bool = False
) -> frozenset[str]:
    out = {*spec_kinds, "flash" if flash else "no_flash", "act32" if act == 4 else "act16"}
    out.add("dropout" if dropout else "no_dropout")
    if autocast:
        out.add("autocast")
    return frozenset(out)


#: The Transformers families whose RMSNorm is GemmaRMSNorm (modeling_gemma.py: computed in
#: fp32, ``output * (1.0 + self.weight.float())``) and whose embeddings are scaled by sqrt(h)
GEMMA_FAMILIES = ("gemma", "gemma2", "gemma3_text")
#: The families whose router casts the top-k weights to the activation dtype
#: (Qwen2MoeTopKRouter, Qwen3MoeTopKRouter: ``router_top_value.to(router_logits.dtype)``)
ROUTER_CAST_FAMILIES = ("qwen2_moe", "qwen3_moe")


def _spec_kinds(spec: ModelSpec) -> tuple[str, ...]:
    """The conditions of ``data/engines.toml`` that the model's shape and its Transformers code
    path (``spec.family``) decide."""
    out = [spec.ffn_kind, spec.norm, spec.position, "moe" if spec.is_moe else "dense"]
    if spec.shared_experts > 0:
        out.append("shared")
    if spec.qk_norm:
        out.append("qk_norm")
    if spec.attention == "mla":
        out.append("mla")
    if spec.sandwich_norm:
        out.append("sandwich")
    if spec.shared_expert_gate:
        out.append("shared_gate")
    gemma = spec.family in GEMMA_FAMILIES
    out += ["gemma_norm", "embed_scale"] if gemma else ["cast_norm"]
    out.append("router_cast" if spec.family in ROUTER_CAST_FAMILIES else "router_fp32")
    if getattr(spec, "norm_topk_prob", True):
        out.append("topk_norm")
    if getattr(spec, "attn_softcap", 0):
        out.append("softcap")
    if getattr(spec, "logit_softcap", 0):
        out.append("logit_softcap")
    if spec.family == "gemma3_text" and spec.global_every and spec.layers >= spec.global_every:
        out.append("two_rope")  # local and global layers, each kind with its rotary table
    return tuple(out)


#: The structural features of a :class:`~parmem.model.ModelSpec` that change what a layer
#: keeps for backward, each with what it means; an activation table models those of its
#: ``features`` list (``data/engines.toml``) and refuses a spec with any other. Biases, and
#: norms without a weight or a bias, keep no extra tensor (a bias's gradient needs none).
FEATURES: dict[str, str] = {
    "parallel_block": "attention and MLP in parallel on the layer input (GPT-J, Falcon, ...)",
    "norms_per_layer=1": "one norm feeding attention and MLP",
    "norm_position=post": "norms on the attention and MLP outputs (OLMo 2)",
    "qk_norm": "an RMSNorm on each query and key head (Qwen3, Gemma 3)",
    "qk_norm_shape=heads": "a q/k norm weight per head (Cohere)",
    "qk_norm_shape=full": "q/k norms over the whole projection (OLMo 2)",
    "embedding_norm": "a LayerNorm after the embedding (BLOOM)",
    "position=alibi": "ALiBi attention biases",
    "sandwich_norm": "four norms per layer (Gemma 2/3)",
    "attn_softcap": "attention logit soft-capping (Gemma 2)",
    "logit_softcap": "final logit soft-capping (Gemma 2)",
    "shared_expert_gate": "a sigmoid gate on the shared expert (Qwen2-MoE)",
    "norm_topk_prob=false": "top-k routing weights not renormalised (Qwen-MoE)",
    "attention=mla": "multi-latent attention: compressed query and key/value latents (DeepSeek-V2/V3)",
}


def spec_features(spec: ModelSpec) -> tuple[str, ...]:
    """The keys of :data:`FEATURES` that ``spec`` uses."""
    out = []
    if getattr(spec, "parallel_block", False):
        out.append("parallel_block")
    if getattr(spec, "norms_per_layer", 0) == 1:
        out.append("norms_per_layer=1")
    for f, default in (("norm_position", "pre"), ("position", "")):
        value = getattr(spec, f, default)
        if f"{f}={value}" in FEATURES:
            out.append(f"{f}={value}")
    if spec.qk_norm and getattr(spec, "qk_norm_shape", "head") != "head":
        out.append(f"qk_norm_shape={spec.qk_norm_shape}")
    elif spec.qk_norm:
        out.append("qk_norm")
    for f in ("embedding_norm", "sandwich_norm", "attn_softcap", "logit_softcap"):
        if getattr(spec, f, False):
            out.append(f)
    if spec.shared_expert_gate and spec.shared_experts:
        out.append("shared_expert_gate")
    if spec.is_moe and not getattr(spec, "norm_topk_prob", True):
        out.append("norm_topk_prob=false")
    if spec.attention == "mla":
        out.append("attention=mla")
    return tuple(out)


@lru_cache(maxsize=256)
def _refusal(
    engine_name: str,
    family: str,
    flash: bool,
    window: int,
    seq_len: int,
    autocast: bool,
    features: tuple[str, ...] = (),
    dropout: bool = False,
) -> str:
    """Why the profile ``engine_name`` cannot give a family's saved tensors, or ``""``."""
    prof = engine(engine_name)
    for f in features:
        if f not in prof.features:
            field, _, value = f.partition("=")
            shown = f"{field}={value or True}"
            return (
                f"{shown} ({FEATURES[f]}) is not modelled by the {prof.activations!r} "
                f"activation table ({prof.who}): refused rather than counted as another layer"
            )
    if autocast and not prof.autocast:
        return (
            f"precision='bf16-autocast' (fp32 weights under bf16 autocast) is modelled by the "
            f"hf profile only, not by {prof.who}"
        )
    if autocast and family and family not in prof.autocast:
        return (
            f"precision='bf16-autocast': the {prof.activations} profile's saved tensors under "
            f"autocast are not measured for model_type={family!r} layers (measured: "
            f"{', '.join(prof.autocast)})"
        )
    if not prof.families or not family:
        return ""
    who = f"the {prof.activations} profile's saved tensors"
    if family not in prof.families:
        return (
            f"{who} are not measured for model_type={family!r} layers (measured: "
            f"{', '.join(prof.families)})"
        )
    if dropout and family in prof.dropout_free:
        return (
            f"dropout: {who} are measured for model_type={family!r} without dropout only "
            "(its dropout keys differ; set dropout=False if the config's are 0)"
        )
    if flash and family in prof.eager_only:
        return (
            f"flash_attention=True: Transformers 5.23 has no SDPA attention for "
            f"model_type={family!r} (_supports_sdpa = False); the model runs eager attention, "
            "set flash_attention=False"
        )
    if flash and window and seq_len > window:
        return (
            f"seq_len={seq_len} > sliding_window={window} with flash_attention=True: "
            "Transformers' SDPA local layers then keep a mask and key/value heads repeated to "
            f"every query head, which {who} do not model"
        )
    return ""


def check_family(
    spec: ModelSpec,
    seq_len: int,
    flash: bool,
    engine_name: str,
    autocast: bool = False,
    dropout: bool = False,
) -> None:
    """Raise ``ValueError`` when the profile's activation table does not model a structural
    feature ``spec`` uses (:func:`spec_features`, the table's ``features`` list), is not measured
    for the Transformers family ``spec.family`` (its ``families`` list in ``data/engines.toml``;
    a spec without a family, a preset or a hand-built spec, passes this check), or not for its
    attention setting."""
    if autocast and spec.is_moe:
        raise ValueError(
            "precision='bf16-autocast' with a mixture of experts: the experts' grouped matmuls "
            "under autocast are not measured (the hf profile models dense layers)"
        )
    if flash and spec.head_dim > 256 and spec.family and engine(engine_name).families:
        raise ValueError(
            f"head_dim={spec.head_dim} > 256 with flash_attention=True: Transformers' SDPA "
            "then repeats the key/value heads (integrations/sdpa_attention.py use_gqa_in_sdpa), "
            "which the measured table does not model"
        )
    why = _refusal(
        engine_name,
        spec.family,
        flash,
        spec.sliding_window,
        seq_len,
        autocast,
        spec_features(spec),
        dropout,
    )
    if why:
        raise ValueError(why)


@lru_cache(maxsize=512)
def _active(engine_name: str, place: str, conds: frozenset[str]) -> tuple[SavedTensor, ...]:
    """The entries of a profile's ``layer``, ``first`` or ``last`` table whose conditions
    hold."""
    table: tuple[SavedTensor, ...] = getattr(engine(engine_name), place)
    return tuple(x for x in table if x.when <= conds)


def _entry_bytes(x: SavedTensor, c: _Ctx) -> int:
    """Bytes of one saved tensor: itemsize × copies × tokens (or positions, or 1) × width
    (× top_k·capacity for tokens sent to experts), the norm region divided by t under sequence
    parallelism."""
    n = c.sizes[x.dtype] * x.times * c.counts[x.per] * c.widths[x.width]
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
    device: str,
    autocast: bool = False,
) -> _Ctx:
    s = seq_len // cp
    return _Ctx(
        counts={"token": s * micro_batch, "position": s, "layer": 1},
        rep=tp if sp else 1,
        widths=_widths(spec, tp, s * cp),
        sizes=activation_itemsizes(device, act_bytes, norm_stat_bytes, 4 if autocast else 0),
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
    device: str = "cuda",
    autocast: bool = False,
) -> list[list[tuple[SavedTensor, int]]]:
    """For each of ``places`` (``"layer"``; ``"stage"``: the tensors every pipeline stage keeps
    once, shared by its layers; ``"first"``, ``"last"``: the first and the last pipeline stage's
    own tensors), (entry, bytes) of every saved tensor of the profile's table that applies to
    ``spec``, for one micro-batch on one rank. The layout is taken as checked: this is the
    estimator's fast path; :func:`layer_terms` is the checked, named view. A profile measured
    family by family (``hf``) refuses a spec of another family (:func:`check_family`).
    ``autocast``: fp32 weights under bf16 autocast (``precision="bf16-autocast"``,
    ``act_bytes=2``): the residual stream is fp32 (the ``res`` entries) and each layer keeps its
    matmuls' 16-bit weight copies."""
    check_family(spec, seq_len // cp, flash, engine, autocast, dropout)
    conds = _conditions(_spec_kinds(spec), flash, dropout, act_bytes, autocast)
    c = _context(
        spec,
        seq_len,
        micro_batch,
        tp,
        sp,
        cp,
        act_bytes,
        norm_stat_bytes,
        capacity_factor,
        device,
        autocast,
    )
    return [
        [
            (x, _entry_bytes(x, c))
            for x in _active(engine, place, conds)
            if norm_stat_bytes or x.dtype != "stat"  # statistics left out, as the paper does
        ]
        for place in places
    ]


def _all_terms(
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
    device: str = "cuda",
    place: str = "layer",
    autocast: bool = False,
) -> list[Term]:
    """:func:`layer_terms` with the profile's ``only_selective`` terms: checks the arguments,
    evaluates one table."""
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    _check_pos(seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, act_bytes=act_bytes)
    norm_stat_bytes = integer("norm_stat_bytes", norm_stat_bytes, 0)
    choice("engine", engine, engines())
    choice("device", device, devices())
    choice("place", place, PLACES)
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
        places=(place,),
        tp=tp,
        sp=sp,
        cp=cp,
        flash=flash,
        dropout=dropout,
        act_bytes=act_bytes,
        norm_stat_bytes=norm_stat_bytes,
        capacity_factor=capacity_factor,
        engine=engine,
        device=device,
        autocast=boolean("autocast", autocast),
    )
    return [Term(x.name, n, x.note, x.core, x.only_selective) for x, n in pairs]


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
    device: str = "cuda",
    place: str = "layer",
    autocast: bool = False,
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
    input and its f-wide output, 6sbf; Transformers' RMSNorm keeps an fp32 copy of its input …),
    each measured or read from the engine's source (see the table's comments).

    Sharding: ``tp`` divides every term inside the column/row-parallel region; ``sp`` also divides
    the norm/dropout region; ``cp`` divides the sequence (queries); the score matrix is (s/cp)×s.
    ``act_bytes`` is the activation element size (2 for 16-bit, 4 for fp32).
    ``dropout=None`` follows the model (:attr:`~parmem.model.ModelSpec.has_dropout`).

    ``device`` (``"cuda"``, the default, where the profiles' numbers hold; ``"cpu"``) sets the
    element sizes that depend on the kernels (``[devices.*]`` in ``data/engines.toml``): dropout
    masks are 1-byte booleans on CUDA but the activation dtype on CPU; LayerNorm statistics fp32
    on CUDA, the input dtype on CPU; ``nn.RMSNorm`` keeps its input on CUDA, an fp32 copy and an
    fp32 normalised tensor on CPU. ``place`` picks the table: ``"layer"`` (one layer),
    ``"stage"`` (what a pipeline stage keeps once for all its layers, e.g. Transformers' rotary
    cos and sin), ``"first"`` or ``"last"`` (the first and the last stage's own tensors).
    ``autocast=True`` (the ``hf`` profile only, with ``act_bytes=2``): fp32 weights trained
    under bf16 autocast (``precision="bf16-autocast"``).

    These are the tensors kept without recomputation; :func:`kept_terms` applies one.
    """
    terms = _all_terms(
        spec,
        seq_len,
        micro_batch,
        tp,
        sp,
        cp,
        flash,
        dropout,
        act_bytes,
        norm_stat_bytes,
        capacity_factor,
        engine,
        device,
        place,
        autocast,
    )
    return [x for x in terms if not x.only_selective]


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
    Korthikanti et al. 2022 §5; other profiles say what their selective mode drops, and may keep
    tensors a plain forward does not: torchtitan's op-level SAC keeps the MLP's output);
    ``"full"`` keeps only the layer's 16-bit input, 2sbh bytes (2sbh/t with sequence
    parallelism, Table 2), and recomputes the whole layer. Other keyword arguments go to
    :func:`layer_terms`. For a GPT-shaped layer the sum equals :func:`per_layer_bytes` in all six
    cases of Table 2 (tested).
    """
    choice("recompute", recompute, RECOMPUTE)
    engine(kw.get("engine", "paper")).check_recompute(recompute)
    if recompute == "selective":
        terms = _all_terms(spec, seq_len, micro_batch, tp=tp, sp=sp, **kw)
        return [x for x in terms if not x.core]
    if recompute == "none":
        return layer_terms(spec, seq_len, micro_batch, tp=tp, sp=sp, **kw)
    n = layer_input_bytes(
        spec.hidden,
        seq_len,
        micro_batch,
        tp=tp,
        sp=sp,
        cp=kw.get("cp", 1),
        act_bytes=kw.get("act_bytes", 2),
    )
    return [Term("layer input", n, "the only tensor kept; the layer runs again in backward")]


def layer_input_bytes(
    hidden: int,
    seq_len: int,
    micro_batch: int,
    *,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    act_bytes: int = 2,
) -> int:
    """One layer's input on one rank, s/cp · b · h (``hidden``) activation elements, divided by t under
    sequence parallelism (Korthikanti et al. 2022 §4.2.2, Table 2's 2sbh/t): what full
    recomputation keeps per layer and what a pipeline stage sends (the boundary tensor of
    :attr:`parmem.layout.Layout.boundary_bytes`)."""
    return act_bytes * (seq_len // cp) * micro_batch * hidden // (tp if sp else 1)


def norm_statistics(norm: str, tokens: int, itemsize: int, norms: int = 1) -> int:
    """Bytes of the statistics ``norms`` norms save for backward over ``tokens`` tokens, each
    ``itemsize`` bytes: a LayerNorm keeps its mean and reciprocal standard deviation per token, an
    RMSNorm the reciprocal root mean square only (PyTorch's ``native_layer_norm`` and
    ``rms_norm`` backward). Korthikanti et al. 2022 (§4.1, Table 2) leave them out; the measured
    layers of the book include them (:func:`parmem.reference.norm_stat_bytes` gives the item size
    of a device and dtype)."""
    choice("norm", norm, NORM_KINDS)
    tokens = integer("tokens", tokens, 0)
    norms = integer("norms", norms, 0)
    itemsize = integer("itemsize", itemsize)
    return (2 if norm == "layernorm" else 1) * tokens * norms * itemsize
