"""Pipeline simulator against closed forms, hand-derived timelines and invariants; the closed-form
in-flight counts against Korthikanti et al. 2022 §4.2.3 and the simulator; in-flight timelines.

Expected values come from the papers' formulas (re-derived in comments) or from
timelines worked out by hand; none is pasted from the simulator's output.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parmem.config import SCHEDULES
from parmem.pipeline import (
    Event,
    _zbv_order,
    bubble_fraction,
    bubble_ratio,
    in_flight,
    in_flight_ends,
    in_flight_profile,
    in_flight_timeline,
    in_flight_units,
    simulate,
    zbv_bubble,
)

times = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 0.7])


@st.composite
def plain_case(draw):
    """GPipe / 1F1B: p 1..8, m 1..16, v = 1, arbitrary uniform t_f, t_b."""
    return (
        draw(st.sampled_from(["gpipe", "1f1b"])),
        draw(st.integers(1, 8)),
        draw(st.integers(1, 16)),
        1,
        draw(times),
        draw(times),
    )


@st.composite
def interleaved_case(draw):
    """Interleaved: p 1..8, v 2..4, m a multiple of p up to 16 (Megatron-LM rule)."""
    p = draw(st.integers(1, 8))
    m = p * draw(st.integers(1, 16 // p))
    return ("interleaved", p, m, draw(st.integers(2, 4)), draw(times), draw(times))


any_case = st.one_of(plain_case(), interleaved_case())


# --- closed forms -----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(any_case)
def test_step_time_and_bubble_match_closed_form(case):
    schedule, p, m, v, tf, tb = case
    r = simulate(schedule, p, m, v, tf, tb)
    # Narayanan et al. 2021 §2.2: the pipeline fills and drains in (p-1) forward+backward
    # slots, divided by v when interleaved; the useful work is m (t_f + t_b).
    assert r.step_time == pytest.approx((m + (p - 1) / v) * (tf + tb))
    assert r.bubble_fraction == pytest.approx(bubble_fraction(p, m, v))
    # every stage computes every micro-batch once: busy = m (t_f + t_b), idle = bubble
    for i in range(p):
        assert r.busy[i] == pytest.approx(m * (tf + tb))
        assert r.idle[i] == pytest.approx((p - 1) * (tf + tb) / v)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 16))
def test_gpipe_and_1f1b_same_step_time(p, m):
    # (m + p - 1)(t_f + t_b) for both (Narayanan et al. 2021, §2.2.1: PipeDream-Flush has
    # the same bubble as GPipe); t_f = 1, t_b = 2 -> 3 (m + p - 1).
    assert simulate("gpipe", p, m).step_time == pytest.approx(3 * (m + p - 1))
    assert simulate("1f1b", p, m).step_time == pytest.approx(3 * (m + p - 1))


@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 8))
def test_bubble_fraction_and_ratio_agree(p, m, v):
    # fraction = B / (B + I) and ratio = B / I  =>  fraction = ratio / (1 + ratio)
    r = bubble_ratio(p, m, v)
    assert bubble_fraction(p, m, v) == pytest.approx(r / (1 + r))


def test_bubble_published_values():
    # GPipe (Huang et al. 2019, §2.3): (K-1)/(M+K-1); K=4, M=8 -> 3/11.
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    # Narayanan et al. 2021, §2.2.1: bubble time fraction (p-1)/m; p=4, m=8 -> 0.375;
    # §2.2.2: divided by v; v=2 -> 0.1875.
    assert bubble_ratio(4, 8) == pytest.approx(0.375)
    assert bubble_ratio(4, 8, 2) == pytest.approx(0.1875)
    assert bubble_fraction(1, 5) == 0.0


# --- in-flight micro-batches ------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(any_case)
def test_peak_in_flight_matches_closed_form(case):
    schedule, p, m, v, tf, tb = case
    r = simulate(schedule, p, m, v, tf, tb)
    for i in range(p):
        if schedule == "gpipe":
            expect = m  # all forwards before any backward
        elif schedule == "1f1b":
            expect = min(p - i, m)  # p - i - 1 warm-up forwards + 1 (Narayanan 2021 §2.2.1)
        else:
            expect = in_flight(schedule, p, m, v, i)
        assert r.peak_in_flight[i] == pytest.approx(expect)
        assert r.peak_in_flight_chunks[i] == round(expect * v)
        assert isinstance(r.peak_in_flight_chunks[i], int)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 8), st.integers(2, 4), st.integers(2, 4))
def test_interleaved_stage0_korthikanti_factor(p, v, k):
    # Korthikanti et al. 2022, §4.2.3: with interleaving, the first stage holds
    # p micro-batches of L/p layers times (1 + (p-1)/(p v)), when m > p.
    m = k * p
    r = simulate("interleaved", p, m, v)
    expect = p * (1 + (p - 1) / (p * v))
    assert r.peak_in_flight[0] == pytest.approx(expect)
    assert in_flight("interleaved", p, m, v, 0) == pytest.approx(expect)


def test_interleaved_m_equals_p_runs_all_forwards_first():
    # Megatron-LM schedules.py: if num_microbatches == pipeline_parallel_size every
    # stage runs all m*v chunk-forwards before any backward (all_warmup_microbatches).
    p, v = 4, 2
    r = simulate("interleaved", p, p, v)
    for i in range(p):
        kinds = [e.kind for e in r.stage_events(i)]
        assert kinds == ["F"] * (p * v) + ["B"] * (p * v)
        assert r.peak_in_flight[i] == p


def test_in_flight_closed_form_values():
    # seed claim for chapter 5: GPipe stashes m, 1F1B at most p - i
    assert in_flight("gpipe", 4, 8, stage=3) == 8
    assert [in_flight("1f1b", 4, 8, stage=i) for i in range(4)] == [4, 3, 2, 1]
    assert [in_flight("1f1b", 4, 2, stage=i) for i in range(4)] == [2, 2, 2, 1]
    # interleaved p=4, v=2, m=8, stage 0: warm-up 2*3 + 1*4 = 10 chunks, +1 = 11 -> 5.5
    assert in_flight("interleaved", 4, 8, 2, 0) == 5.5


# --- hand-derived timelines ---------------------------------------------------------------


def test_1f1b_p2_m2_by_hand():
    # t_f = 1, t_b = 2. Stage 1 (last): warm-up 0 -> F0 [1,2] (after stage 0's F0 [0,1]),
    # B0 [2,4], F1 [4,5] (stage 0's F1 ended at 2), B1 [5,7].
    # Stage 0: warm-up 1 -> F0 [0,1]; steady F1 [1,2], B0 needs stage 1's B0 (ends 4) -> [4,6];
    # cooldown B1 needs stage 1's B1 (ends 7) -> [7,9]. Step = 9 = (2 + 2 - 1) * 3.
    r = simulate("1f1b", 2, 2)
    got = [(e.stage, e.kind, e.microbatch, e.start, e.end) for e in r.events]
    assert got == [
        (0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "B", 0, 4, 6), (0, "B", 1, 7, 9),
        (1, "F", 0, 1, 2), (1, "B", 0, 2, 4), (1, "F", 1, 4, 5), (1, "B", 1, 5, 7),
    ]  # fmt: skip
    assert r.step_time == 9
    assert r.peak_in_flight == [2, 1]


def test_interleaved_forward_order_matches_narayanan_fig4():
    # Narayanan et al. 2021, Fig. 4 (p=4, v=2, m=8): device 1 runs micro-batches 1-4
    # through chunk 1, then 1-4 through chunk 2, then 5, 6, ... through chunk 1.
    r = simulate("interleaved", 4, 8, 2)
    first = [(e.microbatch, e.chunk) for e in r.stage_events(0) if e.kind == "F"][:10]
    assert first == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1), (4, 0), (5, 0)]
    # Megatron-LM: w = min(2 (p-i-1) + (v-1) p, m v) warm-up forwards, then each steady
    # iteration runs a forward before its backward: w + 1 forwards precede the first backward.
    for i in range(4):
        kinds = [e.kind for e in r.stage_events(i)]
        assert kinds.index("B") == min(2 * (4 - i - 1) + 4, 16) + 1


# --- invariants ---------------------------------------------------------------------------


def _dep_end(r, e: Event) -> float:
    """End time of the op that ``e`` needs, derived from the layer order c*p + i."""
    p, v = r.p, r.v
    key = {(x.stage, x.kind, x.microbatch, x.chunk): x.end for x in r.events}
    layer_block = e.chunk * p + e.stage
    if e.kind == "F":
        if layer_block == 0:
            return 0.0
        prev = layer_block - 1
        return key[(prev % p, "F", e.microbatch, prev // p)]
    if layer_block == p * v - 1:
        return key[(e.stage, "F", e.microbatch, e.chunk)]
    nxt = layer_block + 1
    return key[(nxt % p, "B", e.microbatch, nxt // p)]


@settings(max_examples=100, deadline=None)
@given(any_case)
def test_schedule_invariants(case):
    schedule, p, m, v, tf, tb = case
    r = simulate(schedule, p, m, v, tf, tb)
    assert len(r.events) == 2 * p * m * v
    for i in range(p):
        evs = r.stage_events(i)
        # each (kind, micro-batch, chunk) exactly once
        assert len({(e.kind, e.microbatch, e.chunk) for e in evs}) == 2 * m * v
        # no two ops overlap on a stage, durations are t/v
        for a, b in zip(evs, evs[1:], strict=False):
            assert a.end <= b.start + 1e-9
        for e in evs:
            dur = (tf if e.kind == "F" else tb) / v
            assert e.end - e.start == pytest.approx(dur)
        # F precedes B of the same micro-batch and chunk
        start = {(e.kind, e.microbatch, e.chunk): e for e in evs}
        for mb in range(m):
            for c in range(v):
                assert start[("F", mb, c)].end <= start[("B", mb, c)].start + 1e-9
    # dependencies respected
    for e in r.events:
        assert _dep_end(r, e) <= e.start + 1e-9
    assert r.step_time == pytest.approx(max(e.end for e in r.events))


def test_to_rows_and_ascii():
    r = simulate("gpipe", 2, 2, t_fwd=1, t_bwd=1)
    rows = r.to_rows()
    assert [row["stage"] for row in rows] == [0, 1]
    assert sum(row["idle_fraction"] for row in rows) / 2 == pytest.approx(r.bubble_fraction)
    # By hand (t_f = t_b = 1): stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [1,2] F1 [2,3]
    # B0 [3,4] B1 [4,5]; stage 0 B0 [4,5] B1 [5,6]. Step 6, cell width 3.
    assert r.ascii() == "S0 |F0 F1 .  .  B0 B1\nS1 |.  F0 F1 B0 B1 ."
    text = simulate("interleaved", 2, 2, 2).ascii()
    assert text.startswith("S0 |F0.0") and text.count("\n") == 1


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "zb", "p": 2, "m": 2}, r"schedule='zb' must be one of 'gpipe', '1f1b'"),
        ({"schedule": "1f1b", "p": 0, "m": 2}, r"p=0 must be an integer >= 1"),
        ({"schedule": "1f1b", "p": 2, "m": 0}, r"m=0 must be an integer >= 1"),
        ({"schedule": "1f1b", "p": 2.0, "m": 2}, r"p=2.0 must be an integer"),
        ({"schedule": "1f1b", "p": True, "m": 2}, r"p=True must be an integer"),
        ({"schedule": "gpipe", "p": 2, "m": 2, "v": 2}, r"v=2 must be 1 for schedule='gpipe'"),
        ({"schedule": "1f1b", "p": 2, "m": 2, "v": 3}, r"v=3 must be 1 for schedule='1f1b'"),
        ({"schedule": "interleaved", "p": 2, "m": 2, "v": 1}, r"v=1 must be >= 2"),
        (
            {"schedule": "interleaved", "p": 4, "m": 6, "v": 2},
            r"m=6 must be a multiple of p=4 for the interleaved schedule \(Megatron-LM",
        ),
        ({"schedule": "1f1b", "p": 2, "m": 2, "t_fwd": 0}, r"t_fwd=0 must be > 0"),
        ({"schedule": "1f1b", "p": 2, "m": 2, "t_bwd": -1.0}, r"t_bwd=-1.0 must be > 0"),
    ],
)
def test_invalid_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate(**kwargs)


def test_invalid_closed_form_input():
    with pytest.raises(ValueError, match=r"stage=4 must be an integer in 0..3"):
        in_flight("1f1b", 4, 8, stage=4)
    with pytest.raises(ValueError, match=r"m=6 must be a multiple of p=4"):
        in_flight("interleaved", 4, 6, 2)
    with pytest.raises(ValueError, match=r"p=0 must be an integer >= 1"):
        bubble_fraction(0, 4)
    with pytest.raises(ValueError, match=r"v=0 must be an integer >= 1"):
        bubble_ratio(2, 4, 0)
    with pytest.raises(ValueError, match=r"stage=9 must be an integer in 0..1"):
        simulate("1f1b", 2, 2).stage_events(9)
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved", "zbv"}
    with pytest.raises(ValueError, match=r"v=3 must be 2 for schedule='zbv'"):
        simulate("zbv", 4, 8, 3)
    with pytest.raises(ValueError, match=r"w_share"):
        simulate("zbv", 4, 8, 2, w_share=1.0)


# ---------------------------------------------------------------------------- in_flight_units
@pytest.mark.parametrize("p,m", [(4, 8), (8, 8), (4, 2), (2, 16)])
def test_in_flight_counts(p, m):
    for i in range(p):
        assert in_flight_units("gpipe", p, m, i) == m
        assert in_flight_units("1f1b", p, m, i) == min(p - i, m)


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 4), (8, 3)])
def test_interleaved_first_stage_factor(p, v):
    # Korthikanti et al. 2022 §4.2.3: stage 0 holds (1 + (p-1)/(p v)) times the 1F1B amount,
    # i.e. p micro-batches of L/p layers times that factor. In chunk units of L/(p v) layers:
    m = 4 * p
    chunks = in_flight_units("interleaved", p, m, 0, v)
    assert chunks / (p * v) == pytest.approx(1 + (p - 1) / (p * v))


def test_in_flight_units_agree_with_the_schedule_simulator():
    # two independent codings of the schedules: the closed form used by estimate() and the
    # event simulator of parmem.pipeline (which replays the operation order step by step)
    from parmem.pipeline import simulate

    for p in (1, 2, 3, 4, 6):
        for m in (1, 2, 4, 8, 12):
            for sched in ("gpipe", "1f1b"):
                r = simulate(sched, p, m)
                assert [in_flight_units(sched, p, m, i) for i in range(p)] == r.peak_in_flight
            for v in (2, 3):
                if m % p or p == 1:
                    continue
                r = simulate("interleaved", p, m, v=v)
                got = [in_flight_units("interleaved", p, m, i, v) for i in range(p)]
                assert got == r.peak_in_flight_chunks


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


# ---------------------------------------------------------------------------- ZB-V
def _pytorch_zbv_order(p, m, rank):
    """The operations of ``rank`` in PyTorch's ScheduleZBVZeroBubble (its own pipeline_order,
    computed by the schedule's _calculate_single_rank_operations without building stages), as
    (kind, micro-batch, chunk) with its input backward ``I`` named ``B``."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    sch = schedules.ScheduleZBVZeroBubble.__new__(schedules.ScheduleZBVZeroBubble)
    sch.pp_group_size, sch._n_microbatches, sch.num_stages, sch.rank = p, m, 2 * p, rank
    kind = {schedules.F: "F", schedules.I: "B", schedules.W: "W"}
    return [(kind[a.computation_type], a.microbatch_index, 0 if a.stage_index == rank else 1)
            for a in sch._calculate_single_rank_operations(rank) if a is not None]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_zbv_runs_pytorchs_order(p):
    for m in range(1, 3 * p + 3):
        for i in range(p):
            assert _zbv_order(p, m, i) == _pytorch_zbv_order(p, m, i), (p, m, i)


@pytest.mark.parametrize("p,m", [(2, 3), (4, 7), (4, 16), (8, 15), (8, 40)])
def test_zbv_with_equal_passes_idles_only_while_the_first_forward_crosses_the_v(p, m):
    # t_f = t_B = t_W = 1 per stage (t_bwd = 2 split in half): a chunk's pass takes 1/2. Rank
    # p-1 cannot start before micro-batch 0 has crossed chunks 0..p-2 ((p-1)/2), and then has
    # 3m of work, so no schedule can end before (p-1)/2 + 3m; ZB-V ends exactly then, where
    # 1F1B needs (p-1)(t_f + t_b) = 3(p-1) more than 3m (Narayanan et al. 2021 §2.2.1).
    r = simulate("zbv", p, m, 2, t_fwd=1.0, t_bwd=2.0)
    assert r.step_time == pytest.approx((p - 1) / 2 + 3 * m)
    assert simulate("1f1b", p, m).step_time == pytest.approx(3 * (p - 1) + 3 * m)
    assert zbv_bubble(p, m, 1.0, 1.0, 1.0) == pytest.approx((p - 1) / 2)
    # every rank holds 2p chunks of L/(2p) layers: 1F1B's first stage (p whole micro-batches)
    assert r.peak_in_flight_chunks == [2 * p] * p
    assert in_flight_profile("zbv", p, m, 2) == (2 * p,) * p
    # rank 0 runs the last chunk's forward, input and weight backward back to back, and holds
    # up to 2p micro-batches of its first chunk (all m when m = 2p - 1)
    assert in_flight_ends("zbv", p, m, 2) == (min(m, 2 * p), 1)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 12),
    st.integers(0, 40),
    st.floats(0.1, 3.0),
    st.floats(0.1, 3.0),
    st.floats(0.05, 3.0),
)
def test_zbv_bubble_equals_the_whole_simulation(p, extra, t_f, t_b, t_w):
    m = 2 * p - 1 + extra if extra < 30 else 1 + extra % (2 * p - 1)  # full V and not
    r = simulate("zbv", p, m, 2, t_fwd=t_f, t_bwd=t_b + t_w, w_share=t_w / (t_b + t_w))
    # the ratios t_b/t_f, t_w/t_f are cached to 7 significant digits: within 1e-5
    assert zbv_bubble(p, m, t_f, t_b, t_w) == pytest.approx(
        r.step_time - m * (t_f + t_b + t_w), rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("p,m", [(2, 2), (3, 4), (4, 5), (4, 8)])
def test_zbv_in_flight_counts_are_the_simulators(p, m):
    r = simulate("zbv", p, m, 2)
    assert list(in_flight_profile("zbv", p, m, 2)) == r.peak_in_flight_chunks
    assert [in_flight_units("zbv", p, m, i, 2) for i in range(p)] == r.peak_in_flight_chunks
    # the timeline releases a chunk at the end of its W and peaks where the count does
    for i in range(p):
        assert max(c for _, c in in_flight_timeline(r, i)) == r.peak_in_flight[i]
