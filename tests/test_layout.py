"""One layout, one engine, one answer (issue 26): every quantity that two modules need has one home
in :class:`parmem.layout.Layout`, and these cross-tests pin each pair that once disagreed to it.

Expected values are computed here from the published shapes and the engines' documented rules,
not read back from the code under test."""

from __future__ import annotations

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.comm import step_comm
from parmem.engines import engine
from parmem.inference import serving_layout, weight_bytes
from parmem.layout import Layout, check_layout, dispatch_slots, layout
from parmem.sharding import stage_params
from parmem.traces import training_step_events

MIXTRAL = ModelSpec.preset("mixtral-8x7b")
LLAMA7 = ModelSpec.preset("llama-2-7b")


def _op(comm, what):
    ops = [o for o in comm.ops if what in o.what]
    assert ops, what
    return ops[0]


# ---------------------------------------------------------------------------- group sizes
def test_group_sizes_have_one_home():
    par = ParallelConfig(dp=4, tp=2, pp=2, ep=4, cp=2, sp=True, zero=1)
    lay = layout(MIXTRAL, par, TrainingSetup(seq_len=4096, num_microbatches=4))
    assert (lay.dp_group, lay.expert_dp_group, lay.world_size) == (8, 2, 32)
    comm = step_comm(MIXTRAL, par, TrainingSetup(seq_len=4096, num_microbatches=4), stage=0)
    # ZeRO's reduce-scatter runs over d·cp ranks, the experts' over d·cp/e (Megatron-Core)
    assert _op(comm, "gradient reduce-scatter").n == lay.dp_group
    assert _op(comm, "expert gradient reduce-scatter").n == lay.expert_dp_group


def test_stage_walk_matches_the_split_and_the_sharding_table():
    spec = ModelSpec.preset("llama-3-70b")
    lay = layout(spec, ParallelConfig(dp=2, tp=8, pp=4), TrainingSetup(seq_len=2048),
                 layers_per_stage=[19, 20, 20, 21])
    assert [(s.start, s.layers, s.first, s.last) for s in lay.stages] == [
        (0, 19, True, False), (19, 20, False, False), (39, 20, False, False),
        (59, 21, False, True)]
    assert sum(s.layers for s in lay.stages) == spec.layers
    # the middle stages are one distinct stage shared by two
    assert [(s.index, n) for s, n in lay.distinct_stages()] == [(0, 1), (1, 2), (3, 1)]
    est = estimate(spec, lay.parallel, lay.setup, layers_per_stage=[19, 20, 20, 21])
    assert [b.num_params for b in est.stages] == [s.params for s in lay.stages]


# ---------------------------------------------------------------------------- boundaries
def test_boundary_tensor_is_the_pipeline_message_and_the_full_recompute_checkpoint():
    par = ParallelConfig(dp=2, tp=4, pp=2, sp=True)
    setup = TrainingSetup(seq_len=4096, micro_batch=2, num_microbatches=4, recompute="full")
    lay = layout(LLAMA7, par, setup)
    # s·b·h bf16 values divided over t by sequence parallelism (Korthikanti et al. 2022 §4.2.2)
    assert lay.boundary_bytes == 2 * 4096 * 2 * 4096 // 4
    assert _op(step_comm(LLAMA7, par, setup, stage=0), "forward activation send").size == (
        lay.boundary_bytes)
    one = estimate(LLAMA7, par, setup).stages[1]  # the last stage: 1 micro-batch in flight
    fewer = estimate(LLAMA7, par, setup, layers_per_stage=[17, 15]).stages[1]
    assert one.activations - fewer.activations == lay.boundary_bytes  # one layer's checkpoint


def test_moe_dispatch_buffer_is_the_all_to_all_message():
    """Mixtral, t = 2 with SP, e = 4 (the case the issue measured at 80 vs 40 MiB): each rank
    routes s/t tokens, each to top_k = 2 experts, h = 4,096 bf16 values per token slot."""
    par = ParallelConfig(dp=4, tp=2, ep=4, sp=True)
    setup = TrainingSetup(seq_len=4096)
    lay = layout(MIXTRAL, par, setup)
    message = (4096 // 2) * 2 * 4096 * 2
    assert lay.dispatch_bytes == message == 32 * 2**20
    assert _op(step_comm(MIXTRAL, par, setup), "dispatch + combine").size == message
    # the estimator's buffers: the SP all-gather output (s·b·h) and the dispatch send + receive
    est = estimate(MIXTRAL, par, setup).peak
    assert est.comm_buffers == 4096 * 4096 * 2 + 2 * message
    # a capacity factor pads the slots, rounded up, in both
    padded = TrainingSetup(seq_len=4096, capacity_factor=1.25)
    slots = dispatch_slots(2048, 2, 1.25)
    assert slots == 5120
    assert _op(step_comm(MIXTRAL, par, padded), "dispatch + combine").size == slots * 4096 * 2
    assert layout(MIXTRAL, par, padded).dispatch_bytes == slots * 4096 * 2


def test_sequence_parallelism_needs_the_tokens_to_split_everywhere():
    par = ParallelConfig(dp=1, tp=4, sp=True)
    odd = TrainingSetup(seq_len=4098)
    for fn in (estimate, step_comm, check_layout):
        with pytest.raises(ValueError, match="divisible by tp=4"):
            fn(LLAMA7, par, odd)


# ---------------------------------------------------------------------------- engines
@pytest.mark.parametrize(
    "name, par, setup, rule",
    [
        ("deepspeed", ParallelConfig(dp=4, tp=2), {}, "cannot run tp=2"),
        ("deepspeed", ParallelConfig(dp=2, pp=2, vpp=2),
         {"schedule": "interleaved", "num_microbatches": 4}, "interleaved"),
        ("deepspeed", ParallelConfig(dp=2, pp=2, zero=2), {}, "pp=2 with zero=2"),
        ("hf", ParallelConfig(dp=2, tp=2), {}, "cannot run tp=2"),
        ("hf", ParallelConfig(dp=2, pp=2), {}, "no pipeline"),
        ("megatron-core", ParallelConfig(dp=2, zero=3), {}, "zero=3"),
        ("megatron-core", ParallelConfig(dp=2, pp=2), {"schedule": "gpipe"}, "gpipe"),
        ("fsdp2", ParallelConfig(dp=2, zero=1), {}, "zero=1"),
        ("megatron-core", ParallelConfig(dp=2, pp=2, vpp=2), {"schedule": "zbv"}, "ZB-V"),
        ("deepspeed", ParallelConfig(dp=2, pp=2, vpp=2), {"schedule": "zbv"}, "ZB-V"),
        ("paper", ParallelConfig(dp=2, pp=2, vpp=2), {"schedule": "zbv"}, "ZB-V"),
        ("fsdp2", ParallelConfig(pp=2, tp=2, sp=True, vpp=2, zero=3),
         {"schedule": "zbv", "tp_comm_overlap": True}, "refuses compiled stages"),
    ],
)
def test_a_layout_the_engine_cannot_run_is_refused_by_name(name, par, setup, rule):
    st = TrainingSetup(seq_len=2048, engine=name, **setup)
    for fn in (estimate, step_comm, check_layout):
        with pytest.raises(ValueError, match=rf"engine='{name}'.*{rule}|{rule}.*engine='{name}'"):
            fn(LLAMA7, par, st)


def test_engine_defaults_are_the_engines():
    """Megatron-Core (TE), torchtitan (FlexAttention) and Transformers (sdpa) keep no s x s
    scores by default; the papers' accounting does; torchtitan's models have no dropout."""
    gpt = ModelSpec.preset("gpt2-medium")
    for name in ("megatron-core", "deepspeed", "fsdp2", "hf"):
        lay = layout(LLAMA7, ParallelConfig(), TrainingSetup(seq_len=4096, engine=name))
        assert lay.flash and engine(name).defaults.flash_attention
    assert not layout(LLAMA7, None, TrainingSetup(seq_len=4096)).flash
    assert layout(gpt, None, TrainingSetup(seq_len=1024, engine="hf")).dropout
    assert not layout(gpt, None, TrainingSetup(seq_len=1024, engine="fsdp2")).dropout
    # the explicit setting wins
    assert not layout(LLAMA7, None, TrainingSetup(seq_len=4096, engine="hf",
                                                  flash_attention=False)).flash


def test_fsdp2_under_a_pipeline_keeps_the_stage_unsharded():
    """torchtitan passes reshard_after_forward=False with PP and the schedule reduce-scatters once
    per step: bf16 weights (2 B) and fp32 gradient accumulators (4 B) of the whole stage."""
    par = ParallelConfig(dp=2, tp=8, pp=4, sp=True, zero=3)
    setup = TrainingSetup(seq_len=4096, num_microbatches=16, engine="fsdp2")
    spec = ModelSpec.preset("llama-2-70b")
    est = estimate(spec, par, setup)
    lay = layout(spec, par, setup)
    sp_out = 2 * 4096 * spec.hidden  # the SP all-gather output
    send_recv = 2 * lay.boundary_bytes
    for st, b in zip(lay.stages, est.stages, strict=True):
        dense, expert = stage_params(spec, 8, 1, st.layers, st.first, st.last)
        assert b.comm_buffers == sp_out + send_recv + 6 * (dense + expert)
    # without a pipeline: one layer gathered and its prefetch (bf16) + its fp32 gradient
    flat = estimate(spec, ParallelConfig(dp=8, tp=8, sp=True, zero=3),
                    TrainingSetup(seq_len=4096, engine="fsdp2")).peak
    layer = sum(stage_params(spec, 8, 1, 1, False, False))
    assert flat.comm_buffers == sp_out + (2 * 2 + 4) * layer


def test_deepspeed_fp32_partition_lives_in_the_optimizer_step_only():
    """stage_1_and_2.py step(): the fp32 gradient partition is made from the 16-bit gradients and
    freed after the step, when the activations are gone; the estimator's 2 + 18/d still holds
    for the model states (DeepSpeed's estimate_zero2_model_states_mem_needs)."""
    d, psi = 8, LLAMA7.num_params()
    est = estimate(LLAMA7, ParallelConfig(dp=d, zero=2),
                   TrainingSetup(seq_len=4096, engine="deepspeed")).peak
    shard = -(-psi // d)
    assert est.optimizer_step == 4 * shard
    assert est.grads == 2 * shard  # the 16-bit gradient partition only
    assert est.model_states == 2 * psi + 18 * shard
    fwd_bwd = sum(getattr(est, f) for f in est.FIELDS) + est.loss  # the loss runs at its peak
    assert est.activations > est.optimizer_step and est.total == fwd_bwd


# ---------------------------------------------------------------------------- second copies
def test_mtp_counts_alike_in_every_serving_path():
    spec = ModelSpec.preset("deepseek-v3")
    for dtype in ("bf16", "int8", "int4"):
        whole = weight_bytes(spec, dtype, tp=8)
        assert serving_layout(spec, "h200", tp=8, weight_dtype=dtype)["weights"] == whole
    mtp = spec.num_params(mtp=True) - spec.num_params()
    assert mtp > 0
    extra = weight_bytes(spec, "bf16", mtp=True) - weight_bytes(spec, "bf16")
    assert extra == 2 * mtp


@pytest.mark.parametrize("optimizer", ["adamw", "adam-8bit", "adafactor", "lion"])
def test_trace_model_states_are_the_estimators(optimizer):
    par = ParallelConfig(dp=4, zero=1)
    setup = TrainingSetup(seq_len=256, optimizer=optimizer)
    spec = ModelSpec.preset("gpt2-medium")
    live: dict[int, int] = {}
    for ev in training_step_events(spec, par, setup):
        if ev[0] == "alloc":
            live[ev[1]] = ev[2]
        else:
            live.pop(ev[1])
    est = estimate(spec, par, setup).peak
    assert sum(live.values()) == est.params + est.grads + est.optimizer


def test_layout_objects_are_built_once():
    setup = TrainingSetup(seq_len=2048)
    a = layout(LLAMA7, ParallelConfig(dp=2), setup)
    assert a is layout(LLAMA7, ParallelConfig(dp=2), setup)
    assert isinstance(a, Layout) and a.problems() == []


def test_zbv_puts_both_ends_on_rank_0_and_even_activations_on_every_rank():
    # ZB-V (Qi et al. 2024a §6; torchtitan maps rank r to stages r and 2p-1-r): rank 0 holds
    # the embedding and the LM head; every rank holds 2p chunks of L/(2p) layers at its peak
    # (tests/test_pipeline.py), and rank 0 the logits of one micro-batch
    p, m = 4, 16
    st = TrainingSetup(seq_len=2048, num_microbatches=m, schedule="zbv", engine="fsdp2")
    par = ParallelConfig(pp=p, vpp=2, zero=3)
    lay = layout(LLAMA7, par, st)
    assert [(s.first, s.last) for s in lay.stages] == [(True, True)] + [(False, False)] * 3
    est = estimate(LLAMA7, par, st)
    ends = stage_params(LLAMA7, 1, 1, 8, True, True, lay.engine.vocab_multiple)
    assert est.stages[0].num_params == sum(ends)
    assert len({s.activations for s in est.stages[1:]}) == 1
    assert est.stages[0].activations > est.stages[1].activations
    assert est.stages[0].logits == lay.logits_bytes
    assert all(s.logits == 0 for s in est.stages[1:])
    # a 1F1B layout of the same split holds its activations on stage 0 and the logits at the end
    one = estimate(LLAMA7, ParallelConfig(pp=p, zero=3),
                   TrainingSetup(seq_len=2048, num_microbatches=m, engine="fsdp2"))
    assert one.stages[1].activations < est.stages[1].activations
    with pytest.raises(ValueError, match=r"ZB-V runs two model chunks per rank in a V \(vpp=2\)"):
        layout(LLAMA7, ParallelConfig(pp=p, vpp=4, zero=3), st)
    # a chunk keeps what recomputation rebuilt until its weight backward: not counted, refused
    with pytest.raises(ValueError, match=r"schedule='zbv' with recompute='full' is not modelled"):
        layout(LLAMA7, par, TrainingSetup(seq_len=2048, num_microbatches=m, schedule="zbv",
                                          engine="fsdp2", recompute="full"))
