"""DeepSpeed's recorded runs (``data/engine_runs/deepspeed.json``, written by
``scripts/record_engine_runs.py --engine deepspeed`` from :mod:`parmem.distributed.runs_deepspeed`)
checked against numbers derived here by hand from the tiny shapes. No engine runs.

The shapes (``runs_deepspeed.TINY``): h = 64, 4 query heads and 2 key/value heads of 16
(query width 64, key/value width 32), FFN 80, 2 layers, vocabulary 256, untied embeddings,
d = 2 ranks. Per layer, in Transformers' parameter order:

* attention: q 64x64 = 4096, k 32x64 = 2048, v 32x64 = 2048, o 64x64 = 4096 -> 12288;
* Llama MLP: gate, up 80x64 and down 64x80 = 3 x 5120 -> 15360;
* Mixtral MoE: router 4x64 = 256, experts gate_up 4x160x64 = 40960, down 4x64x80 = 20480;
* two RMSNorm weights of 64 -> 128.

Llama: embedding 256x64 = 16384, 2 x (12288 + 15360 + 128) = 55552, final norm 64, LM head
16384 -> Ψ = 88384 in 21 tensors. Mixtral: 16384 + 2 x (12288 + 256 + 61440 + 128) + 64 + 16384
-> Ψ = 181056 in 21 tensors.
"""

from __future__ import annotations

import math

import pytest

from parmem.engine_records import DIFFERENCES, RECORDS_DIR, compare_record, load_records
from parmem.model import ModelSpec

D = 2
BUCKET = 500_000_000  # DeepSpeedZeroConfig.reduce_bucket_size, elements
ATTN = 64 * 64 + 32 * 64 + 32 * 64 + 64 * 64
LLAMA_LAYER = ATTN + 3 * 80 * 64 + 2 * 64
MIXTRAL_LAYER = ATTN + 4 * 64 + 4 * 160 * 64 + 4 * 64 * 80 + 2 * 64
PSI = {
    "llama": 2 * 256 * 64 + 2 * LLAMA_LAYER + 64,
    "mixtral": 2 * 256 * 64 + 2 * MIXTRAL_LAYER + 64,
}
# ZeRO-3 persistent parameters (at most 1024 elements): 5 norms of 64, and Mixtral's 2 routers
PERSISTENT = {"llama": (5, 5 * 64), "mixtral": (7, 5 * 64 + 2 * 4 * 64)}
# DeepSpeed's largest module (its own parameters): the embedding or LM head 256x64 for Llama,
# Mixtral's experts module (gate_up + down)
LARGEST = {"llama": 256 * 64, "mixtral": 4 * 160 * 64 + 4 * 64 * 80}
# ZeRO-1/2 flat group split at Ψ/2 = 44192. Offsets: embedding [0, 16384), layer 0 [16384,
# 44160), layer 1's q_proj [44160, 48256) straddles the boundary: rank 0's parameters end at
# 48256, rank 1's start at 44160.
IN_PARTITION = {0: 16384 + LLAMA_LAYER + 4096, 1: PSI["llama"] - (16384 + LLAMA_LAYER)}

CASES = {
    "llama-zero1": ("llama", 1),
    "llama-zero2": ("llama", 2),
    "llama-zero3": ("llama", 3),
    "mixtral-zero3": ("mixtral", 3),
}
RECORDS = [r for r in load_records() if r.get("engine") == "deepspeed"]
IDS = [f"{r['case']}:rank{r['rank']}" for r in RECORDS]


def test_the_hand_derivation():
    assert PSI == {"llama": 88384, "mixtral": 181056}
    assert IN_PARTITION == {0: 48256, 1: 44224}
    assert 16384 + LLAMA_LAYER < PSI["llama"] // D < 16384 + LLAMA_LAYER + 4096


def test_every_case_is_recorded_on_two_ranks():
    assert (RECORDS_DIR / "deepspeed.json").is_file()
    got = sorted((r["case"], r["rank"]) for r in RECORDS)
    assert got == sorted((c, k) for c in CASES for k in range(D))


def _case(rec):
    family, zero = CASES[rec["case"]]
    return family, zero, PSI[family]


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_the_run_is_deepspeeds_own_step(rec):
    family, zero, psi = _case(rec)
    f = rec["facts"]
    assert rec["versions"]["deepspeed"] == "0.19.8"
    assert rec["world_size"] == D and rec["parallel"] == {"dp": D, "zero": zero}
    assert f["zero_optimizer"] == (
        "DeepSpeedZeroOptimizer_Stage3" if zero == 3 else "DeepSpeedZeroOptimizer"
    )
    assert f["base_optimizer"] == "FusedAdam"  # DeepSpeed's "AdamW", as on a GPU
    assert f["comm_backend"] == "gloo"
    assert len(f["losses"]) == 2 and all(math.isfinite(x) for x in f["losses"])
    assert f["losses"][0] == pytest.approx(math.log(256), abs=0.3)  # an untrained model


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_facts_from_the_shapes(rec):
    family, zero, psi = _case(rec)
    f = rec["facts"]
    assert ModelSpec(**rec["model"]).num_params() == psi
    assert f["num_params"] == psi and f["param_tensors"] == 21
    # every tensor has an even size: no padding, whether the group is split flat (ZeRO-1/2:
    # ⌈Ψ/d⌉, aligned to 2·d) or tensor by tensor (ZeRO-3: Σ ⌈n/d⌉)
    assert f["partition_numel"] == psi // D
    assert f["reduce_bucket_size"] == BUCKET
    if zero == 3:
        assert (f["persistent_tensors"], f["persistent_numel"]) == PERSISTENT[family]
        assert f["largest_module_params"] == LARGEST[family]
    else:
        assert f["flat_numel"] == psi
        assert f["params_in_partition_numel"] == IN_PARTITION[rec["rank"]]


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_measured_bytes_from_the_shapes(rec):
    """2-byte weights and gradients, 4-byte fp32 master and gradient partition, 2 x 4-byte
    Adam moments, one 2-byte reduction bucket of 5e8 elements."""
    family, zero, psi = _case(rec)
    part = psi // D
    m = rec["measured"]
    assert m["optimizer"] == 4 * part + 8 * part
    assert m["optimizer_step"] == 4 * part
    if zero == 1:  # every param.grad before the reduction
        assert (m["params"], m["grads"], m["comm_buffers"]) == (2 * psi, 2 * psi, 2 * BUCKET)
    elif zero == 2:  # the whole of every parameter overlapping the partition
        grads = 2 * IN_PARTITION[rec["rank"]]
        assert (m["params"], m["grads"], m["comm_buffers"]) == (2 * psi, grads, 2 * BUCKET)
    else:
        _, persist = PERSISTENT[family]
        assert m["params"] == 2 * part + 2 * persist
        assert m["grads"] == 2 * part  # grad_partitions_flat_buffer
        assert m["comm_buffers"] == 2 * BUCKET + 2 * (psi - persist)  # the whole model gathered
        assert rec["facts"]["gathered_peak"]["comm_buffers"] == m["comm_buffers"]


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_the_named_differences_from_the_shapes(rec):
    family, zero, psi = _case(rec)
    part = psi // D
    want: dict[str, int] = {}
    if zero == 2:
        want["grads"] = 2 * (IN_PARTITION[rec["rank"]] - part)  # 8128 on rank 0, 64 on rank 1
    if zero == 3:
        _, persist = PERSISTENT[family]
        want = {
            "params": 2 * persist,
            "comm_buffers": 2 * (psi - persist) - 4 * LARGEST[family],
        }
    rows = {r.category: r for r in compare_record(rec)}
    assert {c: r.named_bytes for c, r in rows.items() if r.named} == want
    assert all(r.equal for r in rows.values())
    for names in rec["named"].values():
        for n in names:
            assert DIFFERENCES[n].gpu, n  # each is DeepSpeed's own behaviour, on a GPU too


@pytest.mark.parametrize(
    "rec",
    [r for r in RECORDS if r["parallel"]["zero"] == 3],
    ids=[i for i, r in zip(IDS, RECORDS, strict=True) if r["parallel"]["zero"] == 3],
)
def test_the_profile_zero3_accounting_the_differences_assume(rec):
    """The deepspeed profile at ZeRO-3 counts what the engine measured, not DeepSpeed's estimator:
    a 16-bit gradient partition (2 x psi/d) throughout and the fp32 one (4 x psi/d, below one
    sub-group of 1e9 elements) in the step only; buffers of 4 x the largest module (plus the
    bucket), as the estimator. Should the profile change, these differences change with it."""
    from parmem.engine_records import predicted

    family, _, psi = _case(rec)
    p = predicted(rec)
    assert p["grads"] == 2 * (psi // D) and p["optimizer_step"] == 4 * (psi // D)
    assert p["comm_buffers"] == 2 * BUCKET + 4 * LARGEST[family]


def test_the_gathered_difference_refuses_a_large_model():
    rec = {"facts": {"num_params": 10**8, "persistent_numel": 0, "largest_module_params": 1}}
    with pytest.raises(ValueError, match="5e7"):
        DIFFERENCES["deepspeed-zero3-gathered-params"].bytes(rec)
