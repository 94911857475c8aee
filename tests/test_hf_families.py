"""Issue 28: every decoder family of Transformers 5.23 that parmem reads is exact, the others are
refused by name.

Expected parameter counts come from Transformers itself: the family's model built on the meta
device (``sum(p.numel())``, tied weights once; tests/arch_configs.py). Each family is checked
with (a) its configuration class's defaults, (b) options that change its tensors, and (c) the
published config.json of well-known checkpoints, written out here from their Hugging Face model
cards (a full-size model costs nothing on the meta device). The KV bytes per token are checked
against what Transformers' DynamicCache holds after a forward pass of a tiny model on the CPU.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from arch_configs import hf_model  # noqa: E402

from parmem import ModelSpec  # noqa: E402
from parmem.hfconfig import families, refused_families  # noqa: E402
from parmem.kvcache import kv_cache_bytes, kv_layer_tokens, layer_kv_values  # noqa: E402

T = transformers

#: the families read (model_type), without the multimodal wrappers
FAMILIES = [f for f in families() if f not in ("gemma3", "llama4")]

#: where the default config of the class cannot be built or counted, the smallest change
DEFAULT_FIX = {
    "ministral": {"head_dim": 128},  # MinistralConfig's head_dim=None breaks its own model
    "deepseek_v2": {"num_experts_per_tok": 6},  # None in DeepseekV2Config (the Lite model's 6)
}


def hf_total(cfg) -> int:
    return sum(p.numel() for p in hf_model(cfg).parameters())


def build(model_type: str, **kw):
    """Transformers' configuration of ``model_type`` from config.json-style keys."""
    return T.AutoConfig.for_model(model_type, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_default_config_of_every_family_is_exact(family):
    cfg = build(family, **DEFAULT_FIX.get(family, {}))
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    assert spec.family == family
    assert spec.num_params() == hf_total(cfg), family


def test_defaults_apply_where_a_config_omits_keys():
    """A config.json that states only model_type and the shapes gets the class defaults (the
    raw dict, not Transformers' to_dict(), is what parmem reads)."""
    for family in ("llama", "gemma2", "starcoder2", "falcon", "gptj", "cohere", "mpt", "bloom"):
        spec = ModelSpec.from_hf_config({"model_type": family, **DEFAULT_FIX.get(family, {})})
        assert spec.num_params() == hf_total(build(family, **DEFAULT_FIX.get(family, {}))), family


#: options that change a family's tensors (config keys of Transformers 5.23)
SMALL = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4)
OPTIONS = [
    ("llama", {**SMALL, "intermediate_size": 96, "attention_bias": True, "mlp_bias": True}),
    ("granite", {**SMALL, "intermediate_size": 96, "attention_bias": True, "mlp_bias": True}),
    ("starcoder2", {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2, "use_bias": False}),
    ("cohere", {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2, "use_qk_norm": True}),
    ("phi", {**SMALL, "intermediate_size": 96, "qk_layernorm": True}),
    ("gpt_neox", {**SMALL, "intermediate_size": 96, "use_parallel_residual": False,
                  "attention_bias": False, "num_key_value_heads": 2, "head_dim": 8}),
    ("gpt_bigcode", {"n_embd": 64, "n_layer": 2, "n_head": 4, "multi_query": False}),
    ("phimoe", {**SMALL, "num_key_value_heads": 2, "intermediate_size": 32, "lm_head_bias": True, "attention_bias": True}),
    ("glm", {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2, "head_dim": 16,
             "attention_bias": False, "pad_token_id": 0}),
    ("olmo2", {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2}),
    ("qwen2_moe", {**SMALL, "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 64, "num_experts": 4,
                   "num_experts_per_tok": 2, "mlp_only_layers": [0]}),
    ("falcon", {**SMALL, "new_decoder_architecture": True, "num_kv_heads": 2}),
    ("falcon", {**SMALL, "new_decoder_architecture": True, "num_kv_heads": 2,
                "num_ln_in_parallel_attn": 1}),
    ("falcon", {**SMALL, "alibi": True, "bias": True, "multi_query": False,
                "parallel_attn": False}),
    ("qwen2", {**SMALL, "num_key_value_heads": 2, "intermediate_size": 96, "use_sliding_window": True, "sliding_window": 8,
               "max_window_layers": 0}),
]  # fmt: skip


@pytest.mark.parametrize("family,keys", OPTIONS, ids=[f"{f}-{i}" for i, (f, _) in
                                                        enumerate(OPTIONS)])
def test_options_that_change_tensors_are_exact(family, keys):
    spec = ModelSpec.from_hf_config({"model_type": family, **keys})
    assert spec.num_params() == hf_total(build(family, **keys))


# ------------------------------------------------------------------ published config.json files
# From the Hugging Face model pages (config.json of each repository); rope_scaling tables and
# token ids are left out where they are long (they hold no parameters).
PUBLISHED = {
    "bigcode/starcoder2-7b": {
        "model_type": "starcoder2", "hidden_act": "gelu_pytorch_tanh", "hidden_size": 4608,
        "intermediate_size": 18432, "max_position_embeddings": 16384, "norm_epsilon": 1e-05,
        "num_attention_heads": 36, "num_hidden_layers": 32, "num_key_value_heads": 4,
        "rope_theta": 1000000, "sliding_window": 4096, "use_bias": True, "vocab_size": 49152,
        "attention_dropout": 0.1, "residual_dropout": 0.1, "embedding_dropout": 0.1,
    },
    "allenai/OLMo-2-1124-7B": {
        "model_type": "olmo2", "attention_bias": False, "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "rms_norm_eps": 1e-06, "rope_theta": 500000, "tie_word_embeddings": False,
        "vocab_size": 100352,
    },
    "CohereForAI/c4ai-command-r-v01": {
        "model_type": "cohere", "attention_bias": False, "hidden_act": "silu",
        "hidden_size": 8192, "intermediate_size": 22528, "layer_norm_eps": 1e-05,
        "logit_scale": 0.0625, "max_position_embeddings": 8192, "num_attention_heads": 64,
        "num_hidden_layers": 40, "num_key_value_heads": 64, "rope_theta": 8000000.0,
        "vocab_size": 256000,
    },
    "microsoft/Phi-3.5-MoE-instruct": {
        "model_type": "phimoe", "attention_bias": True, "hidden_size": 4096,
        "intermediate_size": 6400, "lm_head_bias": True, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 16, "rms_norm_eps": 1e-05,
        "sliding_window": 131072, "tie_word_embeddings": False, "vocab_size": 32064,
    },
    "tiiuae/falcon-7b": {
        "model_type": "falcon", "alibi": False, "apply_residual_connection_post_layernorm": False,
        "attention_dropout": 0.0, "bias": False, "hidden_dropout": 0.0, "hidden_size": 4544,
        "layer_norm_epsilon": 1e-05, "multi_query": True, "new_decoder_architecture": False,
        "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True,
        "vocab_size": 65024,
    },
    "tiiuae/falcon-40b": {
        "model_type": "falcon", "alibi": False, "bias": False, "hidden_size": 8192,
        "multi_query": True, "new_decoder_architecture": True, "num_attention_heads": 128,
        "num_hidden_layers": 60, "num_kv_heads": 8, "parallel_attn": True, "vocab_size": 65024,
    },
    "EleutherAI/gpt-j-6b": {
        "model_type": "gptj", "activation_function": "gelu_new", "n_embd": 4096, "n_head": 16,
        "n_inner": None, "n_layer": 28, "n_positions": 2048, "rotary_dim": 64,
        "tie_word_embeddings": False, "vocab_size": 50400,
    },
    "EleutherAI/gpt-neox-20b": {
        "model_type": "gpt_neox", "hidden_act": "gelu_fast", "hidden_size": 6144,
        "intermediate_size": 24576, "max_position_embeddings": 2048, "num_attention_heads": 64,
        "num_hidden_layers": 44, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "use_parallel_residual": True, "vocab_size": 50432,
    },
    "EleutherAI/pythia-6.9b": {
        "model_type": "gpt_neox", "hidden_act": "gelu", "hidden_size": 4096,
        "intermediate_size": 16384, "max_position_embeddings": 2048, "num_attention_heads": 32,
        "num_hidden_layers": 32, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "use_parallel_residual": True, "vocab_size": 50432,
    },
    "microsoft/phi-2": {
        "model_type": "phi", "hidden_act": "gelu_new", "hidden_size": 2560,
        "intermediate_size": 10240, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "partial_rotary_factor": 0.4, "qk_layernorm": False, "resid_pdrop": 0.1,
        "tie_word_embeddings": False, "vocab_size": 51200,
    },
    "ibm-granite/granite-3.0-8b-base": {
        "model_type": "granite", "attention_bias": False, "attention_dropout": 0.1,
        "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0, "hidden_size": 4096,
        "intermediate_size": 12800, "logits_scaling": 16.0, "max_position_embeddings": 4096,
        "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 40,
        "num_key_value_heads": 8, "residual_multiplier": 0.22, "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True, "vocab_size": 49155,
    },
    "mistralai/Mistral-7B-v0.1": {
        "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "sliding_window": 4096,
        "tie_word_embeddings": False, "vocab_size": 32000,
    },
    "bigscience/bloom-560m": {
        "model_type": "bloom", "n_embed": 1024, "n_head": 16, "n_layer": 24,
        "apply_residual_connection_post_layernorm": False, "vocab_size": 250880,
    },
    "mosaicml/mpt-7b": {
        "model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
        "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True,
        "learned_pos_emb": True, "norm_type": "low_precision_layernorm",
        "attn_config": {"alibi": True, "attn_type": "multihead_attention", "qk_ln": False,
                        "attn_impl": "torch", "alibi_bias_max": 8},
    },
}  # fmt: skip

#: google/gemma-3-27b-it: a gemma3 config whose text_config omits vocab_size (262,208 is
#: Gemma3TextConfig's default, what Transformers builds)
GEMMA3_27B = {
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
        "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
        "num_key_value_heads": 16, "query_pre_attn_scalar": 168, "sliding_window": 1024,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    },
    "vision_config": {"model_type": "siglip_vision_model"},
}  # fmt: skip


@pytest.mark.parametrize("repo", sorted(PUBLISHED))
def test_published_configs_are_exact(repo):
    raw = PUBLISHED[repo]
    spec = ModelSpec.from_hf_config(json.loads(json.dumps(raw)))
    keys = {k: v for k, v in raw.items() if k != "model_type"}
    assert spec.num_params() == hf_total(build(raw["model_type"], **keys)), repo


def test_gemma3_27b_text_config_without_vocab_size():
    spec = ModelSpec.from_hf_config(GEMMA3_27B)
    text = {k: v for k, v in GEMMA3_27B["text_config"].items() if k != "model_type"}
    assert spec.vocab_size == 262208 and spec.family == "gemma3_text"
    assert spec.num_params() == hf_total(build("gemma3_text", **text))
    assert spec.sliding_window == 1024 and spec.global_every == 6


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("cfg,msg", [
    ({"model_type": "internlm2"}, "internlm2.*not in Transformers 5.23"),
    ({"model_type": "qwen3_next"}, "qwen3_next"),
    ({"model_type": "made_up_family"}, "made_up_family.*supported: .*llama"),
    ({"hidden_size": 64}, "model_type'\\] is missing"),
    ({"model_type": "mpt", "attn_config": {"attn_type": "multiquery_attention"}}, "attn_type"),
    ({"model_type": "mpt", "expansion_ratio": 8}, "expansion_ratio"),
    ({"model_type": "bloom", "apply_residual_connection_post_layernorm": True},
     "apply_residual_connection_post_layernorm"),
    ({"model_type": "llama", "sliding_window": 4096}, "sliding_window"),
    ({"model_type": "gpt_oss", "attention_bias": False}, "attention_bias"),
    ({"model_type": "smollm3", "use_sliding_window": True, "sliding_window": 64}, "layer_types"),
    ({"model_type": "exaone4", "sliding_window_pattern": "LLLG"}, "sliding_window_pattern"),
    ({"model_type": "deepseek_v2"}, "num_experts_per_tok"),
])  # fmt: skip
def test_unmodelled_configs_are_refused_by_name(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        ModelSpec.from_hf_config(cfg)


def test_refused_families_have_reasons():
    assert "internlm2" in refused_families()
    assert not set(refused_families()) & set(families())


# ------------------------------------------------------------------------------ KV cache
TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=4, num_attention_heads=4)
KV_CASES = [
    ("llama", {**TINY, "intermediate_size": 96, "num_key_value_heads": 2}),
    ("falcon", {**TINY}),  # multi-query: one K/V head
    ("gpt_bigcode", {"vocab_size": 128, "n_embd": 64, "n_layer": 2, "n_head": 4}),
    ("gpt_neox", {**TINY, "intermediate_size": 96}),
    ("gptj", {"vocab_size": 128, "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8}),
    ("phi", {**TINY, "intermediate_size": 96, "num_key_value_heads": 2}),
    ("olmo2", {**TINY, "intermediate_size": 96, "num_key_value_heads": 2}),
    ("cohere", {**TINY, "intermediate_size": 96, "num_key_value_heads": 2}),
    ("bloom", {"vocab_size": 128, "hidden_size": 64, "n_layer": 2, "n_head": 4}),
    ("mpt", {"vocab_size": 128, "d_model": 64, "n_layers": 2, "n_heads": 4}),
    ("mistral", {**TINY, "intermediate_size": 96, "num_key_value_heads": 2, "sliding_window": 6}),
    ("cohere2", {**TINY, "intermediate_size": 96, "num_key_value_heads": 2, "head_dim": 16,
                 "sliding_window": 6}),
    ("gemma2", {**TINY, "intermediate_size": 96, "num_key_value_heads": 2, "head_dim": 16,
                "sliding_window": 6}),
]  # fmt: skip


def _cached_values(cfg, seq_len: int) -> list[int]:
    """Numbers each layer of Transformers' DynamicCache holds after a forward pass of
    ``seq_len`` tokens (batch 1), key and value together."""
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    return [layer.keys.numel() + layer.values.numel() for layer in cache.layers]


@pytest.mark.parametrize("family,keys", KV_CASES, ids=[f"{f}-{i}" for i, (f, _) in
                                                       enumerate(KV_CASES)])
def test_kv_bytes_match_transformers_dynamic_cache(family, keys):
    """parmem's per-layer K/V values times the tokens kept equal DynamicCache's tensors. A
    sliding-window layer of Transformers keeps window - 1 tokens between steps (the next token
    makes window, what attention reads); parmem counts the window: one token more per local
    layer, so the check runs within the window and past it with that token added back."""
    cfg = build(family, **keys)
    spec = ModelSpec.from_hf_config({"model_type": family, **keys})
    per_layer = layer_kv_values(spec)
    for seq_len in (5, 11):
        held = _cached_values(cfg, seq_len)
        want = [
            n // max(1, seq_len if not spec.is_local_layer(i) else min(seq_len, spec.sliding_window - 1))
            for i, n in enumerate(held)
        ]
        assert want == [per_layer] * spec.layers, (family, seq_len)
        tokens = [
            seq_len if not spec.is_local_layer(i) else min(seq_len, spec.sliding_window)
            for i in range(spec.layers)
        ]
        assert kv_layer_tokens(spec, seq_len) == sum(tokens)
        assert kv_cache_bytes(spec, seq_len, dtype="fp32") == 4 * per_layer * sum(tokens)
        if seq_len < spec.sliding_window or not spec.sliding_window:
            assert kv_cache_bytes(spec, seq_len, dtype="fp32") == 4 * sum(held)


def test_falcon_new_architecture_cache_broadcasts_kv_heads():
    """Transformers' FalconAttention (new_decoder_architecture) broadcasts K and V to every query
    head before caching them, so its DynamicCache holds heads/kv_heads times what a serving
    engine keeps (vLLM's FalconAttention caches num_kv_heads). parmem counts the kv_heads an
    engine needs; this pins the factor so the difference is known, not silent."""
    keys = {**TINY, "new_decoder_architecture": True, "num_kv_heads": 2}
    spec = ModelSpec.from_hf_config({"model_type": "falcon", **keys})
    held = _cached_values(build("falcon", **keys), 5)
    assert held == [layer_kv_values(spec) * 5 * spec.heads // spec.kv_heads] * spec.layers


# ------------------------------------------------------------------------------ the front ends
def test_models_hf_lists_the_families(capsys):
    from parmem.cli import main

    assert main(["models", "--hf"]) == 0
    out = capsys.readouterr().out
    for family in ("llama", "starcoder2", "olmo2", "cohere", "phimoe", "falcon", "gemma3"):
        assert family in out
    assert "internlm2" in out and "refused" in out


def test_the_calculator_reads_a_pasted_config_of_every_family():
    """The calculator page's pasted config.json (parmem.book.web) reads every family exactly."""
    from parmem.book import web

    for family in FAMILIES:
        cfg = build(family, **DEFAULT_FIX.get(family, {}))
        spec = web._model({"config": cfg.to_json_string()})
        assert spec.family == family and spec.num_params() == hf_total(cfg), family
