"""Part III additions: tensor-parallel parameter split, kept activations under recomputation,
the TP/SP demos that measure model states, collectives and Table 2, and their figures/explorers.

Expected values are derived here by hand from the sources, never copied from a run:
Shoeybi et al. 2019 §3 (what a Megatron rank holds), Touvron et al. 2023 / the Llama-2-7B and
Llama-3-70B configs (shapes), Korthikanti et al. 2022 Table 2 and §5 (activations per layer,
selective recomputation), Rajbhandari et al. 2020 §3.1 (2 + 2 + 12 bytes per parameter).
"""

from __future__ import annotations

import os

import matplotlib
import pytest

matplotlib.use("Agg")

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate  # noqa: E402
from parmem.activations import kept_terms  # noqa: E402
from parmem.papers import korthikanti_table2  # noqa: E402
from parmem.sharding import tp_param_counts  # noqa: E402

N = int(os.environ.get("PARMEM_WORLD_SIZE", "2"))


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


# ---------------------------------------------------------------------------- kept_terms
def table2(s, b, h, a, t, sp, recompute):
    """Korthikanti et al. 2022 Table 2 as printed (exact rationals, data/papers.yaml). Its row
    for full recomputation keeps the layer's input, 2sbh; with sequence parallelism that input is
    the s/t slice, 2sbh/t."""
    if recompute == "full":
        full = korthikanti_table2("full", s, b, h, a, t)
        return full / t if sp else full
    case = "tp" + ("+sp" if sp else "") + ("+selective" if recompute == "selective" else "")
    return korthikanti_table2(case, s, b, h, a, t)


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


# ---------------------------------------------------------------------------- figures, explorers
def test_tp_shards_figure_draws_one_panel_per_matrix():
    from parmem.analyses import tp_shard_layout
    from parmem.book.plots import plot_tp_shards

    fig = plot_tp_shards(tp_shard_layout(ModelSpec.preset("llama-2-7b"), 4))
    # embedding, QKV, attention out, MLP in, MLP out, norms, LM head
    assert len(fig.axes) == 7
    qkv = fig.axes[1]
    # Q split in 4, K in 4, V in 4, plus the outline
    assert len(qkv.patches) == 4 + 4 + 4 + 1
    tied = plot_tp_shards(tp_shard_layout(ModelSpec.preset("gpt3-175b"), 8))
    assert len(tied.axes) == 6  # no separate LM head


def test_tp_components_figure_stacks_to_weights_per_rank():
    from parmem.analyses import tp_component_bytes
    from parmem.book.plots import plot_tp_components

    spec = ModelSpec.preset("llama-2-7b")
    fig = plot_tp_components(tp_component_bytes(spec, (1, 4), bytes_per_param=2))
    ax = fig.axes[0]
    tops = {}
    for p in ax.patches:
        x = round(p.get_x() + p.get_width() / 2)
        tops[x] = max(tops.get(x, 0), p.get_y() + p.get_height())
    assert tops[0] == pytest.approx(2 * 6_738_415_616 / 2**30)
    t4 = estimate(spec, ParallelConfig(tp=4), TrainingSetup(seq_len=128)).stages[0].params
    assert tops[1] == pytest.approx(t4 / 2**30)


def test_terms_compare_and_tradeoff_figures():
    from parmem.activations import layer_terms
    from parmem.analyses import tp_tradeoff
    from parmem.book.plots import plot_terms_compare, plot_tp_tradeoff

    spec = ModelSpec.preset("gpt3-175b")
    fig = plot_terms_compare({"TP": layer_terms(spec, 2048, 1, tp=8),
                              "TP + SP": layer_terms(spec, 2048, 1, tp=8, sp=True)})
    assert "342.0 MiB" in fig.axes[0].get_legend().get_texts()[1].get_text()  # sbh(34+80)/8
    fig = plot_tp_tradeoff(tp_tradeoff(ModelSpec.preset("llama-2-7b"),
                                       TrainingSetup(seq_len=4096), (1, 2, 4)))
    assert len(fig.axes) == 2


def test_explorers_build_headless():
    pytest.importorskip("ipywidgets")
    from parmem.book.widgets import (
        explore_layer_activations,
        explore_tp_shards,
        explore_tp_tradeoff,
        explore_tp_weights,
    )

    for make in (explore_tp_shards, explore_tp_weights, explore_tp_tradeoff,
                 explore_layer_activations):
        assert make(static=False).children  # controls and the output area


# ---------------------------------------------------------------------------- dist demos


@pytest.mark.dist
def test_tp_mixed_precision_states_per_rank(pool):
    V, h, a, L, s, b = 64, 32, 4, 2, 16, 2
    res = pool.run("parmem.dist.tp:demo_states", vocab=V, hidden=h, heads=a, layers=L, seq=s,
                   batch=b)
    # Shoeybi et al. 2019 §3: QKV (3h^2 + 3h), proj weight (h^2), FC1 (4h^2 + 4h) and FC2
    # weight (4h^2) split by t, embedding and head by vocabulary; row biases and norms replicated
    sharded = V * h // N + L * ((3 * h * h + 3 * h + h * h + 4 * h * h + 4 * h + 4 * h * h) // N) \
        + V * h // N
    replicated = L * (2 * h + 2 * 2 * h) + 2 * h  # proj + FC2 biases, 2 LayerNorms; final norm
    for row in res:
        assert row["sharded_numel"] == sharded and row["replicated_numel"] == replicated
        n = sharded + replicated
        assert row["params"] == row["params_estimate"] == 2 * n        # bf16 weights
        assert row["grads"] == row["grads_estimate"] == 2 * n          # bf16 gradients
        assert row["optimizer_estimate"] == 12 * n                     # fp32 master + moments
        assert row["optimizer"] == 12 * n + row["adam_steps"]          # + 0-d step counters
        # one fp32 step per tensor: 6 weight/bias pairs a layer, embedding, final norm (2), head
        assert row["adam_steps"] == 4 * (12 * L + 1 + 2 + 1)


@pytest.mark.dist
def test_tp_layer_all_reduces_one_sbh_tensor_per_block(pool):
    h, a, s, b = 32, 4, 16, 2
    res = pool.run("parmem.dist.tp:demo_comm", hidden=h, heads=a, seq=s, batch=b)
    sbh2 = 2 * s * b * h  # one bf16 [s, b, h] tensor
    for row in res:
        assert row["forward_all_reduce"] == [sbh2, sbh2]    # g after attention and after MLP
        assert row["backward_all_reduce"] == [sbh2, sbh2]   # f before MLP and before attention
        sbh = s * b * h
        assert row["table2"] == 10 * sbh + (24 * sbh + 5 * a * s * s * b) // N
        assert row["saved_bytes"] == row["table2"] + 2 * 2 * s * b * 2  # + LN mean/rstd (bf16)


@pytest.mark.dist
def test_every_case_of_table2_measured(pool):
    h, a, s, b = 32, 4, 16, 2
    res = pool.run("parmem.dist.sp:demo_recompute", hidden=h, heads=a, seq=s, batch=b)
    stats = 2 * 2 * s * b * 2  # 2 LayerNorms x (mean, rstd) x tokens x 2 bytes (bf16 on CPU)
    for row in res:
        for case, (sp, recompute) in {"tp": (False, "none"), "tp+sp": (True, "none"),
                                      "tp+selective": (False, "selective"),
                                      "tp+sp+selective": (True, "selective"),
                                      "full": (False, "full"),
                                      "tp+sp+full": (True, "full")}.items():
            got = row[case]
            assert got["table2"] == table2(s, b, h, a, N, sp, recompute)
            kept_stats = 0 if recompute == "full" else stats // (N if sp else 1)
            assert got["measured"] == got["table2"] + kept_stats, case
            assert got["grad_err"] == 0.0, case


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
