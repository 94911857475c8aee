"""Part V (experts, 3D layouts, the largest runs): layout communication, placement, sweeps,
axis-by-axis estimates, the hybrid TP × DP/ZeRO-1 demo, and the figures and explorers.

Expected values are derived by hand in each test from the formulas they cite (Shoeybi et al. 2019
§3 for tensor parallelism, Rajbhandari et al. 2020 §5/§7 for ZeRO, Lepikhin et al. 2021 §3 for the
all-to-all, Thakur et al. 2005 for the ring), never copied from a run of the code under test.
"""

from __future__ import annotations

import os

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate, hardware_preset
from parmem.analyses import axis_by_axis, layout_sweep
from parmem.comm import (
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    placement,
    reduce_scatter_bytes,
    send_recv_bytes,
    step_comm,
)

GiB = 2**30
LLAMA7 = ModelSpec.preset("llama-2-7b")
MIXTRAL = ModelSpec.preset("mixtral-8x7b")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------- placement
@pytest.mark.parametrize("par, expect", [
    # Megatron order tp-cp-ep-dp-pp on 8-GPU nodes
    (ParallelConfig(dp=2, tp=8, pp=4), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                           dp_intra=False, pp_intra=False)),
    (ParallelConfig(dp=8, pp=8), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                      dp_intra=True, pp_intra=False)),
    (ParallelConfig(dp=2, tp=16), dict(tp_intra=False, cp_intra=False, ep_intra=False,
                                       dp_intra=False, pp_intra=False)),
    (ParallelConfig(dp=16, ep=8, pp=4), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                             dp_intra=False, pp_intra=False)),
    (ParallelConfig(dp=2, tp=2, pp=2), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                            dp_intra=True, pp_intra=True)),
])
def test_placement_follows_megatron_rank_order(par, expect):
    assert placement(par, gpus_per_node=8) == expect


def test_placement_rejects_bad_node_size():
    with pytest.raises(ValueError, match="gpus_per_node"):
        placement(ParallelConfig(), gpus_per_node=0)


# ---------------------------------------------------------------------------- step_comm
def _llama7_local_params(t: int) -> int:
    """Llama-2-7B parameters on one GPU at tensor-parallel size t, p = 1 (Shoeybi et al. §3):
    attention 4h²/t (MHA), SwiGLU 3hf/t, two RMSNorms h each (replicated), vocab-parallel
    embedding and LM head V·h/t each, final norm h."""
    h, f, L, V = 4096, 11008, 32, 32000
    return L * (4 * h * h // t + 3 * h * f // t + 2 * h) + 2 * V * h // t + h


def test_layout_comm_dense_tp_dp_by_hand():
    t, d, m, s = 4, 2, 4, 1024
    par = ParallelConfig(dp=d, tp=t)
    setup = TrainingSetup(seq_len=s, num_microbatches=m)
    com = step_comm(LLAMA7, par, setup)
    x = s * 1 * 4096 * 2  # one bf16 s·b·h tensor
    # 2 all-reduces forward (attention out, MLP out) + 2 backward, per layer per micro-batch
    assert com.tp == 4 * 32 * m * all_reduce_bytes(x, t)
    # ZeRO-0: one all-reduce of the bf16 gradients of this GPU's parameters
    assert com.dp == all_reduce_bytes(2 * _llama7_local_params(t), d)
    assert com.pp == com.ep == com.cp == com.sp == 0


def test_layout_comm_zero1_and_pipeline_by_hand():
    d, p, m, s = 4, 4, 8, 2048
    par = ParallelConfig(dp=d, pp=p, zero=1)
    com = step_comm(LLAMA7, par, TrainingSetup(seq_len=s, num_microbatches=m), stage=1)
    x = s * 4096 * 2
    # a middle stage sends its output forward and its input gradient backward per micro-batch
    assert com.pp == 2 * m * send_recv_bytes(x)
    # ZeRO-1: reduce-scatter of gradients + all-gather of updated weights, once per step
    h, f = 4096, 11008
    n = 8 * (4 * h * h + 3 * h * f + 2 * h)  # 8 layers of stage 1, no embedding or head
    assert com.dp == reduce_scatter_bytes(2 * n, d) + all_gather_bytes(2 * n, d)


def test_layout_comm_moe_all_to_all_and_expert_group_by_hand():
    d, e, p, m, s = 16, 8, 4, 16, 4096
    par = ParallelConfig(dp=d, pp=p, ep=e, zero=1)
    com = step_comm(MIXTRAL, par, TrainingSetup(seq_len=s, num_microbatches=m), stage=1)
    # per MoE layer per micro-batch: dispatch + combine, forward and backward: 4 all-to-alls
    # of top_k · s · b · h bf16 values (Lepikhin et al. 2021 §3)
    buf = 2 * s * 4096 * 2
    assert com.ep == 4 * (32 // p) * m * all_to_all_bytes(buf, e)
    # expert gradients reduce over the expert-data-parallel group of d / e ranks
    expert_ops = [o for o in com.ops if o.what.startswith("expert")]
    assert expert_ops and all(o.n == d // e for o in expert_ops)
    experts_here = (32 // p) * (8 // e) * 3 * 4096 * 14336
    assert sum(o.bytes for o in expert_ops) == 2 * reduce_scatter_bytes(2 * experts_here, d // e)


def test_layout_comm_default_stage_is_the_busiest():
    par = ParallelConfig(dp=2, pp=4, zero=1)
    setup = TrainingSetup(seq_len=1024, num_microbatches=8)
    each = [step_comm(LLAMA7, par, setup, stage=i).total for i in range(4)]
    assert step_comm(LLAMA7, par, setup).total == max(each)
    with pytest.raises(ValueError, match="stage"):
        step_comm(LLAMA7, par, setup, stage=4)


def test_layout_comm_rejects_invalid_layout():
    with pytest.raises(ValueError, match="tp=3"):
        step_comm(LLAMA7, ParallelConfig(tp=3), TrainingSetup(seq_len=1024))


# ---------------------------------------------------------------------------- layout_sweep
def test_layout_sweep_enumerates_every_valid_grid():
    setup = TrainingSetup(seq_len=2048, flash_attention=True, dropout=False)
    rows = layout_sweep(LLAMA7, 8, setup, global_batch=16, zero=1)
    # t must divide 32 heads and p ≤ 32 layers: every (t, p) with t·p | 8 is valid
    assert sorted((r["t"], r["p"]) for r in rows) == sorted(
        (t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if 8 % (t * p) == 0)
    h100 = hardware_preset("h100-sxm")
    for r in rows:
        assert r["d"] * r["t"] * r["p"] == 8 and r["m"] == 16 // r["d"]
        par = ParallelConfig(dp=r["d"], tp=r["t"], pp=r["p"], sp=r["t"] > 1, zero=1)
        est = estimate(LLAMA7, par, TrainingSetup(seq_len=2048, flash_attention=True,
                                                  dropout=False, num_microbatches=r["m"]))
        assert r["peak_bytes"] == est.peak_bytes
        assert r["fits"] == (est.peak_bytes <= h100.memory_bytes)
        assert r["comm_bytes"] == sum(r[c] for c in ("dp", "tp", "sp", "pp", "ep", "cp"))


def test_layout_sweep_skips_uneven_batches_and_bad_tp():
    setup = TrainingSetup(seq_len=1024)
    rows = layout_sweep(LLAMA7, 64, setup, global_batch=8)
    assert all(8 % r["d"] == 0 for r in rows)          # d must divide the global batch
    assert all(32 % r["t"] == 0 for r in rows)         # t must divide the heads


def test_tp_across_nodes_is_slower_than_inside():
    """The same TP traffic on InfiniBand instead of NVLink: the bandwidth ratio, 450/50."""
    spec = ModelSpec.preset("llama-3-70b")
    par = ParallelConfig(dp=2, tp=8, pp=4, sp=True, zero=1)
    com = step_comm(spec, par, TrainingSetup(seq_len=4096, num_microbatches=64))
    inside = com.times("h100-sxm", **placement(par))["sp"]
    outside = com.times("h100-sxm", **{**placement(par), "tp_intra": False})["sp"]
    assert 7 < outside / inside < 9.5


# ---------------------------------------------------------------------------- axis_by_axis
def test_axis_by_axis_ends_at_the_full_estimate_and_each_axis_divides_its_terms():
    spec = ModelSpec.preset("gpt3-175b")
    par = ParallelConfig(dp=24, tp=8, pp=8, sp=True, zero=1)
    setup = TrainingSetup(seq_len=2048, num_microbatches=96, recompute="selective")
    steps = axis_by_axis(spec, par, setup)
    assert list(steps) == ["1 GPU", "d=24", "+ZeRO-1", "+t=8", "+SP", "+p=8",
                           "+selective recompute"]
    assert steps["+selective recompute"].stages == estimate(spec, par, setup).stages
    one, z1 = steps["d=24"].peak, steps["+ZeRO-1"].peak
    psi = spec.num_params()
    assert one.model_states == 16 * psi                      # plain DP divides nothing
    assert z1.params == 2 * psi and z1.grads == 2 * psi      # ZeRO-1 keeps weights, gradients
    assert z1.optimizer == 12 * cdiv(psi, 24)                # ... and shards the optimizer
    tp8, sp = steps["+t=8"].peak, steps["+SP"].peak
    assert tp8.model_states == sp.model_states and sp.activations < tp8.activations


def test_axis_by_axis_skips_axes_that_are_not_used():
    steps = axis_by_axis(LLAMA7, ParallelConfig(tp=2), TrainingSetup(seq_len=1024))
    assert list(steps) == ["1 GPU", "+t=2"]


# ---------------------------------------------------------------------------- figures, widgets
def test_figures_and_explorers_render():
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipywidgets")
    import matplotlib.pyplot as plt

    from parmem.book.plots import plot_axis_steps, plot_tradeoff
    from parmem.book.widgets import explore_3d, explore_axes, explore_experts

    rows = layout_sweep(LLAMA7, 8, TrainingSetup(seq_len=1024), global_batch=8)
    fig = plot_tradeoff(rows, capacity=80 * GiB, highlight=(rows[0]["d"], rows[0]["t"],
                                                            rows[0]["p"]))
    assert fig.axes and fig.axes[0].get_yscale() == "log"
    fig2 = plot_axis_steps(axis_by_axis(LLAMA7, ParallelConfig(dp=2, zero=1),
                                        TrainingSetup(seq_len=1024)), capacity=80 * GiB)
    assert len(fig2.axes[0].get_xticks()) == 3
    plt.close("all")
    for make in (lambda: explore_experts(static=False), lambda: explore_3d(world=16, tp=4, pp=2,
                                                                           static=False),
                 lambda: explore_axes(static=False)):
        box = make()
        assert box.children  # controls and the output area
    plt.close("all")


# ---------------------------------------------------------------------------- the hybrid demo
N = int(os.environ.get("PARMEM_WORLD_SIZE", "2"))




@pytest.mark.dist
@pytest.mark.parametrize("zero", [0, 1])
def test_hybrid_tp_dp_matches_one_process_and_the_formulas(pool, zero):
    L, h, V, s, b = 2, 32, 64, 16, 2
    for t in (k for k in (1, 2, 4) if N % k == 0):
        d = N // t
        for row in pool.run("parmem.dist.hybrid:demo", tp=t, zero=zero, layers=L, hidden=h,
                            vocab=V, seq=s, batch=b):
            assert row["d"] == d and row["t"] == t
            assert row["grad_err"] < 1e-6 and row["param_err"] < 1e-4
            # GPT layer, biases everywhere (Shoeybi §3): QKV and FC1 column-parallel (weights
            # and biases split), projection and FC2 row-parallel (bias replicated), 2 LayerNorms
            layer = (3 * h * h + 3 * h) // t + h * h // t + h + (4 * h * h + 4 * h) // t \
                + 4 * h * h // t + h + 2 * 2 * h
            psi = L * layer + 2 * V * h // t + 2 * h   # + embedding, head, final LayerNorm
            assert row["params"] == row["grads"] == 4 * psi
            shard = cdiv(psi, d) if zero else psi
            assert row["optimizer"] == 8 * shard + 4     # Adam moments + its step counter
            # DP: ZeRO-0 one all-reduce; ZeRO-1 reduce-scatter + all-gather (same ring bytes)
            grads = 4 * psi
            dp = all_reduce_bytes(grads, d) if zero == 0 else \
                reduce_scatter_bytes(grads, d) + all_gather_bytes(grads, d)
            assert row["dp_bytes"] == row["dp_bytes_model"] == dp
            # TP: 4 all-reduces of s·b·h per layer, + embedding and head all-reduces, + logits
            x = s * b * h * 4
            tp = 4 * L * all_reduce_bytes(x, t) + 2 * all_reduce_bytes(x, t) \
                + all_gather_bytes(s * b * V * 4, t)
            assert row["tp_bytes"] == tp == row["tp_bytes_model"] + row["tp_bytes_extras"]
            assert row["tp_collectives"] == (4 * L + 3 if t > 1 else 0)


@pytest.mark.dist
def test_hybrid_rejects_bad_arguments(pool):
    from parmem.dist import RankError

    with pytest.raises(RankError, match="zero=2"):
        pool.run("parmem.dist.hybrid:demo", tp=1, zero=2)


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
