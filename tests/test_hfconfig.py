"""parmem.hfconfig: each family's config.json read by model_type (DeepSeek-V3, Qwen3, Qwen3-MoE,
Qwen2-MoE, Gemma 2/3, gpt-oss, Llama 4): Transformers' default config of each family gives the
parameter count (total and active) Transformers' own model has; features parmem does not model
raise ValueError naming the key."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from arch_configs import DEFAULTS, T, hf_counts  # noqa: E402

from parmem import ModelSpec  # noqa: E402


@pytest.mark.parametrize("family", sorted(DEFAULTS))
def test_default_config_counts_equal_transformers(family):
    cfg = DEFAULTS[family]()
    total, active = hf_counts(cfg)
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    assert spec.num_params() == total
    assert spec.num_params(active=True) == active


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("change,msg", [
    ({"layer_types": ["full_attention"] * 25 + ["linear_attention"]}, r"layer_types'\]\[25\]"),
    ({"layer_types": ["sliding_attention"] * 10 + ["full_attention"] * 16}, "layer_types"),
    ({"layer_types": ["full_attention"] * 3}, "one entry per layer"),
])
def test_unreadable_layer_types_raise(change, msg):
    cfg = {**T.Gemma3TextConfig().to_dict(), **change}
    with pytest.raises(ValueError, match=msg):
        ModelSpec.from_hf_config(cfg)


def test_unmodelled_features_raise():
    with pytest.raises(ValueError, match="mlp_only_layers"):
        ModelSpec.from_hf_config({**T.Qwen3MoeConfig().to_dict(), "mlp_only_layers": [3, 7]})
    with pytest.raises(ValueError, match="attention_bias"):
        ModelSpec.from_hf_config({**T.DeepseekV3Config().to_dict(), "attention_bias": True})
    with pytest.raises(ValueError, match="moe_layers"):
        ModelSpec.from_hf_config({**T.Llama4TextConfig().to_dict(), "moe_layers": [0, 5, 6]})
    base = dict(name="x", vocab_size=100, hidden=64, layers=4, heads=4)
    with pytest.raises(ValueError, match="global_every=2 needs sliding_window"):
        ModelSpec(**base, global_every=2)
    with pytest.raises(ValueError, match="kv_heads=2 must equal heads=4"):
        ModelSpec(**base, kv_heads=2, kv_lora_rank=8, qk_rope_head_dim=4, v_head_dim=8)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        ModelSpec(**base, kv_lora_rank=8, v_head_dim=8)
    with pytest.raises(ValueError, match="leave no MoE layer"):
        ModelSpec(**base, num_experts=4, top_k=1, first_dense_layers=3, moe_every=3)


@pytest.mark.parametrize("outer,inner", [(T.Gemma3Config, T.Gemma3TextConfig),
                                         (T.Llama4Config, T.Llama4TextConfig)])
def test_multimodal_configs_read_their_text_config(outer, inner):
    """gemma3 and llama4 configs nest the language model under text_config; parmem counts that
    model (the vision tower is left out, and the source says so)."""
    spec = ModelSpec.from_hf_config(outer().to_dict())
    assert spec.num_params() == hf_counts(inner())[0]
    assert "vision tower is not counted" in spec.source


def test_mla_keys_outside_deepseek_raise():
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ModelSpec.from_hf_config({**T.LlamaConfig().to_dict(), "kv_lora_rank": 512})


def test_the_rotary_base_is_read_from_either_spelling():
    """config.json's rope_theta (Transformers 4), or rope_parameters["rope_theta"] (Transformers
    5; Gemma 3 nests the global layers' under full_attention); 10,000 when neither is given."""
    base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 128}
    assert ModelSpec.from_hf_config(base).rope_theta == 10000
    assert ModelSpec.from_hf_config({**base, "rope_theta": 500000.0}).rope_theta == 500000
    v5 = {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert ModelSpec.from_hf_config(v5).rope_theta == 1e6
    nested = {**base, "rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                          "sliding_attention": {"rope_theta": 1e4}}}
    assert ModelSpec.from_hf_config(nested).rope_theta == 1e6
    with pytest.raises(ValueError, match="rope_theta"):
        ModelSpec.from_hf_config({**base, "rope_theta": -1})
