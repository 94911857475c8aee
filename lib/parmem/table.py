"""The parameter table: every parameter tensor of a model, its shape and its split kind, as data.

:func:`layer_tensors` (one layer: dense or MoE) and :func:`model_tensors` (the embedding, the
final norm, the LM head and DeepSeek-V3's MTP modules) describe a model row by row; the split
kinds and everything derived from them (whole-model counts, one rank's share, the TP table) are
in :mod:`parmem.sharding`, which re-exports these names. The rows cover Llama/GPT/Mixtral-style
layers and the 2025-26 architectures: multi-head latent attention (DeepSeek-V2 §2.1), q/k norms
(Qwen3, Gemma 3), attention sinks (gpt-oss), Gemma's four norms per layer, shared and gated
experts, router biases, dense-first and interleaved MoE layers (:func:`layer_groups`).

The functions take any object with :class:`~parmem.model.ModelSpec`'s shape attributes; this
module imports nothing from ``parmem``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ._check import normalised_cache

__all__ = [
    "SPLITS",
    "PLACES",
    "Tensor",
    "layer_tensors",
    "layer_groups",
    "moe_layer_count",
    "model_tensors",
]

SPLITS = ("column", "kv", "row", "vocab", "replicated")

#: Where a tensor lives: in every layer, on the first pipeline stage, on the last.
PLACES = ("layer", "first", "last")


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor (or ``count`` identical ones) of a model.

    ``rows × cols`` is its full shape (out_features × in_features for a linear weight; ``cols``
    is 1 for a vector). ``component`` is the key of :func:`~parmem.sharding.param_counts` it adds to; ``group`` the
    row of :func:`~parmem.sharding.tp_param_counts`. ``kind`` says what it is: ``linear`` (a layer's weight matrix:
    quantised for serving, multiplied by every token), ``router``, ``bias``, ``norm``,
    ``embedding``, ``positions`` or ``lm_head``. ``expert``: routed-expert tensor, one of
    ``count`` experts, divided over the expert-parallel ranks. ``place``: ``layer``, ``first`` or
    ``last`` (pipeline stage that holds it).
    """

    name: str
    rows: int
    cols: int
    split: str
    component: str
    group: str
    kind: str
    count: int = 1
    expert: bool = False
    place: str = "layer"

    @property
    def numel(self) -> int:
        """Elements of all ``count`` copies, unsharded."""
        return self.rows * self.cols * self.count


# ---------------------------------------------------------------------------- the table
def _mlp(
    spec: Any,
    prefix: str,
    width: int,
    component: str,
    group: str,
    count: int,
    expert: bool,
    row_bias_group: str,
    biased: bool = False,
) -> list[Tensor]:
    """A dense MLP (or ``count`` experts) of inner size ``width``: weights, then the column
    biases when ``biased``, then the row-parallel bias (Shoeybi et al. 2019 §3: FC1 column-, FC2
    row-parallel)."""
    h = spec.hidden
    names = ("gate", "up", "down") if spec.ffn_kind == "swiglu" else ("fc1", "fc2")

    def t(name: str, rows: int, cols: int, split: str, grp: str, kind: str) -> Tensor:
        return Tensor(prefix + name, rows, cols, split, component, grp, kind, count, expert)

    out = [t(f"{n}.weight", width, h, "column", group, "linear") for n in names[:-1]]
    out.append(t(f"{names[-1]}.weight", h, width, "row", group, "linear"))
    if biased:
        out += [t(f"{n}.bias", width, 1, "column", group, "bias") for n in names[:-1]]
        out.append(t(f"{names[-1]}.bias", h, 1, "replicated", row_bias_group, "bias"))
    return out


def _attention(spec: Any) -> list[Tensor]:
    """Q, K, V and the output projection (weights, then biases), the query/key norms (Qwen3,
    Gemma 3: one RMSNorm of head_dim per query and per key head, shared by the heads) and the
    attention sinks (gpt-oss: one learned logit per query head, split with the heads)."""
    if spec.kv_lora_rank:
        out = _mla(spec)
    else:
        h, q, kv = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        qo, kvg, rb = "attention Q, O", "attention K, V", "row-parallel biases"
        out = [
            Tensor("attn.q.weight", q, h, "column", "attention", qo, "linear"),
            Tensor("attn.k.weight", kv, h, "kv", "attention", kvg, "linear"),
            Tensor("attn.v.weight", kv, h, "kv", "attention", kvg, "linear"),
            Tensor("attn.o.weight", h, q, "row", "attention", qo, "linear"),
        ]
        attn_bias = spec.bias or getattr(spec, "attn_bias", False)
        if attn_bias or spec.qkv_bias:
            out += [
                Tensor("attn.q.bias", q, 1, "column", "attention", qo, "bias"),
                Tensor("attn.k.bias", kv, 1, "kv", "attention", kvg, "bias"),
                Tensor("attn.v.bias", kv, 1, "kv", "attention", kvg, "bias"),
            ]
        if attn_bias:
            out.append(Tensor("attn.o.bias", h, 1, "replicated", "attention", rb, "bias"))
    if spec.qk_norm:
        out += _qk_norms(spec)
    if getattr(spec, "attention_sinks", False):
        out.append(
            Tensor("attn.sinks", spec.heads, 1, "column", "attention", "attention Q, O", "sinks")
        )
    return out


def _qk_norms(spec: Any) -> list[Tensor]:
    """The query and key norms by ``qk_norm_shape``: ``"head"`` one weight of head_dim each,
    shared by the heads (Qwen3Attention, Gemma3Attention, Exaone4Attention; PhiAttention's
    ``q_layernorm`` is a LayerNorm with bias), replicated under TP; ``"heads"`` one weight per
    head, (a, head_dim) and (kv_heads, head_dim) (CohereAttention's CohereLayerNorm, no bias),
    split with the heads (vLLM's CohereAttention keeps its own heads' rows); ``"full"`` one
    RMSNorm over a · head_dim and kv_heads · head_dim (Olmo2Attention, Olmo3Attention),
    replicated (vLLM's Olmo2Attention gathers q and k over TP before it)."""
    shape, d = getattr(spec, "qk_norm_shape", "head"), spec.head_dim
    rows = {"q": d, "k": d}
    split = {"q": "replicated", "k": "replicated"}
    if shape != "head":
        rows = {"q": spec.heads * d, "k": spec.kv_heads * d}
    if shape == "heads":
        split = {"q": "column", "k": "kv"}
    bias = spec.norm == "layernorm" and getattr(spec, "norm_bias", True)
    out = []
    for n in ("q", "k"):
        for part in ("weight", "bias") if bias else ("weight",):
            out.append(
                Tensor(f"attn.{n}_norm.{part}", rows[n], 1, split[n], "norms", "norms", "norm")
            )
    return out


def _mla(spec: Any) -> list[Tensor]:
    """Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2 §2.1, eqs. 9-13; Transformers'
    DeepseekV3Attention): q = W_qb·norm(W_qa·x) (or W_q·x when ``q_lora_rank`` is 0), one latent
    [c_kv; k_rope] = W_kva·x of kv_lora_rank + qk_rope_head_dim, [k_nope; v] = W_kvb·norm(c_kv)
    for every head, output W_o of a·v_head_dim. The down-projections and their norms are
    replicated under TP (Megatron-Core's MLASelfAttention builds ``linear_q_down_proj`` and
    ``linear_kv_down_proj`` with ``parallel_mode='duplicated'``; vLLM's DeepseekV2MLAAttention a
    ReplicatedLinear); the up-projections split by heads, the output projection by rows."""
    h, a, qk, v = spec.hidden, spec.heads, spec.head_dim, spec.v_head_dim
    rq, rkv, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_rope_head_dim
    qo, kvg, lat = "attention Q, O", "attention K, V", "attention latent"
    out = []
    if rq:
        out += [
            Tensor("attn.q_a.weight", rq, h, "replicated", "attention", lat, "linear"),
            Tensor("attn.q_a_norm.weight", rq, 1, "replicated", "norms", "norms", "norm"),
            Tensor("attn.q_b.weight", a * qk, rq, "column", "attention", qo, "linear"),
        ]
    else:
        out.append(Tensor("attn.q.weight", a * qk, h, "column", "attention", qo, "linear"))
    nope = qk - rope
    return out + [
        Tensor("attn.kv_a.weight", rkv + rope, h, "replicated", "attention", lat, "linear"),
        Tensor("attn.kv_a_norm.weight", rkv, 1, "replicated", "norms", "norms", "norm"),
        Tensor("attn.kv_b.weight", a * (nope + v), rkv, "column", "attention", kvg, "linear"),
        Tensor("attn.o.weight", h, a * v, "row", "attention", qo, "linear"),
    ]


def _experts(spec: Any) -> list[Tensor]:
    """An MoE block: the routed experts (over e), the shared experts (a dense MLP of
    shared_experts · expert_ffn_hidden, split by TP and replicated over the expert-parallel
    ranks, as Megatron-Core's SharedExpertMLP and DeepSeek-V3 §3.4's training layout keep it),
    Qwen2-MoE's shared-expert gate and the router (with gpt-oss's bias)."""
    h, ef, E = spec.hidden, spec.expert_ffn_hidden, spec.num_experts
    out = _mlp(spec, "experts.", ef, "experts", "experts", E, True, "experts", spec.bias)
    if spec.shared_experts:
        sh = "shared experts"
        n = spec.shared_experts
        out += _mlp(spec, "shared_experts.", ef, "shared_experts", sh, n, False, sh, spec.bias)
        if getattr(spec, "shared_expert_gate", False):
            out.append(
                Tensor(
                    "shared_expert_gate.weight", 1, h, "replicated", "shared_experts", sh, "router"
                )
            )
    out.append(Tensor("router.weight", E, h, "replicated", "router", "router", "router"))
    if getattr(spec, "router_bias", False):
        out.append(Tensor("router.bias", E, 1, "replicated", "router", "router", "bias"))
    return out


@normalised_cache(maxsize=256)
def layer_tensors(spec: Any, moe: bool | None = None) -> tuple[Tensor, ...]:
    """The parameter tensors of one transformer layer, in module order: the attention
    (:func:`_attention`), the MLP or the experts, shared experts and router, then the norms
    (``layer_norm_count`` of them: two, four with Gemma's ``sandwich_norm``, one for a parallel
    block with one norm: GPTJBlock's ``ln_1``, CohereDecoderLayer, FalconDecoderLayer). ``moe``: an MoE layer (default: when the model has
    experts) or a dense one (the dense layers of an MoE model: DeepSeek-V3's first three, Llama
    4's interleaved ones)."""
    moe = bool(spec.num_experts) if moe is None else moe and bool(spec.num_experts)
    rb = "row-parallel biases"
    out = _attention(spec)
    if moe:
        out += _experts(spec)
    else:
        biased = spec.bias or getattr(spec, "mlp_bias", False)
        out += _mlp(spec, "mlp.", spec.ffn_hidden, "mlp", "MLP", 1, False, rb, biased)
    names = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm")
    for name in names[: getattr(spec, "layer_norm_count", 4 if spec.sandwich_norm else 2)]:
        out += _norm(spec, name)
    return tuple(out)


def moe_layer_count(spec: Any, start: int = 0, n: int | None = None) -> int:
    """MoE layers among layers ``start .. start+n-1``: layer i has experts when
    i >= first_dense_layers and (i+1) % moe_every == 0 (:meth:`ModelSpec.is_moe_layer`)."""
    if not spec.num_experts:
        return 0
    n = spec.layers - start if n is None else n
    first, every = getattr(spec, "first_dense_layers", 0), getattr(spec, "moe_every", 1)
    return sum(1 for i in range(start, start + n) if i >= first and (i + 1) % every == 0)


@normalised_cache(maxsize=1024)
def layer_groups(
    spec: Any, start: int = 0, n: int | None = None
) -> tuple[tuple[int, tuple[Tensor, ...]], ...]:
    """(how many layers, their tensors) for the dense and the MoE layers among layers
    ``start .. start+n-1`` (default: all), groups of 0 layers left out."""
    n = spec.layers - start if n is None else n
    moe = moe_layer_count(spec, start, n)
    groups = ((n - moe, layer_tensors(spec, False)), (moe, layer_tensors(spec, True)))
    return tuple((k, g) for k, g in groups if k)


def _norm(spec: Any, name: str, place: str = "layer") -> list[Tensor]:
    """LayerNorm has a weight and a bias of h values, RMSNorm a weight (Zhang & Sennrich 2019);
    without ``norm_bias`` a LayerNorm has no bias (CohereLayerNorm, MptBlock's norms), without
    ``norm_weight`` no parameters at all (OlmoLayerNorm)."""
    out = []
    if getattr(spec, "norm_weight", True):
        out.append(
            Tensor(
                f"{name}.weight",
                spec.hidden,
                1,
                "replicated",
                "norms",
                "norms",
                "norm",
                place=place,
            )
        )
    if spec.norm == "layernorm" and getattr(spec, "norm_bias", True):
        out.append(
            Tensor(
                f"{name}.bias", spec.hidden, 1, "replicated", "norms", "norms", "norm", place=place
            )
        )
    return out


@normalised_cache(maxsize=256)
def model_tensors(spec: Any, pipeline: bool = False) -> tuple[Tensor, ...]:
    """Tensors outside the layers: the embedding (and learned positions) on the first stage; the
    final norm and the LM head on the last. A tied LM head has no tensor of its own, except with
    ``pipeline=True`` (p > 1): then the last stage keeps a copy of the embedding (Shoeybi et al.
    2019 §3; Megatron-LM's ``shared_embedding``) whose gradient is all-reduced with the first's.
    """
    h, V = spec.hidden, spec.vocab_size
    out = [
        Tensor(
            "embedding.weight", V, h, "vocab", "embedding", "embedding", "embedding", place="first"
        )
    ]
    if spec.position == "learned":
        out.append(
            Tensor(
                "positions.weight",
                spec.max_positions,
                h,
                "replicated",
                "positions",
                "positions",
                "positions",
                place="first",
            )
        )
    if getattr(spec, "embedding_norm", False):  # BloomModel.word_embeddings_layernorm
        out += _norm(spec, "embedding_norm", place="first")
    out += _norm(spec, "final_norm", place="last")
    if not spec.tied_embeddings or pipeline:
        out.append(
            Tensor("lm_head.weight", V, h, "vocab", "lm_head", "LM head", "lm_head", place="last")
        )
    if getattr(spec, "lm_head_bias", False):  # PhiForCausalLM, GPTJForCausalLM: even when tied
        out.append(
            Tensor("lm_head.bias", V, 1, "vocab", "lm_head", "LM head", "bias", place="last")
        )
    for j in range(getattr(spec, "mtp_layers", 0)):
        out += _mtp(spec, f"mtp.{j}.")
    return tuple(out)


def _mtp(spec: Any, prefix: str) -> list[Tensor]:
    """One multi-token-prediction module on the last stage (DeepSeek-AI 2024, DeepSeek-V3 §2.2,
    eq. 21-23): RMSNorms of the hidden state and of the next token's embedding, the projection
    M (h × 2h; column-parallel in Megatron-Core's MultiTokenPredictionLayer ``eh_proj``), one
    transformer block (an MoE layer, as layer 61 of the released checkpoint) and the norm before
    the output head; the embedding and the output head are shared with the main model (§2.2)."""
    mtp, grp = "mtp", "MTP module"
    norms = [
        Tensor(f"{prefix}{n}.weight", spec.hidden, 1, "replicated", mtp, grp, "norm", place="last")
        for n in ("enorm", "hnorm", "head_norm")
    ]
    proj = Tensor(
        f"{prefix}eh_proj.weight",
        spec.hidden,
        2 * spec.hidden,
        "column",
        mtp,
        grp,
        "linear",
        place="last",
    )
    block = [
        replace(
            x,
            name=prefix + x.name,
            component="mtp_experts" if x.expert else mtp,
            group=x.group if x.expert else grp,
            place="last",
        )
        for x in layer_tensors(spec, True)
    ]
    return [*norms[:2], proj, *block, norms[2]]
