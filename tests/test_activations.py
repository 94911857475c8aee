"""Activation formulas against Korthikanti et al. 2022 (Table 2, §4.2.3, §5): the per-layer
bytes, the named terms of a layer and the terms kept under recomputation."""

import pytest
from helpers import table2
from hypothesis import given
from hypothesis import strategies as st

from parmem import ModelSpec
from parmem.activations import kept_terms, layer_terms, per_layer_bytes
from parmem.papers import korthikanti_table2, table
from parmem.pipeline import in_flight_units

shapes = st.tuples(st.sampled_from([128, 512, 2048, 4096]), st.integers(1, 8),
                   st.sampled_from([(4096, 32), (6144, 64), (12288, 96), (20480, 128)]),
                   st.sampled_from([1, 2, 4, 8]))


@given(shapes)
def test_table2_every_case(shape):
    s, b, (h, a), t = shape
    # Korthikanti et al. 2022, Table 2, as printed (data/papers.toml), in exact rationals
    def paper(case):
        return korthikanti_table2(case, s, b, h, a, t)

    assert per_layer_bytes(s, b, h, a) == korthikanti_table2("none", s, b, h, a, 1)
    assert per_layer_bytes(s, b, h, a, tp=t) == paper("tp")
    assert per_layer_bytes(s, b, h, a, tp=t, recompute="selective") == paper("tp+selective")
    assert per_layer_bytes(s, b, h, a, recompute="full") == paper("full")
    if t > 1:
        assert per_layer_bytes(s, b, h, a, tp=t, sp=True) == paper("tp+sp")
        assert per_layer_bytes(s, b, h, a, tp=t, sp=True, recompute="selective") == \
            paper("tp+sp+selective")
        assert per_layer_bytes(s, b, h, a, tp=t, sp=True, recompute="full") == 2 * s * b * h // t


def test_gpt3_5as_over_h_is_80():
    # Korthikanti et al. 2022 §4.1: for GPT-3 (a=96, s=2048, h=12288) 5as/h = 80.
    s, b, h, a = 2048, 1, 12288, 96
    assert per_layer_bytes(s, b, h, a) == s * b * h * (34 + 80)


SAVING = table("korthikanti2022_selective_saving")


@pytest.mark.parametrize("row", SAVING.rows, ids=[r["preset"] for r in SAVING.rows])
def test_selective_recompute_saving(row):
    # Korthikanti et al. 2022 §5: selective recomputation removes 70% (GPT-3) and 65% (MT-NLG)
    # of the activation memory, with s = 2048.
    spec, s = ModelSpec.preset(row["preset"]), SAVING.settings["seq_len"]
    h, a = spec.hidden, spec.heads
    full = per_layer_bytes(s, 1, h, a, tp=8, sp=True)
    sel = per_layer_bytes(s, 1, h, a, tp=8, sp=True, recompute="selective")
    assert round(1 - sel / full, 2) == row["percent"] / 100


def gpt_spec(h, a):
    return ModelSpec(name="gpt", vocab_size=51200, hidden=h, layers=4, heads=a,
                     ffn_kind="gelu", bias=True, norm="layernorm", position="learned",
                     max_positions=8192)


@given(shapes, st.booleans())
def test_layer_terms_sum_to_table2_for_a_gpt_layer(shape, sp):
    s, b, (h, a), t = shape
    sp = sp and t > 1
    spec = gpt_spec(h, a)
    terms = layer_terms(spec, s, b, tp=t, sp=sp)
    assert sum(x.bytes for x in terms) == per_layer_bytes(s, b, h, a, tp=t, sp=sp)
    non_core = sum(x.bytes for x in terms if not x.core)
    assert non_core == per_layer_bytes(s, b, h, a, tp=t, sp=sp, recompute="selective")


def test_flash_attention_drops_the_score_matrix():
    s, b, h, a = 4096, 1, 4096, 32
    flash = per_layer_bytes(s, b, h, a, flash=True)
    assert flash == 34 * s * b * h + 4 * a * s * b  # Table 2 without 5as^2b, plus fp32 LSE
    spec = gpt_spec(h, a)
    assert sum(x.bytes for x in layer_terms(spec, s, b, flash=True)) == flash


def test_context_parallel_divides_the_sequence():
    spec = gpt_spec(4096, 32)
    one = sum(x.bytes for x in layer_terms(spec, 4096, 1, flash=True))
    two = sum(x.bytes for x in layer_terms(spec, 4096, 1, cp=2, flash=True))
    assert one == 2 * two


def test_swiglu_gqa_terms():
    # Llama-2-70B shapes: h=8192, a=64, kv=8, f=28672, no dropout. Hand count per token (bytes):
    # norms 2*(2h), QKV input 2h... written out term by term below.
    spec = ModelSpec.preset("llama-2-70b")
    s, b = 1, 1
    h, d, f = 8192, 128, 28672
    expected = (2 * h + 2 * h            # attention norm input, QKV input
                + 2 * 64 * d             # Q
                + 2 * 2 * 8 * d          # K, V (8 kv heads)
                + 2 * 64 * s             # softmax output, one query row of length s=1
                + 2 * 64 * d             # projection input
                + 2 * h + 2 * h          # MLP norm input, gate/up input
                + 4 * 2 * f)             # gate, up, SiLU(gate), down input
    got = sum(x.bytes for x in layer_terms(spec, s, b, dropout=False))
    assert got == expected


@pytest.mark.parametrize("call,msg", [
    (lambda: per_layer_bytes(0, 1, 64, 4), "seq_len=0"),
    (lambda: per_layer_bytes(8, 1, 64, 4, tp=3), "tp=3 must divide heads=4"),
    (lambda: per_layer_bytes(8, 1, 64, 4, sp=True), "sp=True needs tp >= 2"),
    (lambda: per_layer_bytes(8, 1, 64, 4, recompute="some"), "recompute='some'"),
    (lambda: in_flight_units("zb", 2, 2, 0), "schedule='zb'"),
    (lambda: in_flight_units("1f1b", 2, 2, 2), r"stage=2 must be an integer in 0..1"),
])
def test_invalid(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


# ---------------------------------------------------------------------------- kept_terms
@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_kept_terms_are_table2_for_a_gpt_layer(t, sp, recompute):
    if sp and t == 1:
        pytest.skip("SP needs t >= 2")
    s, b, h, a = 2048, 2, 12288, 96
    spec = ModelSpec.preset("gpt3-175b")
    got = sum(x.bytes for x in kept_terms(spec, s, b, tp=t, sp=sp, recompute=recompute))
    assert got == table2(s, b, h, a, t, sp, recompute)


def test_selective_recompute_saves_70_and_65_percent():
    # Korthikanti et al. 2022 §5: 70% for GPT-3 (5as/h = 80 of 114), 65% for MT-NLG (64 of 98).
    from parmem.papers import table

    exact = {"megatron-175b": 80 / 114, "megatron-530b": 64 / 98}
    paper = table("korthikanti2022_selective_saving")
    s = paper.settings["seq_len"]
    for row in paper.rows:
        spec = ModelSpec.preset(row["preset"])
        full = sum(x.bytes for x in kept_terms(spec, s, 1, tp=8, sp=True))
        sel = sum(x.bytes for x in kept_terms(spec, s, 1, tp=8, sp=True, recompute="selective"))
        assert 1 - sel / full == pytest.approx(exact[row["preset"]])
        assert round(100 * exact[row["preset"]]) == row["percent"]


def test_kept_terms_full_recompute_keeps_the_input_only():
    spec = ModelSpec.preset("llama-2-7b")
    (only,) = kept_terms(spec, 4096, 1, tp=4, sp=True, recompute="full", dropout=False)
    assert only.bytes == 2 * 4096 * 4096 // 4
    with pytest.raises(ValueError, match="recompute='some'"):
        kept_terms(spec, 4096, 1, recompute="some")


# ---------------------------------------------------------------------------- MoE router under SP
def test_router_logits_are_sequence_parallel():
    # Mixtral: E = 8 experts; router logits and probabilities, fp32: 8 bytes per token per expert.
    # With SP each rank routes its own s/t tokens (MoELayer.forward calls the router on the
    # [s/t, b, h] input), so the term should be 8 * (s/t) * b * E.
    from parmem.activations import layer_terms

    s, t, E = 4096, 8, 8
    terms = {x.name: x.bytes for x in layer_terms(ModelSpec.preset("mixtral-8x7b"), s, 1, tp=t,
                                                  sp=True, dropout=False)}
    assert terms["router logits and probabilities"] == 8 * (s // t) * E


def test_mla_saved_activations():
    """What one MLA layer keeps for backward in the paper profile (16-bit, s·b tokens): Q of
    a·(nope+rope), K and V of a·(nope+rope) and a·v, the output projection's input a·v, and the
    latents DeepSeek-V2 §2.1 adds: c_q (q_lora_rank, saved by its norm and by W_qb), [c_kv;
    k_rope] (kv_lora_rank + rope) and norm(c_kv) (kv_lora_rank)."""
    from parmem import ModelSpec
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


def test_torchtitan_sac_and_sequence_parallelism_at_large_t():
    """Issue 34's property report (Llama-2-7B, t = 16 with SP, s = 64) is torchtitan's policy:
    its op-level SAC saves the output of every second matmul, and w2 is row-parallel, so its
    output is the full-width s·b·h partial sum (bf16) before the reduce-scatter, not divided by
    t. Without recomputation torchtitan's sequence parallelism (DTensor) keeps the all-gathered
    inputs of wqkv and w1/w3, full width too (measured: data/engine_runs/fsdp2.json, case
    llama3-fsdp-tp), which SAC recomputes: so SAC still keeps less than no recomputation."""
    spec = ModelSpec.preset("llama-2-7b")
    kw = dict(tp=16, sp=True, engine="fsdp2", flash=True)
    none_terms = kept_terms(spec, 64, 1, recompute="none", **kw)
    none = sum(x.bytes for x in none_terms)
    sel = kept_terms(spec, 64, 1, recompute="selective", **kw)
    w2 = [x.bytes for x in sel if x.name == "mlp output (w2)"]
    assert w2 == [2 * 64 * spec.hidden]  # bf16, s·b·h, whole on every TP rank
    gathered = [x.bytes for x in none_terms if x.name in ("qkv input", "fc1 input")]
    assert gathered == [2 * 64 * spec.hidden] * 2  # bf16, s·b·h each, not divided by t
    assert not [x for x in sel if x.name in ("qkv input", "fc1 input")]
    assert sum(x.bytes for x in sel) < none
    # at t = 1 the policy saves less than keeping everything
    kw1 = dict(engine="fsdp2", flash=True)
    assert (sum(x.bytes for x in kept_terms(spec, 4096, 1, recompute="selective", **kw1))
            < sum(x.bytes for x in kept_terms(spec, 4096, 1, recompute="none", **kw1)))


# ------------------------------------------------------------------ issue 28: features, refusals
_LLAMA = dict(vocab_size=256, hidden=64, layers=2, heads=4, ffn_hidden=80, ffn_kind="swiglu",
              norm="rmsnorm", dropout=0.0)


@pytest.mark.parametrize("engine", ["paper", "megatron-core", "deepspeed", "fsdp2", "hf"])
@pytest.mark.parametrize("field, value, shown", [
    ("parallel_block", True, "parallel_block=True"),
    ("norm_position", "post", "norm_position=post"),
    ("embedding_norm", True, "embedding_norm=True"),
])
def test_every_table_refuses_a_layer_it_does_not_model(engine, field, value, shown):
    """A structural feature no table models is refused, naming the field and the table, by the
    named view and by the estimator alike (never counted as another layer)."""
    from dataclasses import replace

    from parmem import ParallelConfig, TrainingSetup, estimate

    kw = {field: value}
    if field == "parallel_block":
        kw["norms_per_layer"] = 2
    spec = replace(ModelSpec(name="t", **_LLAMA), **kw)
    with pytest.raises(ValueError, match=f"{shown} .* is not modelled by the"):
        layer_terms(spec, 32, 1, engine=engine)
    with pytest.raises(ValueError, match=shown):
        estimate(spec, ParallelConfig(), TrainingSetup(seq_len=32, engine=engine))


def test_engines_refuse_gemmas_sandwich_norms_the_paper_counts_them():
    """Gemma 2/3's post-attention and post-MLP norms: the paper's accounting keeps each norm's
    16-bit input (2sbh, Korthikanti et al. 2022 §4.1) and, with norm statistics, an rstd per
    token; Megatron-Core's and torchtitan's layers have no such norms and refuse the spec."""
    from dataclasses import replace

    base = ModelSpec(name="t", **_LLAMA)
    gemma = replace(base, sandwich_norm=True)
    s, b, h = 32, 2, 64
    plain = sum(x.bytes for x in layer_terms(base, s, b, norm_stat_bytes=4))
    four = sum(x.bytes for x in layer_terms(gemma, s, b, norm_stat_bytes=4))
    assert four - plain == 2 * (2 * s * b * h + 4 * s * b)
    for engine in ("megatron-core", "fsdp2"):
        with pytest.raises(ValueError, match="sandwich_norm=True .* not modelled"):
            layer_terms(gemma, s, b, engine=engine)


def test_the_paper_counts_soft_capping_and_the_gated_shared_expert():
    """Gemma 2's tanh soft-capping keeps its output, an s×s matrix per head when the scores are
    materialised (2as²b) and V logits per token on the last stage (2sbV); Qwen2-MoE's sigmoid
    gate keeps its output (2sb) and the shared expert's output it multiplies (2sbh)."""
    from dataclasses import replace

    base = ModelSpec(name="t", **_LLAMA)
    s, b, a, h, V = 32, 2, 4, 64, 256
    capped = replace(base, attn_softcap=50.0, logit_softcap=30.0)

    def total(spec, **kw):
        return sum(x.bytes for x in layer_terms(spec, s, b, **kw))

    assert total(capped) - total(base) == 2 * a * s * s * b
    assert total(capped, flash=True) == total(base, flash=True)
    assert total(capped, place="last") - total(base, place="last") == 2 * s * b * V
    moe = replace(base, num_experts=4, top_k=2, expert_ffn_hidden=40, shared_experts=1)
    gated = replace(moe, shared_expert_gate=True)
    assert total(gated) - total(moe) == 2 * s * b + 2 * s * b * h


def test_autocast_weight_casts_are_two_bytes_per_layer_matmul_weight():
    """Llama-2-7B by hand (Touvron et al. 2023): one layer's matmuls hold 4h² (q, k, v, o) + 3hf
    (gate, up, down) weights, h = 4096, f = 11008; autocast keeps a bf16 cast of each (2 bytes),
    32 layers, split over t under tensor parallelism."""
    from parmem.activations import autocast_weight_cast_bytes

    h, f = 4096, 11008
    spec = ModelSpec.preset("llama-2-7b")
    assert autocast_weight_cast_bytes(spec) == 2 * 32 * (4 * h * h + 3 * h * f)
    assert autocast_weight_cast_bytes(spec, tp=4) == 2 * 32 * (4 * h * h + 3 * h * f) // 4
    with pytest.raises(ValueError, match="spec"):
        autocast_weight_cast_bytes("llama-2-7b")
