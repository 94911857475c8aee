"""Reading a Hugging Face ``config.json`` into :class:`~parmem.model.ModelSpec` fields.

Dispatched on ``model_type``: every family parmem reads has its own reader with its own key
names (Transformers 5.23's ``configuration_*.py``) and its class's defaults for the keys a
config.json omits (``data/hf_families.toml``, generated from those classes). A ``model_type``
not listed there is refused by name: a config is never read with another family's defaults.

The families: the Llama key names (llama, mistral, ministral, mixtral, qwen2, qwen2_moe, qwen3,
qwen3_moe, gemma, gemma2, gemma3_text, phi3, phimoe, starcoder2, olmo, olmo2, olmo3, cohere,
cohere2, granite, granitemoe, glm, glm4, exaone4, smollm3, phi, gpt_neox, gpt_oss, llama4_text,
deepseek_v2, deepseek_v3), GPT-2's (gpt2, gpt_bigcode, gptj), and
Falcon, MPT and BLOOM. Multimodal configs (``gemma3``, ``llama4``) are read through their
``text_config``: the language model only.

A feature parmem does not model (an unknown ``layer_types`` entry, a layer pattern it cannot
read, MLA with biases, MPT's multi-query attention) raises ``ValueError`` naming the key, never
a silently wrong count. Standard library only.
"""

from __future__ import annotations

from typing import Any

from ._check import MAX_LAYERS, MAX_WIDTH, boolean, integer, number
from ._data import load_toml

__all__ = [
    "spec_fields",
    "families",
    "refused_families",
    "with_defaults",
    "FAMILIES",
    "DROPOUT_KEYS",
]

#: layer_types entries: full attention, and the local kinds with the key of their window
FULL = "full_attention"
LOCAL = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}


def key(k: str) -> str:
    """How a message names a config.json key: ``config['hidden_size']``."""
    return f"config[{k!r}]"


def need(cfg: dict[str, Any], *keys: str, maximum: int = MAX_WIDTH) -> int:
    """The first of ``keys`` that is set (not null), as an integer >= 1."""
    for k in keys:
        if cfg.get(k) is not None:
            return integer(key(k), cfg[k], 1, maximum)
    raise ValueError(f"config: missing {keys[0]!r} (model_type={cfg.get('model_type')!r:.40})")


def opt(cfg: dict[str, Any], k: str) -> int:
    """``k`` as an integer >= 0, 0 when it is missing or null (0: "take the usual value")."""
    value = cfg.get(k)
    return 0 if value is None else integer(key(k), value, 0, MAX_WIDTH)


def flag(cfg: dict[str, Any], k: str, default: bool) -> bool:
    """``k`` as a JSON boolean (``"false"`` is refused, not read as true); ``default`` when it
    is missing or null."""
    value = cfg.get(k)
    return default if value is None else boolean(key(k), value)


#: config keys that hold a dropout probability (GPT-2: resid/embd/attn_pdrop; Llama: attention_dropout)
DROPOUT_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "emb_pdrop",
    "embedding_dropout",
    "residual_dropout",
)


def hf_dropout(cfg: dict[str, Any], default: float) -> float:
    """The largest dropout probability a config states; ``default`` when it states none."""
    found = [number(key(k), cfg[k], 0.0, 1.0) for k in DROPOUT_KEYS if cfg.get(k) is not None]
    return max(found) if found else default


def model_type(cfg: dict[str, Any]) -> str:
    mtype = cfg.get("model_type", "")
    if not isinstance(mtype, str):
        raise ValueError(f"{key('model_type')} must be a string, got {type(mtype).__name__}")
    return mtype.lower()


#: multimodal model_types read through their text_config, and the text model's type
_WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text"}


def _table() -> dict[str, Any]:
    table: dict[str, Any] = load_toml("hf_families.toml")
    return table


def families() -> dict[str, str]:
    """model_type -> Transformers configuration class, for every family parmem reads (and the
    multimodal wrappers read through their ``text_config``)."""
    out = {k: v["config"] for k, v in _table().items() if k != "refused"}
    out.update({w: f"{out[t]} (text_config of {w})" for w, t in _WRAPPERS.items()})
    return dict(sorted(out.items()))


def refused_families() -> dict[str, str]:
    """model_type -> why parmem refuses it (any model_type not in :func:`families` is refused
    too)."""
    return {k: v["reason"] for k, v in _table()["refused"].items()}


#: the model_type values parmem reads (see :func:`families`)
FAMILIES = tuple(families())


def with_defaults(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """``cfg`` with the family's aliases resolved (``hidden_size`` -> ``n_embd`` for GPT-2) and
    the class defaults for the keys it omits (a key given as null stays null)."""
    entry = _table()[mtype]
    out = dict(cfg)
    for alias, real in entry.get("aliases", {}).items():
        if alias in out and real not in out:
            out[real] = out.pop(alias)
    return {**entry["defaults"], **out}


def spec_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """Map a Hugging Face config dict onto ModelSpec fields, each value checked under its key."""
    if not isinstance(cfg, dict):
        raise ValueError(f"config must be a JSON object, got {type(cfg).__name__}")
    mtype = model_type(cfg)
    if mtype in _WRAPPERS and "text_config" in cfg:
        text = cfg["text_config"]
        if not isinstance(text, dict):
            raise ValueError(f"{key('text_config')} must be a JSON object")
        sub = dict(text)
        if cfg.get("tie_word_embeddings") is not None and "tie_word_embeddings" not in sub:
            sub["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        sub["model_type"] = _WRAPPERS[mtype]
        out = spec_fields(sub)
        out["source"] += f" (text_config of model_type={mtype}; the vision tower is not counted)"
        return out
    if mtype in _WRAPPERS:
        mtype = _WRAPPERS[mtype]  # a config of the text model saved under the outer type
    table = _table()
    if not mtype or mtype == "refused" or mtype not in table:
        _refuse(mtype)
    full = with_defaults(cfg, mtype)
    reader = _READERS.get(mtype, _llama_family)
    out = reader(full, mtype)
    out["family"] = mtype
    out["source"] = f"Hugging Face config.json (model_type={mtype}; {table[mtype]['config']})"
    return out


def _refuse(mtype: str) -> None:
    if not mtype:
        raise ValueError(
            f"{key('model_type')} is missing: parmem reads a config by its family's key names"
        )
    why = refused_families().get(mtype)
    if why:
        raise ValueError(f"{key('model_type')}={mtype!r}: {why}")
    raise ValueError(
        f"{key('model_type')}={mtype!r:.40} is not a family parmem reads; supported: "
        + ", ".join(families())
    )


# ---------------------------------------------------------------------------- GPT-2 key names
def _gpt2_names(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """GPT2Config / GPTBigCodeConfig / GPTJConfig: n_embd, n_layer, n_head, n_inner (4h when
    null), LayerNorm with bias, a two-matrix GELU MLP."""
    h = need(cfg, "n_embd")
    return dict(
        vocab_size=need(cfg, "vocab_size"),
        hidden=h,
        layers=need(cfg, "n_layer", maximum=MAX_LAYERS),
        heads=need(cfg, "n_head"),
        ffn_hidden=opt(cfg, "n_inner") or 4 * h,
        ffn_kind="gelu",
        norm="layernorm",
        max_positions=need(cfg, "n_positions"),
        tied_embeddings=flag(cfg, "tie_word_embeddings", True),
    )


def _gpt2(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """GPT2Model (GPT2Attention's c_attn/c_proj and GPT2MLP with biases, learned positions) and
    GPTBigCodeModel (the same, multi-query: c_attn of h + 2·head_dim when ``multi_query``)."""
    out = _gpt2_names(cfg, mtype)
    out.update(bias=True, position="learned", dropout=hf_dropout(cfg, 0.1))
    if mtype == "gpt_bigcode" and flag(cfg, "multi_query", True):
        out["kv_heads"] = 1
    return out


def _gptj(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """GPTJBlock: one LayerNorm ``ln_1`` feeding attention and MLP in parallel; q/k/v/out
    without bias, ``fc_in``/``fc_out`` with bias, rotary (``rotary_dim``: no parameters), an
    LM head with bias (GPTJForCausalLM)."""
    out = _gpt2_names(cfg, mtype)
    out.update(
        position="rotary",
        mlp_bias=True,
        lm_head_bias=True,
        parallel_block=True,
        norms_per_layer=1,
        tied_embeddings=flag(cfg, "tie_word_embeddings", False),
        dropout=hf_dropout(cfg, 0.0),
    )
    return out


# ---------------------------------------------------------------------------- Falcon, MPT, BLOOM
def _falcon(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """FalconDecoderLayer / FalconAttention: a fused QKV of (heads + 2·kv) · head_dim, with
    ``num_kv_heads`` under ``new_decoder_architecture``, one K/V head with ``multi_query``, else
    all heads; ``bias`` on every linear; LayerNorm with bias; a parallel block with one norm, or
    two (``num_ln_in_parallel_attn``, 2 by default with the new architecture); sequential with
    two norms when ``parallel_attn`` is false; ALiBi or rotary (``alibi``), no position table."""
    heads = need(cfg, "num_attention_heads")
    h = need(cfg, "hidden_size")
    if flag(cfg, "new_decoder_architecture", False):
        kv = opt(cfg, "num_kv_heads") or heads
    elif flag(cfg, "multi_query", True):
        kv = 1
    else:
        kv = heads
    parallel = flag(cfg, "parallel_attn", True)
    lns = opt(cfg, "num_ln_in_parallel_attn")
    if not lns:
        lns = 2 if flag(cfg, "new_decoder_architecture", False) else 1
    if parallel and lns not in (1, 2):
        raise ValueError(f"{key('num_ln_in_parallel_attn')}={lns}: Transformers builds 1 or 2")
    return dict(
        vocab_size=need(cfg, "vocab_size"),
        hidden=h,
        layers=need(cfg, "num_hidden_layers", maximum=MAX_LAYERS),
        heads=heads,
        kv_heads=kv,
        ffn_hidden=opt(cfg, "ffn_hidden_size") or 4 * h,
        ffn_kind="gelu",
        bias=flag(cfg, "bias", False),
        norm="layernorm",
        parallel_block=parallel,
        norms_per_layer=(lns if parallel else 2),
        position="alibi" if flag(cfg, "alibi", False) else "rotary",
        max_positions=opt(cfg, "max_position_embeddings") or 2048,
        tied_embeddings=flag(cfg, "tie_word_embeddings", True),
        dropout=hf_dropout(cfg, 0.0),
    )


def _mpt(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """MptBlock as Transformers 5.23 builds it: Wqkv (3h) and out_proj without bias, an MLP of
    4h (``up_proj``/``down_proj``, no bias), LayerNorms without bias, ALiBi (no position table).
    Keys Transformers ignores but the checkpoint would not: refused by name."""
    attn = cfg.get("attn_config") or {}
    if not isinstance(attn, dict):
        raise ValueError(f"{key('attn_config')} must be a JSON object")
    if attn.get("attn_type", "multihead_attention") != "multihead_attention":
        raise ValueError(
            f"{key('attn_config')}['attn_type']={attn['attn_type']!r:.40}: Transformers' "
            "MptAttention builds multi-head attention only"
        )
    if attn.get("qk_ln"):
        raise ValueError(f"{key('attn_config')}['qk_ln']=true: MptAttention has no q/k norms")
    if not attn.get("alibi", True):
        raise ValueError(f"{key('attn_config')}['alibi']=false: MptModel always uses ALiBi")
    if cfg.get("expansion_ratio", 4) != 4:
        raise ValueError(
            f"{key('expansion_ratio')}={cfg['expansion_ratio']!r:.20}: Transformers' MptMLP "
            "is 4·d_model wide whatever the ratio"
        )
    if not flag(cfg, "no_bias", True):
        raise ValueError(f"{key('no_bias')}=false: Transformers' MptBlock has no biases")
    h = need(cfg, "d_model")
    return dict(
        vocab_size=need(cfg, "vocab_size"),
        hidden=h,
        layers=need(cfg, "n_layers", maximum=MAX_LAYERS),
        heads=need(cfg, "n_heads"),
        ffn_hidden=4 * h,
        ffn_kind="gelu",
        norm="layernorm",
        norm_bias=False,
        position="alibi",
        max_positions=need(cfg, "max_seq_len"),
        tied_embeddings=flag(cfg, "tie_word_embeddings", True),
        dropout=hf_dropout(cfg, 0.0),
    )


def _bloom(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """BloomModel: a LayerNorm after the word embeddings, fused QKV and dense with biases, an
    MLP of 4h with biases, LayerNorms with bias, ALiBi. ``n_embed`` is the older name of
    ``hidden_size`` (BloomConfig.__post_init__)."""
    if flag(cfg, "apply_residual_connection_post_layernorm", False):
        raise ValueError(
            f"{key('apply_residual_connection_post_layernorm')}=true is not modelled by parmem"
        )
    h = need(cfg, "n_embed", "hidden_size")
    return dict(
        vocab_size=need(cfg, "vocab_size"),
        hidden=h,
        layers=need(cfg, "n_layer", maximum=MAX_LAYERS),
        heads=need(cfg, "n_head"),
        ffn_hidden=4 * h,
        ffn_kind="gelu",
        bias=True,
        norm="layernorm",
        embedding_norm=True,
        position="alibi",
        max_positions=opt(cfg, "seq_length") or 2048,
        tied_embeddings=flag(cfg, "tie_word_embeddings", True),
        dropout=hf_dropout(cfg, 0.0),
    )


# ---------------------------------------------------------------------------- Llama key names
#: families with a ``sliding_window`` and no layer_types of their own: every layer is local
#: when it is set (transformers.cache_utils.get_layer_types_and_kwargs)
_ALL_LOCAL = {"mistral", "mixtral", "starcoder2", "phi3", "phimoe", "ministral"}
#: families whose configuration class has no window at all
_WINDOWED = _ALL_LOCAL | {
    "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "olmo3", "cohere2",
    "gpt_oss", "exaone4", "smollm3", "llama4_text",
}  # fmt: skip


def _llama_family(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """A family with the Llama key names: the shared fields, then the family's own structure
    and boolean keys (``data/hf_families.toml``), MLA, experts and the attention windows."""
    heads = need(cfg, "num_attention_heads")
    out: dict[str, Any] = dict(
        vocab_size=need(cfg, "vocab_size"),
        hidden=need(cfg, "hidden_size"),
        layers=need(cfg, "num_hidden_layers", maximum=MAX_LAYERS),
        heads=heads,
        kv_heads=opt(cfg, "num_key_value_heads") or heads,
        head_dim=opt(cfg, "head_dim"),
        ffn_hidden=need(cfg, "intermediate_size"),
        ffn_kind="swiglu",  # gated: SwiGLU, or Gemma's GeGLU (the same three matrices)
        norm="rmsnorm",
        tied_embeddings=flag(cfg, "tie_word_embeddings", False),
        position="rotary",
        max_positions=opt(cfg, "max_position_embeddings") or 2048,
        dropout=hf_dropout(cfg, 0.0),
    )
    entry = _table()[mtype]
    out.update(entry.get("structure", {}))
    for k, field in entry.get("keys", {}).items():  # config booleans (data/hf_families.toml)
        out[field] = flag(cfg, k, False)
    out.update(_family_keys(cfg, mtype))
    if cfg.get("kv_lora_rank") and not mtype.startswith("deepseek"):
        raise ValueError(
            f"{key('kv_lora_rank')} (latent attention) with model_type={mtype!r:.40}: parmem "
            "reads MLA from deepseek_v2 / deepseek_v3 configs only"
        )
    if mtype.startswith("deepseek"):
        out.update(_deepseek(cfg, out))
    else:
        out.update(_hf_experts(cfg, mtype, out["layers"]))
    out.update(_window(cfg, mtype, out["layers"]))
    return out


def _family_keys(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """The keys one family reads beyond the booleans of its ``keys`` table (its
    modeling_*.py): gpt-oss's biases, Llama 4's dense width, Gemma's soft-capping, the routers'
    ``norm_topk_prob``; and the refusals."""
    out: dict[str, Any] = {}
    if mtype == "gpt_neox":  # GPTNeoXAttention: head_size = h / a, no GQA, whatever else is set
        out.update(kv_heads=need(cfg, "num_attention_heads"), head_dim=0)
    if mtype == "gpt_oss" and not flag(cfg, "attention_bias", True):
        raise ValueError(
            f"{key('attention_bias')}=false with gpt-oss: parmem models its expert biases "
            "together with the attention biases"
        )
    if mtype.startswith("llama4"):
        out["ffn_hidden"] = opt(cfg, "intermediate_size_mlp") or need(cfg, "intermediate_size")
    if mtype.startswith("deepseek") and flag(cfg, "mlp_bias", False):
        raise ValueError(f"{key('mlp_bias')}=true with DeepSeek is not modelled by parmem")
    if mtype == "gemma3_text" and flag(cfg, "use_bidirectional_attention", False):
        raise ValueError(f"{key('use_bidirectional_attention')}=true is not a causal decoder")
    for k, field in (("attn_logit_softcapping", "attn_softcap"),
                     ("final_logit_softcapping", "logit_softcap")):  # fmt: skip
        if mtype.startswith("gemma") and cfg.get(k) is not None:
            out[field] = number(key(k), cfg[k], 0.0, 1e6)
    if cfg.get("norm_topk_prob") is not None:
        out["norm_topk_prob"] = flag(cfg, "norm_topk_prob", True)
    theta = _rope_theta(cfg)
    if theta is not None:
        out["rope_theta"] = theta
    return out


def _rope_theta(cfg: dict[str, Any]) -> float | None:
    """The rotary base: ``rope_theta``, or Transformers 5's ``rope_parameters["rope_theta"]``
    (for Gemma 3, whose local layers have their own base, the global layers' ``full_attention``
    entry); ``None`` when the config states none."""
    if cfg.get("rope_theta") is not None:
        return number(key("rope_theta"), cfg["rope_theta"], 1.0, 1e12)
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):
        if isinstance(params.get("full_attention"), dict):
            params = params["full_attention"]
        if params.get("rope_theta") is not None:
            return number(key("rope_parameters"), params["rope_theta"], 1.0, 1e12)
    return None


def _deepseek(cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V2/V3 (DeepseekV3Attention, DeepseekV3MoE, DeepseekV3DecoderLayer): MLA widths,
    ``head_dim`` = qk_nope_head_dim + qk_rope_head_dim, every head its own K and V, experts from
    layer ``first_k_dense_replace`` on, ``n_shared_experts`` of ``moe_intermediate_size``, and
    ``num_nextn_predict_layers`` MTP modules (not built by Transformers)."""
    if flag(cfg, "attention_bias", False):
        raise ValueError(f"{key('attention_bias')}=true with MLA is not modelled by parmem")
    freq = cfg.get("moe_layer_freq", 1)
    if freq != 1:
        raise ValueError(f"{key('moe_layer_freq')}={freq!r}: parmem models moe_layer_freq = 1")
    rope = need(cfg, "qk_rope_head_dim")
    out: dict[str, Any] = dict(
        q_lora_rank=opt(cfg, "q_lora_rank"),
        kv_lora_rank=need(cfg, "kv_lora_rank"),
        qk_rope_head_dim=rope,
        head_dim=need(cfg, "qk_nope_head_dim") + rope,
        v_head_dim=need(cfg, "v_head_dim"),
        kv_heads=base["heads"],
        mtp_layers=opt(cfg, "num_nextn_predict_layers"),
    )
    experts = opt(cfg, "n_routed_experts")
    if experts:
        out.update(
            num_experts=experts,
            top_k=need(cfg, "num_experts_per_tok"),
            expert_ffn_hidden=need(cfg, "moe_intermediate_size"),
            shared_experts=opt(cfg, "n_shared_experts"),
            first_dense_layers=opt(cfg, "first_k_dense_replace"),
        )
    return out


def _pattern(flags: list[bool], k: str) -> int:
    """The n with flag i == ((i+1) % n == 0) for every layer i (0: no layer flagged)."""
    if not any(flags):
        return 0
    for n in range(1, len(flags) + 1):
        if all(f == ((i + 1) % n == 0) for i, f in enumerate(flags)):
            return n
    raise ValueError(
        f"{key(k)} is a layer pattern parmem cannot read: it models every n-th layer "
        "(layer i with (i+1) % n == 0) as the odd one out"
    )


def _every(n: int, layers: int, local: str = "sliding_attention") -> list[str]:
    return [FULL if (i + 1) % n == 0 else local for i in range(layers)]


def _layer_types(cfg: dict[str, Any], mtype: str, layers: int) -> list[str] | None:
    """``layer_types`` as given, or as the family's configuration class builds it (Gemma 2 and
    gpt-oss: every 2nd layer global; Gemma 3: every ``sliding_window_pattern``-th; Cohere 2 and
    EXAONE 4: every ``sliding_window_pattern``-th (4); OLMo 3: every 4th; Qwen2/3: local from
    ``max_window_layers`` on; Qwen2-MoE: odd layers below it; SmolLM3: the NoPE layers; Llama 4:
    chunked but the NoPE layers), or every layer local for a family with a window and no
    layer_types (Mistral, Mixtral, StarCoder2, Phi-3, Phi-MoE)."""
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ValueError(f"{key('layer_types')} must list one entry per layer ({layers})")
        return types
    window = cfg.get("sliding_window")
    if mtype.startswith("llama4"):
        if not cfg.get("attention_chunk_size"):
            return None
        return _every(opt(cfg, "no_rope_layer_interval") or 4, layers, "chunked_attention")
    if mtype.startswith("qwen") or mtype == "smollm3":
        return _qwen_types(cfg, mtype, layers)
    if window is None:
        return None
    if mtype in _ALL_LOCAL:
        return ["sliding_attention"] * layers
    n = {"gemma2": 2, "gpt_oss": 2, "olmo3": 4}.get(mtype, 0)
    if mtype in ("gemma3_text", "cohere2", "exaone4"):
        p = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern"))
        p = 6 if p is None and mtype == "gemma3_text" else 4 if p is None else p
        if isinstance(p, str):
            raise ValueError(f"{key('sliding_window_pattern')}={p!r:.20}: give layer_types")
        n = integer(key("sliding_window_pattern"), p, 1, MAX_LAYERS)
    return _every(n, layers) if n else None


def _qwen_types(cfg: dict[str, Any], mtype: str, layers: int) -> list[str] | None:
    """Qwen2Config, Qwen3Config, Qwen2MoeConfig and SmolLM3Config's layer_types."""
    window = cfg.get("sliding_window")
    if not flag(cfg, "use_sliding_window", False) or window is None:
        return None
    if mtype == "qwen3_moe":
        raise ValueError(f"{key('use_sliding_window')}=true with Qwen3-MoE is not modelled")
    if mtype == "smollm3":
        every = opt(cfg, "no_rope_layer_interval") or 4
        rope = cfg.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(layers)]
        return ["full_attention" if r else "sliding_attention" for r in rope]
    top = opt(cfg, "max_window_layers")
    if mtype == "qwen2_moe":
        return ["sliding_attention" if (i + 1) % 2 and i < top else FULL for i in range(layers)]
    return ["sliding_attention" if i >= top else FULL for i in range(layers)]


def _window(cfg: dict[str, Any], mtype: str, layers: int) -> dict[str, int]:
    """``sliding_window`` and ``global_every`` from the layer types (full_attention,
    sliding_attention, chunked_attention; Llama 4's chunks bound the cache like a window of
    ``attention_chunk_size``), as Transformers' DynamicCache keeps them."""
    if mtype not in _WINDOWED:
        for k in ("sliding_window", "layer_types", "attention_chunk_size"):
            if cfg.get(k) is not None:
                raise ValueError(
                    f"{key(k)}={cfg[k]!r:.40}: model_type={mtype!r} has no attention window "
                    "in Transformers 5.23, but its DynamicCache would keep one"
                )
        return {}
    types = _layer_types(cfg, mtype, layers)
    kinds = set()
    for i, t in enumerate(types or ()):
        if not isinstance(t, str) or (t != FULL and t not in LOCAL):
            raise ValueError(
                f"{key('layer_types')}[{i}]={t!r:.40}: parmem models full_attention, "
                "sliding_attention and chunked_attention layers"
            )
        if t in LOCAL:
            kinds.add(t)
    if not kinds or types is None:
        return {}
    if len(kinds) > 1:
        raise ValueError(f"{key('layer_types')} mixes {sorted(kinds)}: parmem models one window")
    return {
        "sliding_window": need(cfg, LOCAL[kinds.pop()]),
        "global_every": _pattern([t == FULL for t in types], "layer_types"),
    }


def _moe_layers(cfg: dict[str, Any], mtype: str, layers: int) -> dict[str, int]:
    """Which layers have experts: Qwen-MoE's ``decoder_sparse_step`` and ``mlp_only_layers`` (a
    prefix of dense layers), Llama 4's ``interleave_moe_layer_step`` (or ``moe_layers``)."""
    if mtype.startswith("llama4"):
        every = opt(cfg, "interleave_moe_layer_step") or 1
        listed = cfg.get("moe_layers")
        if listed is not None:
            if not isinstance(listed, list):
                raise ValueError(f"{key('moe_layers')} must be a list of layer indices")
            flags = [i in listed for i in range(layers)]
            every = 1 if all(flags) else _pattern(flags, "moe_layers")
        return {"moe_every": every}
    if not mtype.startswith("qwen"):
        return {}
    every = opt(cfg, "decoder_sparse_step") or 1
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or dense != list(range(len(dense))):
        raise ValueError(
            f"{key('mlp_only_layers')}={dense!r:.60}: parmem models a prefix of dense layers "
            "(0, 1, ..., k-1)"
        )
    return {"moe_every": every, "first_dense_layers": len(dense)}


def _hf_experts(cfg: dict[str, Any], mtype: str, layers: int) -> dict[str, Any]:
    """The mixture-of-experts fields of a Mixtral / Phi-MoE / Granite-MoE / Qwen-MoE / gpt-oss /
    Llama 4 config (none for a dense one); routers without bias but gpt-oss's."""
    if mtype not in ("mixtral", "phimoe", "granitemoe", "qwen2_moe", "qwen3_moe", "gpt_oss",
                     "llama4_text"):  # fmt: skip
        return {}
    experts = opt(cfg, "num_local_experts") or opt(cfg, "num_experts")
    if not experts:
        return {}
    width = opt(cfg, "moe_intermediate_size") or need(cfg, "intermediate_size")
    out: dict[str, Any] = dict(
        num_experts=experts, top_k=need(cfg, "num_experts_per_tok"), expert_ffn_hidden=width
    )
    out.update(_moe_layers(cfg, mtype, layers))
    if mtype.startswith("llama4"):
        out["shared_experts"] = 1  # Llama4TextMoe.shared_expert, of intermediate_size
    shared = opt(cfg, "shared_expert_intermediate_size") if mtype == "qwen2_moe" else 0
    if shared:
        # Qwen2MoeSparseMoeBlock: one shared expert of its own width and a sigmoid gate (h -> 1)
        if shared % width:
            raise ValueError(
                f"{key('shared_expert_intermediate_size')}={shared} must be a multiple of "
                f"moe_intermediate_size={width} for parmem's shared-expert model"
            )
        out.update(shared_experts=shared // width, shared_expert_gate=True)
    return out


_READERS = {
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt2,
    "gptj": _gptj,
    "falcon": _falcon,
    "mpt": _mpt,
    "bloom": _bloom,
}
