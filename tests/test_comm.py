"""Collective volumes, alpha-beta times, per-step communication of a layout and the placement of
its groups on nodes, derived by hand (Thakur et al. 2005 §4 for the ring, Shoeybi et al. 2019 §3,
Rajbhandari et al. 2020 §7, Lepikhin et al. 2021 §3 for the all-to-all)."""

from __future__ import annotations

from fractions import Fraction
from math import lcm

import pytest
from helpers import LLAMA7, MIXTRAL
from hypothesis import given
from hypothesis import strategies as st

from parmem.comm import (
    CATEGORIES,
    COLLECTIVES,
    CommBreakdown,
    CommOp,
    StageShape,
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    broadcast_bytes,
    collective_bytes,
    collective_steps,
    collective_time,
    collectives,
    op_time,
    placement,
    reduce_scatter_bytes,
    send_recv_bytes,
    step_comm,
    zero_redundancy_comm,
)
from parmem.config import ParallelConfig, TrainingSetup
from parmem.hardware import Link, hardware_preset, link_preset
from parmem.model import ModelSpec

GiB, MiB = 2**30, 2**20
L16 = lcm(*range(1, 17))  # 720720: divisible by every n in 1..16, so no rounding


# --- collectives ----------------------------------------------------------------------


def test_one_gib_over_8_ranks():
    # Ring all-reduce sends 2 (n-1)/n S (Patarasuk & Yuan 2009): 2 * 7/8 GiB = 1.75 GiB.
    assert all_reduce_bytes(GiB, 8) == 7 * GiB // 4
    # reduce-scatter, all-gather, all-to-all: (n-1)/n S = 0.875 GiB (Thakur et al. 2005).
    assert reduce_scatter_bytes(GiB, 8) == 7 * GiB // 8
    assert all_gather_bytes(GiB, 8) == 7 * GiB // 8
    assert all_to_all_bytes(GiB, 8) == 7 * GiB // 8
    assert broadcast_bytes(GiB, 8) == GiB
    assert send_recv_bytes(GiB) == GiB


def test_rounding_uses_ceil_chunks():
    # 10 bytes over 4 ranks: chunks of ceil(10/4) = 3 bytes; all-gather sends 3 chunks.
    assert all_gather_bytes(10, 4) == 9
    assert all_reduce_bytes(10, 4) == 18
    assert all_gather_bytes(0, 4) == 0


@pytest.mark.parametrize("op", COLLECTIVES)
def test_single_rank_sends_nothing(op):
    assert collective_bytes(op, GiB, 1) == 0
    assert collective_steps(op, 1) == 0
    assert collective_time(op, GiB, 1, link_preset("ib-ndr")) == 0.0


@given(st.integers(1, 10**6), st.integers(1, 64))
def test_textbook_identities(k, n):
    size = k * n  # divisible: results equal the textbook fractions exactly
    assert Fraction(all_reduce_bytes(size, n)) == Fraction(2 * (n - 1), n) * size
    assert all_reduce_bytes(size, n) == reduce_scatter_bytes(size, n) + all_gather_bytes(size, n)
    assert Fraction(all_to_all_bytes(size, n)) == Fraction(n - 1, n) * size


@given(st.integers(0, 10**9), st.integers(1, 64))
def test_rounding_bound(size, n):
    # ceil adds less than one byte per chunk sent
    exact = Fraction(n - 1, n) * size
    assert exact <= all_gather_bytes(size, n) < exact + max(n - 1, 1)


@given(st.integers(1, 1000), st.sampled_from(COLLECTIVES), st.integers(1, 15))
def test_monotone_in_n(k, op, n):
    size, link = k * L16, link_preset("nvlink4")
    assert collective_bytes(op, size, n) <= collective_bytes(op, size, n + 1)
    assert collective_time(op, size, n, link) <= collective_time(op, size, n + 1, link)


def test_alpha_beta_by_hand():
    nv = link_preset("nvlink4")  # 450e9 B/s per direction, alpha 3 us
    # ring all-reduce, 8 ranks: 2*7 = 14 steps; 1.75 GiB on the wire
    expect = 14 * 3e-6 + 1.75 * GiB / 450e9
    assert collective_time("all_reduce", GiB, 8, nv) == pytest.approx(expect)
    assert collective_time("all_reduce", GiB, 8, "nvlink4") == pytest.approx(expect)
    # all-gather over IB NDR: 7 steps of 8 us + 0.875 GiB / 50e9
    ib = link_preset("ib-ndr")
    assert collective_time("all_gather", GiB, 8, ib) == pytest.approx(7 * 8e-6 + 0.875 * GiB / 50e9)
    # a point-to-point send: one message
    assert collective_time("send_recv", MiB, 2, Link("x", 1e9, 1e-5)) == pytest.approx(
        1e-5 + MiB / 1e9
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: all_reduce_bytes(-1, 4), r"size=-1 must be an integer >= 0"),
        (lambda: all_reduce_bytes(1.5, 4), r"size=1.5 must be an integer"),
        (lambda: all_gather_bytes(8, 0), r"n=0 must be an integer >= 1"),
        (lambda: collective_bytes("allreduce", 8, 2), r"unknown collective op 'allreduce'"),
        (lambda: collective_steps("all_reduce", 4, "tree"), r"algorithm='tree' is not supported"),
        (lambda: collective_time("all_reduce", 8, 2, 3), r"link=3 must be a Link"),
        (lambda: collective_time("all_reduce", 8, 2, "ethernet"), r"unknown link 'ethernet'"),
    ],
)
def test_invalid_collective_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- a training step ---------------------------------------------------------------------

BASE = {"seq_len": 4096, "micro_batch": 1, "hidden": 4096, "layers": 32}


def comm(**kw) -> CommBreakdown:
    """The collectives of one stage given its quantities directly (a :class:`StageShape`)."""
    kw.setdefault("kv_hidden", kw["hidden"])
    return collectives(StageShape(**kw))


def test_dp_by_hand():
    # Psi = 1e9 params, bf16 grads (2 B): all-reduce 2 * 7/8 * 2e9 B = 3.5e9 B.
    b = comm(params=10**9, dp=8, **BASE)
    assert b.dp == 3_500_000_000
    assert b.total == b.dp
    assert b.as_dict() == {"dp": 3_500_000_000, "tp": 0, "sp": 0, "pp": 0, "ep": 0, "cp": 0}


@given(st.integers(2, 64), st.integers(1, 10**6))
def test_zero_ratios(d, k):
    psi = d * k  # 2 Psi divisible by d: no rounding
    by_stage = [comm(params=psi, dp=d, zero=z, **BASE).dp for z in range(4)]
    # Rajbhandari et al. 2020, §7: ZeRO-1/2 move the same volume as DP (2 Psi), ZeRO-3 3 Psi
    assert by_stage[1] == by_stage[0]
    assert by_stage[2] == by_stage[0]  # m = 1
    assert Fraction(by_stage[3], by_stage[0]) == Fraction(3, 2)


def test_zero_with_gradient_accumulation():
    # m = 4, d = 8, Psi = 8e8. One unit U = 7/8 * 2 Psi = 1.4e9 B (one RS or one AG).
    # ZeRO-1: RS + AG once per step = 2U; ZeRO-2: RS every micro-batch + AG once = 5U;
    # ZeRO-3: per micro-batch AG (fwd) + AG (bwd) + RS = 12U.
    kw = dict(params=8 * 10**8, dp=8, num_microbatches=4, **BASE)
    u = 1_400_000_000
    assert comm(zero=0, **kw).dp == 2 * u
    assert comm(zero=1, **kw).dp == 2 * u
    assert comm(zero=2, **kw).dp == 5 * u
    assert comm(zero=3, **kw).dp == 12 * u


def test_zero_redundancy_optimizer_by_hand():
    # PyTorch DDP + ZeroRedundancyOptimizer, Psi = 1200, d = 4, bf16 (2 B):
    # DDP all-reduce of 2400 B: 2 * 3/4 * 2400 = 3600 B; each rank owns 300 params = 600 B and the
    # four chain broadcasts cost a rank 600 B in each of the three where it is not the tail: 1800 B.
    b = zero_redundancy_comm(1200, 4)
    assert b.dp == b.total == 3600 + 1800
    assert Fraction(b.dp, comm(params=1200, dp=4, zero=1, **BASE).dp) == Fraction(3, 2)
    assert [o.op for o in b.ops] == ["all_reduce", "broadcast"]
    # fp32 (4 B), d = 2: all-reduce 2 * 1/2 * 4Psi, one broadcast of Psi/2 * 4: 1.5 x 4Psi
    assert zero_redundancy_comm(10, 2, grad_bytes=4, param_bytes=4).dp == 40 + 20
    assert zero_redundancy_comm(1200, 1).ops == ()  # one rank sends nothing
    with pytest.raises(ValueError, match=r"dp=0 must be an integer >= 1"):
        zero_redundancy_comm(1200, 0)


def test_tp_by_hand():
    # X = s b h * 2 B = 4096 * 4096 * 2 = 32 MiB. Ring all-reduce over t=4: 2 * 3/4 * 32 = 48 MiB.
    # 4 per layer (2 fwd + 2 bwd, Korthikanti 2022 §4.2.2) * 32 layers * 48 MiB = 6144 MiB.
    b = comm(params=0, tp=4, **BASE)
    assert b.tp == 6144 * MiB
    assert comm(params=0, tp=4, recompute="selective", **BASE).tp == 6144 * MiB
    # full recompute repeats the 2 forward all-reduces: 6 per layer -> 9216 MiB
    assert comm(params=0, tp=4, recompute="full", **BASE).tp == 9216 * MiB
    # m micro-batches: m times as much
    assert comm(params=0, tp=4, num_microbatches=3, **BASE).tp == 3 * 6144 * MiB


@given(
    st.integers(1, 8).map(lambda e: 2**e) | st.sampled_from([3, 6]),
    st.integers(1, 64),
    st.integers(1, 4),
    st.integers(1, 64),
    st.integers(1, 8),
    st.sampled_from(["none", "selective", "full"]),
)
def test_sp_same_bytes_as_tp(t, s_per_t, b, h, layers, recompute):
    kw = dict(
        params=0,
        seq_len=s_per_t * t,
        micro_batch=b,
        hidden=h * 64,
        layers=layers,
        tp=t,
        recompute=recompute,
        num_microbatches=2,
    )
    tp_only = comm(**kw)
    with_sp = comm(sp=True, **kw)
    # Korthikanti et al. 2022 §4.2.2: all-reduce = reduce-scatter + all-gather, same volume
    assert with_sp.sp == tp_only.tp
    assert with_sp.tp == 0
    # Megatron-LM's backward re-gather of the saved input: 2 more all-gathers per layer,
    # each half an all-reduce's volume: 4 AR-units + 1 -> x 5/4 (none/selective).
    regather = comm(sp=True, sp_regather=True, **kw).sp
    units = 6 if recompute == "full" else 4
    assert Fraction(regather, tp_only.tp) == Fraction(units + 1, units)


def test_pp_by_hand():
    # boundary tensor X = s b h * 2 B = 2048 * 4 * 8192 * 2 = 128 MiB; m = 8
    kw = dict(
        params=0,
        seq_len=2048,
        micro_batch=4,
        hidden=8192,
        layers=8,
        num_microbatches=8,
        pp=4,
    )
    # a middle stage sends X forward and a gradient X backward per micro-batch: 2 * 8 * 128 MiB
    assert comm(stage=1, **kw).pp == 2 * GiB
    # first stage sends no gradient backward, last stage no activation forward
    assert comm(stage=0, **kw).pp == GiB
    assert comm(stage=3, **kw).pp == GiB
    # SP (t = 8): the boundary is already sequence-sharded -> / 8 (Narayanan 2021 §4.1)
    assert comm(tp=8, sp=True, stage=1, **kw).pp == 2 * GiB // 8
    # interleaved v = 2: each micro-batch crosses every stage twice per direction;
    # stage 0 sends v backward minus the first chunk's = 1, and v forward = 2 -> 3 * 8 * 128 MiB
    assert comm(v=2, stage=1, **kw).pp == 4 * GiB
    assert comm(v=2, stage=0, **kw).pp == 3 * GiB
    assert comm(**{**kw, "pp": 1}).pp == 0


def test_ep_by_hand():
    # tokens = s b = 4096, top-2, h = 4096, bf16: buffer 4096*2*4096*2 B = 64 MiB;
    # all-to-all over e = 8 sends 7/8 -> 56 MiB; dispatch + combine, fwd + bwd = 4 per layer.
    kw = dict(params=0, dp=16, ep=8, moe_layers=32, top_k=2, **BASE)
    assert comm(**kw).ep == 32 * 4 * 56 * MiB
    assert comm(recompute="full", **kw).ep == 32 * 6 * 56 * MiB
    # capacity factor 1.25: buffers of ceil(1.25 * 4096 * 2) = 10240 slots -> 80 MiB, 70 MiB sent
    assert comm(capacity_factor=1.25, **kw).ep == 32 * 4 * 70 * MiB
    # expert gradients reduce over the expert-data-parallel group dp/ep = 16/8 = 2:
    # all-reduce of 2 * 1e9 B over 2 ranks = 2 * 1/2 * 2e9 = 2e9 B
    assert comm(expert_params=10**9, **kw).dp == 2 * 10**9


def test_cp_by_hand():
    # Llama-3-70B-like K/V width 8 heads * 128 = 1024; s = 8192, b = 1, cp = 2, bf16:
    # full K+V = 2 * 8192 * 1024 * 2 B = 32 MiB; a ring all-gather over 2 sends 16 MiB.
    # Per layer per micro-batch: AG fwd, AG + RS bwd = 3 * 16 MiB = 48 MiB.
    kw = dict(
        params=0,
        seq_len=8192,
        micro_batch=1,
        hidden=8192,
        layers=10,
        cp=2,
        kv_hidden=1024,
    )
    assert comm(**kw).cp == 10 * 48 * MiB
    # CP ranks hold the same weights: gradients reduce over dp * cp = 8 ranks
    assert comm(**{**kw, "params": 10**9, "dp": 4}).dp == 3_500_000_000
    # TP shards the K/V heads: t = 2 halves the exchange
    assert comm(tp=2, **kw).cp == 10 * 24 * MiB


def test_nothing_to_send_on_one_gpu():
    b = comm(params=10**9, **BASE)
    assert b.ops == ()
    assert b.total == 0
    assert b.time("h100-sxm") == 0.0


def test_time_uses_links():
    hw = hardware_preset("h100-sxm")
    b = comm(params=10**9, dp=8, tp=4, **BASE)
    times = b.times(hw)
    # DP on IB NDR: 14 steps * 8 us + 3.5e9 B / 50e9 B/s
    assert times["dp"] == pytest.approx(14 * 8e-6 + 3.5e9 / 50e9)
    # TP on NVLink4: 128 all-reduces, each 6 steps * 3 us + 48 MiB / 450e9
    assert times["tp"] == pytest.approx(128 * (6 * 3e-6 + 48 * MiB / 450e9))
    assert b.time(hw) == pytest.approx(times["dp"] + times["tp"])
    # moving DP inside the node makes it faster
    assert b.times(hw, dp_intra=True)["dp"] < times["dp"]
    assert set(times) == set(CATEGORIES)
    assert b.time("h100-sxm") == pytest.approx(b.time(hw))


def test_breakdown_rows_and_categories():
    b = comm(params=10**9, dp=2, tp=2, pp=2, **BASE)
    rows = b.to_rows()
    assert sum(r["bytes"] for r in rows) == b.total
    assert {r["category"] for r in rows} == {"dp", "tp", "pp"}
    assert isinstance(b, CommBreakdown)
    with pytest.raises(ValueError, match="unknown category 'zero'"):
        b.bytes_of("zero")
    with pytest.raises(ValueError, match="hardware=3 must be a Hardware"):
        b.times(3)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: step_comm(LLAMA7, ParallelConfig(zero=4)), r"zero=4 must be an integer in 0..3"),
        (lambda: step_comm(LLAMA7, None, TrainingSetup(4096, recompute="partial")),
         r"recompute='partial' must be one of 'none', 'selective', 'full'"),
        (lambda: step_comm(LLAMA7, ParallelConfig(dp=0)), r"dp=0 must be an integer >= 1"),
        (lambda: step_comm(LLAMA7, ParallelConfig(cp=3), TrainingSetup(4096)),
         r"cp=3 must divide seq_len=4096"),
        (lambda: step_comm(LLAMA7, ParallelConfig(tp=2, sp=True), TrainingSetup(4095)),
         r"seq_len / cp = 4095 must be divisible by tp=2"),
        (lambda: step_comm(MIXTRAL, ParallelConfig(ep=4, dp=2)), r"ep=4 must divide dp\*cp=2"),
        (lambda: step_comm(LLAMA7, ParallelConfig(pp=2), stage=2), r"stage=2 must be an integer in 0..1"),
        (lambda: step_comm(LLAMA7, ParallelConfig(tp=3)), r"tp=3 must divide heads=32"),
        (lambda: step_comm("llama-2-7b"), r"spec must be a ModelSpec"),
        (lambda: step_comm(LLAMA7, sp_regather="yes"), r"sp_regather='yes' must be True or False"),
    ],
)
def test_invalid_step_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_step_comm_of_a_model_equals_its_stage_shapes():
    # step_comm reads the stage's parameters off the sharding table: Llama-2-7B at t=4, d=8 on
    # one stage holds 6,738,415,616 / 4 of the matrices plus the replicated norms.
    par = ParallelConfig(dp=8, tp=4, sp=True, zero=1)
    c = step_comm(LLAMA7, par, TrainingSetup(seq_len=4096))
    params = 32 * (4 * 4096 * 4096 // 4 + 3 * 4096 * 11008 // 4 + 2 * 4096) \
        + 2 * 32000 * 4096 // 4 + 4096
    # ZeRO-1: reduce-scatter of bf16 gradients + all-gather of bf16 parameters over 8 ranks
    assert c.dp == 2 * 7 * -(-2 * params // 8)
    # SP: each of TP's 4 all-reduces per layer (2 forward, 2 backward) becomes an all-gather and
    # a reduce-scatter of s*b*h*2 bytes, each sending (t-1)/t of it: 8 x 3/4 x 32 MiB per layer
    assert c.sp == 32 * 8 * 3 * (4096 * 4096 * 2 // 4)


# ---------------------------------------------------------------------------- placement
# per node: (tp, cp, ep, dp, edp, pp) ranks of each group on one node, derived by hand from the
# rank order: a group of size n and stride s (the product of the faster axes) has
# min(n, 8 // s) ranks on a node, at least 1 (the expert-data-parallel group: stride tp * ep)
@pytest.mark.parametrize("par, expect, per_node", [
    # Megatron order tp-cp-ep-dp-pp on 8-GPU nodes
    (ParallelConfig(dp=2, tp=8, pp=4), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                           dp_intra=False, pp_intra=False), (8, 1, 1, 1, 1, 1)),
    (ParallelConfig(dp=8, pp=8), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                      dp_intra=True, pp_intra=False), (1, 1, 1, 8, 8, 1)),
    (ParallelConfig(dp=2, tp=16), dict(tp_intra=False, cp_intra=False, ep_intra=False,
                                       dp_intra=False, pp_intra=False), (8, 1, 1, 1, 1, 1)),
    (ParallelConfig(dp=16, ep=8, pp=4), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                             dp_intra=False, pp_intra=False), (1, 1, 8, 8, 1, 1)),
    (ParallelConfig(dp=2, tp=2, pp=2), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                            dp_intra=True, pp_intra=True), (2, 1, 1, 2, 2, 2)),
    (ParallelConfig(dp=16, tp=2, cp=2), dict(tp_intra=True, cp_intra=True, ep_intra=True,
                                             dp_intra=False, pp_intra=False), (2, 2, 1, 4, 4, 1)),
])  # fmt: skip
def test_placement_follows_megatron_rank_order(par, expect, per_node):
    where = placement(par, gpus_per_node=8)
    assert {k: v for k, v in where.items() if k.endswith("_intra")} == expect
    groups = ("tp", "cp", "ep", "dp", "edp", "pp")
    assert tuple(where[f"{g}_per_node"] for g in groups) == per_node


def test_ring_across_nodes_uses_every_port_of_the_node():
    """An all-reduce over 16 GPUs on two DGX A100 nodes, 8 ranks a node: NCCL's team measured
    192 GB/s of bus bandwidth (8 x 200 Gb/s HDR ports; NVIDIA/nccl issue 812, quoted in issue
    1576), and the bus bandwidth is the nccl-tests one, 2(n-1)/n * size / time
    (nccl-tests doc/PERFORMANCE.md). One rank a node: one port, 25 GB/s."""
    hw = hardware_preset("a100-80gb")
    size, n = 2**33, 16  # 8 GiB, nccl-tests' largest default size
    op = CommOp("dp", "gradient all-reduce", "all_reduce", size, n, 1)
    where = dict(dp_intra=False, dp_per_node=8)
    busbw = 2 * (n - 1) / n * size / op_time(op, hw, where)
    assert busbw == pytest.approx(192e9, rel=0.06)
    one = 2 * (n - 1) / n * size / op_time(op, hw, {**where, "dp_per_node": 1})
    assert one == pytest.approx(25e9, rel=0.01)
    # never faster than NVLink: 16 ports a node would be 400 GB/s, NVLink 3 carries 300
    many = 2 * (n - 1) / n * size / op_time(op, hw, {**where, "dp_per_node": 16})
    assert many == pytest.approx(hw.intra_node.bandwidth, rel=0.01)
    # the same through CommBreakdown.times and placement
    b = CommBreakdown((op,))
    par = ParallelConfig(dp=16)
    assert b.times(hw, **placement(par))["dp"] == pytest.approx(op_time(op, hw, where))
    with pytest.raises(ValueError, match="dp_per_nod: unknown keyword"):
        b.times(hw, dp_per_nod=8)
    with pytest.raises(ValueError, match="dp_per_node"):
        b.times(hw, dp_per_node=0)


def test_all_to_all_across_nodes_crosses_one_port_with_the_remote_share():
    """An all-to-all cannot spread over several ports (NVIDIA/nccl-tests issue 267); on N nodes
    its bus bandwidth, (n-1)/n * size / time, is about N/(N-1) ports' (nccl-tests issue 130):
    only the traffic to other nodes crosses the port."""
    hw = hardware_preset("h100-sxm")
    size, n, k = 2**30, 32, 8  # 4 nodes of 8
    op = CommOp("ep", "dispatch", "all_to_all", size, n, 1)
    t = op_time(op, hw, dict(ep_intra=False, ep_per_node=k))
    busbw = (n - 1) / n * size / t
    nodes = n // k
    assert busbw == pytest.approx(hw.inter_node.bandwidth * nodes / (nodes - 1), rel=0.05)
    # not k ports' worth, as a ring's would be
    assert t > 4 * (n - 1) / n * size / (k * hw.inter_node.bandwidth)


def test_placement_rejects_bad_node_size():
    with pytest.raises(ValueError, match="gpus_per_node"):
        placement(ParallelConfig(), gpus_per_node=0)


# ---------------------------------------------------------------------------- step_comm of a layout
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


def test_tp_across_nodes_is_slower_than_inside():
    """The same TP traffic on InfiniBand instead of NVLink: the bandwidth ratio, 450/50."""
    spec = ModelSpec.preset("llama-3-70b")
    par = ParallelConfig(dp=2, tp=8, pp=4, sp=True, zero=1)
    com = step_comm(spec, par, TrainingSetup(seq_len=4096, num_microbatches=64))
    inside = com.times("h100-sxm", **placement(par))["sp"]
    # one rank of the TP group a node: each ring crosses one port
    outside = com.times("h100-sxm", **{**placement(par), "tp_intra": False, "tp_per_node": 1})
    assert 7 < outside["sp"] / inside < 9.5
    # eight a node: the rings share the node's eight ports, 400 GB/s against NVLink's 450
    eight = com.times("h100-sxm", **{**placement(par), "tp_intra": False})["sp"]
    # (the rest is latency: 8 us a message across nodes against 3 us on NVLink)
    assert 1 < eight / inside < 1.5


def test_megatron_reduces_fp32_gradients():
    # Megatron-Core keeps fp32 main_grad buffers and reduce-scatters them (4 bytes a value),
    # then all-gathers bf16 parameters (2 bytes): ZeRO-1 (its distributed optimizer) sends
    # (4 + 2)/(2 + 2) = 1.5x the paper's 16-bit count over the same ring.
    par, setup = ParallelConfig(dp=8, zero=1), TrainingSetup(seq_len=4096)
    paper = step_comm(LLAMA7, par, setup).dp
    megatron = step_comm(LLAMA7, par, TrainingSetup(seq_len=4096, engine="megatron-core")).dp
    psi = LLAMA7.num_params()
    assert paper == 7 * -(-2 * psi // 8) * 2
    assert megatron == 7 * -(-4 * psi // 8) + 7 * -(-2 * psi // 8)
