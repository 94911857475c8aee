"""parmem.lora against PEFT itself: every family's LoRA trainable count is what
``PeftModel.get_nb_trainable_parameters()[0]`` reports for PEFT 0.21.2 on the Transformers 5.23
model, built on the meta device (no memory, no download).

Expected values come from PEFT (``peft.get_peft_model`` on the family's model) and from one
published figure: Llama-2-7B (meta-llama/Llama-2-7b-hf) with LoRA r=16 on q, k, v, o, gate, up
and down_proj, for which PEFT's own ``print_trainable_parameters()`` prints "trainable params:
39,976,960 || all params: 6,778,392,576 || trainable%: 0.5898" (a figure reproduced in many
public fine-tuning scripts and write-ups, e.g. a QLoRA script for
divijmishra/grover-base-p1.00-llama-2-7b on GitHub); it is checked here against PEFT on the
published config.json too.
"""

from __future__ import annotations

import re
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from arch_configs import NEW_PRESETS, preset_config  # noqa: E402

from parmem import ModelSpec  # noqa: E402
from parmem.hfconfig import families  # noqa: E402
from parmem.lora import TARGETS, lora_layer_params, lora_modules, lora_params  # noqa: E402

T = transformers

#: the families read (model_type), without the multimodal wrappers (as test_hf_families.py)
FAMILIES = [f for f in families() if f not in ("gemma3", "llama4")]

#: where the default config cannot be built or counted, the smallest change (test_hf_families.py),
#: and 2 decoder layers (the widths kept) so that each model is quick to build and wrap
DEFAULT_FIX = {
    "ministral": {"head_dim": 128},  # MinistralConfig's head_dim=None breaks its own model
    "deepseek_v2": {"num_experts_per_tok": 6},  # None in DeepseekV2Config (the Lite model's 6)
    "deepseek_v3": {"first_k_dense_replace": 1},  # 3 dense layers by default: keep one of two
}

#: the attention's module names, from each family's modeling_*.py (PEFT ignores a listed name
#: that matches nothing, so MLA's list holds both query forms)
ATTENTION = {
    "phi": ["q_proj", "k_proj", "v_proj", "dense"],
    "phi3": ["qkv_proj", "o_proj"],
    "gptj": ["q_proj", "k_proj", "v_proj", "out_proj"],
    "gpt_neox": ["query_key_value", "dense"],
    "bloom": ["query_key_value", "dense"],
    "falcon": ["query_key_value", "dense"],
    "mpt": ["Wqkv", "out_proj"],
    "gpt2": ["c_attn", "attn.c_proj"],
    "gpt_bigcode": ["c_attn", "attn.c_proj"],
    "deepseek_v2": ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
    "deepseek_v3": ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
}
LLAMA_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]

#: families whose attention has no separate q_proj and v_proj (fused QKV, or MLA)
NO_QV = {"phi3", "gpt_neox", "bloom", "falcon", "mpt", "gpt2", "gpt_bigcode", "deepseek_v2",
         "deepseek_v3"}  # fmt: skip


def build(model_type: str, **kw):
    """Transformers' configuration of ``model_type`` (2 layers unless ``kw`` says otherwise)."""
    return T.AutoConfig.for_model(model_type, **{"num_hidden_layers": 2, **kw})


def fresh_model(cfg):
    """A new model on the meta device. Not arch_configs.hf_model: that caches the model, and
    get_peft_model changes the model it is given in place."""
    with torch.device("meta"):
        return T.AutoModelForCausalLM.from_config(cfg)


def peft_counts(cfg, rank: int, targets) -> tuple[int, dict[int, int], int]:
    """PEFT's trainable count, the trainable values per decoder layer (from the adapter
    parameters' names), and PEFT's "all params"."""
    target_modules = "all-linear" if targets == "all-linear" else list(targets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Conv1D fan_in_fan_out, unmatched rank patterns
        model = peft.get_peft_model(  # low_cpu_mem_usage: the adapters on the meta device too
            fresh_model(cfg),
            peft.LoraConfig(r=rank, target_modules=target_modules),
            low_cpu_mem_usage=True,
        )
    per_layer: dict[int, int] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            layer = int(re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", name).group(1))
            per_layer[layer] = per_layer.get(layer, 0) + p.numel()
    trainable, total = model.get_nb_trainable_parameters()
    return trainable, per_layer, total


def check(cfg, rank: int, targets, peft_targets=None) -> None:
    """parmem's total and per-layer counts equal PEFT's."""
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    trainable, per_layer, _ = peft_counts(cfg, rank, peft_targets or targets)
    assert lora_params(spec, rank, targets) == trainable, (spec.family, rank, targets)
    mine = [lora_layer_params(spec, rank, targets, i) for i in range(spec.layers)]
    assert mine == [per_layer.get(i, 0) for i in range(spec.layers)], (spec.family, targets)


# ---------------------------------------------------------------------------- every family
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_matches_peft(family):
    """all-linear (r=8), the attention projections (r=4), and q_proj + v_proj (r=16) where
    the family has them; where it has not, "qv" is refused by name and all-linear is checked
    at r=16 instead."""
    cfg = build(family, **DEFAULT_FIX.get(family, {}))
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    assert spec.family == family and spec.layers == 2
    check(cfg, 8, "all-linear")
    check(cfg, 4, "attention", ATTENTION.get(family, LLAMA_ATTENTION))
    if family in NO_QV:
        with pytest.raises(ValueError, match="targets"):
            lora_params(spec, 8, "qv")
        check(cfg, 16, "all-linear")
    else:
        check(cfg, 16, "qv", ["q_proj", "v_proj"])


#: options that change which modules exist or their widths (config keys of Transformers 5.23)
SMALL = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4)
OPTIONS = [
    ("qwen2_moe", {**SMALL, "num_key_value_heads": 2, "intermediate_size": 96,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                   "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [0]}),
    ("qwen2_moe", {**SMALL, "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 32, "num_experts": 4,
                   "num_experts_per_tok": 2, "decoder_sparse_step": 2}),
    ("qwen3_moe", {**SMALL, "num_key_value_heads": 2, "intermediate_size": 96, "head_dim": 16,
                   "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
                   "mlp_only_layers": [0, 1]}),
    ("llama4_text", {**SMALL, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32,
                     "intermediate_size_mlp": 96, "num_local_experts": 4,
                     "interleave_moe_layer_step": 2}),
    ("deepseek_v3", {**SMALL, "intermediate_size": 96, "moe_intermediate_size": 32,
                     "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 2,
                     "first_k_dense_replace": 2, "q_lora_rank": 24, "kv_lora_rank": 16,
                     "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 12,
                     "n_group": 1, "topk_group": 1}),
    ("deepseek_v2", {**SMALL, "intermediate_size": 96, "moe_intermediate_size": 32,
                     "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                     "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 16,
                     "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 12}),
    ("mixtral", {**SMALL, "num_key_value_heads": 1, "intermediate_size": 48,
                 "num_local_experts": 3, "num_experts_per_tok": 2}),
    ("phimoe", {**SMALL, "num_key_value_heads": 2, "intermediate_size": 32,
                "num_local_experts": 4}),
    ("falcon", {**SMALL, "new_decoder_architecture": True, "num_kv_heads": 2}),
    ("falcon", {**SMALL, "alibi": True, "bias": True, "multi_query": False,
                "parallel_attn": False}),
    ("gpt_bigcode", {"n_embd": 64, "n_layer": 2, "n_head": 4, "multi_query": False}),
    ("phi3", {**SMALL, "num_key_value_heads": 2, "intermediate_size": 96, "pad_token_id": 0}),
    ("gemma2", {**SMALL, "num_key_value_heads": 2, "head_dim": 24, "intermediate_size": 96}),
]  # fmt: skip


@pytest.mark.parametrize(
    "family,keys", OPTIONS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(OPTIONS)]
)
def test_options_match_peft(family, keys):
    """Dense layers among MoE layers (Qwen-MoE's mlp_only_layers and decoder_sparse_step,
    DeepSeek's first_k_dense_replace, Llama 4's interleave step), MLA without a query
    bottleneck, GQA widths, fused QKV variants."""
    cfg = T.AutoConfig.for_model(family, **keys)
    check(cfg, 8, "all-linear")
    check(cfg, 2, "attention", ATTENTION.get(family, LLAMA_ATTENTION))


#: module-name tuples, as LoraConfig(target_modules=[...]) takes them
NAMED = [
    ("llama", {**SMALL, "intermediate_size": 96}, ("self_attn.q_proj", "down_proj")),
    ("mixtral", OPTIONS[6][1], ("w1", "w3", "gate")),  # v4 names: experts at 2r, the router
    ("mixtral", OPTIONS[6][1], ("mlp.gate", "w2")),
    ("deepseek_v3", OPTIONS[4][1], ("gate_proj", "up_proj", "down_proj")),  # experts only
    ("qwen2_moe", OPTIONS[0][1], ("gate_proj", "up_proj", "down_proj")),  # dense + shared
    ("llama4_text", OPTIONS[3][1], ("router", "shared_expert.down_proj")),
    ("gpt2", {"n_embd": 64, "n_layer": 2, "n_head": 4}, ("c_proj",)),  # attn and mlp c_proj
]


@pytest.mark.parametrize(
    "family,keys,names", NAMED, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(NAMED)]
)
def test_module_name_tuples_match_peft(family, keys, names):
    check(T.AutoConfig.for_model(family, **keys), 4, names)


# ---------------------------------------------------------------------------- published figure
#: meta-llama/Llama-2-7b-hf config.json (its Hugging Face repository)
LLAMA2_7B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "vocab_size": 32000,
    "tie_word_embeddings": False, "hidden_act": "silu",
}  # fmt: skip


def test_llama2_7b_r16_all_linear_is_peft_published_figure():
    """PEFT's own output for Llama-2-7B, r=16, all linear layers: "trainable params: 39,976,960
    || all params: 6,778,392,576"; PEFT on the published config.json gives the same."""
    spec = ModelSpec.from_hf_config(LLAMA2_7B)
    assert lora_params(spec, 16, "all-linear") == 39_976_960
    assert lora_params(ModelSpec.preset("llama-2-7b"), 16) == 39_976_960
    assert spec.num_params() + lora_params(spec, 16) == 6_778_392_576
    keys = {k: v for k, v in LLAMA2_7B.items() if k != "model_type"}
    trainable, _, total = peft_counts(T.AutoConfig.for_model("llama", **keys), 16, "all-linear")
    assert (trainable, total) == (39_976_960, 6_778_392_576)


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_presets_count_as_their_family(name):
    """A preset (family "") counts as the Transformers family it was written from: the same as
    the spec read from its Hugging Face config (tests/arch_configs.py, written independently)."""
    preset = ModelSpec.preset(name)
    spec = ModelSpec.from_hf_config(preset_config(preset).to_dict())
    for targets in TARGETS[:2]:
        assert lora_params(preset, 8, targets) == lora_params(spec, 8, targets), targets


def test_pipeline_stages_sum_to_the_total():
    spec = ModelSpec.from_hf_config({"model_type": "deepseek_v3", **OPTIONS[4][1]})
    per_layer = [lora_layer_params(spec, 8, "all-linear", i) for i in range(spec.layers)]
    assert sum(per_layer) == lora_params(spec, 8)
    assert per_layer[0] == per_layer[1] < per_layer[2] == per_layer[3]  # 2 dense, 2 MoE
    moe = {m.name: m for m in lora_modules(spec) if m.layers == "moe"}
    assert moe["mlp.experts.gate_up_proj"].a_shape(8) == (2 * 8 * 4, 64)  # 2r per expert
    assert moe["mlp.experts.gate_up_proj"].b_shape(8) == (64, 2 * 8 * 4)


# ---------------------------------------------------------------------------- refusals
def _llama():
    return ModelSpec.from_hf_config({"model_type": "llama", **SMALL, "intermediate_size": 96})


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda s: lora_params(s, 0), "rank"),
        (lambda s: lora_params(s, True), "rank"),
        (lambda s: lora_params(s, 8.0), "rank"),
        (lambda s: lora_params(s, 8, "all"), "targets"),
        (lambda s: lora_params(s, 8, ("nonexistent",)), "targets"),
        (lambda s: lora_params(s, 8, ("attn.q_proj",)), "targets"),  # not a suffix at a dot
        (lambda s: lora_params(s, 8, ()), "targets"),
        (lambda s: lora_params(s, 8, ("q_proj", "")), "targets"),
        (lambda s: lora_params(s, 8, ("lm_head",)), "targets"),
        (lambda s: lora_params(s, 8, ("model.embed_tokens",)), "targets"),
        (lambda s: lora_params(s, 8, {"q_proj"}), "targets"),
        (lambda s: lora_layer_params(s, 8, "qv", 4), "layer"),
        (lambda s: lora_layer_params(s, 8, "qv", -1), "layer"),
        (lambda s: lora_params(s.with_(family=""), 8), "family"),
        (lambda s: lora_params(s.with_(family="made_up"), 8), "family"),
        (lambda s: lora_params(s.with_(num_experts=4, top_k=2), 8), "num_experts"),
        (lambda s: lora_modules("llama", "qv"), "spec"),
    ],
)
def test_bad_input_is_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call(_llama())


def test_half_a_fused_pair_is_refused_as_peft_refuses_it():
    cfg = T.AutoConfig.for_model("qwen3_moe", **OPTIONS[2][1])
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    with pytest.raises(ValueError, match="targets.*up_proj"):
        lora_params(spec, 8, ("gate_proj",))
    with pytest.raises(ValueError, match="up_proj"):
        peft_counts(cfg, 8, ("gate_proj",))


def test_unadaptable_router_and_experts_are_refused():
    """gpt-oss's router and Qwen2-MoE's ``gate`` are not nn.Linear (PEFT refuses them); a
    v5 parameter name is no module to PEFT."""
    oss = ModelSpec.from_hf_config({"model_type": "gpt_oss", "num_hidden_layers": 2})
    with pytest.raises(ValueError, match="targets.*router"):
        lora_params(oss, 8, ("router",))
    qwen = ModelSpec.from_hf_config({"model_type": "qwen2_moe", **OPTIONS[0][1]})
    for names in (("gate",), ("gate_up_proj",), ("experts",)):
        with pytest.raises(ValueError, match="targets"):
            lora_params(qwen, 8, names)


def test_unmodelled_specs_are_refused_by_name():
    with pytest.raises(ValueError, match="family"):
        lora_params(ModelSpec.preset("gpt3-175b"), 8)  # no Transformers family
    with pytest.raises(ValueError, match="family"):
        lora_params(ModelSpec.preset("llama-2-7b").with_(layers=2), 8)  # no longer the preset
    gemma3 = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}}
    with pytest.raises(ValueError, match="source.*vision tower"):
        lora_params(ModelSpec.from_hf_config(gemma3), 8)
    no_shared = {"model_type": "qwen2_moe", **OPTIONS[0][1], "shared_expert_intermediate_size": 0}
    with pytest.raises(ValueError, match="shared_experts"):
        lora_params(ModelSpec.from_hf_config(no_shared), 8)
