"""estimate() and model_state_bytes(): ZeRO's published example, sharding, stages, bad input."""

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate, model_state_bytes
from parmem.activations import per_layer_bytes
from parmem.papers import table

FIGURE1 = table("rajbhandari2020_figure1")


@pytest.mark.parametrize("row", FIGURE1.rows, ids=[r["label"] for r in FIGURE1.rows])
def test_zero_paper_figure1(row):
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, K = 12 (mixed-precision Adam):
    # 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU (GB = 1e9 bytes).
    fig = FIGURE1.settings
    assert fig["K"] == 12  # the K of model_state_bytes' default, mixed-precision AdamW
    m = model_state_bytes(fig["params"], dp=fig["dp"], zero=row["zero"])
    assert round(m.total / 1e9, 1) == row["gb"]


def test_zero_stage_formulas_16_bytes_per_param():
    # TOPICS row 16 / ZeRO §5: (2+2+12)Psi -> 4Psi + 12Psi/d -> 2Psi + 14Psi/d -> 16Psi/d.
    psi, d = 1_000_000, 8
    assert model_state_bytes(psi, d, 0).total == 16 * psi
    assert model_state_bytes(psi, d, 1).total == 4 * psi + 12 * psi // d
    assert model_state_bytes(psi, d, 2).total == 2 * psi + 14 * psi // d
    assert model_state_bytes(psi, d, 3).total == 16 * psi // d


def test_other_precisions_and_optimizers():
    n = 1000
    assert model_state_bytes(n, precision="fp32", optimizer="adamw").total == (4 + 4 + 8) * n
    assert model_state_bytes(n, optimizer="sgd").total == (2 + 2 + 4) * n  # fp32 master only
    assert model_state_bytes(n, optimizer="sgd-momentum").total == (2 + 2 + 8) * n
    assert model_state_bytes(n, precision="bf16").total == (2 + 2 + 4) * n
    # 8-bit Adam (Dettmers et al. 2022): 2 one-byte states + one fp32 absmax per 2048 values,
    # plus the fp32 master copy under mixed precision.
    n = 4096
    assert model_state_bytes(n, optimizer="adam-8bit").optimizer == 4 * n + 2 * (n + 4 * 2)


def test_uneven_zero_shards_round_up():
    # 10 values over 4 ranks: each rank holds ceil(10/4) = 3 (flat-buffer padding).
    assert model_state_bytes(10, dp=4, zero=3).params == 2 * 3


def llama7b_layer_params_per_rank(t):
    """Llama-2-7B, one layer on one TP rank, counted by hand from the architecture
    (Touvron et al. 2023; Megatron column/row sharding, RMSNorm replicated)."""
    h, f = 4096, 11008
    return 4 * h * h // t + 3 * h * f // t + 2 * h


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_llama2_7b_weights_per_gpu_under_tp(t):
    spec = ModelSpec.preset("llama-2-7b")
    est = estimate(spec, ParallelConfig(tp=t, sp=t > 1), TrainingSetup(seq_len=4096))
    expected = 32 * llama7b_layer_params_per_rank(t) + 2 * 32000 * 4096 // t + 4096
    assert est.stages[0].num_params == expected
    assert est.stages[0].params == 2 * expected        # bf16 weights
    assert est.stages[0].grads == 2 * expected
    assert est.stages[0].optimizer == 12 * expected    # fp32 master + two Adam moments


def test_pipeline_stages_hold_embedding_first_and_head_last():
    spec = ModelSpec.preset("llama-2-7b")
    est = estimate(spec, ParallelConfig(pp=4), TrainingSetup(seq_len=2048, num_microbatches=8))
    layer = llama7b_layer_params_per_rank(1)
    emb = 32000 * 4096
    assert [s.num_params for s in est.stages] == [8 * layer + emb, 8 * layer, 8 * layer,
                                                  8 * layer + emb + 4096]
    assert est.stages[-1].logits > 0 and all(s.logits == 0 for s in est.stages[:-1])


def test_tied_embedding_is_duplicated_on_the_last_stage():
    spec = ModelSpec.preset("gpt2")
    one = estimate(spec, ParallelConfig(), TrainingSetup(seq_len=1024))
    two = estimate(spec, ParallelConfig(pp=2), TrainingSetup(seq_len=1024))
    assert one.stages[0].num_params == spec.num_params()
    # with p = 2 the last stage keeps its own copy of the word embedding as the LM head
    assert sum(s.num_params for s in two.stages) == spec.num_params() + 50257 * 768


def test_activations_follow_table2_times_in_flight():
    # A GPT-shaped model so that Table 2 applies term for term; 1F1B with p = 4, m = 8: stage i
    # holds p - i micro-batches of its L/p layers (Narayanan et al. 2021 §2.2).
    spec = ModelSpec(name="gpt", vocab_size=51200, hidden=4096, layers=32, heads=32,
                     ffn_kind="gelu", bias=True, norm="layernorm", position="learned",
                     max_positions=2048, tied_embeddings=True)
    s, b, t = 2048, 1, 2
    par = ParallelConfig(tp=t, pp=4, sp=True)
    est = estimate(spec, par, TrainingSetup(seq_len=s, micro_batch=b, num_microbatches=8))
    layer = per_layer_bytes(s, b, 4096, 32, tp=t, sp=True)
    sbh_t = s * b * 4096 // t
    for i, st in enumerate(est.stages):
        inflight = 4 - i
        extra = 0
        if i == 0:
            extra += sbh_t * inflight       # embedding dropout mask (1 byte)
        if i == 3:
            extra += 2 * 2 * sbh_t          # final norm input + LM-head input (16-bit)
        assert st.activations == layer * 8 * inflight + extra
    # fp32 logits of one micro-batch on the last stage: 4 s b V / t
    assert est.stages[3].logits == 4 * s * b * 51200 // t


def test_gpipe_holds_all_microbatches():
    spec = ModelSpec.preset("llama-2-7b")
    g = estimate(spec, ParallelConfig(pp=4), TrainingSetup(seq_len=1024, num_microbatches=16,
                                                          schedule="gpipe"))
    f = estimate(spec, ParallelConfig(pp=4), TrainingSetup(seq_len=1024, num_microbatches=16))
    # GPipe holds m = 16 micro-batches, 1F1B holds 4 on stage 0: 4x the layer activations.
    emb_mask = 1024 * 4096  # embedding dropout mask per micro-batch
    assert g.stages[0].activations - 16 * emb_mask == 4 * (f.stages[0].activations - 4 * emb_mask)


def test_ddp_bucket_copy_doubles_gradients():
    spec = ModelSpec.preset("gpt2")
    view = estimate(spec, ParallelConfig(dp=4), TrainingSetup(seq_len=1024))
    copy = estimate(spec, ParallelConfig(dp=4), TrainingSetup(seq_len=1024, grad_buckets="copy"))
    assert copy.peak.comm_buffers - view.peak.comm_buffers == view.peak.grads


def test_experts_shard_over_ep():
    spec = ModelSpec.preset("mixtral-8x7b")
    expert = 3 * 4096 * 14336
    for e in (1, 2, 4, 8):
        est = estimate(spec, ParallelConfig(dp=8, ep=e), TrainingSetup(seq_len=4096))
        dense = spec.num_params() - 32 * 8 * expert
        assert est.stages[0].num_params == dense + 32 * (8 // e) * expert


def test_expert_states_shard_over_the_expert_data_parallel_group():
    spec = ModelSpec.preset("mixtral-8x7b")
    expert_n = 32 * 2 * 3 * 4096 * 14336          # 2 experts per rank at e = 4
    dense_n = spec.num_params() - 32 * 8 * 3 * 4096 * 14336
    est = estimate(spec, ParallelConfig(dp=8, ep=4, zero=1), TrainingSetup(seq_len=4096))
    # dense optimizer states over d = 8 ranks, expert states over d/e = 2 ranks
    assert est.stages[0].optimizer == 12 * (-(-dense_n // 8)) + 12 * (-(-expert_n // 2))


def test_str_and_html_and_dict():
    est = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(tp=2, pp=2, dp=2, zero=1),
                   TrainingSetup(seq_len=4096, num_microbatches=4))
    text = str(est)
    assert "GiB per GPU" in text and "peak: stage" in text
    assert "<table>" in est._repr_html_()
    d = est.to_dict()
    assert d["peak_bytes"] == max(s["total"] for s in d["stages"])
    assert all(isinstance(v, int) for s in d["stages"] for k, v in s.items()
               if k not in ("notes",))


@pytest.mark.parametrize("par,setup,kw,msg", [
    (dict(tp=3), {}, {}, "tp=3 must divide heads=32"),
    (dict(pp=48), {}, {}, "pp=48 > layers=32"),
    (dict(dp=0), {}, {}, "dp=0 must be an integer >= 1"),
    (dict(zero=4), {}, {}, "zero=4 must be an integer in 0..3"),
    (dict(sp=True), {}, {}, "sp=True needs tp >= 2"),
    (dict(ep=2, dp=2), {}, {}, "needs a mixture-of-experts model"),
    (dict(dp=3, ep=2), {}, {}, r"ep=2 must divide dp\*cp=3"),
    (dict(pp=2, vpp=2), {}, {}, "interleaved schedule needs vpp >= 2"),
    (dict(pp=4, vpp=2), dict(schedule="interleaved", num_microbatches=6), {},
     "num_microbatches=6 must be a multiple of pp=4"),
    (dict(pp=2), {}, dict(layers_per_stage=[10, 10]), "must sum to layers=32"),
    (dict(pp=2), {}, dict(layers_per_stage=[32]), "needs pp=2"),
    (dict(pp=2), {}, dict(layers_per_stage=[32, 0]), r"layers_per_stage\[1\]=0"),
    (dict(dp=2, tp=2), {}, dict(world_size=8), r"dp\*tp\*pp\*cp = 2\*2\*1\*1 = 4 must equal"),
    (dict(cp=3), {}, {}, "cp=3 must divide seq_len=4096"),
    (dict(), dict(micro_batch=0), {}, "micro_batch=0 must be an integer >= 1"),
    (dict(), dict(precision="fp8"), {}, "precision='fp8' must be one of"),
    (dict(), dict(optimizer="lion"), {}, "optimizer='lion' must be one of"),
    (dict(), dict(recompute="partial"), {}, "recompute='partial' must be one of"),
])
def test_invalid_configs(par, setup, kw, msg):
    spec = ModelSpec.preset("llama-2-7b")
    with pytest.raises(ValueError, match=msg):
        estimate(spec, ParallelConfig(**par), TrainingSetup(seq_len=4096, **setup), **kw)


def test_learned_positions_limit_the_sequence():
    with pytest.raises(ValueError, match="seq_len=2048 > max_positions=1024"):
        estimate(ModelSpec.preset("gpt2"), ParallelConfig(), TrainingSetup(seq_len=2048))


def test_gqa_kv_heads_replicate_when_tp_exceeds_them():
    # Llama-3-8B has 8 kv heads; at t = 16 each rank has 2 query heads and keeps one whole kv
    # head (two ranks share each kv head), as vLLM and Megatron-style GQA sharding do.
    spec = ModelSpec.preset("llama-3-8b")
    h, d, t = 4096, 128, 16
    layer = h * 2 * d + 2 * h * d + 2 * d * h + 3 * h * 14336 // t + 2 * h
    expected = 32 * layer + 2 * (128256 // t) * h + h
    e16 = estimate(spec, ParallelConfig(tp=t), TrainingSetup(seq_len=1024))
    assert e16.stages[0].num_params == expected
    odd = ModelSpec(name="odd", vocab_size=1000, hidden=768, layers=2, heads=12, kv_heads=4)
    with pytest.raises(ValueError, match="tp=6 and kv_heads=4: one must divide the other"):
        estimate(odd, ParallelConfig(tp=6), TrainingSetup(seq_len=128))
