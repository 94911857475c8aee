"""The inverse queries of parmem.fit, pinned at their boundaries (issue 32).

Every answer is checked from outside the search: the answer fits and the next value up does not,
each re-computed here with the forward functions (parmem.estimate, parmem.bounds.bounds), across
dense, MoE, long-context (CP) and serving cases. The serving case is checked against arithmetic
done by hand from the published Llama 3 70B shapes.
"""

import math
from dataclasses import replace

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.bounds import bounds
from parmem.fit import (
    MARGIN,
    fewest_gpus,
    fits,
    max_micro_batch,
    max_requests,
    max_seq_len,
)
from parmem.hardware import hardware_preset

H100 = hardware_preset("h100-sxm")


def _fits(spec, par, setup, bound="high", hw=H100, margin=MARGIN):
    """The book's rule, computed here from its two parts: the estimate within (1 − margin) of the
    GPU, and the bound (parmem.bounds) within the whole GPU."""
    est = estimate(spec, par, setup)
    b = bounds(est, hw)
    shown = {"high": b.high, "reserved": b.reserved, "allocated": est.peak_bytes}[bound]
    ok = est.peak_bytes <= int(hw.memory_bytes * (1 - margin)) and shown <= hw.memory_bytes
    assert ok == fits(est, hw, bound=bound, margin=margin)
    return ok


CASES = [
    # dense, one GPU row per layout kind
    ("llama-3-8b", ParallelConfig(dp=8, zero=3), TrainingSetup(seq_len=1, engine="fsdp2")),
    ("llama-3-70b", ParallelConfig(tp=8, pp=4, sp=True),
     TrainingSetup(seq_len=1, num_microbatches=4, recompute="full", engine="megatron-core")),
    # MoE with expert parallelism
    ("mixtral-8x7b", ParallelConfig(dp=4, tp=2, pp=2, ep=4, sp=True, zero=1),
     TrainingSetup(seq_len=1, num_microbatches=4, recompute="selective", engine="megatron-core")),
    # long context: context parallelism (sequences in steps of cp·t)
    ("llama-3-70b", ParallelConfig(dp=1, tp=8, pp=4, cp=2, sp=True, zero=1),
     TrainingSetup(seq_len=1, num_microbatches=4, recompute="full", engine="megatron-core")),
]


@pytest.mark.parametrize("name, par, setup", CASES, ids=lambda x: str(x)[:40])
def test_longest_sequence_fits_and_one_step_more_does_not(name, par, setup):
    spec = ModelSpec.preset(name)
    ans = max_seq_len(spec, par, setup, H100)
    step = par.cp * (par.tp if par.sp else 1)
    # torchtitan chunks its own Llama 3 models' loss in 8 equal chunks of the rank's sequence
    chunks = 8 if setup.engine == "fsdp2" and name == "llama-3-8b" else 0
    step = math.lcm(step, par.cp * chunks) if chunks else step
    assert ans.value > 0 and ans.value % step == 0
    assert ans.next_value == ans.value + step
    assert _fits(spec, par, replace(setup, seq_len=ans.value))
    assert not _fits(spec, par, replace(setup, seq_len=ans.value + step))
    # the bytes reported are the bytes of the forward question
    at = estimate(spec, par, replace(setup, seq_len=ans.value))
    assert ans.bytes == bounds(at, H100).high and ans.allocated == at.peak_bytes
    assert ans.probes < 64  # bisection, not a sweep


def test_without_the_margin_the_high_bound_alone_decides():
    """margin=0: the whole GPU for the high bound alone; the answer is at least as long, and
    judged on allocated bytes alone longer still."""
    name, par, setup = CASES[1]
    spec = ModelSpec.preset(name)
    book = max_seq_len(spec, par, setup, H100)
    high = max_seq_len(spec, par, setup, H100, margin=0)
    alloc = max_seq_len(spec, par, setup, H100, bound="allocated", margin=0)
    assert alloc.value >= high.value >= book.value
    assert _fits(spec, par, replace(setup, seq_len=high.value), margin=0)
    assert not _fits(spec, par, replace(setup, seq_len=high.next_value), margin=0)
    assert estimate(spec, par, replace(setup, seq_len=alloc.value)).peak_bytes <= H100.memory_bytes
    nxt = replace(setup, seq_len=alloc.next_value)
    assert estimate(spec, par, nxt).peak_bytes > H100.memory_bytes


@pytest.mark.parametrize("name, par, setup", CASES[:3], ids=lambda x: str(x)[:40])
def test_largest_micro_batch_fits_and_one_more_does_not(name, par, setup):
    spec = ModelSpec.preset(name)
    st = replace(setup, seq_len=2048)
    ans = max_micro_batch(spec, par, st, H100)
    assert ans.value >= 1 and ans.next_value == ans.value + 1
    assert _fits(spec, par, replace(st, micro_batch=ans.value))
    assert not _fits(spec, par, replace(st, micro_batch=ans.value + 1))


def test_nothing_fits_is_zero_with_the_smallest_bytes():
    spec = ModelSpec.preset("llama-3-70b")
    ans = max_seq_len(spec, ParallelConfig(), TrainingSetup(seq_len=1), H100)
    assert ans.value == 0 and not ans.fits and ans.bytes > H100.memory_bytes


def test_learned_positions_stop_at_max_positions():
    spec = ModelSpec.preset("gpt2")
    ans = max_seq_len(spec, ParallelConfig(), TrainingSetup(seq_len=1), H100)
    assert ans.value == spec.max_positions and ans.next_value is None


def test_serving_requests_by_hand():
    """Llama 3 70B (Meta's config.json: 80 layers, 8 key/value heads of 128, vocabulary 128,256,
    70,553,706,496 parameters) served in bf16 on 8 H100s (tp = 8): each GPU keeps 1 kv head,
    K and V, 80 layers, 2 bytes: 40,960 bytes per token; its weights are 2·Ψ/8 bytes. The
    budget is 0.9 of 81,559 MiB. Requests of 8,192 tokens: ⌊(budget − weights)/(8,192 ·
    40,960)⌋."""
    spec = ModelSpec.preset("llama-3-70b")
    assert spec.num_params() == 70_553_706_496
    budget = int(81559 * 2**20 * 0.9)
    weights = 2 * 70_553_706_496 // 8
    per_request = 8192 * 2 * 80 * 1 * 128 * 2
    want = (budget - weights) // per_request
    ans = max_requests(spec, 8192, H100, tp=8, utilization=0.9)
    assert ans.value == want
    assert ans.bytes <= budget < ans.next_bytes
    assert ans.next_value == want + 1


def test_fewest_gpus_and_no_fewer():
    """Llama 3 70B at 4K under Megatron-Core on H100s: the answer's layout fits, and no layout
    of fewer GPUs does."""
    spec = ModelSpec.preset("llama-3-70b")
    setup = TrainingSetup(seq_len=4096, engine="megatron-core")
    ans = fewest_gpus(spec, setup, H100)
    assert ans.value > 1 and ans.parallel.world_size == ans.value
    assert _fits(spec, ans.parallel, ans.setup)
    # every count below the answer was tried, every layout of it: none fits on the high bound
    assert fewest_gpus(spec, setup, H100, max_gpus=ans.value - 1).value == 0
    # without the margin, judged on allocated bytes alone, it may need fewer
    assert 0 < fewest_gpus(spec, setup, H100, bound="allocated", margin=0).value <= ans.value


def test_fewest_gpus_moe_uses_expert_parallelism_when_it_must():
    spec = ModelSpec.preset("mixtral-8x7b")
    setup = TrainingSetup(seq_len=4096, engine="megatron-core")
    ans = fewest_gpus(spec, setup, H100)
    assert ans.value >= 2
    assert _fits(spec, ans.parallel, ans.setup)
    assert fewest_gpus(spec, setup, H100, max_gpus=ans.value - 1).value == 0


def test_bad_input_names_the_field():
    spec = ModelSpec.preset("llama-3-8b")
    with pytest.raises(ValueError, match="bound='tight' must be one of"):
        max_seq_len(spec, bound="tight")
    with pytest.raises(ValueError, match="setup must be a TrainingSetup"):
        max_micro_batch(spec)
    with pytest.raises(ValueError, match="hardware="):
        max_seq_len(spec, hardware=3)
    with pytest.raises(ValueError, match="recompute='some' must be one of"):
        fewest_gpus(spec, TrainingSetup(seq_len=8), recompute=("some",))


def test_cli_fit(capsys):
    from parmem.cli import main

    assert main(["fit", "seq", "--model", "llama-3-8b", "--dp", "8", "--zero", "3",
                 "--engine", "fsdp2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("seq_len = ") and "headroom" in out
    assert main(["fit", "micro-batch", "--model", "llama-3-70b", "--seq", "4096"]) == 1
    assert "nothing fits" in capsys.readouterr().out
    assert main(["fit", "requests", "--model", "llama-3-70b", "--tp", "8"]) == 2
    assert "--seq is required" in capsys.readouterr().err
