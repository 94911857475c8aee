"""Every parmem.dist demo on real gloo ranks: equal to one process, bytes equal to the formulas.

Expected values are written here from the papers' formulas (and checked against parmem's
estimators where those exist), never copied from a run. One pool serves the whole file.
World size: $PARMEM_WORLD_SIZE, default 2 (the formulas hold for any size the demos accept).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from parmem import comm  # noqa: E402
from parmem.pipeline import simulate  # noqa: E402

pytestmark = pytest.mark.dist

N = int(os.environ.get("PARMEM_WORLD_SIZE", "2"))
FP32 = 4




# ---------------------------------------------------------------------------- collectives
def test_collectives_bytes_sent_equal_ring_formulas(pool):
    numel = 3840
    size = numel * FP32
    res = pool.run("parmem.dist.collectives:demo", numel=numel)
    for r, row in enumerate(res):
        assert all(row[c]["equal"] for c in row), row  # same result as gloo's own collective
        assert row["all_reduce"]["bytes_sent"] == 2 * (N - 1) * size // N
        assert row["reduce_scatter"]["bytes_sent"] == (N - 1) * size // N
        assert row["all_gather"]["bytes_sent"] == (N - 1) * size // N
        assert row["all_to_all"]["bytes_sent"] == (N - 1) * size // N
        assert row["broadcast"]["bytes_sent"] == (size if r < N - 1 else 0)  # chain from rank 0
        for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
            assert row[c]["bytes_sent"] == comm.collective_bytes(c, size, N)
    # parmem.comm gives the busiest rank of the chain broadcast
    assert max(r["broadcast"]["bytes_sent"] for r in res) == comm.broadcast_bytes(size, N)


# ---------------------------------------------------------------------------- tensor parallel
def tp_param_bytes(V, h, L, t):
    """Per-rank parameters of the TP tiny GPT (Shoeybi et al. 2019 §3): attention and MLP
    weights and column biases split by t; row biases, LayerNorms replicated; vocab split."""
    attn = (3 * h * h + 3 * h) // t + h * h // t + h
    mlp = (4 * h * h + 4 * h) // t + 4 * h * h // t + h
    layer = attn + mlp + 2 * 2 * h
    return FP32 * (V * h // t + L * layer + 2 * h + V * h // t)


def test_tp_equals_single_process_and_bytes_equal_formulas(pool):
    V, h, a, L, s, b = 64, 32, 4, 2, 16, 2
    res = pool.run("parmem.dist.tp:demo", vocab=V, hidden=h, heads=a, layers=L, seq=s, batch=b)
    for row in res:
        assert row["loss_err"] < 1e-6 and row["logits_err"] < 1e-5 and row["grad_err"] < 1e-6
        assert row["param_bytes"] == row["param_bytes_estimate"] == tp_param_bytes(V, h, L, N)
        assert row["grad_bytes"] == row["grad_bytes_estimate"] == row["param_bytes"]
        # Korthikanti et al. 2022 Table 2, TP without SP, 16-bit, 1-byte masks
        sbh = s * b * h
        assert row["saved_bytes_table2"] == 10 * sbh + (24 * sbh + 5 * a * s * s * b) // N
        # the one difference: LayerNorm mean and rstd (bf16 on CPU), 2 norms x 2 stats x s·b
        ln_stats = 2 * 2 * s * b * 2
        assert row["saved_bytes"] == row["saved_bytes_table2"] + ln_stats
        assert row["saved_bytes"] == row["saved_bytes_layer_terms"]
        # one all-reduce per block in forward (g), one per block in backward (f): 2 per layer
        assert row["layer_fwd_all_reduce"] == 2
        assert row["model_fwd_all_reduce"] == 2 * L + 1  # + the vocab-parallel embedding
        assert row["model_bwd_all_reduce"] == 2 * L + 1  # + f before the vocab-parallel head


def test_tp_through_dtensor_parallelize_module(pool):
    h = 32
    res = pool.run("parmem.dist.tp:demo_dtensor", hidden=h, heads=4)
    for row in res:
        assert row["out_err"] < 1e-5 and row["input_grad_err"] < 1e-5 and row["grad_err"] < 1e-5
        full = 12 * h * h + 13 * h
        assert row["param_bytes_full"] == FP32 * full
        local = (4 * h * h + 3 * h) // N + h + (8 * h * h + 4 * h) // N + h + 4 * h
        assert row["param_bytes"] == FP32 * local


# ---------------------------------------------------------------------------- sequence parallel
def test_sp_equals_single_process_and_divides_every_activation_by_t(pool):
    h, a, s, b = 32, 4, 16, 2
    res = pool.run("parmem.dist.sp:demo", hidden=h, heads=a, seq=s, batch=b)
    sbh = s * b * h
    for row in res:
        assert row["out_err"] < 1e-5 and row["input_grad_err"] < 1e-5 and row["grad_err"] < 1e-5
        # Korthikanti et al. 2022 §4.2.2: sbh(34 + 5as/h)/t, plus LayerNorm stats (bf16 on CPU)
        assert row["table2_sp"] == (34 * sbh + 5 * a * s * s * b) // N
        assert row["saved_bytes_sp"] == row["table2_sp"] + 2 * 2 * (s * b // N) * 2
        assert row["saved_bytes_sp"] == row["layer_terms_sp"]
        # SP removes the replicated 10sbh (and the stats) down to 1/t of it
        removed = row["saved_bytes_tp"] - row["saved_bytes_sp"]
        assert removed == (10 * sbh + 2 * 2 * s * b * 2) * (N - 1) // N
        # forward: 2 all-gathers + 2 reduce-scatters; backward: 2 reduce-scatters and 4
        # all-gathers (2 for the gradients, 2 re-gathering the saved s/t inputs)
        assert (row["fwd_all_gather"], row["fwd_reduce_scatter"]) == (2, 2)
        assert (row["bwd_all_gather"], row["bwd_reduce_scatter"]) == (4, 2)


# ---------------------------------------------------------------------------- pipeline parallel
def expected_order(schedule, p, m, i):
    """Operation order on stage i (Huang et al. 2019; Narayanan et al. 2021 §2.2.1)."""
    if schedule == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    w = min(p - i - 1, m)
    order = [("F", k) for k in range(w)]
    for k in range(m - w):
        order += [("F", w + k), ("B", k)]
    return order + [("B", k) for k in range(m - w, m)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_pp_schedules_equal_unpipelined_and_stash_what_the_papers_say(pool, schedule):
    m, v = 2 * N, 2
    res = pool.run("parmem.dist.pp:demo", schedule=schedule, microbatches=m, v=v)
    sim = simulate(schedule, N, m, v if schedule == "interleaved" else 1)
    assert res[-1]["loss_err"] < 1e-6
    for i, row in enumerate(res):
        assert row["grad_err"] < 1e-6
        if schedule == "gpipe":
            assert row["peak_stashed"] == m
        elif schedule == "1f1b":
            assert row["peak_stashed"] == N - i
        else:  # Megatron-LM warm-up 2(p-i-1) + (v-1)p chunks, plus the first steady forward
            chunks = min(2 * (N - i - 1) + (v - 1) * N + 1, m * v)
            assert row["peak_stashed_chunks"] == chunks
        assert row["peak_stashed"] == sim.peak_in_flight[i]
        assert row["order_matches_sim"], row["order"]
        if schedule != "interleaved":
            ops = [(op[0], int(op[1:])) for op in row["order"].split()]
            assert ops == expected_order(schedule, N, m, i)
        assert row["idle_s"] >= 0 and row["busy_s"] > 0  # wall-clock: reported, not asserted


def test_pp_rejects_bad_schedule(pool):
    with pytest.raises(Exception, match="schedule='zigzag'"):
        pool.run("parmem.dist.pp:demo", schedule="zigzag")


# ---------------------------------------------------------------------------- DDP / ZeRO / FSDP
def test_ddp_zero1_fsdp2_train_alike_and_shard_what_zero_says(pool):
    L, h = 4, 64
    res = pool.run("parmem.dist.zero:demo", layers=L, hidden=h, steps=3)
    psi = L * (h * h + h)
    n_t = 2 * L  # weight and bias per layer; Adam keeps a 4-byte step counter for each
    for row in res:
        assert row["num_params"] == psi
        ddp, z1, fs = row["ddp"], row["zero1"], row["fsdp2"]
        for v in (ddp, z1, fs):
            assert v["grad_err"] < 1e-7  # the all-reduced mean gradient is the full-batch one
            # after 3 Adam steps at lr=1e-2: m/sqrt(v) turns last-bit gradient differences of
            # near-zero gradients into parameter differences of a fraction of lr (one process
            # summing the same quarter-batch gradients in another order differs by 4e-6 too)
            assert v["param_err"] < 1e-3 * 1e-2 * 3
        assert (ddp["params"], ddp["grads"], ddp["optimizer"]) == (4 * psi, 4 * psi,
                                                                    8 * psi + 4 * n_t)
        # ZeRO-1 (ZeroRedundancyOptimizer): whole tensors per rank, balanced for this model
        assert (z1["params"], z1["grads"]) == (4 * psi, 4 * psi)
        assert z1["optimizer"] == 8 * z1["owned_params"] + 4 * z1["owned_tensors"]
        if L % N == 0:
            assert z1["owned_params"] == psi // N
            assert z1["optimizer"] == 8 * psi // N + 4 * z1["owned_tensors"]
        # FSDP2 (ZeRO-3): every state divided by d
        assert (fs["params"], fs["grads"]) == (4 * psi // N, 4 * psi // N)
        assert fs["optimizer"] == 8 * psi // N + 4 * n_t
        # against parmem.model_state_bytes: equal, except the named step counters
        for v, steps in ((ddp, n_t), (z1, z1["owned_tensors"]), (fs, n_t)):
            assert v["params"] == v["params_estimate"] and v["grads"] == v["grads_estimate"]
            assert v["optimizer"] == v["optimizer_estimate"] + 4 * steps


def test_ddp_buckets_are_a_second_copy_unless_views(pool):
    L, h = 4, 64
    res = pool.run("parmem.dist.zero:demo_ddp_buckets", layers=L, hidden=h)
    psi = L * (h * h + h)
    for row in res:
        copy, view = row["copy"], row["view"]
        assert copy["buckets"] == view["buckets"] == 4 * psi
        assert copy["grads"] == view["grads"] == 4 * psi == copy["grads_estimate"]
        assert not copy["grad_views_share_buckets"] and view["grad_views_share_buckets"]
        assert copy["gradient_memory"] == 8 * psi and view["gradient_memory"] == 4 * psi


# ---------------------------------------------------------------------------- expert parallel
def test_ep_equals_single_process_moe(pool):
    h, f, per, k, T = 16, 32, 2, 2, 32
    res = pool.run("parmem.dist.ep:demo", hidden=h, ffn=f, experts_per_rank=per, top_k=k,
                   tokens=T)
    for row in res:
        assert row["out_err"] < 1e-6 and row["input_grad_err"] < 1e-6
        assert row["expert_grad_err"] < 1e-6 and row["router_grad_err"] < 1e-5
        assert row["expert_bytes"] == row["expert_bytes_estimate"] == FP32 * per * (2 * h * f + f + h)
        assert row["expert_bytes_unsharded"] == N * row["expert_bytes"]
        assert row["tokens_sent"] == T * k
        assert sum(row["tokens_per_expert"]) == row["tokens_received"]
        assert row["dispatch_send_bytes"] == T * k * h * FP32
        assert row["dispatch_recv_bytes"] == row["tokens_received"] * h * FP32
    assert sum(r["tokens_received"] for r in res) == N * T * k  # no token dropped


def test_ep_unbalanced_router_overloads_the_rank_of_expert_0(pool):
    T, k = 32, 2
    res = pool.run("parmem.dist.ep:demo", tokens=T, top_k=k, imbalance=20.0)
    assert res[0]["out_err"] < 1e-6
    assert res[0]["tokens_per_expert"][0] == N * T  # every token picks expert 0
    assert res[0]["tokens_received"] > T * k >= max(r["tokens_received"] for r in res[1:])
