"""The serving roofline (parmem.serving_latency) against numbers derived by hand.

Constants used below, from data/hardware.toml (tested in tests/test_hardware.py and here):
H100 SXM HBM 3.35e12 B/s ("GPU Memory Bandwidth 3.35TB/s"), dense BF16 peak 989e12 FLOP/s,
NVLink 4 450e9 B/s per direction with an assumed 3 us latency. Default efficiencies: 0.8 of the
HBM bandwidth, 0.6 of the peak.

Llama-3-70B: h = 8192, L = 80, 64 query heads and 8 kv heads of 128, MLP 28672 (SwiGLU),
vocabulary 128256, untied. One layer on one of t GPUs multiplies by
(2·8192² + 2·1024·8192 + 3·8192·28672) / t weights and keeps two RMSNorm vectors of 8192.
"""

from __future__ import annotations

import doctest

import pytest

import parmem.serving_latency as sl
from parmem.hardware import Hardware, hardware_preset, link_preset
from parmem.inference import decode_step_comm
from parmem.model import ModelSpec
from parmem.serving_latency import (
    all_reduce_time,
    custom_all_reduce_algorithm,
    decode_step,
    expected_experts,
    prefill,
    serving_latency,
)

HBM = 3.35e12 * 0.8  # H100 SXM bytes/s at the default mem_efficiency
PEAK = 989e12 * 0.6  # dense BF16 FLOP/s at the default flop_efficiency
ALPHA, BETA = 3e-6, 450e9  # NVLink 4: latency (assumption), bytes/s per direction

H, L, V = 8192, 80, 128256
ATTN = 2 * H * H + 2 * 1024 * H  # Q, O; K, V (8 kv heads of 128)
MLP = 3 * H * 28672


@pytest.fixture(scope="module")
def llama70():
    return ModelSpec.preset("llama-3-70b")


@pytest.fixture(scope="module")
def mixtral():
    return ModelSpec.preset("mixtral-8x7b")


def test_memory_bandwidth_presets():
    # datasheet "GPU Memory Bandwidth": A100 40GB SXM 1,555GB/s, A100 80GB SXM 2,039GB/s,
    # H100 SXM 3.35TB/s, H200 4.8TB/s
    for name, bw in [
        ("a100-40gb", 1555e9),
        ("a100-80gb", 2039e9),
        ("h100-sxm", 3.35e12),
        ("h200", 4.8e12),
    ]:
        hw = hardware_preset(name)
        assert hw.memory_bandwidth == pytest.approx(bw, rel=1e-12)
        assert "GPU Memory Bandwidth" in hw.source
    nv = link_preset("nvlink4")
    unknown = Hardware("x", 80, 1e15, nv, nv, nv)  # left out: unknown, fine for memory sizing
    with pytest.raises(ValueError, match="memory_bandwidth is unknown"):
        decode_step(ModelSpec.preset("llama-3-8b"), unknown, batch=1, context=16)
    with pytest.raises(ValueError, match=r"memory_bandwidth=-1"):
        Hardware("x", 80, 1e15, nv, nv, nv, memory_bandwidth=-1)


def test_decode_step_by_hand(llama70):
    """Llama-3-70B, t = 8, 32 sequences of 4096 tokens, 16-bit weights and cache."""
    s = decode_step(llama70, "h100-sxm", batch=32, context=4096, tp=8)
    per_layer = (ATTN + MLP) // 8  # matmul weights of one layer on one GPU
    head = V // 8 * H  # the LM head's vocabulary shard
    # weights: the layers (with their two norms), the final norm, the LM head; the embedding
    # only by the 32 rows the step gathers
    params = L * (per_layer + 2 * H) + H + head + 32 * H
    assert s.weights_read == 2 * params == 17_378_590_720
    # KV: 32 · 4096 tokens · 80 layers · 2 (K, V) · 1 kv head · 128 · 2 bytes
    assert s.kv_read == 32 * 4096 * L * 2 * 1 * 128 * 2
    # FLOPs: 2 · matmul weights · 32 tokens + LM head for 32 sequences + 4·b·ctx·(q_dim/t)·L
    attention = 4 * 32 * 4096 * (64 * 128 // 8) * L
    assert s.flops == 2 * L * per_layer * 32 + 2 * head * 32 + attention
    assert s.memory_s == pytest.approx((s.weights_read + s.kv_read) / HBM)
    assert s.compute_s == pytest.approx(s.flops / PEAK)
    assert s.seconds == pytest.approx(max(s.memory_s, s.compute_s) + s.comm_s)
    assert s.stages == 1 and s.bound == "memory"


def test_custom_all_reduce_beats_the_ring(llama70):
    """(2) TP = 8 at batch 32: 2 all-reduces per layer of 32 · 8192 · 2 = 512 KiB. vLLM's
    kernel runs two-shot (8 GPUs, not below 256 KiB): 2 latencies and 2·7·(size/8) bytes; the
    ring takes 2·7 latencies for the same bytes."""
    size = 32 * H * 2
    assert size == 512 * 1024
    per_custom = 2 * ALPHA + 2 * 7 * (size // 8) / BETA
    per_ring = 14 * ALPHA + 2 * 7 * (size // 8) / BETA
    custom = decode_step(llama70, batch=32, context=4096, tp=8)
    ring = decode_step(llama70, batch=32, context=4096, tp=8, allreduce="nccl")
    assert custom.comm["tp"] == pytest.approx(2 * L * per_custom, rel=1e-12)
    assert ring.comm["tp"] == pytest.approx(2 * L * per_ring, rel=1e-12)
    assert ring.comm["tp"] > 5 * custom.comm["tp"]
    # the ring agrees with parmem.inference's decode traffic
    assert ring.comm["tp"] == pytest.approx(decode_step_comm(llama70, 8, 32)["seconds"])
    assert custom.comm == {"tp": custom.comm_s, "ep": 0.0, "pp": 0.0}


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_tp_lowers_decode_latency_and_per_gpu_throughput(llama70, batch):
    """(1) Memory-bound decode: each t splits the weights and the cache, so TPOT falls; the
    all-reduces do not shrink, so t · TPOT (the GPU-seconds per token) grows."""
    tpot = {t: decode_step(llama70, batch=batch, context=4096, tp=t).seconds for t in (2, 4, 8)}
    assert tpot[8] < tpot[4] < tpot[2]
    per_gpu = {t: batch / tpot[t] / t for t in tpot}
    assert per_gpu[8] < per_gpu[4] < per_gpu[2]
    for t in tpot:
        r = serving_latency(llama70, prompt=4096 - 1, output=2, batch=batch, tp=t)
        assert r.tpot_s == tpot[t]  # context = prompt + output // 2 = 4096
        assert r.tokens_per_s_per_gpu == pytest.approx(per_gpu[t])


def test_custom_all_reduce_algorithm_thresholds():
    # csrc/custom_all_reduce.cuh: 2 GPUs one-shot; <= 4 GPUs below 512 KiB, <= 8 below 256 KiB
    KiB = 1024
    assert custom_all_reduce_algorithm(4 * 2**20, 2) == "one-shot"
    assert custom_all_reduce_algorithm(512 * KiB - 16, 4) == "one-shot"
    assert custom_all_reduce_algorithm(512 * KiB, 4) == "two-shot"
    assert custom_all_reduce_algorithm(256 * KiB - 16, 8) == "one-shot"
    assert custom_all_reduce_algorithm(256 * KiB, 6) == "two-shot"
    # declined: max_size 8 MiB, sizes not a multiple of 16 bytes, world sizes outside 2,4,6,8
    assert custom_all_reduce_algorithm(8 * 2**20, 8) == "nccl"
    assert custom_all_reduce_algorithm(8 * 2**20 - 16, 8) == "two-shot"
    assert custom_all_reduce_algorithm(1000, 2) == "nccl"  # 1000 % 16 = 8
    assert custom_all_reduce_algorithm(1024, 3) == "nccl"
    assert custom_all_reduce_algorithm(1024, 16) == "nccl"
    assert custom_all_reduce_algorithm(1024, 1) == "none"
    nv = link_preset("nvlink4")
    # one-shot: one latency, each GPU reads the n - 1 other inputs
    assert all_reduce_time(64 * KiB, 4, nv) == pytest.approx(ALPHA + 3 * 64 * KiB / BETA)
    assert all_reduce_time(64 * KiB, 1, nv) == 0.0
    # declined sizes cost what the ring costs
    big = 16 * 2**20
    ring = 14 * ALPHA + 2 * 7 * big / 8 / BETA
    assert all_reduce_time(big, 8, nv) == pytest.approx(ring)
    assert all_reduce_time(big, 8, nv, "nccl") == pytest.approx(ring)


def test_expected_experts():
    # E·(1 − (1 − k/E)^B): one token touches exactly k; many touch all
    assert expected_experts(8, 2, 1) == pytest.approx(2)
    assert expected_experts(8, 2, 0) == 0
    assert expected_experts(8, 2, 4) == pytest.approx(8 * (1 - 0.75**4))
    assert expected_experts(256, 8, 10_000) == pytest.approx(256)
    with pytest.raises(ValueError, match="top_k=9"):
        expected_experts(8, 9, 1)


def test_moe_decode_reads_the_routed_experts(mixtral):
    """Mixtral 8x7B at batch 1 reads 2 of 8 experts per layer. h = 4096, L = 32, Q/O 4096²,
    K/V 1024·4096, experts 3·4096·14336 each, router 8·4096, V = 32000 (untied)."""
    h, layers = 4096, 32
    dense = 2 * h * h + 2 * 1024 * h + 8 * h + 2 * h  # attention, router, two norms
    expert = 3 * h * 14336
    s = decode_step(mixtral, batch=1, context=4096)
    params = layers * (dense + 2 * expert) + h + 32000 * h + 1 * h  # + final norm, head, 1 row
    assert s.weights_read == 2 * params
    # FLOPs: the two routed experts and the dense matmuls, the head, attention over 4096
    matmul = layers * (dense - 2 * h + 2 * expert)
    assert s.flops == 2 * matmul + 2 * 32000 * h + 4 * 4096 * 4096 * layers
    # at batch 32 nearly every expert is read
    big = decode_step(mixtral, batch=32, context=4096)
    share = 1 - 0.75**32  # an expert escapes all 32 tokens with probability (6/8)^32
    params = layers * (dense + 8 * expert * share) + h + 32000 * h + 32 * h
    assert big.weights_read == pytest.approx(2 * params, abs=1)


def test_expert_parallel_all_to_all(mixtral):
    """(3) ep = 8, 32 sequences: each rank holds 4; per MoE layer a dispatch and a combine of
    4·2·4096·2 bytes, each rank sending 7/8 of it in 7 steps."""
    s = decode_step(mixtral, batch=32, context=4096, ep=8)
    buf = 4 * 2 * 4096 * 2
    per = 7 * ALPHA + 7 * (buf // 8) / BETA
    assert s.comm["ep"] == pytest.approx(2 * 32 * per, rel=1e-12)
    assert s.comm["ep"] > 0 and s.comm["tp"] == 0 and s.comm["pp"] == 0
    # each rank's KV: its 4 sequences, every kv head
    assert s.kv_read == 4 * 4096 * 32 * 2 * 8 * 128 * 2


def test_decode_is_memory_bound_and_prefill_compute_bound(llama70):
    """(4) Batch-1 decode does 2 FLOPs per 2-byte weight; a 4096-token prefill 4096 times more."""
    for t in (1, 8):
        step = decode_step(llama70, batch=1, context=4096, tp=t)
        assert step.memory_s > step.compute_s and step.bound == "memory"
        first = prefill(llama70, prompt=4096, tp=t)
        assert first.compute_s > first.memory_s and first.bound == "compute"
    first = prefill(llama70, prompt=4096, tp=8)
    per_layer = (ATTN + MLP) // 8
    causal = 2 * 4096 * 4096 * (64 * 128 // 8)  # 2·P²·(q_dim/t) per layer
    assert first.flops == 2 * L * per_layer * 4096 + 2 * (V // 8 * H) + L * causal
    # KV written: 4096 tokens · 80 layers · 2 · 128 · 2 bytes (one kv head per GPU)
    assert first.kv_read == 4096 * L * 2 * 128 * 2
    # 4096 · 8192 · 2 = 64 MiB messages: above the custom kernel's 8 MiB, so NCCL's ring
    size = 4096 * H * 2
    ring = 2 * L * (14 * ALPHA + 2 * 7 * (size // 8) / BETA)
    assert first.comm["tp"] == pytest.approx(ring, rel=1e-12)


def test_pipeline_stages_add_up(llama70):
    one = decode_step(llama70, batch=32, context=4096, tp=4)
    two = decode_step(llama70, batch=32, context=4096, tp=4, pp=2)
    assert two.stages == 2
    # an untied model: the stages together read what one stage reads
    assert two.weights_read == one.weights_read and two.kv_read == one.kv_read
    assert two.flops == one.flops
    # one send of 32 · 8192 · 2 bytes from stage 0 to stage 1
    assert two.comm["pp"] == pytest.approx(ALPHA + 32 * H * 2 / BETA)
    assert two.comm["tp"] == pytest.approx(one.comm["tp"])
    # each stage: max(memory, compute) + comm; both memory-bound here
    assert two.seconds == pytest.approx(two.memory_s + two.comm_s)


def test_sliding_window_caps_the_cache():
    spec = ModelSpec.preset("gemma-3-27b")
    w, full = spec.sliding_window, spec.layers - spec.num_local_layers
    per = 2 * spec.kv_heads * spec.head_dim * 2
    s = decode_step(spec, batch=2, context=4 * w)
    assert s.kv_read == 2 * (full * 4 * w + spec.num_local_layers * w) * per
    fp8 = decode_step(spec, batch=2, context=4 * w, kv_dtype="fp8")
    assert fp8.kv_read * 2 == s.kv_read


def test_weight_overrides(llama70):
    base = decode_step(llama70, batch=4, context=1024, tp=8)
    fp8 = decode_step(llama70, batch=4, context=1024, tp=8, weight_bytes_per_param=1.0)
    assert fp8.weights_read * 2 == base.weights_read
    # the bytes one GPU holds: its parameters at 1 byte each give the same reads as 1.0 B/param
    held = L * (ATTN + MLP) // 8 + L * 2 * H + H + 2 * (V // 8) * H  # + embedding and head
    same = decode_step(llama70, batch=4, context=1024, tp=8, weights=held)
    assert same.weights_read == fp8.weights_read


def test_serving_latency(llama70):
    r = serving_latency(llama70, "h100-sxm", prompt=1000, output=201, batch=8, tp=4, pp=2)
    assert r.gpus == 8
    assert r.ttft_s == prefill(llama70, prompt=1000, batch=8, tp=4, pp=2).seconds
    assert r.tpot_s == decode_step(llama70, batch=8, context=1100, tp=4, pp=2).seconds
    assert r.tokens_per_s_per_gpu == pytest.approx(8 / r.tpot_s / 8)
    assert r.latency_s == pytest.approx(r.ttft_s + 200 * r.tpot_s)
    with pytest.raises(ValueError, match="unknown option 'dtype'"):
        serving_latency(llama70, prompt=10, output=10, batch=1, dtype="fp8")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch": 0}, r"batch=0 must be an integer"),
        ({"context": 0}, r"context=0 must be an integer"),
        ({"tp": 3}, r"tp=3 must divide heads=64"),
        ({"pp": 81}, r"pp=81 must be at most layers=80"),
        ({"ep": 2}, r"ep=2 needs a mixture-of-experts model"),
        ({"allreduce": "mpi"}, r"allreduce='mpi' must be one of 'custom', 'nccl'"),
        ({"kv_dtype": "fp4"}, r"kv_dtype='fp4' must be one of"),
        ({"mem_efficiency": 0}, r"mem_efficiency=0 must be > 0"),
        ({"flop_efficiency": 1.5}, r"flop_efficiency=1\.5 must be <= 1"),
        ({"weight_bytes_per_param": 0}, r"weight_bytes_per_param=0 must be > 0"),
        ({"weights": 0}, r"weights=0 must be an integer"),
        ({"gpu": "h900"}, r"gpu='h900': unknown hardware 'h900'"),
        ({"gpu": 80}, r"gpu must be a Hardware"),
    ],
)
def test_bad_inputs_name_the_field(llama70, kwargs, match):
    """(5) Every bad input is a ValueError naming the field and the rule."""
    args = {"batch": 1, "context": 16, **kwargs}
    gpu = args.pop("gpu", "h100-sxm")
    with pytest.raises(ValueError, match=match):
        decode_step(llama70, gpu, **args)


def test_bad_inputs_of_prefill_and_serving(llama70):
    with pytest.raises(ValueError, match="prompt=0 must be an integer"):
        prefill(llama70, prompt=0)
    with pytest.raises(ValueError, match="output=0 must be an integer"):
        serving_latency(llama70, prompt=1, output=0, batch=1)
    with pytest.raises(ValueError, match="spec must be a ModelSpec"):
        decode_step("llama-3-70b", batch=1, context=1)  # type: ignore[arg-type]


def test_docstring_examples():
    assert doctest.testmod(sl).failed == 0
