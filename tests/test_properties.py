"""Property tests: more parallelism or recompute never raises per-GPU memory, and the whole
cluster always holds at least one copy of the model states.

"Valid values" here are the real presets, pipeline sizes that divide the layers evenly and
m >= p (an uneven split can put one more layer on stage 0, and with m < p a deeper pipeline
holds fewer micro-batches, which the tests of test_estimate.py cover separately)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate, model_state_bytes

MODELS = ["llama-2-7b", "llama-2-13b", "llama-3-8b", "llama-3-70b", "mistral-7b", "gpt3-175b",
          "mixtral-8x7b", "megatron-22b"]

setups = st.builds(
    lambda seq, b, rc, flash: TrainingSetup(seq_len=seq, micro_batch=b, num_microbatches=64,
                                            recompute=rc, flash_attention=flash),
    st.sampled_from([512, 2048]), st.integers(1, 4), st.sampled_from(["none", "selective", "full"]),
    st.booleans())


def peak(spec, setup, **par):
    return estimate(spec, ParallelConfig(**par), setup).peak_bytes


def divisors(n, limit):
    return [k for k in range(1, limit + 1) if n % k == 0]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MODELS), setups, st.sampled_from([1, 2, 4]), st.integers(0, 3))
def test_more_tp_never_costs_more(name, setup, pp, zero):
    spec = ModelSpec.preset(name)
    tps = [t for t in divisors(spec.heads, 16) if spec.ffn_hidden % t == 0]
    peaks = [peak(spec, setup, tp=t, pp=pp, zero=zero, dp=2) for t in tps]
    assert peaks == sorted(peaks, reverse=True)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MODELS), setups, st.sampled_from([1, 2, 8]), st.booleans())
def test_more_pp_never_costs_more(name, setup, tp, sp):
    spec = ModelSpec.preset(name)
    pps = divisors(spec.layers, 16)
    peaks = [peak(spec, setup, tp=tp, sp=sp and tp > 1, pp=p) for p in pps]
    assert peaks == sorted(peaks, reverse=True)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MODELS), setups, st.integers(1, 3))
def test_more_dp_with_zero_never_costs_more(name, setup, zero):
    spec = ModelSpec.preset(name)
    peaks = [peak(spec, setup, dp=d, zero=zero, tp=8) for d in (1, 2, 4, 8, 16, 64, 512)]
    assert peaks == sorted(peaks, reverse=True)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from([512, 2048]), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 4]), st.booleans())
def test_more_recompute_never_costs_more(name, seq, b, pp, flash):
    spec = ModelSpec.preset(name)
    peaks = [peak(spec, TrainingSetup(seq_len=seq, micro_batch=b, num_microbatches=8,
                                      recompute=rc, flash_attention=flash), pp=pp, tp=2)
             for rc in ("none", "selective", "full")]
    assert peaks == sorted(peaks, reverse=True)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]),
       st.sampled_from([1, 2, 8, 32]), st.integers(0, 3))
def test_cluster_holds_at_least_one_copy_of_the_model_states(name, tp, pp, dp, zero):
    spec = ModelSpec.preset(name)
    ep = 8 if spec.is_moe and dp % 8 == 0 else 1
    est = estimate(spec, ParallelConfig(dp=dp, tp=tp, pp=pp, zero=zero, ep=ep),
                   TrainingSetup(seq_len=512))
    cluster = dp * tp * sum(s.model_states for s in est.stages)
    assert cluster >= model_state_bytes(spec.num_params()).total
