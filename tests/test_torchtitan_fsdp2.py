"""torchtitan's own FSDP2 sharding against the ``fsdp2`` engine profile (issue 14).

torchtitan 0.3.0's Llama 3 ``debugmodel`` (dim 256, 16 heads, 6 layers, ffn 768, vocabulary
2048) is parallelized by torchtitan's ``parallelize_llama`` over the session's gloo ranks
(fully_shard per block, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)) and takes one
step of the AdamW that torchtitan's optimizer container builds (parmem.distributed.engine_runs names
what a CPU run changes). Per rank, each number is derived here by hand from the shapes and
compared with the measurement and with the profile (parmem.estimate, engine="fsdp2", ZeRO-3):

* parameters: the fp32 shard, 4Ψ/d; gradients: fp32, 4Ψ/d; AdamW: two fp32 moments, 8Ψ/d, plus
  one named term, a 0-d fp32 ``step`` counter per parameter tensor (45 tensors);
* FSDP2's buffers of one block: the all-gather output holds its bf16 weights (2 bytes per
  parameter), the reduce-scatter input its fp32 gradients (4); the profile's ZeRO-3 buffers are
  two blocks' bf16 weights (the current and the prefetched one) and one block's fp32 gradients;
* one block's saved tensors (weights excluded), the profile's layer table on device "cpu".
World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from helpers import WORLD_SIZE as N  # noqa: E402

pytestmark = pytest.mark.dist

V, H, L, A, F = 2048, 256, 6, 16, 768  # torchtitan's _debugmodel
LAYER = 4 * H * H + 3 * H * F + 2 * H  # fused wqkv + wo, w1 w2 w3, two RMSNorm weights
PSI = 2 * V * H + H + L * LAYER  # untied embedding and output, final norm
TENSORS = L * 7 + 3
S, B = 64, 2  # demo_torchtitan's defaults


@pytest.fixture(scope="module")
def rows(pool):
    return pool.run("parmem.distributed.engine_runs:demo_torchtitan", timeout=600)


def test_the_spec_counts_what_torchtitan_builds(rows):
    from parmem.distributed.engine_runs import torchtitan_spec

    assert torchtitan_spec().num_params() == PSI
    for r in rows:
        assert r["num_params"] == PSI
        assert r["param_tensors"] == TENSORS


def test_per_rank_states_equal_the_fsdp2_profile(rows):
    for r in rows:
        assert r["params"] == r["est_params"] == 4 * PSI // N
        assert r["grads"] == r["est_grads"] == 4 * PSI // N
        assert r["est_optimizer"] == 8 * PSI // N
        assert r["optimizer"] == r["est_optimizer"] + 4 * TENSORS  # AdamW's step counters


def test_unsharded_buffers_of_a_block(rows):
    for r in rows:
        assert (r["all_gather"], r["all_gather_dtype"]) == (2 * LAYER, "torch.bfloat16")
        assert (r["reduce_scatter"], r["reduce_scatter_dtype"]) == (4 * LAYER, "torch.float32")
        assert r["est_layer"] == 2 * LAYER
        assert r["est_comm"] == 2 * r["all_gather"] + r["reduce_scatter"]


def test_a_block_saves_what_the_fsdp2_table_lists(rows):
    """Per token, on CPU: each nn.RMSNorm (the CPU composite) keeps an fp32 copy, the fp32
    normalised tensor and an fp32 rstd (4h + 4h + 4); wqkv and w1/w3 keep the norms' bf16
    outputs (2h each); RoPE keeps the complex64 cache gathered at the positions (4·head_dim);
    SDPA keeps Q, K, V, its output (which wo keeps too) and an fp32 log-sum-exp per head; the
    MLP keeps w1's and w3's outputs, SiLU's and the product (4 x 2f)."""
    hd = H // A
    per_token = (2 * (4 * H + 4 * H + 4) + 2 * 2 * H + 4 * hd + 2 * 3 * H + 4 * A + 2 * H
                 + 4 * 2 * F)
    for r in rows:
        assert r["block_saved"] == r["est_block_saved"] == S * B * per_token
