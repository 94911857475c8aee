"""Reading a Hugging Face ``config.json`` into :class:`~parmem.model.ModelSpec` fields.

Each family's own key names, dispatched on ``model_type``: GPT-2; the Llama key names (Llama,
Mistral, Mixtral, Qwen2); Qwen2-MoE and Qwen3(-MoE) (q/k norms, many small experts, a gated
shared expert); DeepSeek-V2/V3 (multi-head latent attention, dense-first layers, shared experts,
MTP modules); Gemma 2/3 (sliding-window layers between global ones, four norms per layer);
gpt-oss (alternating sliding windows, attention sinks, biases); Llama 4 (chunked-attention
layers, interleaved MoE layers, a shared expert). Multimodal configs (``gemma3``, ``llama4``)
are read through their ``text_config``: the language model only.

A feature parmem does not model (an unknown ``layer_types`` entry, a layer pattern it cannot
read, MLA with biases) raises ``ValueError`` naming the key, never a silently wrong count. The
key names are Transformers 5.23's (``configuration_*.py`` of each family). Standard library only.
"""

from __future__ import annotations

from typing import Any

from ._check import MAX_LAYERS, MAX_WIDTH, boolean, integer, number

__all__ = ["spec_fields", "FAMILIES"]

#: the model_type values with their own reader (any other takes the Llama key names)
FAMILIES = (
    "gpt2",
    "deepseek_v2",
    "deepseek_v3",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gpt_oss",
    "llama4",
    "llama4_text",
)
#: layer_types entries: full attention, and the local kinds with the key of their window
_FULL = "full_attention"
_LOCAL = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}


def _key(key: str) -> str:
    """How a message names a config.json key: ``config['hidden_size']``."""
    return f"config[{key!r}]"


def _need(cfg: dict[str, Any], *keys: str, maximum: int = MAX_WIDTH) -> int:
    """The first of ``keys`` that is set (not null), as an integer >= 1."""
    for k in keys:
        if cfg.get(k) is not None:
            return integer(_key(k), cfg[k], 1, maximum)
    raise ValueError(f"config: missing {keys[0]!r} (model_type={cfg.get('model_type')!r:.40})")


#: Hugging Face config keys that hold a dropout probability (GPT-2: resid/embd/attn_pdrop; Llama,
#: Mistral, Mixtral, Qwen: attention_dropout; others: hidden_dropout …).
_HF_DROPOUT_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)


def _hf_dropout(cfg: dict[str, Any], default: float) -> float:
    """The largest dropout probability a config states; ``default`` (the family's Hugging Face
    default: 0.1 for GPT-2, 0.0 for the Llama key names) when it states none."""
    found = [number(_key(k), cfg[k], 0.0, 1.0) for k in _HF_DROPOUT_KEYS if cfg.get(k) is not None]
    return max(found) if found else default


def _opt(cfg: dict[str, Any], key: str) -> int:
    """``key`` as an integer >= 0, 0 when it is missing or null (0: "take the usual value")."""
    value = cfg.get(key)
    return 0 if value is None else integer(_key(key), value, 0, MAX_WIDTH)


def _flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    """``key`` as a JSON boolean (``"false"`` is refused, not read as true); ``default`` when it
    is missing or null."""
    value = cfg.get(key)
    return default if value is None else boolean(_key(key), value)


def _model_type(cfg: dict[str, Any]) -> str:
    mtype = cfg.get("model_type", "")
    if not isinstance(mtype, str):
        raise ValueError(f"{_key('model_type')} must be a string, got {type(mtype).__name__}")
    return mtype.lower()


def spec_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """Map a Hugging Face config dict onto ModelSpec fields, each value checked under its key."""
    mtype = _model_type(cfg)
    if mtype in ("gemma3", "llama4") and "text_config" in cfg:
        text = cfg["text_config"]
        if not isinstance(text, dict):
            raise ValueError(f"{_key('text_config')} must be a JSON object")
        sub = {"tie_word_embeddings": cfg.get("tie_word_embeddings"), **text}
        sub["model_type"] = sub.get("model_type") or f"{mtype}_text"
        out = spec_fields(sub)
        out["source"] += f" (text_config of model_type={mtype}; the vision tower is not counted)"
        return out
    if mtype == "gpt2" or "n_embd" in cfg:
        return _gpt2(cfg, mtype)
    out = _llama_names(cfg, mtype)
    if cfg.get("kv_lora_rank") and not mtype.startswith("deepseek"):
        raise ValueError(
            f"{_key('kv_lora_rank')} (latent attention) with model_type={mtype!r:.40}: parmem "
            "reads MLA from deepseek_v2 / deepseek_v3 configs only"
        )
    if mtype.startswith("deepseek"):
        out.update(_deepseek(cfg, out))
    elif mtype.startswith("gemma"):
        out.update(_gemma(cfg, mtype))
    elif mtype == "gpt_oss":
        # GptOssAttention: q/k/v/o with bias=True and sinks; GptOssTopKRouter has a bias;
        # GptOssExperts: gate_up_proj_bias and down_proj_bias
        out.update(bias=_flag(cfg, "attention_bias", True), qkv_bias=False, attention_sinks=True)
        out.update(router_bias=True)
    elif mtype.startswith("llama4"):
        out.update(ffn_hidden=_opt(cfg, "intermediate_size_mlp") or out["ffn_hidden"])
    out.update(_window(cfg, mtype, out["layers"]))
    if not mtype.startswith("deepseek"):
        out.update(_hf_experts(cfg, mtype, out["layers"]))
    return out


def _gpt2(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    h = _need(cfg, "n_embd")
    return dict(
        vocab_size=_need(cfg, "vocab_size"),
        hidden=h,
        layers=_need(cfg, "n_layer", maximum=MAX_LAYERS),
        heads=_need(cfg, "n_head"),
        ffn_hidden=_opt(cfg, "n_inner") or 4 * h,
        ffn_kind="gelu",
        bias=True,
        norm="layernorm",
        tied_embeddings=_flag(cfg, "tie_word_embeddings", True),
        position="learned",
        max_positions=_need(cfg, "n_positions", "n_ctx"),
        dropout=_hf_dropout(cfg, 0.1),
        source=f"Hugging Face config.json (model_type={mtype or 'gpt2'})",
    )


def _llama_names(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """The fields every Llama-style config names the same way."""
    hidden = _need(cfg, "hidden_size")
    heads = _need(cfg, "num_attention_heads")
    attention_bias = _flag(cfg, "attention_bias", False)
    return dict(
        vocab_size=_need(cfg, "vocab_size"),
        hidden=hidden,
        layers=_need(cfg, "num_hidden_layers", maximum=MAX_LAYERS),
        heads=heads,
        kv_heads=_opt(cfg, "num_key_value_heads") or heads,
        head_dim=_opt(cfg, "head_dim"),
        ffn_hidden=_need(cfg, "intermediate_size"),
        ffn_kind="swiglu",  # gated: SwiGLU, or Gemma's GeGLU (the same three matrices)
        bias=_flag(cfg, "mlp_bias", False) and attention_bias,
        qkv_bias=mtype.startswith("qwen2") or attention_bias,
        norm="rmsnorm",
        # Qwen3Attention's and Gemma3Attention's q_norm and k_norm (RMSNorm of head_dim)
        qk_norm=mtype.startswith("qwen3") or mtype.startswith("gemma3"),
        tied_embeddings=_flag(cfg, "tie_word_embeddings", mtype.startswith("gemma")),
        position="rotary",
        max_positions=_opt(cfg, "max_position_embeddings") or 2048,
        dropout=_hf_dropout(cfg, 0.0),
        source=f"Hugging Face config.json (model_type={mtype or 'unknown'})",
    )


def _deepseek(cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V2/V3 (Transformers' DeepseekV3Attention, DeepseekV3MoE, DeepseekV3DecoderLayer):
    MLA widths, ``head_dim`` = qk_nope_head_dim + qk_rope_head_dim (the config's own
    ``head_dim`` is the rotary part), every head its own K and V, experts from layer
    ``first_k_dense_replace`` on, ``n_shared_experts`` of ``moe_intermediate_size``, and
    ``num_nextn_predict_layers`` MTP modules."""
    if _flag(cfg, "attention_bias", False):
        raise ValueError(f"{_key('attention_bias')}=true with MLA is not modelled by parmem")
    freq = cfg.get("moe_layer_freq", 1)
    if freq != 1:
        raise ValueError(f"{_key('moe_layer_freq')}={freq!r}: parmem models moe_layer_freq = 1")
    rope = _need(cfg, "qk_rope_head_dim")
    out: dict[str, Any] = dict(
        q_lora_rank=_opt(cfg, "q_lora_rank"),
        kv_lora_rank=_need(cfg, "kv_lora_rank"),
        qk_rope_head_dim=rope,
        head_dim=_need(cfg, "qk_nope_head_dim") + rope,
        v_head_dim=_need(cfg, "v_head_dim"),
        kv_heads=base["heads"],
        qkv_bias=False,
        mtp_layers=_opt(cfg, "num_nextn_predict_layers"),
    )
    experts = _opt(cfg, "n_routed_experts")
    if experts:
        width = _need(cfg, "moe_intermediate_size")
        out.update(
            num_experts=experts,
            top_k=_need(cfg, "num_experts_per_tok"),
            expert_ffn_hidden=width,
            shared_experts=_opt(cfg, "n_shared_experts"),
            first_dense_layers=_opt(cfg, "first_k_dense_replace"),
        )
    return out


def _gemma(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """Gemma 2/3 (Gemma2DecoderLayer: input, post-attention, pre- and post-feedforward
    RMSNorms). Gemma 1 has two norms and no window."""
    if mtype == "gemma":
        return {}
    return {"sandwich_norm": True}


def _pattern(flags: list[bool], key: str) -> int:
    """The n with flag i == ((i+1) % n == 0) for every layer i (0: no layer flagged)."""
    if not any(flags):
        return 0
    for n in range(1, len(flags) + 1):
        if all(f == ((i + 1) % n == 0) for i, f in enumerate(flags)):
            return n
    raise ValueError(
        f"{_key(key)} is a layer pattern parmem cannot read: it models every n-th layer "
        "(layer i with (i+1) % n == 0) as the odd one out"
    )


def _layer_types(cfg: dict[str, Any], mtype: str, layers: int) -> list[str] | None:
    """``layer_types`` as given, or as Transformers builds it for a family whose older
    config.json does not list it (Gemma 2: every 2nd layer global; Gemma 3: every
    ``sliding_window_pattern``-th; gpt-oss: every 2nd; Llama 4: the NoPE layers global)."""
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ValueError(f"{_key('layer_types')} must list one entry per layer ({layers})")
        return types
    every = 0
    if mtype == "gemma2" or mtype == "gpt_oss":
        every = 2
    elif mtype == "gemma3_text":
        every = _opt(cfg, "sliding_window_pattern") or _opt(cfg, "_sliding_window_pattern") or 6
    elif mtype == "llama4_text" and cfg.get("attention_chunk_size"):
        every = _opt(cfg, "no_rope_layer_interval") or 4
        return [
            "full_attention" if (i + 1) % every == 0 else "chunked_attention" for i in range(layers)
        ]
    if not every or not cfg.get("sliding_window"):
        return None
    return [
        "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)
    ]


def _window(cfg: dict[str, Any], mtype: str, layers: int) -> dict[str, int]:
    """``sliding_window`` and ``global_every`` from ``layer_types`` (full_attention,
    sliding_attention, chunked_attention; Llama 4's chunks bound the cache like a window of
    ``attention_chunk_size``). Other families' ``sliding_window`` keys are not read (Mistral
    v0.1's 4096 window is left out, as before)."""
    if mtype.startswith("qwen") and _flag(cfg, "use_sliding_window", False):
        if cfg.get("layer_types") is None:
            raise ValueError(
                f"{_key('use_sliding_window')}=true without layer_types is not modelled by parmem"
            )
    if not (mtype in FAMILIES or cfg.get("layer_types") is not None):
        return {}
    types = _layer_types(cfg, mtype, layers)
    if types is None:
        return {}
    kinds = set()
    for i, t in enumerate(types):
        if not isinstance(t, str):
            raise ValueError(
                f"{_key('layer_types')}[{i}]={t!r:.40} must be a name (full_attention, "
                "sliding_attention or chunked_attention)"
            )
        if t != _FULL and t not in _LOCAL:
            raise ValueError(
                f"{_key('layer_types')}[{i}]={t!r:.40}: parmem models full_attention, "
                "sliding_attention and chunked_attention layers"
            )
        if t in _LOCAL:
            kinds.add(t)
    if not kinds:
        return {}
    if len(kinds) > 1:
        raise ValueError(f"{_key('layer_types')} mixes {sorted(kinds)}: parmem models one window")
    window = _need(cfg, _LOCAL[kinds.pop()])
    return {
        "sliding_window": window,
        "global_every": _pattern([t == _FULL for t in types], "layer_types"),
    }


def _moe_layers(cfg: dict[str, Any], mtype: str, layers: int) -> dict[str, int]:
    """Which layers have experts: Qwen-MoE's ``decoder_sparse_step`` and ``mlp_only_layers`` (a
    prefix of dense layers), Llama 4's ``interleave_moe_layer_step`` (or ``moe_layers``)."""
    if mtype.startswith("llama4"):
        every = _opt(cfg, "interleave_moe_layer_step") or 1
        listed = cfg.get("moe_layers")
        if listed is not None:
            if not isinstance(listed, list):
                raise ValueError(f"{_key('moe_layers')} must be a list of layer indices")
            flags = [i in listed for i in range(layers)]
            every = 1 if all(flags) else _pattern(flags, "moe_layers")
        return {"moe_every": every}
    every = _opt(cfg, "decoder_sparse_step") or 1
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or dense != list(range(len(dense))):
        raise ValueError(
            f"{_key('mlp_only_layers')}={dense!r:.60}: parmem models a prefix of dense layers "
            "(0, 1, ..., k-1)"
        )
    return {"moe_every": every, "first_dense_layers": len(dense)}


def _hf_experts(cfg: dict[str, Any], mtype: str, layers: int) -> dict[str, Any]:
    """The mixture-of-experts fields of a Mixtral / Qwen-MoE / gpt-oss / Llama 4 config (none
    for a dense one)."""
    experts = _opt(cfg, "num_local_experts") or _opt(cfg, "num_experts")
    if not experts:
        return {}
    width = _opt(cfg, "moe_intermediate_size") or _need(cfg, "intermediate_size")
    out: dict[str, Any] = dict(
        num_experts=experts, top_k=_need(cfg, "num_experts_per_tok"), expert_ffn_hidden=width
    )
    out.update(_moe_layers(cfg, mtype, layers))
    if mtype.startswith("llama4"):
        out["shared_experts"] = 1  # Llama4TextMoe.shared_expert, of intermediate_size
    shared = _opt(cfg, "shared_expert_intermediate_size")
    if shared:
        # Qwen2-MoE: one shared expert of its own width and a sigmoid gate (shared_expert_gate,
        # Linear(h, 1)); counted as shared_experts of expert width, so we only support the case
        # where it is a multiple of that width.
        if shared % width:
            raise ValueError(
                "config: shared_expert_intermediate_size must be a multiple of "
                "moe_intermediate_size for parmem's shared-expert model"
            )
        out["shared_experts"] = shared // width
        out["shared_expert_gate"] = mtype.startswith("qwen2_moe")
    return out
