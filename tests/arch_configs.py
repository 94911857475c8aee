"""Models of Transformers for the 2025-26 architectures (issue 20), for the tests of
parmem.hfconfig, parmem.table and parmem.kvcache: each family's default config, the new presets
written as their family's Hugging Face config, and the models built from them on the meta device
(no memory, no download), with their parameter counts.

Expected parameter counts come from Transformers itself (``sum(p.numel())``, tied weights once).
Active parameters are derived here from that model: every routed-expert tensor (leading
dimension E, under ``.experts.``) counts top_k/E.
"""

from __future__ import annotations

import torch
import transformers

from parmem import ModelSpec

T = transformers

#: Transformers' own default config of each family (the model_type dispatch of parmem.hfconfig)
DEFAULTS = {
    "deepseek_v3": T.DeepseekV3Config,
    "qwen3": T.Qwen3Config,
    "qwen3_moe": T.Qwen3MoeConfig,
    "qwen2_moe": T.Qwen2MoeConfig,
    "gemma2": T.Gemma2Config,
    "gemma3_text": T.Gemma3TextConfig,
    "gpt_oss": T.GptOssConfig,
    "llama4_text": T.Llama4TextConfig,
}

_BUILT: dict[str, tuple[int, int]] = {}

_MODELS: dict[str, object] = {}

def hf_model(cfg):
    """Transformers' model for ``cfg`` on the meta device (built once per config)."""
    key = cfg.to_json_string()
    if key not in _MODELS:
        with torch.device("meta"):
            _MODELS[key] = T.AutoModelForCausalLM.from_config(cfg)
    return _MODELS[key]

def hf_counts(cfg) -> tuple[int, int]:
    """(total, active) parameters of Transformers' model for ``cfg``, built on the meta device.
    Active: each routed-expert tensor (name under ``.experts.``, leading dimension E) counts
    top_k / E of its elements; everything else (shared experts, routers, dense layers) counts
    whole. Tied weights are counted once (``parameters()`` deduplicates them)."""
    key = cfg.to_json_string()
    if key not in _BUILT:
        model = hf_model(cfg)
        total = sum(p.numel() for p in model.parameters())
        E = getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_local_experts", None) \
            or getattr(cfg, "num_experts", None) or 0
        routed = sum(p.numel() for n, p in model.named_parameters()
                     if ".experts." in n and E and p.shape[0] == E)
        k = getattr(cfg, "num_experts_per_tok", 0) or 0
        _BUILT[key] = (total, total - routed + (routed // E * k if E else 0))
    return _BUILT[key]

# ------------------------------------------------------------------------ presets as HF configs
def layer_pattern(layers: int, every: int, local: str) -> list[str]:
    return ["full_attention" if (i + 1) % every == 0 else local for i in range(layers)]

def preset_config(s: ModelSpec):
    """The preset's fields written as its family's Hugging Face config (key names of
    Transformers 5.23's configuration_*.py), independently of parmem.hfconfig."""
    common = dict(vocab_size=s.vocab_size, hidden_size=s.hidden, num_hidden_layers=s.layers,
                  num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                  max_position_embeddings=s.max_positions,
                  tie_word_embeddings=s.tied_embeddings)
    if s.name == "deepseek-v3":
        return T.DeepseekV3Config(
            **common, intermediate_size=s.ffn_hidden, moe_intermediate_size=s.expert_ffn_hidden,
            n_routed_experts=s.num_experts, n_shared_experts=s.shared_experts,
            num_experts_per_tok=s.top_k, q_lora_rank=s.q_lora_rank, kv_lora_rank=s.kv_lora_rank,
            qk_nope_head_dim=s.head_dim - s.qk_rope_head_dim, qk_rope_head_dim=s.qk_rope_head_dim,
            v_head_dim=s.v_head_dim, first_k_dense_replace=s.first_dense_layers,
            num_nextn_predict_layers=s.mtp_layers)
    common.update(head_dim=s.head_dim)
    if s.name == "qwen3-32b":
        return T.Qwen3Config(**common, intermediate_size=s.ffn_hidden)
    if s.name == "qwen3-235b-a22b":
        return T.Qwen3MoeConfig(**common, intermediate_size=s.ffn_hidden,
                                moe_intermediate_size=s.expert_ffn_hidden,
                                num_experts=s.num_experts, num_experts_per_tok=s.top_k)
    if s.name == "gemma-3-27b":
        return T.Gemma3TextConfig(**common, intermediate_size=s.ffn_hidden,
                                  sliding_window=s.sliding_window,
                                  layer_types=layer_pattern(s.layers, 6, "sliding_attention"))
    if s.name == "gpt-oss-120b":
        return T.GptOssConfig(**common, intermediate_size=s.expert_ffn_hidden,
                              num_local_experts=s.num_experts, num_experts_per_tok=s.top_k,
                              sliding_window=s.sliding_window,
                              layer_types=layer_pattern(s.layers, 2, "sliding_attention"))
    assert s.name.startswith("llama-4")
    return T.Llama4TextConfig(**common, intermediate_size=s.expert_ffn_hidden,
                              intermediate_size_mlp=s.ffn_hidden, num_local_experts=s.num_experts,
                              num_experts_per_tok=s.top_k, interleave_moe_layer_step=s.moe_every,
                              attention_chunk_size=s.sliding_window)

NEW_PRESETS = ["deepseek-v3", "qwen3-32b", "qwen3-235b-a22b", "gemma-3-27b", "gpt-oss-120b",
               "llama-4-scout", "llama-4-maverick"]
