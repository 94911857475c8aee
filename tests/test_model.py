"""ModelSpec: exact parameter counts against published totals, presets and HF configs."""

import json

import pytest

from parmem import ModelSpec, presets

# Published totals. GPT-2: the Hugging Face model cards / safetensors metadata of
# openai-community/gpt2{,-medium,-large,-xl}. Llama/Mistral/Mixtral: the safetensors metadata
# ("total" parameters) of the Hugging Face checkpoints named in data/models.toml.
PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name,expected", sorted(PUBLISHED.items()))
def test_exact_param_counts(name, expected):
    assert ModelSpec.preset(name).num_params() == expected


def test_mixtral_active_params():
    # Jiang et al. 2024 / Mistral AI: 46.7B total, 12.9B active per token (top-2 of 8 experts).
    spec = ModelSpec.preset("mixtral-8x7b")
    assert round(spec.num_params() / 1e8) == 467
    assert round(spec.num_params(active=True) / 1e8) == 129
    # dense models: active == total
    assert ModelSpec.preset("llama-2-7b").num_params(active=True) == PUBLISHED["llama-2-7b"]


@pytest.mark.parametrize("name,billions", [("megatron-22b", 22), ("megatron-175b", 175),
                                           ("megatron-530b", 530), ("megatron-1t", 1000),
                                           ("gpt3-175b", 175)])
def test_paper_model_sizes(name, billions):
    # Korthikanti et al. 2022 Table 3 and Brown et al. 2020 Table 2.1 name the sizes in round
    # billions; the exact count depends on the vocabulary, so we ask for 1% agreement.
    n = ModelSpec.preset(name).num_params()
    assert abs(n / 1e9 - billions) / billions < 0.01


def test_llama2_7b_components():
    # Touvron et al. 2023: V=32000, h=4096, untied embedding and LM head of V*h each.
    c = ModelSpec.preset("llama-2-7b").param_counts()
    assert c["embedding"] == c["lm_head"] == 32000 * 4096 == 131_072_000
    assert c["positions"] == 0
    assert c["attention"] == 32 * 4 * 4096 * 4096
    assert c["mlp"] == 32 * 3 * 4096 * 11008
    assert c["norms"] == (2 * 32 + 1) * 4096


def test_gpt2_tied_and_learned_positions():
    c = ModelSpec.preset("gpt2").param_counts()
    assert c["lm_head"] == 0
    assert c["positions"] == 1024 * 768


def test_presets_list_has_the_required_names():
    required = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-2-7b", "llama-2-13b",
                "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b", "mixtral-8x7b",
                "gpt3-175b", "megatron-22b", "megatron-175b", "megatron-530b", "megatron-1t"}
    assert required <= set(presets())


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError, match="unknown model preset 'llama-9'.*llama-2-7b"):
        ModelSpec.preset("llama-9")


LLAMA_HF = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "float16",
}
MIXTRAL_HF = {
    "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "max_position_embeddings": 32768, "tie_word_embeddings": False,
}
GPT2_HF = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12,
           "n_head": 12, "n_positions": 1024, "n_inner": None}
# Qwen2-0.5B (Hugging Face Qwen/Qwen2-0.5B config.json): Q/K/V biases, tied embeddings.
# Published total: 494,032,768 parameters (safetensors metadata).
QWEN2_HF = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "max_position_embeddings": 131072,
            "tie_word_embeddings": True}


@pytest.mark.parametrize("cfg,expected", [(LLAMA_HF, 6_738_415_616),
                                          (MIXTRAL_HF, 46_702_792_704),
                                          (GPT2_HF, 124_439_808),
                                          (QWEN2_HF, 494_032_768)])
def test_from_hf_config(cfg, expected, tmp_path):
    assert ModelSpec.from_hf_config(cfg).num_params() == expected
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert ModelSpec.from_hf_config(path).num_params() == expected
    assert ModelSpec.from_hf_config(tmp_path).num_params() == expected  # a folder works too


def test_from_hf_config_malformed(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelSpec.from_hf_config(bad)
    with pytest.raises(ValueError, match="missing 'hidden_size'"):
        ModelSpec.from_hf_config({"model_type": "llama", "vocab_size": 10, "hidden_size": None})
    with pytest.raises(ValueError, match="no such file"):
        ModelSpec.from_hf_config(tmp_path / "nope.json")
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        ModelSpec.from_hf_config(bad)


@pytest.mark.parametrize("kw,msg", [
    ({"hidden": 0}, "hidden=0 must be an integer >= 1"),
    ({"layers": -2}, "layers=-2 must be an integer >= 1"),
    ({"heads": 3}, "heads=3 must divide hidden=64"),
    ({"kv_heads": 3}, "kv_heads=3 must divide heads=4"),
    ({"ffn_kind": "relu"}, "ffn_kind='relu' must be one of"),
    ({"norm": "batch"}, "norm='batch' must be one of"),
    ({"num_experts": 4, "top_k": 5}, "top_k=5 must be between 1 and num_experts=4"),
    ({"top_k": 2}, "need num_experts"),
    ({"hidden": 64.0}, "must be an integer"),
])
def test_invalid_spec(kw, msg):
    base = dict(name="x", vocab_size=100, hidden=64, layers=2, heads=4)
    base.update(kw)
    with pytest.raises(ValueError, match=msg):
        ModelSpec(**base)
