"""parmem.distributed.pp on real gloo ranks: the schedules equal an unpipelined run and stash what the
papers say (Huang et al. 2019; Narayanan et al. 2021 §2.2), a GPT cut into stages holds exactly
what :func:`parmem.estimate` says plus named extras, and the idle time of a pipeline with emulated
compute is at least that of its schedule replayed with the measured operation times and free
communication (:func:`parmem.distributed.pp.replay`). World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import WORLD_SIZE as N  # noqa: E402

from parmem.pipeline import simulate  # noqa: E402


def expected_order(schedule, p, m, i):
    """Operation order on stage i (Huang et al. 2019; Narayanan et al. 2021 §2.2.1)."""
    if schedule == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    w = min(p - i - 1, m)
    order = [("F", k) for k in range(w)]
    for k in range(m - w):
        order += [("F", w + k), ("B", k)]
    return order + [("B", k) for k in range(m - w, m)]


@pytest.mark.dist
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zbv"])
def test_pp_schedules_equal_unpipelined_and_stash_what_the_papers_say(pool, schedule):
    m, v = 2 * N, 2
    res = pool.run("parmem.distributed.pp:demo", schedule=schedule, microbatches=m, v=v)
    sim = simulate(schedule, N, m, v if schedule in ("interleaved", "zbv") else 1)
    # the loss is computed where the model's last chunk runs: rank 0 under ZB-V's V
    assert res[0 if schedule == "zbv" else -1]["loss_err"] < 1e-6
    for i, row in enumerate(res):
        assert row["grad_err"] < 1e-6
        if schedule == "gpipe":
            assert row["peak_stashed"] == m
        elif schedule == "1f1b":
            assert row["peak_stashed"] == N - i
        elif schedule == "zbv":  # 2p chunks of L/(2p) blocks on every rank, held until their W
            # (PyTorch's input backward keeps the graph for the weight backward; Qi et al.
            # 2024a §6: ZB-V's peak is 1F1B's first stage, p micro-batches)
            assert row["peak_stashed_chunks"] == 2 * N
        else:  # Megatron-LM warm-up 2(p-i-1) + (v-1)p chunks, plus the first steady forward
            chunks = min(2 * (N - i - 1) + (v - 1) * N + 1, m * v)
            assert row["peak_stashed_chunks"] == chunks
        assert row["peak_stashed"] == sim.peak_in_flight[i]
        assert row["order_matches_sim"], row["order"]
        if schedule in ("gpipe", "1f1b"):
            ops = [(op[0], int(op[1:])) for op in row["order"].split()]
            assert ops == expected_order(schedule, N, m, i)
        assert row["busy_s"] > 0
        assert len(row["events"]) == 2 * m * (v if schedule in ("interleaved", "zbv") else 1)


@pytest.mark.dist
def test_pp_rejects_bad_schedule(pool):
    with pytest.raises(Exception, match="schedule='zigzag'"):
        pool.run("parmem.distributed.pp:demo", schedule="zigzag")


@pytest.mark.dist
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_gpt_holds_what_estimate_says(pool, schedule):
    from parmem.distributed.pp import compare_gpt

    layers = 2 * N
    seq, b, h, m = 32, 2, 64, 2 * N
    res = pool.run("parmem.distributed.pp:demo_gpt", schedule=schedule, layers=layers,
                   microbatches=m, seq=seq, microbatch_size=b, hidden=h)
    assert res[-1]["loss_err"] == 0.0
    for i, r in enumerate(res):
        assert r["grad_err"] == 0.0  # same micro-batches, same bf16 accumulation, bit for bit
        assert all(row["unexplained"] == 0 for row in compare_gpt(r)), compare_gpt(r)
        # measured: the micro-batches whose saved tensors are alive at the stage's byte peak
        assert r["in_flight"] == r["peak_in_flight"] == (m if schedule == "gpipe" else N - i)
        assert r["in_flight_model"] == r["in_flight"]  # the count parmem.estimate uses
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
    from parmem.distributed.pp import compare_gpt

    res = pool.run("parmem.distributed.pp:demo_gpt", microbatch_size=1, microbatches=2 * N)
    for r in res:
        assert all(row["unexplained"] == 0 for row in compare_gpt(r)), compare_gpt(r)


@pytest.mark.dist
def test_pipelined_gpt_uneven_split(pool):
    from parmem.distributed.pp import compare_gpt

    split = [1] * (N - 1) + [N + 1]  # 2N layers, most of them on the last stage
    res = pool.run("parmem.distributed.pp:demo_gpt", layers=2 * N, layers_per_stage=split)
    for r, n in zip(res, split, strict=True):
        assert r["layers"] == n
        assert all(row["unexplained"] == 0 for row in compare_gpt(r))


@pytest.mark.dist
@pytest.mark.parametrize("schedule,k,v", [("1f1b", 1, 1), ("1f1b", 4, 1), ("gpipe", 2, 1),
                                          ("interleaved", 2, 2)])
def test_idle_time_with_emulated_compute_is_at_least_the_bubble(pool, schedule, k, v):
    # only what holds on a starved machine: every sleep lasts at least its delay and an
    # operation starts after its input was computed, so the step and each stage's idle time are
    # at least the schedule's (no upper bound: a loaded machine may add any time to a hand-off)
    from parmem.distributed.pp import bubble_rows

    m, t_f = k * N, 20.0  # ms
    res = pool.run("parmem.distributed.pp:demo", schedule=schedule, microbatches=m, v=v,
                   delay_ms=(t_f, 2 * t_f))
    # (p-1)/(v m + p-1) of the step (Narayanan et al. 2021 §2.2), t_b = 2 t_f as delayed
    expect = (N - 1) / (v * m + N - 1)
    rows = bubble_rows(res)
    for r, row in zip(res, rows, strict=True):
        assert row["sim_idle_fraction"] == pytest.approx(expect)
        assert row["peak_stashed"] == row["sim_peak_stashed"]
        assert r["order_matches_sim"], r["order"]
        assert row["late"] == []  # every operation began after the one it consumes had ended
        assert row["idle_fraction"] >= row["replay_idle_fraction"] - 1e-9
        assert row["excess_s"] >= -1e-9
    step = rows[0]["step_s"]
    # no sleep ends early: at least (m + (p-1)/v)(t_f + t_b)
    assert step + 1e-9 >= rows[0]["replay_step_s"] >= (m + (N - 1) / v) * 3 * t_f / 1e3 * (1 - 1e-9)


def _simulated_results(schedule, p, m, v, t_fwd=1.0, t_bwd=2.0):
    """demo-like results whose events are the simulator's timeline."""
    sim = simulate(schedule, p, m, v, t_fwd=t_fwd, t_bwd=t_bwd)
    return [{"stage": i, "v": v, "events": [(e.kind, e.microbatch, e.chunk, e.start, e.end)
                                            for e in sim.stage_events(i)]} for i in range(p)]


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1),
                                            ("1f1b", 3, 2, 1), ("interleaved", 4, 8, 2),
                                            ("interleaved", 2, 4, 4)])
def test_replay_of_nominal_times_is_the_papers_step(schedule, p, m, v):
    from parmem.distributed.pp import replay

    rep = replay(_simulated_results(schedule, p, m, v))
    # (m + (p-1)/v)(t_f + t_b) (Huang et al. 2019 §2.3; Narayanan et al. 2021 §2.2.2)
    assert rep["step_s"] == pytest.approx((m + (p - 1) / v) * 3.0)
    assert rep["busy_s"] == [pytest.approx(3.0 * m)] * p
    assert rep["late"] == []


def test_replay_finds_an_operation_that_began_before_its_input_and_a_slow_one():
    from parmem.distributed.pp import replay

    res = _simulated_results("1f1b", 2, 4, 1)
    evs = res[1]["events"]
    k, mb, c, t0, t1 = evs[0]  # stage 1's first forward, which consumes stage 0's F0
    evs[0] = (k, mb, c, t0 - 0.5, t1 - 0.5)
    assert replay(res)["late"] == [("F", 1, 0, 0)]
    res = _simulated_results("1f1b", 2, 4, 1)
    k, mb, c, t0, t1 = res[0]["events"][-1]  # stage 0's last backward takes 1.5 longer
    res[0]["events"][-1] = (k, mb, c, t0, t1 + 1.5)
    assert replay(res)["step_s"] == pytest.approx((4 + 1) * 3.0 + 1.5)


def test_replay_rejects_rows_out_of_order():
    from parmem.distributed.pp import replay

    res = _simulated_results("1f1b", 2, 2, 1)
    with pytest.raises(ValueError, match=r"results\[0\]\['stage'\]"):
        replay(res[::-1])


def test_delay_rejects_negative_time():
    pytest.importorskip("torch")
    from parmem.distributed.pp import Delay

    with pytest.raises(ValueError, match="must be >= 0"):
        Delay(-1.0, 2.0)
