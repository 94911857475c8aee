"""parmem.distributed.tp on real gloo ranks: equal to one process, and the bytes each rank holds, saves
and all-reduces equal Shoeybi et al. 2019 §3 and Korthikanti et al. 2022 Table 2 (derived here by
hand, never copied from a run). World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import FP32  # noqa: E402
from helpers import WORLD_SIZE as N  # noqa: E402

from parmem.reference import TinyGPT, tiny_spec  # noqa: E402


def tp_param_bytes(V, h, L, t):
    """Per-rank parameters of the TP tiny GPT (Shoeybi et al. 2019 §3): attention and MLP
    weights and column biases split by t; row biases, LayerNorms replicated; vocab split."""
    attn = (3 * h * h + 3 * h) // t + h * h // t + h
    mlp = (4 * h * h + 4 * h) // t + 4 * h * h // t + h
    layer = attn + mlp + 2 * 2 * h
    return FP32 * (V * h // t + L * layer + 2 * h + V * h // t)


@pytest.mark.dist
def test_tp_equals_single_process_and_bytes_equal_formulas(pool):
    V, h, a, L, s, b = 64, 32, 4, 2, 16, 2
    res = pool.run("parmem.distributed.tp:demo", vocab=V, hidden=h, heads=a, layers=L, seq=s, batch=b)
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


@pytest.mark.dist
def test_tp_through_dtensor_parallelize_module(pool):
    h = 32
    res = pool.run("parmem.distributed.tp:demo_dtensor", hidden=h, heads=4)
    for row in res:
        assert row["out_err"] < 1e-5 and row["input_grad_err"] < 1e-5 and row["grad_err"] < 1e-5
        full = 12 * h * h + 13 * h
        assert row["param_bytes_full"] == FP32 * full
        local = (4 * h * h + 3 * h) // N + h + (8 * h * h + 4 * h) // N + h + 4 * h
        assert row["param_bytes"] == FP32 * local


@pytest.mark.dist
def test_tp_mixed_precision_states_per_rank(pool):
    V, h, a, L, s, b = 64, 32, 4, 2, 16, 2
    res = pool.run("parmem.distributed.tp:demo_states", vocab=V, hidden=h, heads=a, layers=L, seq=s,
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
    res = pool.run("parmem.distributed.tp:demo_comm", hidden=h, heads=a, seq=s, batch=b)
    sbh2 = 2 * s * b * h  # one bf16 [s, b, h] tensor
    for row in res:
        assert row["forward_all_reduce"] == [sbh2, sbh2]    # g after attention and after MLP
        assert row["backward_all_reduce"] == [sbh2, sbh2]   # f before MLP and before attention
        sbh = s * b * h
        assert row["table2"] == 10 * sbh + (24 * sbh + 5 * a * s * s * b) // N
        assert row["saved_bytes"] == row["table2"] + 2 * 2 * s * b * 2  # + LN mean/rstd (bf16)


def test_tp_gpt_shards_only_a_model_without_position_table():
    from parmem.distributed.tp import TPGPT

    with pytest.raises(ValueError, match="without a position table"):
        TPGPT(TinyGPT(tiny_spec(vocab=40, hidden=16, heads=2, seq=8)))  # learned positions
