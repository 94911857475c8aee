"""Numbers normalised at the boundary, and work bounded by stated limits (issue 34).

* A NumPy integer given for a size is stored as a Python ``int``: its arithmetic cannot wrap, and a
  spec built from NumPy numbers cannot leave a wrong answer in the caches for the equal spec built
  from ints (``np.int32(4096) == 4096`` and the hashes agree, so both share cache entries).
* Every public function of :mod:`parmem.pipeline` does work bounded by a named limit or by a
  closed form; the closed in-flight counts agree with the event simulator on every small case.

Expected values are derived in the comments (Llama-2-7B's shapes, Touvron et al. 2023; the bubble
of Narayanan et al. 2021 §2.2) or come from the simulator, an independent coding of the schedules.
"""

from __future__ import annotations

import dataclasses

import pytest

from parmem._check import MAX_BATCH, MAX_GPUS
from parmem.config import ParallelConfig, TrainingSetup
from parmem.estimate import estimate
from parmem.model import ModelSpec
from parmem.pipeline import (
    MAX_CHART_CELLS,
    MAX_SIM_OPS,
    bubble_fraction,
    bubble_ratio,
    in_flight_profile,
    in_flight_units,
    list_schedule,
    simulate,
)

np = pytest.importorskip("numpy")

# Llama-2-7B (Touvron et al. 2023): V = 32000, h = 4096, L = 32, a = 32, SwiGLU f = 11008,
# RMSNorm, untied embeddings. Ψ = 2Vh (embedding, LM head) + L(4h² + 3hf + 2h) + h (final norm)
#   = 262,144,000 + 32 · (67,108,864 + 135,266,304 + 8,192) + 4,096 = 6,738,415,616.
LLAMA2_7B = dict(
    vocab_size=32000,
    hidden=4096,
    layers=32,
    heads=32,
    ffn_hidden=11008,
    ffn_kind="swiglu",
    norm="rmsnorm",
    max_positions=4096,
)
LLAMA2_7B_PARAMS = 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 4096
INT_FIELDS = [f.name for f in dataclasses.fields(ModelSpec) if f.type == "int"]


# ---------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_numpy_model_fields_count_like_ints_and_do_not_poison_the_caches(dtype):
    assert LLAMA2_7B_PARAMS == 6_738_415_616
    kind = getattr(np, dtype)
    name = f"test-bounds-{dtype}"  # a spec no other test has put in the caches
    npspec = ModelSpec(
        name=name, **{k: kind(v) if type(v) is int else v for k, v in LLAMA2_7B.items()}
    )
    for f in INT_FIELDS:
        assert type(getattr(npspec, f)) is int, f
    # the NumPy spec first: with int32 fields h·f wrapped, -1,851,518,976 was the count
    assert npspec.num_params() == LLAMA2_7B_PARAMS
    assert npspec.param_counts()["mlp"] == 32 * 3 * 4096 * 11008
    plain = ModelSpec(name=name, **LLAMA2_7B)  # equal, so it meets the NumPy spec's cache entries
    assert plain == npspec and hash(plain) == hash(npspec)
    assert plain.num_params() == LLAMA2_7B_PARAMS


def test_numpy_floats_and_config_fields_are_stored_as_python_numbers():
    spec = ModelSpec(name="test-bounds-float", dropout=np.float32(0.25), **LLAMA2_7B)
    assert type(spec.dropout) is float and spec.dropout == 0.25
    par = ParallelConfig(
        dp=np.int64(2), tp=np.int32(2), pp=np.int16(2), zero=np.uint8(1), vpp=np.int64(2)
    )
    assert [type(getattr(par, f)) for f in ("dp", "tp", "pp", "ep", "cp", "zero", "vpp")] == [
        int
    ] * 7
    assert par.world_size == 8
    setup = TrainingSetup(
        seq_len=np.int64(4096),
        micro_batch=np.int32(2),
        num_microbatches=np.uint16(8),
        cuda_context=np.int64(0),
        capacity_factor=np.float32(1.25),
    )
    for f in ("seq_len", "micro_batch", "num_microbatches", "cuda_context"):
        assert type(getattr(setup, f)) is int, f
    assert type(setup.capacity_factor) is float and setup.capacity_factor == 1.25


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda b: ModelSpec(name="x", **{**LLAMA2_7B, "layers": b}), "layers"),
        (lambda b: ModelSpec(name="x", **{**LLAMA2_7B, "kv_heads": b}), "kv_heads"),
        (lambda b: ParallelConfig(tp=b), "tp"),
        (lambda b: TrainingSetup(seq_len=b), "seq_len"),
    ],
)
@pytest.mark.parametrize("flag", [True, "np.True_"])
def test_booleans_are_not_integers(build, field, flag):
    value = np.True_ if flag == "np.True_" else flag
    with pytest.raises(ValueError, match=rf"{field}=.*must be an integer"):
        build(value)


def test_estimate_with_numpy_sizes_equals_the_int_estimate():
    spec = ModelSpec(name="test-bounds-estimate", **LLAMA2_7B)
    # NumPy first, so that a wrapped answer would sit in the caches for the int call below
    np_est = estimate(
        spec,
        ParallelConfig(dp=np.int32(2), tp=np.int32(2), pp=np.int32(2)),
        TrainingSetup(
            seq_len=np.int64(4096), micro_batch=np.int64(2), num_microbatches=np.int32(8)
        ),
    )
    est = estimate(
        spec,
        ParallelConfig(dp=2, tp=2, pp=2),
        TrainingSetup(seq_len=4096, micro_batch=2, num_microbatches=8),
    )
    assert np_est == est
    assert all(type(s.activations) is int and s.activations > 0 for s in np_est.stages)


def test_numpy_int64_sizes_do_not_wrap_activation_bytes():
    # s·b·h = 2**27 · 2**20 · 2**12 = 2**59 and a layer keeps 34 s·b·h bytes and more (Korthikanti
    # et al. 2022, eq. 1), 32 layers: far above 2**63, where NumPy's int64 wraps
    spec = ModelSpec(name="test-bounds-wrap", **LLAMA2_7B)
    big = dict(seq_len=2**27, micro_batch=2**20)
    np_est = estimate(spec, setup=TrainingSetup(**{k: np.int64(v) for k, v in big.items()}))
    est = estimate(spec, setup=TrainingSetup(**big))
    assert np_est == est
    assert est.stages[0].activations >= 32 * 34 * 2**59 > 2**63


def test_in_flight_cache_is_keyed_on_ints():
    got = in_flight_profile("1f1b", np.int32(4), np.int64(8))
    assert got == (4, 3, 2, 1) and all(type(x) is int for x in got)
    assert in_flight_profile("1f1b", 4, 8) == (4, 3, 2, 1)
    assert type(in_flight_units("gpipe", np.int32(2), np.int32(3), np.int8(1))) is int


# ---------------------------------------------------------------------------- closed forms
def _cases():
    for p in range(1, 13):
        for m in range(1, 13):
            yield "gpipe", p, m, 1
            yield "1f1b", p, m, 1
            if m % p == 0:
                yield "interleaved", p, m, 2
                yield "interleaved", p, m, 3


@pytest.mark.timeout(30)
def test_closed_form_in_flight_counts_equal_the_simulator_for_all_small_pipelines():
    for schedule, p, m, v in _cases():
        r = simulate(schedule, p, m, v)
        profile = in_flight_profile(schedule, p, m, v)
        assert list(profile) == r.peak_in_flight_chunks, (schedule, p, m, v)
        assert [in_flight_units(schedule, p, m, i, v) for i in range(p)] == list(profile)
        # the step of uniform stages, t_f = 1, t_b = 2: (m + (p-1)/v)(t_f + t_b), Narayanan et
        # al. 2021 §2.2.1-2.2.2 (checks the event-driven list scheduler on every case)
        assert r.step_time == pytest.approx(3 * (m + (p - 1) / v)), (schedule, p, m, v)
        assert r.bubble_fraction == pytest.approx(bubble_fraction(p, m, v))


# ---------------------------------------------------------------------------- bounded work
@pytest.mark.timeout(10)
def test_simulate_refuses_work_above_its_limit_by_name():
    with pytest.raises(
        ValueError, match=rf"simulate: p\*m\*v = .*9000000 > MAX_SIM_OPS={MAX_SIM_OPS}"
    ):
        simulate("1f1b", 3000, 3000)
    with pytest.raises(ValueError, match="MAX_SIM_OPS"):
        simulate("interleaved", 64, 1024, 4)
    with pytest.raises(ValueError, match=r"t_fwd=1e\+300 must be in \[1/MAX_TIME, MAX_TIME\]"):
        simulate("1f1b", 2, 2, t_fwd=1e300)
    with pytest.raises(ValueError, match=r"t_bwd=1e-300 must be in \[1/MAX_TIME, MAX_TIME\]"):
        simulate("1f1b", 2, 2, t_bwd=1e-300)


@pytest.mark.timeout(10)
def test_simulate_work_grows_linearly_with_the_stages():
    # one micro-batch through 16,384 stages: the round-robin scheduler took a pass over every
    # stage per backward (p² steps, about 40 s here); the event-driven one wakes one stage
    p = 16384
    r = simulate("1f1b", p, 1)
    assert r.step_time == pytest.approx(3 * p)  # (m + p - 1)(t_f + t_b) with m = 1
    assert r.peak_in_flight_chunks == [1] * p


@pytest.mark.timeout(10)
def test_in_flight_functions_refuse_sizes_beyond_the_limits_by_name():
    with pytest.raises(ValueError, match=rf"p=1000000000 must be an integer in 1..{MAX_GPUS}"):
        in_flight_profile("1f1b", 10**9, 8)
    with pytest.raises(ValueError, match=rf"m=1000000000 must be an integer in 1..{MAX_BATCH}"):
        in_flight_profile("gpipe", 4, 10**9)
    with pytest.raises(ValueError, match=r"p=1000000000 must be an integer"):
        in_flight_units("1f1b", 10**9, 8, 0)
    with pytest.raises(ValueError, match=r"p=1000\d*\.\.\. must be an integer"):
        bubble_ratio(10**400, 1)  # was an OverflowError: int too large for a float
    # at the limit the profile is p closed forms, not a simulation
    prof = in_flight_profile("1f1b", MAX_GPUS, 8)  # min(p - i, m)
    assert len(prof) == MAX_GPUS and prof[:2] == (8, 8) and prof[-3:] == (3, 2, 1)
    half = MAX_GPUS // 2  # interleaved, v = 2, m = MAX_BATCH: min(2(p - i - 1) + p + 1, 2m)
    prof = in_flight_profile("interleaved", half, MAX_BATCH, 2)
    assert len(prof) == half and prof[0] == 3 * half - 1 and prof[-1] == half + 1


@pytest.mark.timeout(10)
def test_ascii_chart_is_bounded():
    r = simulate("gpipe", 1, 1, t_fwd=1e-6, t_bwd=1e6)  # 10**12 cells of the shortest operation
    with pytest.raises(ValueError, match=rf"ascii: .* > MAX_CHART_CELLS={MAX_CHART_CELLS}"):
        r.ascii()
    assert simulate("gpipe", 2, 2, t_fwd=1, t_bwd=1).ascii().splitlines()[0].startswith("S0 |F0")


def test_list_schedule_reports_a_deadlock_and_mismatched_durations():
    # stage 0 wants B0 (needs stage 1's B0, which needs stage 1's F0, which needs stage 0's F0)
    orders = [[("B", 0, 0), ("F", 0, 0)], [("F", 0, 0), ("B", 0, 0)]]
    with pytest.raises(ValueError, match=r"wait on each other at positions \[0, 0\]"):
        list_schedule(orders, [[1.0, 1.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="durations must hold one time per operation"):
        list_schedule(orders, [[1.0], [1.0, 1.0]])
