"""parmem.distributed.ep on real gloo ranks: expert parallelism equals a single-process MoE layer, and
the all-to-all moves top_k tokens each (Lepikhin et al. 2021 §3). World size: $PARMEM_WORLD_SIZE,
default 2.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

pytest.importorskip("torch")

from helpers import FP32  # noqa: E402
from helpers import WORLD_SIZE as N  # noqa: E402

pytestmark = pytest.mark.dist


def test_ep_equals_single_process_moe(pool):
    h, f, per, k, T = 16, 32, 2, 2, 32
    res = pool.run("parmem.distributed.ep:demo", hidden=h, ffn=f, experts_per_rank=per, top_k=k,
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
    res = pool.run("parmem.distributed.ep:demo", tokens=T, top_k=k, imbalance=20.0)
    assert res[0]["out_err"] < 1e-6
    assert res[0]["tokens_per_expert"][0] == N * T  # every token picks expert 0
    assert res[0]["tokens_received"] > T * k >= max(r["tokens_received"] for r in res[1:])


def test_ep_moves_activations_to_the_ranks_that_receive_the_tokens(pool):
    # Expert parallelism shards expert weights, not activations: a rank keeps, for backward, the
    # expert activations of the (token, choice) pairs it receives, T·k on average, as many as
    # when it runs every expert on its own T tokens (e = 1)
    res = pool.run("parmem.distributed.ep:demo", hidden=64, ffn=256, tokens=128)
    mean = sum(r["saved_bytes"] for r in res) / N
    assert all(r["saved_bytes_local"] == res[0]["saved_bytes_local"] for r in res)  # same T
    assert mean >= res[0]["saved_bytes_local"]
    by_tokens = sorted(res, key=lambda r: r["tokens_received"])
    for a, b in pairwise(by_tokens):
        assert (a["tokens_received"] < b["tokens_received"]) <= (a["saved_bytes"] < b["saved_bytes"])
