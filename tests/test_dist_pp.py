"""parmem.dist.pp on real gloo ranks: the schedules equal an unpipelined run and stash what the
papers say (Huang et al. 2019; Narayanan et al. 2021 §2.2), a GPT cut into stages holds exactly
what :func:`parmem.estimate` says plus named extras, and the idle time of a pipeline with emulated
compute is the simulator's bubble. World size: $PARMEM_WORLD_SIZE, default 2.
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
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_pp_schedules_equal_unpipelined_and_stash_what_the_papers_say(pool, schedule):
    m, v = 2 * N, 2
    res = pool.run("parmem.dist.pp:demo", schedule=schedule, microbatches=m, v=v)
    sim = simulate(schedule, N, m, v if schedule == "interleaved" else 1)
    assert res[-1]["loss_err"] < 1e-6
    for i, row in enumerate(res):
        assert row["grad_err"] < 1e-6
        if schedule == "gpipe":
            assert row["peak_stashed"] == m
        elif schedule == "1f1b":
            assert row["peak_stashed"] == N - i
        else:  # Megatron-LM warm-up 2(p-i-1) + (v-1)p chunks, plus the first steady forward
            chunks = min(2 * (N - i - 1) + (v - 1) * N + 1, m * v)
            assert row["peak_stashed_chunks"] == chunks
        assert row["peak_stashed"] == sim.peak_in_flight[i]
        assert row["order_matches_sim"], row["order"]
        if schedule != "interleaved":
            ops = [(op[0], int(op[1:])) for op in row["order"].split()]
            assert ops == expected_order(schedule, N, m, i)
        assert row["busy_s"] > 0
        assert len(row["events"]) == 2 * m * (v if schedule == "interleaved" else 1)


@pytest.mark.dist
def test_pp_rejects_bad_schedule(pool):
    with pytest.raises(Exception, match="schedule='zigzag'"):
        pool.run("parmem.dist.pp:demo", schedule="zigzag")


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

    m, t_f = k * N, 60.0  # ms; 60 ms operations dilute gloo's ~1 ms per hand-off
    res = pool.run("parmem.dist.pp:demo", schedule=schedule, microbatches=m, v=v,
                   delay_ms=(t_f, 2 * t_f))
    # (p-1)/(v m + p-1) of the step (Narayanan et al. 2021 §2.2), t_b = 2 t_f as delayed
    expect = (N - 1) / (v * m + N - 1)
    rows = bubble_rows(res)
    for row in rows:
        assert row["sim_idle_fraction"] == pytest.approx(expect)
        assert row["peak_stashed"] == row["sim_peak_stashed"]
        # sleeping cannot beat the schedule; communication adds a little on the critical path
        assert expect - 0.01 <= row["idle_fraction"] <= expect + 0.05, row
    step = rows[0]["step_s"]
    assert step >= (m + (N - 1) / v) * 3 * t_f / 1e3 * 0.99  # (m + (p-1)/v)(t_f + t_b)
    assert -0.01 * step <= rows[0]["excess_s"] <= 0.05 * step


def test_delay_rejects_negative_time():
    pytest.importorskip("torch")
    from parmem.dist.pp import Delay

    with pytest.raises(ValueError, match="must be >= 0"):
        Delay(-1.0, 2.0)
