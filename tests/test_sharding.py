"""parmem.sharding: what one tensor-parallel rank holds, component by component.

Expected values are derived here by hand from the sources, never copied from a run:
Shoeybi et al. 2019 §3 (what a Megatron rank holds), Touvron et al. 2023 / the Llama-2-7B and
Llama-3-70B configs (shapes, data/models.toml), Lepikhin et al. 2021 (experts).
"""

from __future__ import annotations

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.inference import serving_weight_bytes
from parmem.sharding import kv_heads_local, linear_shapes, tp_param_counts


def by_name(rows):
    return {r.component: r for r in rows}


# ---------------------------------------------------------------------------- tp_param_counts
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_llama2_7b_component_by_component(t):
    # Llama-2-7B: V=32000, h=4096, L=32, a=kv=32, d=128, SwiGLU f=11008, RMSNorm, untied head.
    V, h, L, f = 32000, 4096, 32, 11008
    rows = by_name(tp_param_counts(ModelSpec.preset("llama-2-7b"), t))
    assert rows["embedding"].full == 131_072_000                  # 32000 x 4096
    assert rows["embedding"].per_rank == V // t * h
    assert rows["LM head"].per_rank == V // t * h                 # vocab-parallel head
    assert rows["attention Q, O"].per_rank == L * 2 * h * h // t
    assert rows["attention K, V"].per_rank == L * 2 * h * h // t
    assert rows["MLP"].per_rank == L * 3 * h * f // t
    assert rows["norms"].per_rank == rows["norms"].full == (2 * L + 1) * h
    assert rows["norms"].replicated and not rows["MLP"].replicated
    assert set(rows) == {"embedding", "attention Q, O", "attention K, V", "MLP", "norms",
                         "LM head"}
    assert sum(r.full for r in rows.values()) == 6_738_415_616  # Llama-2-7B, exact


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-3-70b", "mixtral-8x7b", "gpt3-175b",
                                  "gpt2", "llama-3-8b"])
@pytest.mark.parametrize("t", [1, 2, 4, 8, 16])
def test_per_rank_sum_equals_what_estimate_puts_on_a_gpu(name, t):
    spec = ModelSpec.preset(name)
    if spec.heads % t:
        pytest.skip(f"t={t} does not divide heads={spec.heads}")
    rows = tp_param_counts(spec, t)
    assert sum(r.full for r in rows) == spec.num_params()
    est = estimate(spec, ParallelConfig(tp=t), TrainingSetup(seq_len=1024)).stages[0]
    assert sum(r.per_rank for r in rows) == est.num_params


def test_gqa_kv_heads_stop_shrinking_past_kv_heads():
    # Llama-3-70B: a=64, kv=8, d=128, h=8192, L=80. At t=8 each rank has one kv head; at t=16
    # each rank still needs one whole kv head (for its 4 query heads), so K and V stay the same.
    spec = ModelSpec.preset("llama-3-70b")
    h, d, L = 8192, 128, 80
    kv8 = by_name(tp_param_counts(spec, 8))["attention K, V"]
    kv16 = by_name(tp_param_counts(spec, 16))["attention K, V"]
    assert kv8.per_rank == kv16.per_rank == L * 2 * h * d
    assert kv8.split == "kv heads" and "2 ranks" in kv16.split
    qo16 = by_name(tp_param_counts(spec, 16))["attention Q, O"]
    assert qo16.per_rank == L * 2 * h * (64 // 16) * d


def test_gpt3_biases_positions_and_tied_head():
    # GPT-3 175B: learned positions (2048 x h) and row-parallel biases replicated, LM head tied.
    h, L, t = 12288, 96, 8
    rows = by_name(tp_param_counts(ModelSpec.preset("gpt3-175b"), t))
    assert rows["positions"].per_rank == 2048 * h and rows["positions"].replicated
    assert rows["row-parallel biases"].per_rank == L * 2 * h
    assert rows["norms"].per_rank == (2 * L + 1) * 2 * h           # LayerNorm weight and bias
    assert "LM head" not in rows
    # the column-parallel biases travel with their weights: QKV bias 3h/t, FC1 bias 4h/t
    assert rows["attention Q, O"].per_rank + rows["attention K, V"].per_rank == \
        L * (4 * h * h + 3 * h) // t
    assert rows["MLP"].per_rank == L * (8 * h * h + 4 * h) // t
    assert rows["embedding"].per_rank == -(-50257 // t) * h        # vocab rows, padded


def test_mixtral_experts_split_over_e_then_t_router_replicated():
    h, L, f, E = 4096, 32, 14336, 8
    rows = by_name(tp_param_counts(ModelSpec.preset("mixtral-8x7b"), tp=2, ep=4))
    assert rows["experts"].per_rank == L * (E // 4) * 3 * h * f // 2
    assert rows["router"].per_rank == rows["router"].full == L * h * E


def test_tp_param_counts_rejects_bad_t():
    with pytest.raises(ValueError, match="tp=3 must divide heads=32"):
        tp_param_counts(ModelSpec.preset("llama-2-7b"), 3)
    with pytest.raises(ValueError, match="spec must be a ModelSpec"):
        tp_param_counts("llama-2-7b", 2)


# ---------------------------------------------------------------------------- kv_heads_local
def test_kv_heads_are_duplicated_beyond_kv_heads():
    # Llama-3-70B has 8 kv heads: at t = 16 each GPU keeps 64/16 = 4 query heads and one whole
    # kv head (held by two GPUs), 28,672/16 = 1,792 MLP columns, 128,256/16 = 8,016 vocab rows.
    spec = ModelSpec.preset("llama-3-70b")
    assert kv_heads_local(spec, 16) == 1
    rows = {r.component: r for r in tp_param_counts(spec, 16)}
    assert rows["attention K, V"].per_rank == 80 * 2 * 8192 * 128
    assert rows["MLP"].per_rank == 80 * 3 * 8192 * 1792
    assert rows["embedding"].per_rank == 8016 * 8192
    with pytest.raises(ValueError, match="tp=3"):
        serving_weight_bytes(spec, "fp16", 3)


# ---------------------------------------------------------------------------- linear_shapes
def test_linear_shapes_cover_the_layer_params():
    for name in ("llama-2-7b", "mixtral-8x7b", "llama-3-70b"):
        spec = ModelSpec.preset(name)
        c = spec.param_counts()
        in_layers = sum(i * o * n for _, i, o, n in linear_shapes(spec))
        assert in_layers == c["attention"] + c.get("mlp", 0) + c.get("experts", 0)
