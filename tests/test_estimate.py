"""estimate(): weights per GPU under TP, pipeline stages, activations in flight, buffers, experts,
its outputs.

Expected values are counted by hand from the architectures (Touvron et al. 2023; Megatron
column/row sharding, Shoeybi et al. 2019 §3), Korthikanti et al. 2022 Table 2, the in-flight
counts of Narayanan et al. 2021 §2.2 and ZeRO's 2 + 2 + 12 bytes per parameter
(Rajbhandari et al. 2020 §3.1), never copied from a run.
"""

import pytest
from helpers import MIXTRAL

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.activations import per_layer_bytes


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


# ---------------------------------------------------------------------------- EP across d·cp
def test_expert_parallelism_may_span_context_parallel_ranks():
    # Megatron-Core carves expert parallelism out of the d·cp ranks: d=2, cp=4, e=8 is valid and
    # each rank keeps one of Mixtral's 8 experts per layer (3 h f parameters each, h=4096,
    # f=14336), the rest of the model whole.
    par = ParallelConfig(dp=2, cp=4, ep=8)
    est = estimate(MIXTRAL, par, TrainingSetup(seq_len=4096))
    dense = MIXTRAL.num_params() - 32 * 8 * 3 * 4096 * 14336
    assert est.stages[0].num_params == dense + 32 * 1 * 3 * 4096 * 14336
    with pytest.raises(ValueError, match=r"ep=8 must divide dp\*cp=6"):
        ParallelConfig(dp=2, cp=3, ep=8)


def test_all_to_all_buffers_grow_with_the_capacity_factor():
    # a capacity factor pads every expert's receive buffer: send + receive 2 * s*b*k*h*cf 16-bit
    par = ParallelConfig(dp=8, ep=8)
    one = estimate(MIXTRAL, par, TrainingSetup(seq_len=4096, capacity_factor=1.0)).stages[0]
    two = estimate(MIXTRAL, par, TrainingSetup(seq_len=4096, capacity_factor=2.0)).stages[0]
    assert two.comm_buffers - one.comm_buffers == 2 * 2 * 4096 * 2 * 4096 * (2.0 - 1.0)


@pytest.mark.parametrize(("engine", "per_logit"), [("paper", 0), ("megatron-core", 2),
                                                   ("fsdp2", 8), ("hf", 8)])  # fmt: skip
def test_the_loss_transient_sits_on_the_last_stage_only(engine, per_logit):
    """loss_peak (bytes per logit at the loss's peak, measured per engine: tests/test_measure.py)
    less the 4 the logits term keeps: 8 more for an unfused F.cross_entropy on fp32-cast logits
    (its two gradients), 2 for Megatron-Core's in-place loss (the bf16 logits beside their fp32
    copy), none under the papers' accounting. One micro-batch's worth, whatever is in flight."""
    from parmem.layout import layout

    spec = ModelSpec.preset("llama-3-8b")
    pp = 1 if engine == "hf" else 2
    gpipe = engine in ("paper", "fsdp2")  # Megatron-Core has no GPipe schedule
    setup = TrainingSetup(seq_len=2048, micro_batch=2, num_microbatches=4, engine=engine,
                          schedule="gpipe" if gpipe else "1f1b", loss_chunks=0)  # fmt: skip
    est = estimate(spec, ParallelConfig(pp=pp), setup)
    last = est.stages[-1]
    logits_one = layout(spec, ParallelConfig(pp=pp), setup).logits_bytes
    assert last.logits == logits_one * (4 if gpipe and pp > 1 else 1)  # GPipe holds all four
    assert last.loss == logits_one // 4 * per_logit
    assert all(s.loss == 0 for s in est.stages[:-1])
    assert last.total == sum(getattr(last, f) for f in last.FIELDS) + last.loss + last.step_extra


def test_recomputation_rebuilds_after_the_loss_not_beside_it():
    """Full recomputation's working set (one layer rebuilt, what it keeps less what a plain
    forward keeps) and the loss's transient exist at different moments of the backward: the
    peak holds the larger, so the estimate adds the transient less the working set it already
    counts."""
    from dataclasses import replace

    from parmem.estimate import activation_terms, loss_transient
    from parmem.layout import layout

    spec = ModelSpec.preset("llama-3-8b")
    setup = TrainingSetup(seq_len=4096, engine="fsdp2", recompute="full", loss_chunks=0)
    lay = layout(spec, ParallelConfig(), setup)
    full, kept = (sum(x) for x in activation_terms(lay)[:2])
    transient = loss_transient(lay)
    assert transient == 8 * 4096 * spec.vocab_size  # 12 - 4 bytes per logit, one sequence
    assert 0 < full - kept < transient
    peak = estimate(spec, ParallelConfig(), setup).peak
    assert peak.loss == transient - (full - kept)
    plain = estimate(spec, ParallelConfig(), replace(setup, recompute="none")).peak
    assert plain.loss == transient  # nothing rebuilt


@pytest.mark.parametrize(("b", "chunks"), [(2, None), (1, 4), (2, 1), (1, 32)])
def test_torchtitan_chunks_its_own_llama_loss(b, chunks):
    """torchtitan 0.3.0's llama3_8b config wraps the loss in ChunkedLossWrapper (8 chunks): the
    decoder's forward stops before the LM head, so what the last stage keeps through the
    decoder's backward is the hidden states' bf16 gradient, not fp32 logits, and the loss's
    peak is, counted by hand from tests/test_measure.py's measurement of the wrapper under
    FSDP2: the fp32 gradient buffer (4 bytes per hidden-state element), the chunks' copies when
    b > 1 and N > 1 (2), the head's gathered bf16 weight (2 per weight) and, with N > 1, its
    fp32 gradient accumulator (4); then the larger of one chunk's bf16 logits beside the
    cross-entropy's 12 bytes per logit, and (N > 1) the head's new gradient (4 per weight) with
    2 per logit and the chunk's input gradient."""
    spec = ModelSpec.preset("llama-3-8b")
    s, h, V = 8192, spec.hidden, spec.vocab_size
    setup = TrainingSetup(seq_len=s, micro_batch=b, engine="fsdp2", loss_chunks=chunks)
    last = estimate(spec, ParallelConfig(dp=8, zero=3), setup).peak
    n = 8 if chunks is None else chunks
    T, ch = s * b, s * b * V // n
    hand = 4 * T * h + (2 * T * h if b > 1 and n > 1 else 0) + 2 * V * h
    hand += 4 * V * h if n > 1 else 0
    hand += max(14 * ch, (4 * V * h + 2 * ch + 2 * T * h // n) if n > 1 else 0)
    assert last.logits == 2 * T * h
    assert last.loss == hand


def test_the_engines_default_chunks_must_divide_the_sequence():
    """torchtitan checks that its chunks divide the rank's sequence: a layout whose default 8
    chunks do not is refused by name (and parmem.fit.max_seq_len steps by them)."""
    from parmem.fit import max_seq_len

    spec, par = ModelSpec.preset("llama-3-8b"), ParallelConfig(dp=8, zero=3)
    with pytest.raises(ValueError, match="chunks the loss of llama-3-8b in 8"):
        estimate(spec, par, TrainingSetup(seq_len=4100, engine="fsdp2"))
    estimate(spec, par, TrainingSetup(seq_len=4100, engine="fsdp2", loss_chunks=0))
    ans = max_seq_len(spec, par, TrainingSetup(seq_len=1, engine="fsdp2"), "h100-sxm")
    assert ans.value % 8 == 0


def test_only_torchtitans_own_models_chunk_by_default():
    """The default follows the engine's recipe for the model: torchtitan's Transformers backend
    (every model torchtitan does not build itself) and every other engine compute the loss
    whole, and keep the fp32 logits."""
    from parmem.estimate import kept_logits
    from parmem.layout import layout

    par = ParallelConfig(dp=8, zero=3)
    for name, engine, chunks in (("llama-3-8b", "fsdp2", 8), ("llama-3-70b", "fsdp2", 8),
                                 ("mistral-7b", "fsdp2", 0), ("llama-3-8b", "hf", 0),
                                 ("llama-3-8b", "megatron-core", 0)):  # fmt: skip
        setup = TrainingSetup(seq_len=4096, engine=engine)
        p = {"megatron-core": ParallelConfig(dp=8, zero=1), "hf": ParallelConfig()}.get(engine, par)
        lay = layout(ModelSpec.preset(name), p, setup)
        assert lay.loss_chunks == chunks, (name, engine)
        peak = estimate(ModelSpec.preset(name), p, setup).peak
        assert peak.logits == (kept_logits(lay) if chunks else lay.logits_bytes)
        assert (peak.logits < lay.logits_bytes) == bool(chunks)


@pytest.mark.parametrize(("name", "engine", "chunks", "seq", "match"), [
    ("llama-3-8b", "megatron-core", 4, 4096, "whole micro-batch"),
    ("llama-3-8b", "hf", 2, 4096, "whole micro-batch"),
    ("mistral-7b", "fsdp2", 8, 4096, "Transformers backend"),
    ("llama-3-8b", "fsdp2", 3, 4096, "must divide"),
])  # fmt: skip
def test_loss_chunks_an_engine_cannot_run_are_refused_by_name(name, engine, chunks, seq, match):
    par = {"megatron-core": ParallelConfig(dp=8, zero=1), "hf": ParallelConfig()}.get(
        engine, ParallelConfig(dp=8, zero=3))
    setup = TrainingSetup(seq_len=seq, engine=engine, loss_chunks=chunks)
    with pytest.raises(ValueError, match=match):
        estimate(ModelSpec.preset(name), par, setup)
    with pytest.raises(ValueError, match="loss_chunks"):
        TrainingSetup(seq_len=seq, loss_chunks=-1)


def test_torchtitans_tensor_parallel_loss_holds_sixteen_bytes_a_logit():
    """Under TP torchtitan's cross_entropy_loss runs _LossParallelCrossEntropy on the
    vocab-sharded logits, measured at 16 bytes per logit (tests/test_measure.py), 4 more than
    the plain F.cross_entropy: the whole loss's transient is 12 per logit of the rank's V/t
    above the kept fp32 logits, and a chunk's cross-entropy moment (2 + 16) per chunk logit."""
    from parmem.estimate import loss_pieces
    from parmem.layout import layout

    spec = ModelSpec.preset("llama-3-8b")
    par = ParallelConfig(dp=4, tp=2, sp=True, zero=3)
    whole = layout(spec, par, TrainingSetup(seq_len=8192, engine="fsdp2", loss_chunks=0))
    assert estimate(spec, par, whole.setup).peak.loss == whole.logits_bytes // 4 * 12
    chunked = layout(spec, par, TrainingSetup(seq_len=8192, engine="fsdp2", loss_chunks=1))
    assert sum(loss_pieces(chunked)) == (4 * 8192 * spec.hidden + 2 * spec.vocab_size // 2
                                         * spec.hidden + 18 * 8192 * spec.vocab_size // 2)
