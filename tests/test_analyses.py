"""The studies of ``parmem.analyses`` that the book's figures draw.

Expected values are derived here by hand from the sources: ZeRO's Figure 1 and §7 (Rajbhandari
et al. 2020), the ring collectives and the alpha-beta model (Thakur et al. 2005 §4), Megatron's
tensor-parallel layout (Shoeybi et al. 2019 §3) and sequence parallelism (Korthikanti et al. 2022
§4.2.2), with the published shapes of Llama-2-7B (Touvron et al. 2023) and Llama-3-70B.
"""

from __future__ import annotations

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.analyses import (
    collective_curves,
    tp_component_bytes,
    tp_shard_layout,
    tp_tradeoff,
    zero3_vs_tp,
    zero_stages,
)

LLAMA7 = ModelSpec.preset("llama-2-7b")     # h 4096, a = kv 32, L 32, f 11008, V 32000, untied
LLAMA70 = ModelSpec.preset("llama-3-70b")   # h 8192, a 64, kv 8, L 80, f 28672, V 128256
PSI_70B = 70_553_706_496                    # Llama-3-70B parameters (Meta's model card: 70.6B)


# ---------------------------------------------------------------------------- zero_stages
def test_zero_stages_reproduce_zero_figure1():
    # Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, d = 64, K = 12: 120, 31.4, 16.6, 1.9 GB.
    # Exactly (Ψ/64 = 117,187,500): 16Ψ; 4Ψ + 12Ψ/64; 2Ψ + 14Ψ/64; 16Ψ/64 bytes.
    psi, d = 7_500_000_000, 64
    rows = zero_stages(psi, d)
    assert [r["zero"] for r in rows] == [0, 1, 2, 3]
    assert [r["model_states"] for r in rows] == [16 * psi, 4 * psi + 12 * psi // d,
                                                 2 * psi + 14 * psi // d, 16 * psi // d]
    assert [round(r["model_states"] / 1e9, 1) for r in rows] == [120.0, 31.4, 16.6, 1.9]
    assert [r["params"] for r in rows] == [2 * psi] * 3 + [2 * psi // d]
    assert [r["grads"] for r in rows] == [2 * psi] * 2 + [2 * psi // d] * 2
    assert [r["optimizer"] for r in rows] == [12 * psi] + [12 * psi // d] * 3
    assert all(r["params"] + r["grads"] + r["optimizer"] == r["model_states"] for r in rows)
    assert all((r["num_params"], r["dp"], r["num_microbatches"]) == (psi, d, 1) for r in rows)


def test_zero_stages_communication_follows_section7():
    # §7: DP, ZeRO-1 and ZeRO-2 send 2Ψ values per step (a ring all-reduce of the 16-bit
    # gradients, or reduce-scatter + all-gather: 2(d-1)/d of 2Ψ bytes), ZeRO-3 3Ψ (1.5x).
    psi, d = 7_500_000_000, 64
    rows = zero_stages(psi, d)
    frac = (d - 1) / d
    assert [r["dp_bytes"] for r in rows] == [2 * 63 * (2 * psi // 64)] * 3 \
        + [3 * 63 * (2 * psi // 64)]
    assert [r["dp_values"] for r in rows] == pytest.approx([2 * frac] * 3 + [3 * frac])


def test_zero_stages_with_gradient_accumulation():
    # m micro-batches: DDP and ZeRO-1 communicate once per step, ZeRO-2 reduce-scatters every
    # micro-batch (m reduce-scatters + 1 all-gather), ZeRO-3 also gathers the parameters in every
    # micro-batch's forward and backward (m reduce-scatters + 2m all-gathers)
    d, m = 8, 4
    rows = zero_stages(1_000_000_000, d, num_microbatches=m)
    frac = (d - 1) / d
    assert [r["dp_values"] for r in rows] == pytest.approx(
        [2 * frac, 2 * frac, (m + 1) * frac, 3 * m * frac])


def test_zero_stages_rejects_no_parameters():
    with pytest.raises(ValueError, match="num_params"):
        zero_stages(0, 8)


# ---------------------------------------------------------------------------- zero3_vs_tp
def test_zero3_vs_tp_states_fall_as_one_over_d_activations_do_not():
    dps = (1, 2, 8)
    rows = zero3_vs_tp(LLAMA70, 4096, tp=8, dps=dps)
    assert [(r["t"], r["sp"], r["d"]) for r in rows] == \
        [(1, False, d) for d in dps] + [(8, True, d) for d in dps]
    t1 = [r for r in rows if r["t"] == 1]
    # ZeRO-3 (§5.3): all 16Ψ bytes of model states sharded over d
    assert [r["model_states"] for r in t1] == [16 * PSI_70B // d for d in dps]
    # logits: s·V fp32 values (b = 1), vocab-parallel under TP
    assert t1[0]["logits"] == 4096 * 128256 * 4
    for t in (1, 8):
        same_t = [r for r in rows if r["t"] == t]
        assert len({r["activations"] for r in same_t}) == 1  # d never touches activations
        assert len({r["logits"] for r in same_t}) == 1
    t8 = [r for r in rows if r["t"] == 8]
    # TP + SP divide every activation term by t (no s² term with FlashAttention)
    assert t1[0]["activations"] == 8 * t8[0]["activations"]
    assert t1[0]["logits"] == 8 * t8[0]["logits"]
    assert all(r["model"] == "llama-3-70b" and r["seq_len"] == 4096 for r in rows)


def test_zero3_vs_tp_one_tensor_parallel_size_when_tp_is_one():
    rows = zero3_vs_tp(LLAMA7, 1024, tp=1, dps=(1, 2))
    assert [(r["t"], r["d"]) for r in rows] == [(1, 1), (1, 2)]


# ---------------------------------------------------------------------------- tp_shard_layout
def test_tp_shard_layout_llama7b_panels_and_splits():
    lay = tp_shard_layout(LLAMA7, 4)
    assert (lay["model"], lay["tp"], lay["kv_heads"]) == ("llama-2-7b", 4, 32)
    titles = [p["title"].split("\n")[0] for p in lay["panels"]]
    assert titles == ["embedding", "Q | K | V", "attention out", "MLP in (gate | up)", "MLP out",
                      "norms", "LM head"]
    by = {p["title"].split("\n")[0]: p for p in lay["panels"]}
    # vocab-parallel embedding [V, h] by rows, LM head [h, V] by columns
    assert (by["embedding"]["rows"], by["embedding"]["axis"]) == (32000, "rows")
    assert (by["LM head"]["cols"], by["LM head"]["axis"]) == (32000, "cols")
    # Q, K, V each in 4 head groups: a/t = kv/t = 8 heads of the 96, 1/12 of the columns each
    qkv = by["Q | K | V"]
    assert qkv["cols"] == (32 + 2 * 32) * 128
    assert [f for f, _ in qkv["parts"]] == pytest.approx([1 / 12] * 12)
    assert [o for _, o in qkv["parts"]] == [[r] for r in range(4)] * 3
    # SwiGLU: gate and up, each split in 4 columns; down and attention out split by rows
    assert [f for f, _ in by["MLP in (gate | up)"]["parts"]] == pytest.approx([1 / 8] * 8)
    assert by["MLP in (gate | up)"]["cols"] == 2 * 11008
    assert by["MLP out"]["axis"] == by["attention out"]["axis"] == "rows"
    assert by["norms"]["parts"] == [(1.0, [0, 1, 2, 3])]  # replicated on every rank
    for p in lay["panels"]:
        assert sum(f for f, _ in p["parts"]) == pytest.approx(1.0)


def test_tp_shard_layout_kv_heads_shared_when_t_exceeds_them():
    # Llama-3-70B, t = 16 > kv = 8: each K and V head is kept by 16/8 = 2 ranks; Q splits into
    # 64/16 = 4 heads per rank, 4/80 of the QKV columns, and each K or V head is 1/80
    qkv = tp_shard_layout(LLAMA70, 16)["panels"][1]
    parts = qkv["parts"]
    assert len(parts) == 16 + 8 + 8
    assert [f for f, _ in parts[:16]] == pytest.approx([4 / 80] * 16)
    assert [f for f, _ in parts[16:]] == pytest.approx([1 / 80] * 16)
    assert [o for _, o in parts[16:24]] == [[2 * j, 2 * j + 1] for j in range(8)]


def test_tp_shard_layout_tied_head_and_invalid_t():
    assert len(tp_shard_layout(ModelSpec.preset("gpt3-175b"), 8)["panels"]) == 6  # tied head
    with pytest.raises(ValueError):
        tp_shard_layout(LLAMA7, 3)  # 3 does not divide 32 heads


# ---------------------------------------------------------------------------- tp_component_bytes
def test_tp_component_bytes_llama7b_at_t4():
    # Shoeybi et al. 2019 §3: Q, K, V, O, the MLP (gate, up, down), embedding and LM head split
    # by t; the RMSNorm weights (2 per layer + the final one) stay whole. bf16: 2 bytes.
    h, L, f, V = 4096, 32, 11008, 32000
    rows = tp_component_bytes(LLAMA7, (1, 4), bytes_per_param=2)
    assert [(r["model"], r["t"], r["bytes_per_param"]) for r in rows] == \
        [("llama-2-7b", 1, 2), ("llama-2-7b", 4, 2)]
    assert rows[1]["components"] == {
        "embedding": 2 * V * h // 4, "attention Q, O": 2 * L * 2 * h * h // 4,
        "attention K, V": 2 * L * 2 * h * h // 4, "MLP": 2 * L * 3 * h * f // 4,
        "norms": 2 * (2 * L + 1) * h, "LM head": 2 * V * h // 4}
    assert sum(rows[0]["components"].values()) == 2 * 6_738_415_616  # 6.74B parameters
    model_states = tp_component_bytes(LLAMA7, (4,), bytes_per_param=16)[0]["components"]
    assert model_states == {k: 8 * v for k, v in rows[1]["components"].items()}


def test_tp_component_bytes_validates_bytes_per_param():
    with pytest.raises(ValueError, match="bytes_per_param"):
        tp_component_bytes(LLAMA7, (1,), bytes_per_param=0)


# ---------------------------------------------------------------------------- tp_tradeoff
def test_tp_tradeoff_traffic_and_buffer():
    # s = 4096, b = 1, bf16: X = s·b·h·2 bytes = 32 MiB. Per layer and micro-batch 2 all-reduces
    # forward + 2 backward, each sending 2(t-1)/t·X (ring): at t = 4, 4 · 32 · 1.5 · 32 MiB = 6 GiB.
    setup = TrainingSetup(seq_len=4096)
    rows = tp_tradeoff(LLAMA7, setup, (1, 2, 4))
    x = 4096 * 4096 * 2
    assert [r["t"] for r in rows] == [1, 2, 4]
    assert [r["tp_bytes"] for r in rows] == [0, 4 * 32 * x, 4 * 32 * 3 * x // 2]
    assert rows[2]["tp_bytes"] == 6 * 2**30
    assert [r["comm_buffer"] for r in rows] == [0, x, x]  # one s·b·h all-reduce buffer
    for r in rows:
        assert r["estimate"].peak_bytes == \
            estimate(LLAMA7, ParallelConfig(tp=r["t"]), setup).peak_bytes


# ---------------------------------------------------------------------------- collective_curves
def test_collective_curves_alpha_beta_and_crossover():
    # ring all-reduce on n ranks: 2(n-1)·α + 2(n-1)/n·S/β; latency = bandwidth term at S = n·α·β.
    # NVLink 4: 450 GB/s, 3 µs; InfiniBand NDR: 50 GB/s, 8 µs (data/hardware.yaml).
    n, size = 8, 2**26
    nv, ib = collective_curves("all_reduce", n, ("nvlink4", "ib-ndr"), mark=size)
    assert (nv["link"], nv["bandwidth"], nv["latency"]) == ("nvlink4", 450e9, 3e-6)
    assert nv["sizes"] == [2**k for k in range(10, 37)]
    assert nv["mark"][0] == size
    assert nv["mark"][1] == pytest.approx(2 * 7 * 3e-6 + 2 * 7 * size / 8 / 450e9)
    assert ib["mark"][1] == pytest.approx(2 * 7 * 8e-6 + 2 * 7 * size / 8 / 50e9)
    assert nv["times"][0] == pytest.approx(2 * 7 * 3e-6 + 2 * 7 * 2**10 / 8 / 450e9)
    assert nv["crossover"] == pytest.approx(n * 3e-6 * 450e9)
    assert ib["crossover"] == pytest.approx(n * 8e-6 * 50e9)
    # all-gather: (n-1) steps and (n-1)/n·S bytes: the same crossover n·α·β
    (ag,) = collective_curves("all_gather", 16, ("ib-ndr",), sizes=[2**20])
    assert ag["crossover"] == pytest.approx(16 * 8e-6 * 50e9)
    assert ag["times"] == pytest.approx([15 * 8e-6 + 15 * 2**20 / 16 / 50e9])
    assert ag["mark"] is None and (ag["op"], ag["n"]) == ("all_gather", 16)


def test_collective_curves_one_rank_sends_nothing():
    (one,) = collective_curves("all_reduce", 1, ("nvlink4",), sizes=[2**20])
    assert one["crossover"] is None and one["times"] == [0.0]
