"""Serving memory: KV cache from the config, quantised weights, serving capacity and the
PagedAttention simulator, against numbers worked out by hand.

Shapes: Hugging Face config.json of each model (data/models.toml); GPU memory as nvidia-smi reports
it (data/hardware.toml). PagedAttention: Kwon et al. 2023, §3-§4.
"""

import pytest

from parmem import ModelSpec, kv_cache_bytes, kv_cache_bytes_per_token, weight_bytes
from parmem.inference import (
    Request,
    decode_step_comm,
    max_concurrency,
    prefill_workspace_bytes,
    random_requests,
    serving_layout,
    serving_weight_bytes,
    simulate_kv_cache,
)

GiB = 2**30


def test_llama2_7b_kv_is_512_kib_per_token():
    # 2 (K and V) * 32 layers * 32 heads * 128 dims * 2 bytes = 524,288 bytes (TOPICS row 20).
    assert kv_cache_bytes_per_token(ModelSpec.preset("llama-2-7b")) == 512 * 1024


def test_gqa_and_tp():
    spec = ModelSpec.preset("llama-3-70b")  # 80 layers, 8 kv heads of 128 (GQA)
    assert kv_cache_bytes_per_token(spec) == 2 * 80 * 8 * 128 * 2
    assert kv_cache_bytes_per_token(spec, tp=8) == 2 * 80 * 1 * 128 * 2
    # t = 16 > 8 kv heads: each GPU still keeps one whole head (duplicated across pairs)
    assert kv_cache_bytes_per_token(spec, tp=16) == 2 * 80 * 1 * 128 * 2
    assert kv_cache_bytes(spec, 8192, 16, tp=8) == 16 * 8192 * 2 * 80 * 128 * 2
    assert kv_cache_bytes_per_token(spec, "fp8") * 2 == kv_cache_bytes_per_token(spec)


def test_mqa():
    spec = ModelSpec(name="mqa", vocab_size=1000, hidden=1024, layers=4, heads=16, kv_heads=1)
    assert kv_cache_bytes_per_token(spec) == 2 * 4 * 1 * 64 * 2


def test_fp16_weights_are_two_bytes_per_param():
    spec = ModelSpec.preset("llama-2-7b")
    assert weight_bytes(spec, "fp16") == 2 * 6_738_415_616
    assert weight_bytes(spec, "fp32") == 4 * 6_738_415_616


def test_int4_group_quantisation_by_hand():
    # Llama-2-7B, int4 with group size 128 and fp16 scale + zero point per group (GPTQ/AWQ):
    # each layer matrix costs n_in*n_out/2 bytes plus 4 bytes per 128 inputs of each row.
    spec = ModelSpec.preset("llama-2-7b")
    h, f, L = 4096, 11008, 32
    mats = [(h, h)] * 4 + [(h, f), (h, f), (f, h)]
    quant = sum(i * o for i, o in mats) * L
    expected = (L * sum(i * o // 2 + o * (i // 128) * 4 for i, o in mats)
                + 2 * (6_738_415_616 - quant))
    assert weight_bytes(spec, "int4") == expected
    # int8 per-channel (one fp16 scale per row), no zero point
    expected8 = L * sum(i * o + o * 2 for i, o in mats) + 2 * (6_738_415_616 - quant)
    assert weight_bytes(spec, "int8", group_size=None) == expected8


@pytest.mark.parametrize("call,msg", [
    (lambda s: kv_cache_bytes_per_token(s, "fp12"), "dtype='fp12'"),
    (lambda s: kv_cache_bytes_per_token(s, tp=3), "tp=3 must divide heads=32"),
    (lambda s: kv_cache_bytes(s, -1), "seq_len=-1"),
    (lambda s: weight_bytes(s, "int3"), "dtype='int3'"),
    (lambda s: weight_bytes(s, "int4", group_size=0), "group_size=0"),
    (lambda s: max_concurrency(s, 0, "h100-sxm"), "seq_len=0"),
    (lambda s: max_concurrency(s, 128, "h100-sxm", utilization=1.5), "utilization=1.5"),
    (lambda s: max_concurrency(s, 128, -5), "gpu=-5"),
    (lambda s: max_concurrency(s, 128, "tpu"), "unknown hardware"),
    (lambda s: simulate_kv_cache([], 16, policy="buddy"), "policy='buddy'"),
    (lambda s: simulate_kv_cache([Request(0, 100, 100)], 4096, "contiguous", max_len=128),
     "exceeds max_len"),
    (lambda s: simulate_kv_cache([Request(0, 100, 100)], 64), "longest request"),
    (lambda s: random_requests(3, prompt=(5, 2)), "prompt"),
])
def test_invalid(call, msg):
    with pytest.raises(ValueError, match=msg):
        call(ModelSpec.preset("llama-2-7b"))


# ---------------------------------------------------------------------------- serving capacity
def test_llama2_7b_on_an_a100_80gb():
    # 81,920 MiB = 85,899,345,920 bytes; 90% = 77,309,411,328. Weights 2 x 6,738,415,616 =
    # 13,476,831,232. KV budget 63,832,580,096; one 4,096-token sequence is 512 KiB x 4096 = 2 GiB:
    # 63,832,580,096 / 2,147,483,648 = 29.7 -> 29 sequences.
    spec = ModelSpec.preset("llama-2-7b")
    assert max_concurrency(spec, 4096, "a100-80gb", utilization=0.9) == 29
    # fp8 KV cache halves the bytes per token: 63,832,580,096 / 2**30 = 59.4 -> 59
    assert max_concurrency(spec, 4096, "a100-80gb", utilization=0.9, kv_dtype="fp8") == 59
    # the same with 2 GiB set aside for prefill activations: 61,685,096,448 / 2 GiB = 28.7 -> 28
    assert max_concurrency(spec, 4096, "a100-80gb", utilization=0.9, reserved=2 * GiB) == 28


def test_llama3_70b_tp8_on_h100_by_hand():
    # Per GPU at t = 8 (h 8192, L 80, a 64, kv 8, d 128, f 28672, V 128256):
    #   q 8192*1024, k and v 8192*128 each, o 1024*8192, MLP 3*8192*3584, two norms 2*8192
    #   = 106,971,136 per layer, x80 = 8,557,690,880; embedding and head 2*16,032*8192 =
    #   262,668,288; final norm 8,192: 8,820,367,360 params -> 17,640,734,720 bytes in fp16.
    spec = ModelSpec.preset("llama-3-70b")
    assert serving_weight_bytes(spec, "fp16", tp=8) == 17_640_734_720
    # H100: 81,559 MiB = 85,520,809,984 bytes; 90% -> 76,968,728,985; minus weights ->
    # 59,327,994,265. KV per token per GPU: 2*80*(8/8)*128*2 = 40,960; x8192 = 335,544,320
    # -> 176.8 -> 176 sequences of 8K tokens per GPU group.
    assert max_concurrency(spec, 8192, "h100-sxm", tp=8, utilization=0.9) == 176
    # the weights alone (131 GiB in fp16) do not fit on one 80 GiB GPU
    assert max_concurrency(spec, 8192, "h100-sxm", tp=1) == 0


def test_sharded_weights_add_up_to_the_whole_plus_replicated_norms():
    # For t <= kv_heads only the norms (2L + 1 vectors of h) are held by every GPU.
    spec = ModelSpec.preset("llama-2-13b")   # V = 32,000 divides by 8
    norms = (2 * spec.layers + 1) * spec.hidden * 2
    for t in (2, 4, 8):
        per_gpu = serving_weight_bytes(spec, "fp16", t)
        assert t * per_gpu == weight_bytes(spec, "fp16") + (t - 1) * norms


def test_serving_weight_bytes_int4_groups_per_shard():
    # int4, group 128, fp16 scale + zero point (4 bytes per group). Llama-2-7B at t = 2: each
    # layer's q, k, v (4096 -> 2048) and gate/up (4096 -> 5504) keep n_in = 4096 (32 groups per
    # row); o (2048 -> 4096) and down (5504 -> 4096) have n_in / 2 (16 and 43 groups per row).
    spec = ModelSpec.preset("llama-2-7b")
    mats = [(4096, 2048)] * 3 + [(2048, 4096)] + [(4096, 5504)] * 2 + [(5504, 4096)]
    quant = 32 * sum(i * o // 2 + o * (-(-i // 128)) * 4 for i, o in mats)
    rest = 2 * (2 * 16000 * 4096 + (2 * 32 + 1) * 4096)   # half the vocab, whole norms
    assert serving_weight_bytes(spec, "int4", tp=2) == quant + rest


# ---------------------------------------------------------------------------- the KV-cache simulator
def test_one_request_paged_and_contiguous():
    # prompt 10, output 5: it holds 11, 12, 13, 14, 15 tokens over five steps.
    r = [Request(0, 10, 5)]
    paged = simulate_kv_cache(r, capacity=64, policy="paged", block_size=16)
    assert paged.stored == (11, 12, 13, 14, 15)
    assert paged.allocated == (16,) * 5          # one 16-token block
    assert paged.utilization == pytest.approx(65 / 80)
    cont = simulate_kv_cache(r, capacity=64, policy="contiguous", max_len=64)
    assert cont.allocated == (64,) * 5
    assert cont.utilization == pytest.approx(65 / 320)
    assert paged.generated == cont.generated == 5


def test_pre_allocation_limits_concurrency():
    # four requests of 5 + 3 tokens at step 0, room for 128 tokens. Contiguous with max_len 64
    # runs two at a time (steps 0-2, then 3-5); paged (16-token blocks) runs all four at once.
    reqs = [Request(0, 5, 3)] * 4
    cont = simulate_kv_cache(reqs, capacity=128, policy="contiguous", max_len=64)
    assert (cont.steps, cont.peak_running, cont.running) == (6, 2, (2, 2, 2, 2, 2, 2))
    paged = simulate_kv_cache(reqs, capacity=128, policy="paged", block_size=16)
    assert (paged.steps, paged.peak_running) == (3, 4)
    assert paged.throughput == pytest.approx(12 / 3) and cont.throughput == pytest.approx(12 / 6)


def test_preemption_of_the_newest_request():
    # Two blocks of 16. Both requests (prompt 15, output 3) hold 16 tokens after step 0: one
    # block each. At step 1 the first needs a second block: the second is preempted and waits.
    # Step 2: the first holds 18 and finishes. Steps 3-4: the second resumes with 17, then 18.
    reqs = [Request(0, 15, 3), Request(0, 15, 3)]
    sim = simulate_kv_cache(reqs, capacity=32, policy="paged", block_size=16)
    assert sim.stored == (32, 17, 18, 17, 18)
    assert sim.allocated == (32,) * 5
    assert (sim.preemptions, sim.generated) == (1, 6)


def test_late_arrival_leaves_empty_steps():
    sim = simulate_kv_cache([Request(3, 4, 2)], capacity=16)
    assert sim.stored == (0, 0, 0, 5, 6)


def test_paged_waste_is_below_one_block_per_request():
    reqs = random_requests(300, seed=3, prompt=(1, 300), output=(1, 300), rate=1.0)
    sim = simulate_kv_cache(reqs, capacity=8192, policy="paged", block_size=16)
    for stored, alloc, n in zip(sim.stored, sim.allocated, sim.running, strict=True):
        assert 0 <= alloc - stored <= 15 * n
    assert sim.generated == sum(r.output for r in reqs)


def test_random_requests_are_reproducible_and_in_range():
    a = random_requests(50, seed=7, prompt=(8, 16), output=(1, 4), rate=0.5)
    assert a == random_requests(50, seed=7, prompt=(8, 16), output=(1, 4), rate=0.5)
    assert all(8 <= r.prompt <= 16 and 1 <= r.output <= 4 for r in a)
    assert [r.arrival for r in a] == sorted(r.arrival for r in a)
    assert all(r.arrival == 0 for r in random_requests(5))


def test_contiguous_reservation_holds_a_request_for_its_whole_life():
    # one request, prompt 100, output 10, pre-allocated 2048 slots for its 10 steps
    sim = simulate_kv_cache([Request(0, 100, 10)], 4096, "contiguous", max_len=2048)
    assert sim.allocated == (2048,) * 10
    assert sim.utilization == pytest.approx(sum(range(101, 111)) / (2048 * 10))


def test_kv_cache_bytes_unchanged_reference():
    # the per-sequence bytes max_concurrency divides by (TOPICS row 20: 512 KiB per token)
    assert kv_cache_bytes(ModelSpec.preset("llama-2-7b"), 4096) == 2 * GiB


# ---------------------------------------------------------------------------- parallel layouts
# Llama-2-7B by hand: a layer is 4·4096² (attention) + 3·4096·11008 (SwiGLU MLP) + 2·4096 (norms)
# = 202,383,360 parameters; embedding and untied LM head 32,000·4096 = 131,072,000 each; final
# norm 4096; in all 6,738,415,616.
L7_LAYER, L7_VOCAB, L7_ALL = 202_383_360, 131_072_000, 6_738_415_616


def test_serving_layout_tp_pp_dp_by_hand():
    spec = ModelSpec.preset("llama-2-7b")
    budget = int(81_559 * 2**20 * 0.9)  # H100: 81,559 MiB, 90% usable
    one = serving_layout(spec, "h100-sxm")
    assert one["weights"] == 2 * L7_ALL and one["kv_per_token"] == 524_288
    assert one["kv_tokens"] == (budget - 2 * L7_ALL) // 524_288
    # p = 2: 16 layers + embedding, 16 layers + LM head + final norm; half the layers' cache
    two = serving_layout(spec, "h100-sxm", pp=2)
    first, last = 16 * L7_LAYER + L7_VOCAB, 16 * L7_LAYER + L7_VOCAB + 4096
    assert two["weights"] == 2 * last and two["kv_per_token"] == 2 * 16 * 32 * 128 * 2
    assert two["kv_tokens"] == (budget - 2 * last) // 262_144
    assert 2 * first < 2 * last
    # replicas divide nothing and multiply the cache
    four = serving_layout(spec, "h100-sxm", dp=4)
    assert four["weights"] == one["weights"] and four["kv_tokens"] == 4 * one["kv_tokens"]
    assert four["gpus"] == 4


def test_serving_layout_cp_and_ep():
    spec = ModelSpec.preset("llama-2-7b")
    one = serving_layout(spec, "h100-sxm")
    assert serving_layout(spec, "h100-sxm", cp=4)["kv_tokens"] == 4 * one["kv_tokens"]
    mix = ModelSpec.preset("mixtral-8x7b")  # 32 layers, 8 kv heads of 128: 128 KiB per token
    ep = serving_layout(mix, "h100-sxm", ep=8)
    assert ep["kv_per_token"] == 2 * 32 * 8 * 128 * 2  # every kv head: attention is not split
    tp = serving_layout(mix, "h100-sxm", tp=8)
    assert tp["kv_per_token"] == 2 * 32 * 1 * 128 * 2 and tp["weights"] < ep["weights"]
    with pytest.raises(ValueError, match="ep=2 needs a mixture-of-experts"):
        serving_layout(spec, ep=2)
    with pytest.raises(ValueError, match="pp = ep = 1"):
        serving_layout(spec, pp=2, weight_dtype="int4")
    with pytest.raises(ValueError, match="pp=33"):
        serving_layout(spec, pp=33)


def test_decode_step_comm_by_hand():
    spec = ModelSpec.preset("llama-2-7b")
    # TP: 2 all-reduces per layer of 2 sequences x 4096 x 2 bytes = 16,384 bytes; a ring
    # all-reduce over 4 ranks sends 2·3·16,384/4 = 24,576 bytes per rank
    assert decode_step_comm(spec, 4, batch=2)["bytes"] == 64 * 24_576
    assert decode_step_comm(spec, 4, batch=2, scheme="pp")["bytes"] == 16_384
    # ZeRO-3 over 2 ranks: every 16-bit weight is gathered, each rank sends its half: Ψ bytes
    assert decode_step_comm(spec, 2, scheme="zero3")["bytes"] == L7_ALL
    assert decode_step_comm(spec, 1, scheme="zero3") == {"bytes": 0, "seconds": 0.0}
    z3, tp = (decode_step_comm(spec, 8, 8, s) for s in ("zero3", "tp"))
    assert z3["bytes"] > 1000 * tp["bytes"] and z3["seconds"] > tp["seconds"]
    with pytest.raises(ValueError, match="scheme"):
        decode_step_comm(spec, 8, scheme="fsdp")


def test_prefill_workspace_by_hand():
    spec = ModelSpec.preset("llama-2-7b")
    # T = 1024: residual + normed copy 2·1024·4096; attention 1024·(2·4096 + 2·4096) = 16.8M is
    # smaller than the SwiGLU MLP's gate, up and product, 3·1024·11008 = 33.8M; 2 bytes each;
    # plus one sequence's fp32 logits, 4·32,000
    assert prefill_workspace_bytes(spec, 1024) == 2 * (2 * 1024 * 4096 + 3 * 1024 * 11008) \
        + 4 * 32_000
    assert prefill_workspace_bytes(spec, 1024, tp=4, sequences=1) == 2 * (
        2 * 1024 * 4096 + 3 * 1024 * 11008 // 4) + 4 * 32_000


def test_prefill_workspace_moe_by_hand():
    """vLLM's fused MoE keeps three caches of every routed copy: T·k·2f/t (gate/up), T·k·f/t
    (their product) and T·k·h (the down projection's output): Mixtral, T = 1,024, k = 2, t = 2."""
    mix = ModelSpec.preset("mixtral-8x7b")
    routed = 1024 * 2 * (3 * 14336 // 2 + 4096)
    assert prefill_workspace_bytes(mix, 1024, tp=2, sequences=0) == 2 * (2 * 1024 * 4096 + routed)
