"""parmem.distributed.dp on real gloo ranks: DDP's per-rank bytes, and what ZeRO-3 and TP shard.

Expected values are derived here by hand from the papers' formulas, never copied from a run:
Rajbhandari et al. 2020 §3.1 (2 + 2 + 12 bytes per parameter), PyTorch DDP's default buckets
(a second 16-bit copy of the gradients, Li et al. 2020, gradient bucketing), Korthikanti et al. 2022 §4.1 and
Table 2 (activations per layer). World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import WORLD_SIZE as N  # noqa: E402

pytestmark = pytest.mark.dist

def tiny_gpt_params(V, h, L, s):
    """GPT-2 layout: token and position embeddings, L layers of 12h² + 13h (QKV, projection,
    FC1, FC2 with biases, two LayerNorms), a final LayerNorm, an untied LM head."""
    return V * h + s * h + L * (12 * h * h + 13 * h) + 2 * h + V * h


def saved_bytes_no_dropout(s, b, h, a, L, V):
    """Korthikanti et al. 2022 §4.1 without dropout: per layer 34sbh + 5as²b minus the two 1-byte
    output-dropout masks (2sbh), the 1-byte attention-dropout mask and its 2-byte output (3as²b);
    plus the final LayerNorm and LM-head inputs (2sbh each) and the fp32 logits (4sbV)."""
    per_layer = 32 * s * b * h + 2 * a * s * s * b
    return L * per_layer + 4 * s * b * h + 4 * s * b * V


def extras(s, b, L):
    """What the formula leaves out: LayerNorm mean and rstd (bf16 on CPU) for 2L + 1 norms, int64
    token ids and labels (s·b each), int64 position ids (s), the loss's 0-d fp32 weight."""
    return (2 * L + 1) * 2 * s * b * 2 + 8 * s * b + 8 * s * b + 8 * s + 4


def test_ddp_states_and_buckets_per_rank_equal_estimate(pool):
    V, h, L, a, s, B = 512, 64, 2, 4, 32, 4 * N
    res = pool.run("parmem.distributed.dp:demo", global_batch=B, seq=s, vocab=V, hidden=h, layers=L,
                   heads=a)
    psi = tiny_gpt_params(V, h, L, s)
    n_tensors = 2 + 12 * L + 2 + 1  # embeddings, 12 per layer, final norm, head
    for row in res:
        assert row["num_params"] == psi and row["d"] == N
        st, est = row["states"], row["states_estimate"]
        # every rank holds the full 2 + 2 + 12 bytes per parameter, and DDP's buckets another 2
        assert st == {"params": 2 * psi, "grads": 2 * psi, "buckets": 2 * psi,
                      "optimizer": 12 * psi + 4 * n_tensors}
        assert est == {"params": 2 * psi, "grads": 2 * psi, "buckets": 2 * psi,
                       "optimizer": 12 * psi}
        assert row["adam_steps"] == 4 * n_tensors
        assert row["max_weight_diff_vs_rank0"] == 0.0
        # the mean of the shard losses is the whole batch's loss (bf16 model, fp32 loss)
        assert row["loss_mean"] == pytest.approx(row["loss_full"], rel=1e-4)


def test_fixed_global_batch_divides_activations_by_d(pool):
    V, h, L, a, s, B = 512, 64, 2, 4, 32, 4 * N
    res = pool.run("parmem.distributed.dp:demo", global_batch=B, seq=s, vocab=V, hidden=h, layers=L,
                   heads=a)
    for row in res:
        act = row["activations"]
        for d in (1, N):
            b = B // d
            assert row["activations_estimate"][d] == saved_bytes_no_dropout(s, b, h, a, L, V)
            assert row["activation_extras"][d] == extras(s, b, L)
            assert act[d] == saved_bytes_no_dropout(s, b, h, a, L, V) + extras(s, b, L)
        fixed = 8 * s + 4  # position ids and the loss weight do not grow with b
        assert (act[N] - fixed) * N == act[1] - fixed


def test_compare_rows_are_all_explained(pool):
    from parmem.distributed.dp import compare

    res = pool.run("parmem.distributed.dp:demo", global_batch=2 * N)
    rows = compare(res[0])
    assert [r["unexplained"] for r in rows] == [0] * len(rows)
    assert len(rows) == 4 + (2 if N > 1 else 1)


def test_global_batch_must_split_evenly(pool):
    with pytest.raises(Exception, match="global_batch"):
        pool.run("parmem.distributed.dp:demo", global_batch=2 * N + 1)


def test_zero3_keeps_activations_tp_shards_them(pool):
    h, a, s, b = 32, 4, 16, 2
    res = pool.run("parmem.distributed.dp:demo_activation_sharding", hidden=h, heads=a, seq=s, batch=b)
    sbh = s * b * h
    ln_stats = 2 * 2 * s * b * 2  # two LayerNorms x (mean, rstd) x s·b tokens, bf16 on CPU
    full = 34 * sbh + 5 * a * s * s * b  # Korthikanti et al. 2022 Table 2, t = 1
    layer_params = 12 * h * h + 13 * h
    tp_params = ((4 * h * h + 3 * h) // N + h + (8 * h * h + 4 * h) // N + h + 4 * h)
    for row in res:
        saved, params = row["saved_bytes"], row["param_bytes"]
        assert row["table2"][1] == full
        assert saved["single"] == full + ln_stats
        assert saved["zero3"] == saved["single"]  # ZeRO-3 shards no activation
        assert row["out_equal_zero3"]
        # TP: the 24sbh + 5as²b inside the parallel region divided by t, 10sbh replicated
        assert saved["tp"] == 10 * sbh + (24 * sbh + 5 * a * s * s * b) // N + ln_stats
        assert params["single"] == 2 * layer_params
        assert params["zero3"] == 2 * layer_params // N
        assert params["tp"] == 2 * tp_params
