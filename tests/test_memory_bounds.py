"""Allocated, expected reserved and the high bound (parmem.bounds, issue 32).

* The step's allocation trace (parmem.bounds.step_events) is built tensor by tensor, in the
  order of the stage's schedule; replayed through the allocator simulation, its peak of requested
  bytes must equal the estimate's closed-form peak, for every engine profile, ZeRO stage,
  recomputation policy and schedule tried: two independent ways of counting the same step.
* Reserved is allocated plus that replay's overhead (peak reserved − peak requested).
* The high bound adds the documented driver-level costs: NCCL's buffers from its own constants
  (src/init.cc: DEFAULT_BUFFSIZE 4 MiB; LL: 8 lines x 512 threads x 8 steps x 16 bytes; LL128:
  120 elements x 640 threads x 8 steps x 8 bytes), PyTorch's cuBLAS workspace
  (CublasHandlePool.cpp: 32 MiB on sm90, 2 x 4096 KiB + 8 x 16 KiB before) and the CUDA context
  measured in pytorch/pytorch PR #86509 (666,632,192 bytes eager).
"""

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.allocator import replay
from parmem.bounds import bounds, communicators, nccl_bytes, step_events

SIMPLE = 4 * 2**20
LL = 8 * 512 * 8 * 16
LL128 = 120 * 640 * 8 * 8
RING = 32 * (SIMPLE + LL + LL128)  # 32 channels (data/overheads.toml's assumption)

LAYOUTS = [
    ("llama-2-7b", ParallelConfig(), TrainingSetup(seq_len=2048)),
    ("llama-2-7b", ParallelConfig(dp=4, zero=1), TrainingSetup(seq_len=2048, recompute="selective")),
    ("llama-3-8b", ParallelConfig(dp=8, zero=3), TrainingSetup(seq_len=4096, engine="fsdp2")),
    ("llama-3-8b", ParallelConfig(dp=8, zero=2), TrainingSetup(seq_len=4096, engine="deepspeed")),
    ("llama-3-8b", ParallelConfig(dp=2), TrainingSetup(seq_len=1024, engine="hf")),
    ("llama-2-70b", ParallelConfig(tp=8, pp=4, dp=2, sp=True, zero=1),
     TrainingSetup(seq_len=4096, num_microbatches=16, recompute="full", engine="megatron-core")),
    ("llama-2-70b", ParallelConfig(tp=8, pp=4, sp=True),
     TrainingSetup(seq_len=4096, num_microbatches=6, schedule="gpipe")),
    ("mixtral-8x7b", ParallelConfig(tp=2, pp=2, dp=4, ep=4, sp=True, zero=1),
     TrainingSetup(seq_len=4096, num_microbatches=8, engine="megatron-core")),
    # fine-tuning (issue 31): LoRA's first layer keeps less; QLoRA's dequantised weight;
    # offloaded activations
    ("llama-2-7b", ParallelConfig(dp=2),
     TrainingSetup(seq_len=2048, engine="hf", precision="bf16", adapter="lora")),
    ("llama-3-8b", ParallelConfig(), TrainingSetup(seq_len=2048, engine="hf", precision="bf16",
                                                   adapter="qlora", recompute="full")),
    ("llama-2-7b", ParallelConfig(), TrainingSetup(seq_len=1024, engine="hf", precision="bf16",
                                                   adapter="qlora", offload_activations=True)),
]


@pytest.mark.parametrize("name, par, setup", LAYOUTS, ids=lambda x: str(x)[:40])
def test_the_trace_peaks_at_the_estimate(name, par, setup):
    est = estimate(ModelSpec.preset(name), par, setup)
    for b in est.stages:
        r = replay(step_events(est, b.stage))
        assert r.peak_requested == b.total, (b.stage, r.peak_requested, b.total)


@pytest.mark.parametrize("name, par, setup", LAYOUTS[:3], ids=lambda x: str(x)[:40])
def test_reserved_is_allocated_plus_the_replay_overhead(name, par, setup):
    est = estimate(ModelSpec.preset(name), par, setup)
    band = bounds(est, "h100-sxm")
    for b, s in zip(est.stages, band.stages, strict=True):
        r = replay(step_events(est, b.stage))
        assert s.allocated == b.total
        assert s.reserved == b.total + r.peak_reserved - r.peak_requested
        assert s.allocated <= s.reserved <= s.high


def test_expandable_segments_reserve_no_more():
    est = estimate(ModelSpec.preset("llama-3-8b"), ParallelConfig(dp=8, zero=3),
                   TrainingSetup(seq_len=4096, engine="fsdp2"))
    plain = bounds(est, "h100-sxm").reserved
    assert bounds(est, "h100-sxm", expandable_segments=True).reserved <= plain


def test_nccl_buffers_from_nccls_constants():
    """t = 8, d = 2, p = 4: the world, TP and DP rings (three collectives) and the pipeline's
    neighbours: one at the ends (stage 0, stage 3), two in the middle, 2 channels each, Simple."""
    est = estimate(ModelSpec.preset("llama-2-70b"), ParallelConfig(tp=8, pp=4, dp=2, sp=True),
                   TrainingSetup(seq_len=4096, num_microbatches=8))
    assert [c[0] for c in communicators(est)] == ["world", "tp", "dp", "pp"]
    assert nccl_bytes(est, 0) == 3 * RING + 1 * 2 * SIMPLE
    assert nccl_bytes(est, 1) == 3 * RING + 2 * 2 * SIMPLE
    assert nccl_bytes(est, 3) == nccl_bytes(est, 0)
    assert nccl_bytes(est, 0, channels=16, p2p_channels_per_peer=1) == (
        3 * 16 * (SIMPLE + LL + LL128) + SIMPLE
    )


def test_expert_parallel_all_to_all_receives_from_every_peer():
    est = estimate(ModelSpec.preset("mixtral-8x7b"), ParallelConfig(dp=8, ep=8),
                   TrainingSetup(seq_len=4096))
    names = [c[0] for c in communicators(est)]
    assert names == ["world", "dp", "ep"]  # expert-dp = d/e = 1: no group
    assert nccl_bytes(est) == 2 * RING + 7 * 2 * SIMPLE


def test_one_gpu_opens_no_communicator():
    est = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(), TrainingSetup(seq_len=2048))
    assert communicators(est) == [] and nccl_bytes(est) == 0


def test_the_high_bound_adds_context_nccl_and_workspace():
    est = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=4, zero=1),
                   TrainingSetup(seq_len=2048))
    h100, a100 = bounds(est, "h100-sxm"), bounds(est, "a100-80gb")
    s = h100.stages[0]
    assert s.cuda_context == 666_632_192
    assert s.workspace == 32 * 2**20 and a100.stages[0].workspace == 2 * 4096 * 1024 + 8 * 16 * 1024
    assert s.nccl == 2 * RING  # world and DP rings
    assert s.high == s.reserved + 666_632_192 + 2 * RING + 32 * 2**20
    assert h100.headroom == h100.capacity - h100.high
    assert h100.fits == (h100.high <= 81559 * 2**20)


def test_measured_context_and_reserve_replace_the_defaults():
    est = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=4, zero=1),
                   TrainingSetup(seq_len=2048))
    band = bounds(est, "h100-sxm", cuda_context=500 * 2**20, reserve=3 * 2**30)
    s = band.stages[0]
    assert s.reserved == s.allocated + 3 * 2**30
    assert s.high == s.reserved + 500 * 2**20 + s.nccl + s.workspace
    # a context the setup already counts is not counted twice
    counted = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=4, zero=1),
                       TrainingSetup(seq_len=2048, cuda_context=2**30))
    assert bounds(counted, "h100-sxm").stages[0].cuda_context == 0


def test_bad_input_names_the_field():
    est = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(), TrainingSetup(seq_len=64))
    with pytest.raises(ValueError, match="est must be an Estimate"):
        bounds("est")
    with pytest.raises(ValueError, match="unknown hardware"):
        bounds(est, "tpu")
    with pytest.raises(ValueError, match="reserve="):
        bounds(est, reserve=-1)
    with pytest.raises(ValueError, match="channels="):
        nccl_bytes(est, channels=0)
    with pytest.raises(ValueError, match="stage="):
        step_events(est, stage=1)


def test_cli_estimate_prints_the_band(capsys):
    import json

    from parmem.cli import main

    assert main(["estimate", "--model", "llama-2-7b", "--seq", "2048", "--gpu", "h100-sxm"]) == 0
    assert "reserved" in capsys.readouterr().out
    assert main(["estimate", "--model", "llama-2-7b", "--seq", "2048", "--gpu", "h100-sxm",
                 "--json", "--reserve-gib", "1"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bounds"]["reserved"] - d["bounds"]["allocated"] == 2**30


def test_allocator_overhead_is_the_replays_and_checks_its_input():
    from parmem.bounds import allocator_overhead

    est = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=4, zero=1),
                   TrainingSetup(seq_len=2048))
    r = replay(step_events(est, 0))
    assert allocator_overhead(est) == r.peak_reserved - r.peak_requested
    with pytest.raises(ValueError, match="est must be an Estimate"):
        allocator_overhead([est])
    with pytest.raises(ValueError, match="stage="):
        allocator_overhead(est, 1)
