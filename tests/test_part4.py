"""Part IV (pipeline parallelism): the library functions its chapters use.

* :func:`parmem.analyses.balance_layers` against brute force over every split of small models;
* :func:`parmem.analyses.microbatch_sweep` against Korthikanti et al. 2022 Table 2 times the
  in-flight counts of Narayanan et al. 2021 §2.2, and the bubble (p-1)/(m+p-1);
* :func:`parmem.pipeline.in_flight_timeline` against a timeline worked out by hand;
* the real pipelines of :mod:`parmem.dist.pp` on gloo ranks (marked ``dist``): a GPT cut into
  stages holds exactly what :func:`parmem.estimate` says plus named extras, and the idle time of a
  pipeline with emulated compute is the simulator's bubble;
* the part's plots and explorers draw without error.

Expected values are derived in the tests (brute force, papers' formulas, hand timelines), never
pasted from the code under test.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.activations import per_layer_bytes
from parmem.analyses import balance_layers, microbatch_sweep
from parmem.pipeline import in_flight_timeline, simulate

N = int(os.environ.get("PARMEM_WORLD_SIZE", "2"))


def gpt_spec(layers: int, vocab: int = 4096, hidden: int = 64, heads: int = 4,
             tied: bool = False) -> ModelSpec:
    return ModelSpec(name="t", vocab_size=vocab, hidden=hidden, layers=layers, heads=heads,
                     ffn_kind="gelu", bias=True, norm="layernorm", position="learned",
                     max_positions=256, tied_embeddings=tied)


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


# ---------------------------------------------------------------------------- in_flight_timeline
def test_in_flight_timeline_by_hand():
    # 1F1B, p = 2, m = 3, t_f = 1, t_b = 2. Stage 0: F0 [0,1] F1 [1,2]; stage 1: F0 [1,2]
    # B0 [2,4]; stage 0: B0 [4,6] F2 [6,7]; stage 1: F1 [4,5] B1 [5,7] F2 [7,8] B2 [8,10];
    # stage 0: B1 [7,9] B2 [10,12]. Stage 0 holds 1 from 0, 2 from 1; at 6 B0 ends and F2 starts
    # (still 2); 1 from 9, 0 at 12. Stage 1: 1 from 1 to 4 (B0 ends), 1 from 4 to 7, ... 0 at 10.
    r = simulate("1f1b", 2, 3)
    tl = in_flight_timeline(r, 0)
    assert tl[0] == (0.0, 1) and tl[-1] == (12.0, 0)
    assert [c for t, c in tl if t in (1.0, 6.0, 9.0)] == [2, 2, 1]
    assert max(c for _, c in in_flight_timeline(r, 1)) == 1
    assert in_flight_timeline(r, 1)[-1] == (12.0, 0)  # padded to the step's end


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved"]), st.integers(1, 6), st.integers(1, 4),
       st.integers(2, 3))
def test_in_flight_timeline_peak_is_the_simulators(schedule, p, k, v):
    m = k * p
    r = simulate(schedule, p, m, v if schedule == "interleaved" else 1)
    for i in range(p):
        tl = in_flight_timeline(r, i)
        assert max(c for _, c in tl) == pytest.approx(r.peak_in_flight[i])
        assert tl[-1][1] == 0 and all(c >= 0 for _, c in tl)
        assert [t for t, _ in tl] == sorted(t for t, _ in tl)


def test_in_flight_timeline_rejects_bad_input():
    with pytest.raises(ValueError, match="stage=2"):
        in_flight_timeline(simulate("1f1b", 2, 2), 2)
    with pytest.raises(ValueError, match="PipelineResult"):
        in_flight_timeline("1f1b", 0)


# ---------------------------------------------------------------------------- plots, widgets
def test_part4_plots_and_explorers_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parmem.book import widgets
    from parmem.book.plots import (
        plot_breakdowns,
        plot_in_flight,
        plot_microbatch_sweep,
        plot_schedules,
    )

    spec = gpt_spec(8)
    par, setup = ParallelConfig(pp=2), TrainingSetup(seq_len=64, num_microbatches=4)
    figs = [plot_in_flight(simulate("gpipe", 3, 4)),
            plot_schedules([simulate("1f1b", 3, 6), simulate("interleaved", 3, 6, 2)]),
            plot_breakdowns({"even": estimate(spec, par, setup),
                             "balanced": estimate(spec, par, setup,
                                                  layers_per_stage=balance_layers(spec, par,
                                                                                  setup))}),
            plot_microbatch_sweep(microbatch_sweep(spec, par, setup, global_batch=8),
                                  highlight=2)]
    assert all(f.axes for f in figs)
    for f in figs:
        plt.close(f)
    for make in (widgets.explore_pp_memory, widgets.explore_schedules, widgets.explore_bubble,
                 widgets.explore_stage_balance, widgets.explore_microbatch):
        box = make(static=False)
        assert box.children  # controls and an output area
    plt.close("all")


# ---------------------------------------------------------------------------- real pipelines


@pytest.mark.dist
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_gpt_holds_what_estimate_says(pool, schedule):
    from parmem.dist.pp import compare_gpt

    layers = 2 * N
    seq, b, h, m = 32, 2, 64, 2 * N
    res = pool.run("parmem.dist.pp:demo_gpt", schedule=schedule, layers=layers,
                   microbatches=m, seq=seq, microbatch_size=b, hidden=h)
    assert res[-1]["loss_err"] == 0.0
    for i, r in enumerate(res):
        assert r["grad_err"] == 0.0  # same micro-batches, same bf16 accumulation, bit for bit
        assert all(row["unexplained"] == 0 for row in compare_gpt(r)), compare_gpt(r)
        assert r["in_flight"] == (m if schedule == "gpipe" else N - i)
        assert r["saved_after_step"] == 0  # everything released after the backward
        if i < N - 1:  # the activation sent downstream: one bf16 [s, b, h] tensor
            assert r["sent_bytes"] == 2 * seq * b * h
    # L layers of one micro-batch measured in one process = L x one layer
    assert res[0]["all_layers_saved_bytes"] == layers * res[0]["layer_saved_bytes"]
    if schedule == "1f1b":
        # Korthikanti et al. 2022 §4.2.3: stage 0 holds p micro-batches of L/p layers, i.e. the
        # layer activations of the whole model for one micro-batch
        x = res[0]["extras"]
        first_only = x["token_ids"] + x["position_ids"]
        assert (res[0]["measured"]["activations_and_logits"] - first_only
                == res[0]["all_layers_saved_bytes"])


@pytest.mark.dist
def test_pipelined_gpt_micro_batch_of_one(pool):
    # b = 1: every micro-batch's token ids and labels must be its own s x 1 storage, not a view
    # of the whole batch (a transposed [1, s] slice is already contiguous)
    from parmem.dist.pp import compare_gpt

    res = pool.run("parmem.dist.pp:demo_gpt", microbatch_size=1, microbatches=2 * N)
    for r in res:
        assert all(row["unexplained"] == 0 for row in compare_gpt(r)), compare_gpt(r)


@pytest.mark.dist
def test_pipelined_gpt_uneven_split(pool):
    from parmem.dist.pp import compare_gpt

    split = [1] * (N - 1) + [N + 1]  # 2N layers, most of them on the last stage
    res = pool.run("parmem.dist.pp:demo_gpt", layers=2 * N, layers_per_stage=split)
    for r, n in zip(res, split, strict=True):
        assert r["layers"] == n
        assert all(row["unexplained"] == 0 for row in compare_gpt(r))


@pytest.mark.dist
@pytest.mark.parametrize("schedule,k,v", [("1f1b", 1, 1), ("1f1b", 4, 1), ("gpipe", 2, 1),
                                          ("interleaved", 2, 2)])
def test_idle_time_with_emulated_compute_is_the_bubble(pool, schedule, k, v):
    from parmem.dist.pp import bubble_rows

    m = k * N
    t_f = 20.0 if N <= 2 else 40.0  # more ranks than cores: longer ops dilute gloo's latency
    res = pool.run("parmem.dist.pp:demo", schedule=schedule, microbatches=m, v=v,
                   delay_ms=(t_f, 2 * t_f))
    # (p-1)/(v m + p-1) of the step (Narayanan et al. 2021 §2.2), t_b = 2 t_f as delayed
    expect = (N - 1) / (v * m + N - 1)
    for row in bubble_rows(res):
        assert row["sim_idle_fraction"] == pytest.approx(expect)
        assert row["peak_stashed"] == row["sim_peak_stashed"]
        # sleeping cannot be faster than the schedule allows; gloo adds a few ms per message
        assert expect - 0.03 <= row["idle_fraction"] <= expect + 0.3, row  # wall clock, shared cores
    step = bubble_rows(res)[0]["step_s"]
    assert step >= (m + (N - 1) / v) * 3 * t_f / 1e3 * 0.98  # (m + (p-1)/v)(t_f + t_b)


def test_delay_rejects_negative_time():
    pytest.importorskip("torch")
    from parmem.dist.pp import Delay

    with pytest.raises(ValueError, match="must be >= 0"):
        Delay(-1.0, 2.0)
