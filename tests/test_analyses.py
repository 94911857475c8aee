"""The studies of ``parmem.analyses`` that the book's figures draw.

Expected values are derived here by hand from the sources: ZeRO's Figure 1 and §7 (Rajbhandari
et al. 2020), the ring collectives and the alpha-beta model (Thakur et al. 2005 §4), Megatron's
tensor-parallel layout (Shoeybi et al. 2019 §3) and sequence parallelism (Korthikanti et al. 2022
§4.2.2), with the published shapes of Llama-2-7B (Touvron et al. 2023) and Llama-3-70B; the
layer balance against brute force over every split, the micro-batch sweep against Korthikanti et
al. 2022 Table 2 times the in-flight counts of Narayanan et al. 2021 §2.2 and the bubble
(p-1)/(m+p-1), the layout sweep and the axis-by-axis estimates against estimate() and ZeRO §5.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from helpers import LLAMA7, cdiv, gpt_spec

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate, hardware_preset
from parmem.activations import per_layer_bytes
from parmem.analyses import (
    axis_by_axis,
    balance_layers,
    collective_curves,
    gpipe_remat_activations,
    layout_sweep,
    microbatch_sweep,
    tp_component_bytes,
    tp_shard_layout,
    tp_tradeoff,
    zero3_vs_tp,
    zero_stages,
)

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
    # NVLink 4: 450 GB/s, 3 µs; InfiniBand NDR: 50 GB/s, 8 µs (data/hardware.toml).
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


def compositions(total: int, parts: int, step: int = 1):
    """Every way to write ``total`` as ``parts`` positive multiples of ``step`` (brute force)."""
    for cuts in itertools.combinations(range(step, total, step), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[k + 1] - bounds[k] for k in range(parts)]


# ---------------------------------------------------------------------------- balance_layers
CASES = [
    # (spec, parallel, setup)
    (gpt_spec(8), ParallelConfig(pp=2), TrainingSetup(seq_len=128, num_microbatches=8)),
    (gpt_spec(9), ParallelConfig(pp=3), TrainingSetup(seq_len=256, micro_batch=2,
                                                      num_microbatches=6)),
    (gpt_spec(10, vocab=32000), ParallelConfig(pp=4), TrainingSetup(seq_len=256,
                                                                     num_microbatches=8)),
    (gpt_spec(10, vocab=32000, tied=True), ParallelConfig(pp=3),
     TrainingSetup(seq_len=64, num_microbatches=4, schedule="gpipe")),
    (gpt_spec(12, vocab=50000), ParallelConfig(pp=4, tp=2, sp=True),
     TrainingSetup(seq_len=256, num_microbatches=4, recompute="selective")),
    (gpt_spec(8), ParallelConfig(pp=2, dp=4, zero=3),
     TrainingSetup(seq_len=128, num_microbatches=2, recompute="full")),
    (gpt_spec(12), ParallelConfig(pp=2, vpp=2),
     TrainingSetup(seq_len=128, num_microbatches=4, schedule="interleaved")),
    (ModelSpec.preset("gpt2"), ParallelConfig(pp=3), TrainingSetup(seq_len=1024,
                                                                   num_microbatches=6)),
    (replace(ModelSpec.preset("mixtral-8x7b"), layers=8),
     ParallelConfig(pp=4, ep=2, dp=2), TrainingSetup(seq_len=512, num_microbatches=8,
                                                     flash_attention=True, dropout=False)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_balance_layers_matches_brute_force(case):
    spec, par, setup = CASES[case]
    split = balance_layers(spec, par, setup)
    assert len(split) == par.pp and sum(split) == spec.layers
    peaks = {tuple(c): estimate(spec, par, setup, layers_per_stage=c).peak_bytes
             for c in compositions(spec.layers, par.pp, par.vpp)}
    best = min(peaks.values())
    assert estimate(spec, par, setup, layers_per_stage=split).peak_bytes == best
    # the tie-break: of the optimal splits, the one closest to even
    mean = spec.layers / par.pp
    dev = {c: sum((n - mean) ** 2 for n in c) for c, pk in peaks.items() if pk == best}
    assert dev[tuple(split)] == pytest.approx(min(dev.values()))
    assert best <= estimate(spec, par, setup).peak_bytes  # never worse than the even split


def test_balance_layers_edge_cases():
    spec = gpt_spec(6)
    assert balance_layers(spec) == (6,)
    assert balance_layers(spec, ParallelConfig(pp=6), TrainingSetup(seq_len=64)) == (1,) * 6
    with pytest.raises(ValueError, match="pp=7 > layers=6"):
        balance_layers(spec, ParallelConfig(pp=7), TrainingSetup(seq_len=64))
    with pytest.raises(ValueError, match="interleaved"):
        balance_layers(gpt_spec(8), ParallelConfig(pp=2, vpp=2), TrainingSetup(seq_len=64))


def test_balance_layers_unloads_the_first_stage_of_llama():
    # 1F1B, m >= p: stage 0 holds p micro-batches, stage p-1 one (Narayanan et al. 2021 §2.2),
    # so the first stage must get fewer layers than the last.
    spec = ModelSpec.preset("llama-2-7b")
    par = ParallelConfig(pp=4)
    setup = TrainingSetup(seq_len=4096, num_microbatches=16, flash_attention=True, dropout=False)
    split = balance_layers(spec, par, setup)
    assert split[0] < spec.layers // 4 < split[-1]
    assert (estimate(spec, par, setup, layers_per_stage=split).peak_bytes
            < estimate(spec, par, setup).peak_bytes)


# ---------------------------------------------------------------------------- microbatch_sweep
def test_microbatch_sweep_follows_table2_times_in_flight():
    # GPT-3 175B (GeLU MLP, MHA, dropout): one layer keeps sbh(34 + 5as/h) bytes
    # (Korthikanti et al. 2022, Table 2); stage 0 of 8 keeps 12 layers plus the embedding-dropout
    # mask (s·b·h bytes) for each micro-batch in flight: min(p, m) under 1F1B, m under GPipe.
    spec = ModelSpec.preset("gpt3-175b")
    s, h, a, p, B = 2048, spec.hidden, spec.heads, 8, 32
    for schedule in ("1f1b", "gpipe"):
        rows = microbatch_sweep(spec, ParallelConfig(pp=p),
                                TrainingSetup(seq_len=s, schedule=schedule), global_batch=B)
        assert [r["b"] for r in rows] == [1, 2, 4, 8, 16, 32]
        for r in rows:
            b, m = r["b"], r["m"]
            assert m * b == B
            units = min(p, m) if schedule == "1f1b" else m
            per_mb = 12 * per_layer_bytes(s, b, h, a) + s * b * h
            assert r["in_flight"] == units
            assert r["activations"] == units * per_mb
            assert r["logits"] == units * 4 * s * b * spec.vocab_size if schedule == "gpipe" \
                else r["logits"] == 4 * s * b * spec.vocab_size  # last stage: 1 in flight
            assert r["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1))
        if schedule == "gpipe":  # GPipe holds the whole batch whatever b is
            assert len({r["activations"] for r in rows}) == 1


def test_gpipe_remat_keeps_stage_inputs_plus_one_recomputed_micro_batch():
    # Huang et al. 2019 §2.3: a stage stores its boundary input for each of the m
    # micro-batches (2sbh bytes; 2sbh/t with SP) and recomputes its L/p layers for one
    # micro-batch at a time, each keeping sbh(34 + 5as/h) (Korthikanti et al. 2022, Table 2)
    spec = ModelSpec.preset("gpt3-175b")
    s, h, a, m = 2048, spec.hidden, spec.heads, 8
    setup = TrainingSetup(seq_len=s, num_microbatches=m)
    got = gpipe_remat_activations(spec, ParallelConfig(pp=4), setup, stage=1)
    assert got == m * 2 * s * h + 24 * per_layer_bytes(s, 1, h, a)
    sp = ParallelConfig(pp=4, tp=8, sp=True)
    got = gpipe_remat_activations(spec, sp, setup, stage=1)
    assert got == m * 2 * s * h // 8 + 24 * per_layer_bytes(s, 1, h, a, tp=8, sp=True)
    with pytest.raises(ValueError, match="stage"):
        gpipe_remat_activations(spec, ParallelConfig(pp=4), setup, stage=4)


def test_microbatch_sweep_interleaved_skips_m_not_multiple_of_p():
    spec = gpt_spec(8)
    rows = microbatch_sweep(spec, ParallelConfig(pp=2, vpp=2),
                            TrainingSetup(seq_len=64, schedule="interleaved"), global_batch=8)
    assert [r["m"] for r in rows] == [8, 4, 2]  # m = 1 is not a multiple of p = 2
    # Korthikanti et al. 2022 §4.2.3: stage 0 holds p(1 + (p-1)/(pv)) = 2.5 stage micro-batches
    assert rows[0]["in_flight"] == pytest.approx(2 * (1 + 1 / 4))
    with pytest.raises(ValueError, match="must divide global_batch"):
        microbatch_sweep(spec, ParallelConfig(pp=2), TrainingSetup(seq_len=64), global_batch=8,
                         micro_batches=[3])


# ---------------------------------------------------------------------------- layout_sweep
def test_layout_sweep_enumerates_every_valid_grid():
    setup = TrainingSetup(seq_len=2048, flash_attention=True, dropout=False)
    rows = layout_sweep(LLAMA7, 8, setup, global_batch=16, zero=1)
    # t must divide 32 heads and p ≤ 32 layers: every (t, p) with t·p | 8 is valid
    assert sorted((r["t"], r["p"]) for r in rows) == sorted(
        (t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if 8 % (t * p) == 0)
    h100 = hardware_preset("h100-sxm")
    for r in rows:
        assert r["d"] * r["t"] * r["p"] == 8 and r["m"] == 16 // r["d"]
        par = ParallelConfig(dp=r["d"], tp=r["t"], pp=r["p"], sp=r["t"] > 1, zero=1)
        est = estimate(LLAMA7, par, TrainingSetup(seq_len=2048, flash_attention=True,
                                                  dropout=False, num_microbatches=r["m"]))
        assert r["peak_bytes"] == est.peak_bytes
        assert r["fits"] == (est.peak_bytes <= h100.memory_bytes)
        assert r["comm_bytes"] == sum(r[c] for c in ("dp", "tp", "sp", "pp", "ep", "cp"))


def test_layout_sweep_headroom_keeps_part_of_the_gpu_free():
    setup = TrainingSetup(seq_len=4096, flash_attention=True, dropout=False)
    usable = int(hardware_preset("h100-sxm").memory_bytes * 0.9)  # 10% kept free
    rows = layout_sweep(LLAMA7, 8, setup, global_batch=64, zero=1, headroom=0.1)
    assert all(r["fits"] == (r["peak_bytes"] <= usable) for r in rows)
    with pytest.raises(ValueError, match="headroom"):
        layout_sweep(LLAMA7, 8, setup, global_batch=64, headroom=1.0)


def test_layout_sweep_skips_uneven_batches_and_bad_tp():
    setup = TrainingSetup(seq_len=1024)
    rows = layout_sweep(LLAMA7, 64, setup, global_batch=8)
    assert all(8 % r["d"] == 0 for r in rows)          # d must divide the global batch
    assert all(32 % r["t"] == 0 for r in rows)         # t must divide the heads


# ---------------------------------------------------------------------------- axis_by_axis
def test_axis_by_axis_ends_at_the_full_estimate_and_each_axis_divides_its_terms():
    spec = ModelSpec.preset("gpt3-175b")
    par = ParallelConfig(dp=24, tp=8, pp=8, sp=True, zero=1)
    setup = TrainingSetup(seq_len=2048, num_microbatches=96, recompute="selective")
    steps = axis_by_axis(spec, par, setup)
    assert list(steps) == ["1 GPU", "d=24", "+ZeRO-1", "+t=8", "+SP", "+p=8",
                           "+selective recompute"]
    assert steps["+selective recompute"].stages == estimate(spec, par, setup).stages
    one, z1 = steps["d=24"].peak, steps["+ZeRO-1"].peak
    psi = spec.num_params()
    assert one.model_states == 16 * psi                      # plain DP divides nothing
    assert z1.params == 2 * psi and z1.grads == 2 * psi      # ZeRO-1 keeps weights, gradients
    assert z1.optimizer == 12 * cdiv(psi, 24)                # ... and shards the optimizer
    tp8, sp = steps["+t=8"].peak, steps["+SP"].peak
    assert tp8.model_states == sp.model_states and sp.activations < tp8.activations


def test_axis_by_axis_skips_axes_that_are_not_used():
    steps = axis_by_axis(LLAMA7, ParallelConfig(tp=2), TrainingSetup(seq_len=1024))
    assert list(steps) == ["1 GPU", "+t=2"]


def test_dualpipe_pairs_chunks_r_and_p_minus_1_minus_r():
    """DualPipe (DeepSeek-V3 §3.2.1; deepseek-ai/DualPipe examples/example_dualpipe.py builds
    ``nn.Sequential(full_modules[rank], full_modules[pp_size - 1 - rank])``): rank r holds chunks
    r and p-1-r. Llama-2-7B at p = 4 counted by hand: 8 layers of 4h² + 3hf + 2h per stage, the
    embedding (V·h) on the first, the final norm (h) and the head (V·h) on the last."""
    from parmem.analyses import dualpipe_ranks

    h, f, v = 4096, 11008, 32000
    layer = 4 * h * h + 3 * h * f + 2 * h
    spec = ModelSpec.preset("llama-2-7b")
    # DeepSeek-V3's recipe (§3.3.1, §3.3.3): bf16 weights, fp32 gradients, fp32 master weights
    # and bf16 AdamW moments: 2 + 4 + (4 + 2 + 2) = 14 bytes per parameter, optimizer not sharded (d = 1)
    setup = TrainingSetup(seq_len=2048, num_microbatches=8, optimizer="adamw-bf16",
                          grad_dtype="fp32")
    rows = dualpipe_ranks(estimate(spec, ParallelConfig(pp=4), setup))
    ends = 16 * layer + 2 * v * h + h       # chunks 0 and 3: both ends of the model
    middle = 16 * layer                     # chunks 1 and 2
    assert [r["chunks"] for r in rows] == [(0, 3), (1, 2), (2, 1), (3, 0)]
    assert [r["num_params"] for r in rows] == [ends, middle, middle, ends]
    for r in rows:
        n = r["num_params"]
        assert (r["params"], r["grads"]) == (2 * n, 4 * n)
        assert r["optimizer_per_copy"] == 8 * n and r["optimizer"] == 4 * n
        assert r["model_states"] == 2 * n + 4 * n + 4 * n
    # two copies of the model over p ranks: twice the parameters of the 1F1B stages
    assert sum(r["num_params"] for r in rows) == 2 * (32 * layer + 2 * v * h + h)


def test_dualpipe_needs_an_even_pipeline():
    from parmem.analyses import dualpipe_ranks

    spec = ModelSpec.preset("llama-2-7b")
    est = estimate(spec, ParallelConfig(pp=3), TrainingSetup(seq_len=2048, num_microbatches=6))
    with pytest.raises(ValueError, match="even number of pipeline stages"):
        dualpipe_ranks(est)


def test_adamw_bf16_moments_are_14_bytes_per_parameter_with_fp32_gradients():
    """DeepSeek-V3 §3.3.1 and §3.3.3: BF16 moments, FP32 master weights and gradients:
    2 + 4 + 4 + 2·2 = 14 bytes per parameter; with fp32 moments the optimizer holds 12 (ZeRO §3.1)."""
    spec = ModelSpec.preset("llama-2-7b")
    n = spec.num_params()
    st = estimate(spec, ParallelConfig(), TrainingSetup(seq_len=2048, optimizer="adamw-bf16",
                                                        grad_dtype="fp32")).stages[0]
    assert (st.params, st.grads, st.optimizer) == (2 * n, 4 * n, 8 * n)
    fp32 = estimate(spec, ParallelConfig(), TrainingSetup(seq_len=2048, grad_dtype="fp32")).stages[0]
    assert fp32.optimizer == 12 * n
