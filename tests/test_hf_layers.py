"""Transformers' own decoder layers against the ``hf`` engine profile (issues 14 and 28).

One decoder layer of each case of parmem.distributed.engine_runs.HF_TINY (Llama, Mistral,
Qwen2, Qwen3, Mixtral, GPT-2, Gemma, Gemma 2, Gemma 3, Qwen2-MoE, Qwen3-MoE with and without
norm_topk_prob, Llama and Gemma 2 with attention dropout) is built by transformers 5.23.0 from a
tiny config (every width distinct: h = 64, query heads x head_dim = 96, key/value heads x
head_dim = 48, f = 80, expert f = 40, shared expert 120), run forward as the Trainer runs it
(train mode, use_cache=False), in bf16 and fp32, with eager and SDPA attention (Gemma 2: eager
only, Transformers has no SDPA for it), and fp32 weights under bf16 autocast; the bytes it keeps
for backward are counted by storage (parmem.measure.SavedTensorsMeter, parameters excluded).
A whole tiny model with labels (the loss computed in its forward, as the Trainer does) keeps
layers x the layer table plus the stage, first and last tables and the fp32 log-probabilities.

The measurement must equal the ``hf`` profile (``layer`` and ``stage`` tables of
data/engines.toml, evaluated on device "cpu") to the byte. The only differences between a CPU
run and the GPU numbers the profile gives are named in the profile's ``[devices.*]`` tables:
dropout masks (the activation dtype on CPU, 1 byte on CUDA) and LayerNorm statistics (the input
dtype on CPU, fp32 on CUDA); they matter for GPT-2 only. GPT-2's SDPA case runs with
attn_pdrop = 0 (CPU SDPA has no fused kernel with dropout; see parmem.distributed.engine_runs).

Two cases are also derived by hand from the modelling code, term by term, independently of the
table.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dataclasses import replace  # noqa: E402

from parmem import ParallelConfig, TrainingSetup, estimate  # noqa: E402
from parmem.activations import layer_terms  # noqa: E402
from parmem.distributed.engine_runs import (  # noqa: E402
    HF_CASES,
    HF_EAGER_ONLY,
    HF_FAMILIES,
    HF_TINY,
    hf_layer,
    hf_model,
    hf_spec,
)
from parmem.engines import engine  # noqa: E402

S, B = 24, 3  # hf_layer's defaults
T = S * B


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("family", HF_CASES)
def test_layer_keeps_exactly_what_the_hf_profile_lists(family, dtype, attn):
    assert family in HF_FAMILIES or family in HF_EAGER_ONLY
    if attn == "sdpa" and family in HF_EAGER_ONLY:
        with pytest.raises(ValueError, match="flash_attention=True: Transformers 5.23 has no SDPA"):
            layer_terms(hf_spec(family, "eager"), S, B, flash=True, engine="hf")
        return
    r = hf_layer(family, dtype, attn)
    assert r["measured"] == r["predicted"], (r["measured"], r["predicted"], r["records"])


AUTOCAST = [c for c in HF_CASES if c in engine("hf").autocast]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", AUTOCAST)
def test_fp32_weights_under_bf16_autocast(family, attn):
    """precision="bf16-autocast": an fp32 model's layer run under torch.autocast(bfloat16)."""
    if attn == "sdpa" and family in HF_EAGER_ONLY:
        return
    r = hf_layer(family, "fp32", attn, autocast=True)
    assert r["measured"] == r["predicted"], (r["measured"], r["predicted"], r["records"])


def test_llama_autocast_by_hand():
    """LlamaDecoderLayer, fp32 weights under bf16 autocast, SDPA (modeling_llama.py): the
    residual stream stays fp32, so each RMSNorm keeps its fp32 input (4h), an fp32 rsqrt (4) and
    the fp32 normalised tensor (4h); q_proj, k_proj and v_proj each keep their own bf16 cast of
    the norm's output (3 x 2h), gate_proj and up_proj theirs (2 x 2h); SDPA and the MLP keep
    bf16 tensors as in a bf16 layer (2·96 + 2·2·48 + 4·4 + 2·96; 4 x 2f); every matmul keeps
    autocast's bf16 copy of its weight (2 bytes x the 7 projections' weights); cos and sin are
    fp32."""
    h, q, kv, heads, f, hd = 64, 96, 48, 4, 80, 24
    norms = 2 * (4 * h + 4 * h + 4) + 3 * 2 * h + 2 * 2 * h
    attention = 2 * q + 2 * 2 * kv + 4 * heads + 2 * q
    weights = 2 * (h * q + 2 * h * kv + q * h + 3 * h * f)
    rotary = 2 * 4 * S * hd
    got = hf_layer("llama", "fp32", "sdpa", autocast=True)["measured"]
    assert got == T * (norms + attention + 4 * 2 * f) + weights + rotary


@pytest.mark.parametrize("family", HF_CASES)
def test_whole_model_with_the_loss(family):
    """Two layers, labels given: layers x layer + stage + first + last + 4·s·b·V."""
    attn = "eager" if family in HF_EAGER_ONLY else "sdpa"
    for dtype in ("bf16", "fp32"):
        r = hf_model(family, dtype, attn)
        assert r["measured"] == r["predicted"], (dtype, r["measured"], r["predicted"])


def test_the_loss_keeps_shifted_labels_and_a_scalar():
    """ForCausalLMLoss: cross_entropy keeps the int64 shifted labels (8 bytes per token) and
    nll_loss a 0-d fp32 total weight (4 bytes), besides its fp32 log-probabilities (4·V per
    token): measured in a whole Llama, beside the same model's forward without labels."""
    import torch
    import transformers

    from parmem.measure import SavedTensorsMeter

    got = {}
    for labels in (False, True):
        torch.manual_seed(0)
        cfg = transformers.AutoConfig.for_model(
            "llama", vocab_size=256, num_hidden_layers=1, use_cache=False, **HF_TINY["llama"]
        )
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).train()
        ids = torch.randint(0, 256, (B, S))
        with SavedTensorsMeter(exclude=model.parameters()) as meter:
            model(input_ids=ids, labels=ids if labels else None, use_cache=False)
        got[labels] = meter.bytes
    assert got[True] - got[False] == T * (8 + 4 * 256) + 4
    last = layer_terms(hf_spec("llama"), S, B, engine="hf", place="last")
    assert {x.name: x.bytes for x in last}["shifted labels"] == 8 * T
    assert {x.name: x.bytes for x in last}["loss total weight"] == 4


def test_the_hf_profile_refuses_what_it_did_not_measure():
    spec = hf_spec("llama")
    falcon = replace(spec, family="falcon")
    with pytest.raises(ValueError, match="not measured for model_type='falcon' layers"):
        layer_terms(falcon, S, B, engine="hf")
    with pytest.raises(ValueError, match="not measured for model_type='falcon' layers"):
        estimate(falcon, ParallelConfig(), TrainingSetup(seq_len=S, engine="hf"))
    # DeepSpeed trains the Transformers model: the same table, the same refusal
    with pytest.raises(ValueError, match="model_type='falcon'"):
        estimate(falcon, ParallelConfig(), TrainingSetup(seq_len=S, engine="deepspeed"))
    layer_terms(replace(spec, family=""), S, B, engine="hf")  # a hand-built spec passes
    gemma3 = hf_spec("gemma3_text")
    window = replace(gemma3, sliding_window=16)
    with pytest.raises(ValueError, match="seq_len=24 > sliding_window=16 with flash_attention"):
        layer_terms(window, S, B, flash=True, engine="hf")
    layer_terms(window, S, B, flash=False, engine="hf")  # eager: the mask is only added
    with pytest.raises(ValueError, match="engine='hf' only, not engine='paper'"):
        TrainingSetup(seq_len=S, precision="bf16-autocast")
    with pytest.raises(ValueError, match="mixture of experts"):
        layer_terms(hf_spec("mixtral"), S, B, engine="hf", autocast=True)
    with pytest.raises(ValueError, match="without dropout only"):
        layer_terms(hf_spec("starcoder2"), S, B, engine="hf", dropout=True)
    wide = replace(spec, head_dim=288)
    with pytest.raises(ValueError, match="head_dim=288 > 256 with flash_attention"):
        layer_terms(wide, S, B, flash=True, engine="hf")


def test_llama_sdpa_bf16_by_hand():
    """LlamaDecoderLayer, bf16, SDPA, from modeling_llama.py, per token: each RMSNorm keeps an
    fp32 copy of its input (4h), the bf16 normalised tensor (2h) and an fp32 rsqrt (4); the
    projections keep the norm's output (2h, twice); SDPA keeps Q (2·96), K and V (2·48 each),
    its output (2·96, the same storage o_proj keeps) and an fp32 log-sum-exp per head (4·4); the
    MLP keeps gate, up, SiLU(gate) and the product (4 x 2f). Once per model: cos and sin,
    (1, s, head_dim) each in bf16."""
    h, q, kv, heads, f, hd = 64, 96, 48, 4, 80, 24
    norms = 2 * (4 * h + 2 * h + 4) + 2 * (2 * h)
    attention = 2 * q + 2 * 2 * kv + 4 * heads + 2 * q
    mlp = 4 * 2 * f
    rotary = 2 * 2 * S * hd
    assert hf_layer("llama", "bf16", "sdpa")["measured"] == T * (norms + attention + mlp) + rotary


def test_gpt2_eager_bf16_by_hand():
    """GPT2Block, bf16, eager attention, dropout 0.1, on CPU (modeling_gpt2.py): each LayerNorm
    keeps its input (2h) and a bf16 mean and rstd (2 + 2, CPU); c_attn and c_fc keep the norm's
    output (2h each); matmul copies Q, K^T and V (2h each); softmax keeps its bf16 output, dropout
    a bf16 mask (CPU) and the matmul with V the dropped-out scores (2 + 2 + 2 per score, a·s per
    token); c_proj keeps the attention output (2h); the two residual dropouts keep bf16 masks
    (2h each); NewGELU keeps x, tanh(.), 0.5x and 1 + tanh(.), c_proj its output (5 x 2·4h).
    GPT-2 has learned positions: no rotary tensors."""
    h, a, f = 64, 4, 256
    norms = 2 * (2 * h + 2 + 2) + 2 * (2 * h)
    attention = 3 * 2 * h + 6 * a * S + 2 * h
    dropout = 2 * 2 * h
    mlp = 5 * 2 * f
    assert hf_layer("gpt2", "bf16", "eager")["measured"] == T * (norms + attention + dropout + mlp)


def test_on_a_gpu_the_masks_are_bytes_and_the_statistics_fp32():
    """The profile's CUDA numbers differ from the CPU run by the named device terms only: for
    GPT-2 in bf16 with eager attention, the attention-dropout mask (a·s per token), the two
    residual masks (2h) lose a byte per element, and the two LayerNorms' four statistics gain two
    bytes each; the Llama family has no dropout and no LayerNorm: equal."""
    h, a = 64, 4
    r = hf_layer("gpt2", "bf16", "eager")
    assert r["measured"] - r["cuda"] == T * (a * S + 2 * h - 4 * 2)
    llama = hf_layer("llama", "bf16", "eager")
    assert llama["cuda"] == llama["measured"]


def test_the_spec_read_from_each_config():
    """from_hf_config reads the shapes the tables need: Qwen3's per-head q/k norms, GPT-2's
    learned positions and dropout, Mixtral's experts."""
    assert hf_spec("qwen3").qk_norm and not hf_spec("qwen2").qk_norm
    gpt2 = hf_spec("gpt2")
    assert gpt2.position == "learned" and gpt2.has_dropout
    mixtral = hf_spec("mixtral")
    assert (mixtral.num_experts, mixtral.top_k, mixtral.expert_ffn_hidden) == (4, 2, 80)
    assert hf_spec("llama").head_dim == 24


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="family='phi' must be one of 'llama'"):
        hf_layer("phi")
    with pytest.raises(ValueError, match="attn='flash' must be one of"):
        hf_layer("llama", attn="flash")
    with pytest.raises(ValueError, match="dtype='fp16' must be one of"):
        hf_layer("llama", dtype="fp16")


def test_hf_states_are_8_bytes_per_parameter():
    """The Trainer's defaults on a 16-bit checkpoint: from_pretrained(dtype="auto") keeps the
    checkpoint's bf16 (modeling_utils.py: a missing dtype becomes "auto"), TrainingArguments
    picks optim="adamw_torch_fused" (training_args.py, torch >= 2.8), whose moments are
    zeros_like(param), bf16 too. One step of that optimizer on a tiny Llama in bf16: 2 bytes of
    weights, 2 of gradients and 4 of moments per parameter, plus the named step counters (one
    0-d fp32 tensor per parameter tensor); the hf profile says 2 + 2 + 4."""
    import torch
    import transformers

    from parmem.measure import state_bytes
    from parmem.states import model_state_bytes

    cfg = transformers.AutoConfig.for_model("llama", vocab_size=256, hidden_size=64,
                                            intermediate_size=80, num_hidden_layers=1,
                                            num_attention_heads=4, num_key_value_heads=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    ids = torch.randint(0, 256, (2, 16))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    got = state_bytes(model, opt)
    assert (got.params, got.grads, got.optimizer) == (2 * n, 2 * n, 4 * n + 4 * tensors)
    want = model_state_bytes(n, engine="hf")
    assert (want.params, want.grads, want.optimizer) == (2 * n, 2 * n, 4 * n)
