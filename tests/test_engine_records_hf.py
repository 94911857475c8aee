"""The Transformers Trainer's recorded runs (``data/engine_runs/hf.json``, written by
``scripts/record_engine_runs.py --engine hf`` from :mod:`parmem.distributed.runs_hf`) against
numbers derived here by hand from the tiny models' shapes. No engine runs.

Every case: two ranks of DDP (Accelerate's ``DistributedDataParallel``, gradient buckets that
copy the gradients), bf16 weights under the Trainer's ``bf16=True`` (autocast), the Trainer's
``adamw_torch_fused``, SDPA attention, s = 32 tokens x b = 2 sequences per rank (T = 64).
Per rank, with Ψ parameters in P tensors:

* parameters 2Ψ, gradients 2Ψ, AdamW's two bf16 moments 4Ψ plus a 0-d fp32 ``step`` per
  tensor (4P, fused AdamW: on the parameter's device), DDP's buckets 2Ψ (one bucket: 2Ψ is
  below DDP's 1 MiB first bucket);
* saved for backward, per token (2-byte activations): each of Transformers' own RMSNorms keeps
  an fp32 copy of its input (4h), the bf16 normalised tensor (2h) and an fp32 rsqrt (4), and the
  linear after it its output (2h): 8h + 4; SDPA with GQA keeps q (2q), k and v at key/value
  width (2 x 2kv), the fp32 log-sum-exp (4a) and o_proj's input (2q); a SwiGLU MLP 4 x 2f;
  the MoE block (grouped_mm experts) the fp32 router probabilities (4E), the int64 top-k
  indices (8k), the dispatched inputs (2hk), 4 x 2f per expert slot (gate_up output 2f, SiLU
  output, down input), the expert outputs (2hk), the sorted routing weights (Mixtral fp32 4k,
  Qwen3-MoE bf16 2k), three int64 index tensors (3 x 8k), and per layer the int32 offsets (4E);
  Mixtral's top-k renormalisation its fp32 weights (4k) and their sum (4); Qwen3's q/k norms
  the same three tensors per head as a layer norm (4q + 2q + 4a, 4kv + 2kv + 4 kv-heads).
  Once per model: the rotary cos and sin, 2 x (1, s, head_dim) bf16; the int64 token ids
  (8T); the final norm (8h + 4 per token, the LM-head input included); the loss's int64 shifted
  labels (8T), nll_loss's 0-d fp32 total weight (4), its fp32 log-probabilities (4V per token)
  and the Trainer's 0-d fp32 ``num_items_in_batch`` divisor (4).
"""

from __future__ import annotations

import pytest

from parmem.engine_records import DIFFERENCES, load_records, predicted
from parmem.model import ModelSpec

RECORDS = [r for r in load_records() if r["engine"] == "hf"]
S, B, V, LAYERS = 32, 2, 512, 2
T = S * B
A, KVH, D = 4, 2, 40  # query heads, key/value heads, head_dim
Q, KV = A * D, KVH * D  # 160, 80
E, K = 4, 2  # experts, top-k


def _attn_params(h: int) -> int:
    return h * Q + 2 * h * KV + Q * h  # q, k, v, o projections (no biases)


def _shell(h: int, layer: int) -> int:
    return LAYERS * layer + 2 * V * h + h  # untied embedding and LM head, final norm


#: family -> (h, parameters, parameter tensors), from the configs of runs_hf.TINY
SHAPES = {
    # q, k, v, o; gate, up, down (h x 224); two norms
    "llama": (128, _shell(128, _attn_params(128) + 3 * 128 * 224 + 2 * 128), LAYERS * 9 + 3),
    # q, k, v, o; router (E x h); gate_up (E x 2f x h) and down (E x h x f), f = 96; two norms
    "mixtral": (
        64,
        _shell(64, _attn_params(64) + E * 64 + E * 2 * 96 * 64 + E * 64 * 96 + 2 * 64),
        LAYERS * 9 + 3,
    ),
    # as Mixtral with f = 48, plus q_norm and k_norm (head_dim each)
    "qwen3_moe": (
        64,
        _shell(64, _attn_params(64) + 2 * D + E * 64 + E * 2 * 48 * 64 + E * 64 * 48 + 2 * 64),
        LAYERS * 11 + 3,
    ),
}
CASE_FAMILY = {"ddp-llama": "llama", "ddp-mixtral": "mixtral", "ddp-qwen3-moe": "qwen3_moe"}


def _per_token_layer(family: str) -> int:
    h = SHAPES[family][0]
    norm = 4 * h + 2 * h + 4 + 2 * h
    attn = 2 * Q + 2 * 2 * KV + 4 * A + 2 * Q
    if family == "llama":
        return 2 * norm + attn + 4 * 2 * 224
    ef = {"mixtral": 96, "qwen3_moe": 48}[family]
    moe = 4 * E + 8 * K + 2 * h * K + 4 * 2 * ef * K + 2 * h * K + 3 * 8 * K
    if family == "mixtral":
        moe += 4 * K + 4 * K + 4  # fp32 routing weights; renormalised top-k weights and sum
    else:
        moe += 2 * K  # bf16 routing weights
        attn += (4 * Q + 2 * Q + 4 * A) + (4 * KV + 2 * KV + 4 * KVH)  # q_norm, k_norm
    return 2 * norm + attn + moe


def saved_by_hand(family: str) -> tuple[int, int]:
    """(the estimate's activations + logits, the Trainer's divisor) for one rank."""
    h = SHAPES[family][0]
    layer = T * _per_token_layer(family) + (4 * E if family != "llama" else 0)
    rotary = 2 * 2 * S * D
    first = 8 * T
    last = T * (8 * h + 4) + 8 * T + 4  # the final norm, its output the LM head's input
    logits = 4 * T * V
    return LAYERS * layer + rotary + first + last + logits, 4


def _rec(case: str, rank: int) -> dict:
    got = [r for r in RECORDS if r["case"] == case and r["rank"] == rank]
    assert len(got) == 1, f"{case} rank {rank}: {len(got)} records"
    return got[0]


def test_every_case_is_recorded_on_both_ranks():
    from parmem.distributed.runs_hf import CASES

    assert set(CASES) == set(CASE_FAMILY)
    for case, (world, _) in CASES.items():
        for rank in range(world):
            rec = _rec(case, rank)
            assert rec["world_size"] == world == rec["parallel"]["dp"] == 2


@pytest.mark.parametrize("case", CASE_FAMILY)
def test_the_spec_counts_what_the_trainer_trained(case):
    _, psi, tensors = SHAPES[CASE_FAMILY[case]]
    for rank in (0, 1):
        rec = _rec(case, rank)
        assert ModelSpec(**rec["model"]).num_params() == psi == rec["facts"]["num_params"]
        assert rec["facts"]["param_tensors"] == tensors == rec["facts"]["grad_tensors"]
        assert rec["facts"]["optimizer_tensors"] == 3 * tensors  # exp_avg, exp_avg_sq, step


@pytest.mark.parametrize("case", CASE_FAMILY)
def test_states_and_buckets_by_hand(case):
    _, psi, tensors = SHAPES[CASE_FAMILY[case]]
    for rank in (0, 1):
        rec = _rec(case, rank)
        m, f = rec["measured"], rec["facts"]
        assert m["params"] == m["grads"] == 2 * psi
        assert m["optimizer"] == 4 * psi + 4 * tensors
        assert f["ddp_bucket_sizes"] == [2 * psi] and m["comm_buffers"] == 2 * psi
        assert 2 * psi < 1 << 20  # one bucket: below DDP's first-bucket cap
        assert f["ddp_gradient_as_bucket_view"] is False
        assert f["param_dtypes"] == ["bfloat16"]
        assert f["optimizer"] == "AdamW(fused=True)"
        assert f["optimizer_state"] == [
            "exp_avg:bfloat16:cpu",
            "exp_avg_sq:bfloat16:cpu",
            "step:float32:cpu",
        ]
        assert DIFFERENCES["adamw-fused-step-counters"].bytes(rec) == 4 * tensors


@pytest.mark.parametrize("case", CASE_FAMILY)
def test_saved_tensors_by_hand(case):
    profile, divisor = saved_by_hand(CASE_FAMILY[case])
    for rank in (0, 1):
        rec = _rec(case, rank)
        assert rec["measured"]["saved"] == profile + divisor
        assert predicted(rec)["saved"] == profile
        assert rec["named"]["saved"] == ["trainer-loss-divisor"]
        assert DIFFERENCES["trainer-loss-divisor"].bytes(rec) == divisor


@pytest.mark.parametrize("case", CASE_FAMILY)
def test_the_setup_is_what_the_trainer_ran(case):
    for rank in (0, 1):
        rec = _rec(case, rank)
        st, f = rec["setup"], rec["facts"]
        assert (st["engine"], st["precision"], st["grad_buckets"]) == ("hf", "bf16", "copy")
        assert (st["seq_len"], st["micro_batch"], st["flash_attention"]) == (S, B, True)
        assert f["mixed_precision"] == "bf16" and f["autocast"] is True
        assert f["wrapper"] == "DistributedDataParallel"
        assert f["tokens_per_rank"] == T


def test_fsdp_is_left_out_because_the_hf_profile_refuses_it():
    """The FSDP case is not recorded: the hf profile has no sharding (runs_hf.REFUSED)."""
    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.distributed.runs_hf import REFUSED

    assert "fsdp-llama" in REFUSED
    spec = ModelSpec(**_rec("ddp-llama", 0)["model"])
    with pytest.raises(ValueError, match="zero=3"):
        estimate(spec, ParallelConfig(dp=2, zero=3), TrainingSetup(seq_len=S, engine="hf"))
