"""The 2025-26 architectures (issue 20): DeepSeek-V3 (MLA, fine-grained and shared experts,
dense-first layers, MTP), Qwen3 and Qwen3-MoE (q/k norms, many small experts), Qwen2-MoE (a
gated shared expert), Gemma 2/3 (sliding windows between global layers, four norms per layer,
head_dim != h/a), gpt-oss (alternating windows, attention sinks, biases) and Llama 4 (chunked
layers, interleaved MoE and dense layers, a shared expert).

Expected parameter counts come from Transformers itself: the model is built from its config on
the meta device (no memory, no download) and its ``p.numel()`` summed. Active parameters are
derived here from that model: every routed-expert tensor (leading dimension E) counts top_k/E.
KV-cache bytes are derived here from the DeepSeek-V2 paper's formula (§2.1.2: (d_c + d_h^R) per
token and layer) and from min(seq, window) per local layer.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate  # noqa: E402
from parmem.cli import main  # noqa: E402
from parmem.inference import (  # noqa: E402
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    max_concurrency,
    serving_layout,
)
from parmem.sharding import stage_params, tp_param_counts  # noqa: E402

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


def _model(cfg):
    """Transformers' model for ``cfg`` on the meta device (built once per config)."""
    key = cfg.to_json_string()
    if key not in _MODELS:
        with torch.device("meta"):
            _MODELS[key] = T.AutoModelForCausalLM.from_config(cfg)
    return _MODELS[key]


def _counts(cfg) -> tuple[int, int]:
    """(total, active) parameters of Transformers' model for ``cfg``, built on the meta device.
    Active: each routed-expert tensor (name under ``.experts.``, leading dimension E) counts
    top_k / E of its elements; everything else (shared experts, routers, dense layers) counts
    whole. Tied weights are counted once (``parameters()`` deduplicates them)."""
    key = cfg.to_json_string()
    if key not in _BUILT:
        model = _model(cfg)
        total = sum(p.numel() for p in model.parameters())
        E = getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_local_experts", None) \
            or getattr(cfg, "num_experts", None) or 0
        routed = sum(p.numel() for n, p in model.named_parameters()
                     if ".experts." in n and E and p.shape[0] == E)
        k = getattr(cfg, "num_experts_per_tok", 0) or 0
        _BUILT[key] = (total, total - routed + (routed // E * k if E else 0))
    return _BUILT[key]


@pytest.mark.parametrize("family", sorted(DEFAULTS))
def test_default_config_counts_equal_transformers(family):
    cfg = DEFAULTS[family]()
    total, active = _counts(cfg)
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    assert spec.num_params() == total
    assert spec.num_params(active=True) == active


# ------------------------------------------------------------------------ presets as HF configs
def _pattern(layers: int, every: int, local: str) -> list[str]:
    return ["full_attention" if (i + 1) % every == 0 else local for i in range(layers)]


def _hf_config(s: ModelSpec):
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
                                  layer_types=_pattern(s.layers, 6, "sliding_attention"))
    if s.name == "gpt-oss-120b":
        return T.GptOssConfig(**common, intermediate_size=s.expert_ffn_hidden,
                              num_local_experts=s.num_experts, num_experts_per_tok=s.top_k,
                              sliding_window=s.sliding_window,
                              layer_types=_pattern(s.layers, 2, "sliding_attention"))
    assert s.name.startswith("llama-4")
    return T.Llama4TextConfig(**common, intermediate_size=s.expert_ffn_hidden,
                              intermediate_size_mlp=s.ffn_hidden, num_local_experts=s.num_experts,
                              num_experts_per_tok=s.top_k, interleave_moe_layer_step=s.moe_every,
                              attention_chunk_size=s.sliding_window)


NEW_PRESETS = ["deepseek-v3", "qwen3-32b", "qwen3-235b-a22b", "gemma-3-27b", "gpt-oss-120b",
               "llama-4-scout", "llama-4-maverick"]


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_preset_counts_equal_transformers(name):
    spec = ModelSpec.preset(name)
    cfg = _hf_config(spec)
    total, active = _counts(cfg)
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
    model = _model(_hf_config(spec))
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
    model = _model(_hf_config(spec))
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


# ------------------------------------------------------------------------------ KV cache
def test_mla_kv_cache_is_the_latent():
    """DeepSeek-V2 §2.1.2: MLA caches c_kv (d_c = kv_lora_rank) and k_rope (d_h^R) per token and
    layer. DeepSeek-V3 in bf16: (512 + 64) x 2 bytes x 61 layers = 70,272 bytes; the latent is
    shared by the heads, so TP does not divide it."""
    spec = ModelSpec.preset("deepseek-v3")
    assert kv_cache_bytes_per_token(spec, "bf16") == (512 + 64) * 2 * 61 == 70_272
    assert kv_cache_bytes_per_token(spec, "bf16", tp=8) == 70_272
    assert kv_cache_bytes(spec, 4096, dtype="bf16") == 4096 * 70_272
    assert kv_cache_bytes(spec, 131072, dtype="bf16") == 131072 * 70_272
    # from the config too (Transformers' default DeepseekV3Config is V3's shape)
    from_cfg = ModelSpec.from_hf_config(T.DeepseekV3Config().to_dict())
    assert kv_cache_bytes_per_token(from_cfg, "bf16") == 70_272


def test_sliding_window_kv_is_bounded_by_the_window():
    """Gemma-3-27B: 62 layers, every 6th global (10), 52 local with a 1024-token window;
    16 kv heads of 128 in bf16 = 8192 bytes per token and layer."""
    spec = ModelSpec.preset("gemma-3-27b")
    per_layer = 2 * 16 * 128 * 2
    assert spec.num_local_layers == 52
    for seq in (4096, 131072):
        want = per_layer * (10 * seq + 52 * min(seq, 1024))
        assert kv_cache_bytes(spec, seq, dtype="bf16") == want
    assert kv_cache_bytes(spec, 512, dtype="bf16") == per_layer * 62 * 512
    gpt_oss = ModelSpec.preset("gpt-oss-120b")  # 18 full, 18 with a 128-token window
    assert kv_cache_bytes(gpt_oss, 8192, dtype="bf16") == 2 * 8 * 64 * 2 * (18 * 8192 + 18 * 128)


def test_serving_accepts_the_new_presets():
    for name in ("deepseek-v3", "gpt-oss-120b", "llama-4-scout"):
        spec = ModelSpec.preset(name)
        out = serving_layout(spec, "h100-sxm", tp=8, ep=1)
        assert out["kv_tokens"] > 0 or out["weights"] > 80 * 2**30
    gemma = ModelSpec.preset("gemma-3-27b")
    n = max_concurrency(gemma, 131072, "h100-sxm", tp=2)
    assert n == (int(80 * 2**30) - sum(stage_params(gemma, 2)) * 2) // kv_cache_bytes(
        gemma, 131072, tp=2)


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


# ------------------------------------------------------------------------------ the CLI
def test_cli_estimate_new_preset(capsys):
    assert main(["estimate", "--model", "deepseek-v3", "--tp", "8", "--pp", "8", "--ep", "8",
                 "--dp", "8", "--zero", "1", "--seq", "4096", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got["stages"]) == 8


def test_cli_serve_memory_sliding_window(capsys):
    assert main(["serve-memory", "--model", "gemma-3-27b", "--seq", "131072", "--tp", "2",
                 "--kv-dtype", "bf16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    spec = ModelSpec.preset("gemma-3-27b")
    assert got["kv_cache_bytes_per_gpu"] == 8 * 2 * 128 * 2 * (10 * 131072 + 52 * 1024)
    assert got["kv_cache_bytes_per_gpu"] == kv_cache_bytes(spec, 131072, dtype="bf16", tp=2)


def test_cli_plan_new_preset_and_config(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(T.GptOssConfig().to_json_string())
    for model in ("qwen3-235b-a22b", str(path)):
        code = main(["plan", "--model", model, "--gpu", "h100-sxm", "--nodes", "4",
                     "--global-batch", "64", "--seq", "4096", "--top", "2", "--json"])
        assert code in (0, 1)
        capsys.readouterr()


def test_mla_saved_activations():
    """What one MLA layer keeps for backward in the paper profile (16-bit, s·b tokens): Q of
    a·(nope+rope), K and V of a·(nope+rope) and a·v, the output projection's input a·v, and the
    latents DeepSeek-V2 §2.1 adds: c_q (q_lora_rank, saved by its norm and by W_qb), [c_kv;
    k_rope] (kv_lora_rank + rope) and norm(c_kv) (kv_lora_rank)."""
    from parmem.activations import saved_tensor_bytes

    spec = ModelSpec.preset("deepseek-v3")
    s, b = 4096, 1
    (layer,) = saved_tensor_bytes(spec, s, b, flash=True, dropout=False)
    got = {}
    for x, n in layer:
        got[x.name] = got.get(x.name, 0) + n
    tok = 2 * s * b
    assert got["q"] == tok * 128 * 192
    assert got["k, v"] == tok * 128 * (192 + 128)
    assert got["projection input"] == tok * 128 * 128
    assert got["MLA query latent"] == tok * 2 * 1536
    assert got["MLA key/value latent"] == tok * (512 + 64)
    assert got["MLA key/value latent (normalised)"] == tok * 512


def test_kv_cache_by_layer_kind_and_its_explorer():
    from parmem.kvcache import kv_cache_by_layer_kind

    gemma = ModelSpec.preset("gemma-3-27b")
    split = kv_cache_by_layer_kind(gemma, 131072, 2, "bf16")
    assert split == {"full-attention layers": 2 * 8192 * 10 * 131072,
                     "sliding-window layers": 2 * 8192 * 52 * 1024}
    ds = kv_cache_by_layer_kind(ModelSpec.preset("deepseek-v3"), 4096, 1, "bf16")
    assert ds == {"full-attention layers": 4096 * 70_272, "sliding-window layers": 0}
    pytest.importorskip("ipywidgets")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from parmem.book.widgets import explore_kv_cache

    assert explore_kv_cache(static=False).children


@pytest.mark.parametrize("outer,inner", [(T.Gemma3Config, T.Gemma3TextConfig),
                                         (T.Llama4Config, T.Llama4TextConfig)])
def test_multimodal_configs_read_their_text_config(outer, inner):
    """gemma3 and llama4 configs nest the language model under text_config; parmem counts that
    model (the vision tower is left out, and the source says so)."""
    spec = ModelSpec.from_hf_config(outer().to_dict())
    assert spec.num_params() == _counts(inner())[0]
    assert "vision tower is not counted" in spec.source


def test_mla_keys_outside_deepseek_raise():
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ModelSpec.from_hf_config({**T.LlamaConfig().to_dict(), "kv_lora_rank": 512})
