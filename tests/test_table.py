"""parmem.table: the parameter rows of the 2025-26 architectures (MLA, q/k norms, sinks, Gemma's
four norms, shared and gated experts, router biases, dense-first and interleaved MoE layers, MTP
modules): every new preset, written as its family's Hugging Face config, has the parameter count
(total and active) of Transformers' model; published totals; the MTP module and the uneven
pipeline stages of DeepSeek-V3; shared experts under EP and TP."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from arch_configs import NEW_PRESETS, hf_counts, hf_model, preset_config  # noqa: E402

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate  # noqa: E402
from parmem.sharding import stage_params, tp_param_counts  # noqa: E402


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_preset_counts_equal_transformers(name):
    spec = ModelSpec.preset(name)
    cfg = preset_config(spec)
    total, active = hf_counts(cfg)
    assert spec.num_params() == total
    assert spec.num_params(active=True) == active
    back = ModelSpec.from_hf_config(cfg.to_dict(), name=name)  # the reader agrees with the preset
    for f in ("num_params", "attention", "num_moe_layers", "num_local_layers"):
        got, want = getattr(back, f), getattr(spec, f)
        assert (got() if callable(got) else got) == (want() if callable(want) else want), f


@pytest.mark.parametrize("name,total,active", [
    # published totals: DeepSeek-V3 report §1 (671B, 37B activated); Qwen3 report Table 1/2
    # (32.8B; 235B, 22B activated); Llama 4 herd (Scout 109B incl. vision, 17B active;
    # Maverick 400B, 17B active); gpt-oss model card Table 1 (116.83B total)
    ("deepseek-v3", 671e9, 37e9), ("qwen3-235b-a22b", 235e9, 22e9), ("qwen3-32b", 32.8e9, None),
    ("llama-4-maverick", 400e9, 17e9), ("llama-4-scout", None, 17e9), ("gpt-oss-120b", 116.8e9, None),
])
def test_published_totals(name, total, active):
    spec = ModelSpec.preset(name)
    if total:
        assert abs(spec.num_params() - total) / total < 0.005
    if active:
        assert abs(spec.num_params(active=True) - active) / active < 0.02


def test_deepseek_mtp_module_counted_apart():
    """Transformers' DeepseekV3ForCausalLM builds no MTP module; parmem counts it (mtp=True) as
    one MoE layer, eh_proj (h x 2h) and three norms (DeepSeek-V3 §2.2). The Hugging Face card's
    685B = 671B + 14B of MTP, whose checkpoint also stores its own copies of the embedding and head."""
    spec = ModelSpec.preset("deepseek-v3")
    model = hf_model(preset_config(spec))
    moe_layer = sum(p.numel() for p in model.model.layers[spec.first_dense_layers].parameters())
    h, V = spec.hidden, spec.vocab_size
    mtp = moe_layer + 2 * h * h + 3 * h
    counts = spec.param_counts()
    assert counts["mtp"] + counts["mtp_experts"] == mtp
    assert spec.num_params(mtp=True) == spec.num_params() + mtp
    # the card's "685B" (safetensors, with FP8 scales) within 1B: 684.5B here
    assert abs(spec.num_params(mtp=True) + 2 * V * h - 685e9) < 1e9
    # on the last pipeline stage only; a middle stage of the same MoE layers holds none of it
    last = sum(stage_params(spec, 1, 1, 10, first=False, last=True, start=51))
    middle = sum(stage_params(spec, 1, 1, 10, first=False, last=False, start=41))
    assert last - middle == mtp + V * h + h  # + LM head + final norm


def test_dense_first_layers_in_stage_balance():
    """DeepSeek-V3's first three layers are dense: a first stage of 15 layers holds 3 dense + 12
    MoE layers, a middle stage 15 MoE layers; the difference is 3 x (MoE layer - dense layer)."""
    spec = ModelSpec.preset("deepseek-v3")
    model = hf_model(preset_config(spec))
    dense = sum(p.numel() for p in model.model.layers[0].parameters())
    moe = sum(p.numel() for p in model.model.layers[3].parameters())
    emb = spec.vocab_size * spec.hidden
    first = sum(stage_params(spec, 1, 1, 15, first=True, last=False, start=0))
    middle = sum(stage_params(spec, 1, 1, 15, first=False, last=False, start=15))
    assert middle - (first - emb) == 3 * (moe - dense)
    est = estimate(spec, ParallelConfig(pp=4, ep=8, dp=8), TrainingSetup(seq_len=4096),
                   layers_per_stage=[16, 15, 15, 15])
    s0, s1 = est.stages[0].num_params, est.stages[1].num_params
    assert s0 < s1 + emb  # the dense layers make the first stage lighter than its layer count says


def test_llama4_maverick_interleaves_moe_layers():
    spec = ModelSpec.preset("llama-4-maverick")
    assert [spec.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert spec.num_moe_layers == 24
    keys = spec.param_counts()
    assert keys["mlp"] == 24 * 3 * spec.hidden * spec.ffn_hidden


def test_shared_experts_replicated_over_ep_split_by_tp():
    """Megatron-Core's SharedExpertMLP is a TP-split dense MLP, not expert-parallel: e-way EP
    leaves it whole on every rank, t-way TP divides it."""
    spec = ModelSpec.preset("deepseek-v3")
    rows = {r.component: r for r in tp_param_counts(spec, tp=8, ep=8)}
    shared = rows["shared experts"]
    assert shared.full == spec.num_moe_layers * 3 * spec.hidden * spec.expert_ffn_hidden
    assert shared.per_rank == shared.full // 8
    assert rows["experts"].per_rank == rows["experts"].full // 64
    assert rows["attention latent"].split == "replicated"
