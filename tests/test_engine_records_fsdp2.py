"""torchtitan's recorded runs (``data/engine_runs/fsdp2.json``, written by
``scripts/record_engine_runs.py --engine fsdp2`` from :mod:`parmem.distributed.runs_fsdp2`)
checked against numbers derived here by hand from the shapes. No engine runs.

Llama 3 ``debugmodel`` (torchtitan 0.3.0): h = 256, 16 heads of 16, ffn 768, 6 layers,
vocabulary 2048, untied. A block: fused wqkv 768x256 + wo 256x256 = 4h², w1 w2 w3 = 3hf, two
RMSNorm weights 2h -> 852480, in 7 tensors. Ψ = 2Vh + h + 6 x 852480 = 6163712, in 45 tensors.
Under TP (t = 2) the matmuls, the embedding (vocabulary rows) and the LM head are split, the norms
replicated: (2Vh/t + h + 6 (4h²/t + 3hf/t + 2h)) = 3083520 elements on a TP rank.
Under PP (2 stages, torchtitan's split with the embedding and the head counted as a layer each):
stage 0 = embedding + blocks 0-2 = 3081728, stage 1 = blocks 3-5 + final norm + LM head =
3081984.

DeepSeek-V3 ``debugmodel``: h = 256, 16 heads, MLA (q_lora_rank 0, kv_lora_rank 512, qk head
128 + 64, v head 128): wq 256 x 16·192, wkv_a 256 x (512 + 64), kv_norm 512, wkv_b 512 x
16·(128 + 128), wo 16·128 x 256, two norms -> 3556352 per layer; layer 0 a dense FFN 3 x 256 x
1024; layers 1-5 MoE: 8 experts 3 x 8 x 256 x 256, router 8 x 256, 2 shared experts as one FFN
of 512: 3 x 256 x 512. Ψ = 33014016 in 83 tensors.

Every rank: fp32 shards (4 bytes), fp32 gradients (4), AdamW's two fp32 moments (8) over d = 2,
plus a 4-byte step counter per parameter tensor.
"""

from __future__ import annotations

import pytest

from parmem.engine_records import DIFFERENCES, compare_record, load_records
from parmem.model import ModelSpec

V, H, A, F, L = 2048, 256, 16, 768, 6
HD = H // A
BLOCK = 4 * H * H + 3 * H * F + 2 * H
PSI = 2 * V * H + H + L * BLOCK
TENSORS = 7 * L + 3
D, T = 2, 2
TP_LOCAL = 2 * V * H // T + H + L * ((4 * H * H + 3 * H * F) // T + 2 * H)
TP_BLOCK = (4 * H * H + 3 * H * F) // T + 2 * H
STAGE = {0: V * H + 3 * BLOCK, 1: 3 * BLOCK + H + V * H}
STAGE_TENSORS = {0: 1 + 3 * 7, 1: 3 * 7 + 2}

MLA = H * A * (128 + 64) + H * (512 + 64) + 512 + 512 * A * (128 + 128) + A * 128 * H + 2 * H
MOE = 3 * 8 * H * 256 + 8 * H + 3 * H * 512
DSV3 = 2 * V * H + H + 6 * MLA + 3 * H * 1024 + 5 * MOE
DSV3_TENSORS = 3 + 10 + 5 * 14

RECORDS = [r for r in load_records() if r.get("engine") == "fsdp2"]
IDS = [f"{r['case']}:rank{r['rank']}" for r in RECORDS]
CASES = {"llama3-fsdp": 2, "llama3-fsdp-tp": 4, "llama3-fsdp-pp": 4, "dsv3-moe-fsdp": 2}


def _recs(case):
    return [r for r in RECORDS if r["case"] == case]


def test_the_hand_derivation():
    assert (BLOCK, PSI, TENSORS) == (852480, 6163712, 45)
    assert (TP_LOCAL, TP_BLOCK) == (3083520, 426496)
    assert STAGE == {0: 3081728, 1: 3081984} and sum(STAGE.values()) == PSI
    assert (MLA, MOE, DSV3) == (3556352, 1968128, 33014016)


def test_every_case_is_recorded_on_every_rank():
    for case, world in CASES.items():
        recs = _recs(case)
        assert sorted(r["rank"] for r in recs) == list(range(world)), case
        assert all(r["world_size"] == world for r in recs)
        assert all(r["versions"]["torchtitan"] == "0.3.0" for r in recs)


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_the_spec_counts_what_torchtitan_built(rec):
    psi = DSV3 if rec["case"].startswith("dsv3") else PSI
    assert ModelSpec(**rec["model"]).num_params() == psi
    assert rec["facts"]["num_params_whole"] == psi


@pytest.mark.parametrize("case", ["llama3-fsdp", "dsv3-moe-fsdp"])
def test_fsdp_states_are_16_bytes_per_parameter_over_d(case):
    psi, tensors = (DSV3, DSV3_TENSORS) if case.startswith("dsv3") else (PSI, TENSORS)
    for r in _recs(case):
        m = r["measured"]
        assert r["facts"]["param_tensors"] == tensors
        assert r["facts"]["num_params_local"] == psi // D
        assert (m["params"], m["grads"]) == (4 * psi // D, 4 * psi // D)
        assert m["optimizer"] == 8 * psi // D + 4 * tensors


def test_fsdp_tp_shards_the_tp_split_model_over_d():
    for r in _recs("llama3-fsdp-tp"):
        m = r["measured"]
        assert r["facts"]["num_params_local"] == TP_LOCAL // D
        assert (m["params"], m["grads"]) == (4 * TP_LOCAL // D, 4 * TP_LOCAL // D)
        assert m["optimizer"] == 8 * TP_LOCAL // D + 4 * TENSORS
        assert r["parallel"] == {"dp": D, "tp": T, "pp": 1, "zero": 3, "sp": True}


def test_a_block_is_gathered_in_bf16_and_reduced_in_fp32():
    """FSDP2's buffers of the largest block: 2 bytes per parameter gathered, 4 reduced."""
    largest = {"llama3-fsdp": BLOCK, "llama3-fsdp-tp": TP_BLOCK, "llama3-fsdp-pp": BLOCK,
               "dsv3-moe-fsdp": MLA + MOE}
    for r in RECORDS:
        f, n = r["facts"], largest[r["case"]]
        assert (f["block_all_gather"], f["block_all_gather_dtype"]) == (2 * n, "torch.bfloat16")
        assert (f["block_reduce_scatter"], f["block_reduce_scatter_dtype"]) == (
            4 * n, "torch.float32")
        if r["parallel"]["pp"] == 1:
            assert r["measured"]["comm_buffers"] == 2 * 2 * n + 4 * n


def test_pp_keeps_each_stage_unsharded_between_micro_batches():
    """torchtitan's reshard_after_forward=False under PP and the schedule's deferred
    reduce-scatter: when the schedule reduces, every stage parameter is unsharded in bf16 (2
    bytes) with an fp32 accumulated gradient (4), besides the fp32 shards; and
    torch.distributed.pipelining holds one receive buffer per micro-batch (m = 4, b = 1, s = 64:
    bf16 s x b x h each)."""
    for r in _recs("llama3-fsdp-pp"):
        f, m, s = r["facts"], r["measured"], r["stage"]
        assert s == r["rank"] // D  # the pp axis is the outer one
        n = STAGE[s]
        assert f["param_tensors"] == STAGE_TENSORS[s]
        assert (m["params"], m["grads"]) == (4 * n // D, 4 * n // D)
        assert m["optimizer"] == 8 * n // D + 4 * STAGE_TENSORS[s]
        assert f["stage_unsharded_weights"] == 2 * n
        assert f["stage_unsharded_grads"] == 4 * n
        assert f["pp_recv_buffers"] == 4 * 2 * 64 * 1 * H
        assert m["comm_buffers"] == 6 * n + 4 * 2 * 64 * H
        assert f["stage_layers"] == [str(i) for i in range(3 * s, 3 * s + 3)]
        # the estimate's pair of boundary tensors, and the named rest: 4 - 2 buffers
        assert DIFFERENCES["pipelining-recv-buffers"].bytes(r) == 2 * 2 * 64 * H


def _saved_per_token(t: int) -> tuple[int, int]:
    """(bytes per token of every block, of the embedding, final norm, LM head and loss) of the
    Llama debugmodel on CPU, s·b tokens on the rank; under SP (t > 1) the norms see s/t of them.
    Per block: two nn.RMSNorm (CPU composite: fp32 copy and fp32 normalised tensor, 4h + 4h, and
    an fp32 rstd, 4), the bf16 matmul inputs of wqkv and w1/w3 (2h each, all-gathered under SP:
    whole h), the complex64 RoPE cache at the positions (4 x head_dim), q, k, v and the
    attention output (4 x 2h/t), the fp32 log-sum-exp (4 x heads/t), w1's and w3's outputs,
    SiLU's and the product (4 x 2f/t)."""
    norm = (8 * H + 4) // t  # per token of the micro-batch, sequence-sharded under SP
    block = 2 * norm + 2 * 2 * H + 4 * HD + 4 * 2 * H // t + 4 * A // t + 4 * 2 * F // t
    # ids (int64), final norm, LM-head input (bf16, all-gathered), fp32 log-probabilities
    # (V/t), int64 labels
    ends = 8 + norm + 2 * H + 4 * V // t + 8
    return block, ends


@pytest.mark.parametrize("case,t", [("llama3-fsdp", 1), ("llama3-fsdp-tp", T)])
def test_saved_tensors_of_the_micro_batch(case, t):
    """One micro-batch (s = 64, b = 2) of the Llama debugmodel; besides the per-token bytes, the
    0-d int64 valid-token count (8), F.cross_entropy's 0-d fp32 total weight (4; the vocab-
    parallel loss under TP keeps none) and, under TP, torchtitan's vocab-parallel embedding's
    (b, s, 1) bf16 mask (2 per token)."""
    tokens = 64 * 2
    block, ends = _saved_per_token(t)
    extra = 8 + (4 if t == 1 else 2 * tokens)
    want = tokens * (L * block + ends) + extra
    assert want == {1: 11706892, 2: 6305288}[t]
    for r in _recs(case):
        assert r["measured"]["saved"] == want
        assert r["facts"]["rmsnorm_calls"] == 2 * L + 1
        assert r["facts"]["rmsnorm_elements"] == (2 * L + 1) * tokens * H // t
        assert DIFFERENCES["cpu-rmsnorm"].bytes(r) == 6 * (2 * L + 1) * tokens * H // t


def test_the_difference_functions_on_hand_records():
    rec = {"setup": {"seq_len": 64, "micro_batch": 2, "num_microbatches": 4},
           "model": {"hidden": H}, "parallel": {"pp": 2, "tp": 1}, "stage": 0}
    assert DIFFERENCES["torchtitan-tp-embedding-mask"].bytes(rec) == 2 * 128
    assert DIFFERENCES["tp-collective-output-not-measured"].bytes(rec) == -2 * 128 * H
    assert DIFFERENCES["loss-parallel-no-total-weight"].bytes(rec) == -4
    # a middle stage of three receives activations and gradients: 2m - 2 buffers
    mid = dict(rec, parallel={"pp": 3, "tp": 2, "sp": True}, stage=1)
    assert DIFFERENCES["pipelining-recv-buffers"].bytes(mid) == 6 * 2 * 128 * H // 2


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_each_row_is_the_estimate_or_named(rec):
    rows = compare_record(rec)
    assert {r.category for r in rows} >= {"params", "grads", "optimizer", "comm_buffers"}
    assert all(r.equal for r in rows), [r for r in rows if not r.equal]
