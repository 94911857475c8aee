"""Megatron-Core's recorded runs (data/engine_runs/megatron-core.json, written by
``scripts/record_engine_runs.py --engine megatron-core`` from
:mod:`parmem.distributed.runs_megatron_core`) held against numbers derived by hand from the tiny
shapes, so that a wrong record cannot pass because it was recorded. No engine runs here.

Shapes (``ARCHS``): V = 256, h = 64, L = 2, a = 4 query heads, 2 key/value heads, head_dim 24
(query width 96, key/value width 48), f = 80; MoE: E = 4 experts, top-2, expert f = 40;
s = 32, b = 2, so T = s·b = 64 tokens per rank; bf16 weights and activations.
"""

from __future__ import annotations

import copy

import pytest

from parmem.engine_records import DIFFERENCES, compare_record, load_records

V, H, L, A, KV, HD, F, E, K, EF, S, B = 256, 64, 2, 4, 2, 24, 80, 4, 2, 40, 32, 2
T = S * B

CASES = (
    "llama-dp2",
    "llama-dp2-distopt",
    "llama-tp2",
    "mixtral-ep2",
    "mixtral-ep2-distopt",
    "qwen3-moe-ep2",
)


def _records() -> dict[tuple[str, int], dict]:
    return {(r["case"], r["rank"]): r for r in load_records() if r["engine"] == "megatron-core"}


RECS = _records()
pytestmark = pytest.mark.skipif(not RECS, reason="data/engine_runs/megatron-core.json absent")


# ---------------------------------------------------------------------------- parameters
def _dense_layer(tp: int = 1) -> int:
    # two RMSNorm weights (h each, on every TP rank), fused QKV h x (a + 2 kv) head_dim, output
    # projection a head_dim x h, fused fc1 h x 2f, fc2 f x h: the matrices split over t
    return 2 * H + (H * (A + 2 * KV) * HD + A * HD * H + H * 2 * F + F * H) // tp


def _moe_layer(ep: int, qk_norm: bool = False) -> tuple[int, int]:
    # (dense, expert) per layer: norms, attention, the router E x h; E/ep local experts of
    # h x 2 ef + ef x h; q/k RMSNorm weights of head_dim each
    dense = 2 * H + H * (A + 2 * KV) * HD + A * HD * H + E * H + (2 * HD if qk_norm else 0)
    return dense, E // ep * (H * 2 * EF + EF * H)


LLAMA = 2 * V * H + L * _dense_layer() + H  # embedding, output layer (untied), final norm
assert LLAMA == 100672
LLAMA_TP2 = 2 * V * H // 2 + L * _dense_layer(2) + H
assert LLAMA_TP2 == 50496
MIX_DENSE = 2 * V * H + L * _moe_layer(2)[0] + H
MIX_EXPERT = L * _moe_layer(2)[1]
assert (MIX_DENSE, MIX_EXPERT) == (70464, 30720)
QWEN_DENSE = 2 * V * H + L * _moe_layer(2, True)[0] + H
assert QWEN_DENSE == 70560

LOCAL = {
    "llama-dp2": LLAMA,
    "llama-dp2-distopt": LLAMA,
    "llama-tp2": LLAMA_TP2,
    "mixtral-ep2": MIX_DENSE + MIX_EXPERT,
    "mixtral-ep2-distopt": MIX_DENSE + MIX_EXPERT,
    "qwen3-moe-ep2": QWEN_DENSE + MIX_EXPERT,
}
# parameter tensors: embedding and output, the final norm, per layer 2 norms + qkv + proj and
# fc1 + fc2 (dense) or the router + 2 local experts x 2 (MoE), + 2 q/k norms (Qwen3-MoE)
TENSORS = {"llama": 3 + L * 6, "mixtral": 3 + L * 9, "qwen3-moe": 3 + L * 11}
ARCH = {c: "qwen3-moe" if c.startswith("qwen3") else c.split("-")[0] for c in CASES}


def test_every_case_ran_on_both_ranks_with_megatron_core_0_16_1():
    assert {(c, r) for c in CASES for r in (0, 1)} <= set(RECS)
    for rec in RECS.values():
        assert rec["versions"]["megatron-core"] == "0.16.1"
        assert rec["world_size"] == 2 and rec["setup"]["engine"] == "megatron-core"
        assert rec["setup"]["flash_attention"] is False  # the local spec's DotProductAttention
        assert rec["facts"]["step_ok"] is True  # the optimizer step ran (no skipped update)


@pytest.mark.parametrize("case", CASES)
def test_the_engine_built_the_hand_counted_parameters(case):
    for rank in (0, 1):
        f = RECS[case, rank]["facts"]
        assert f["num_params"] == f["local_params"] == LOCAL[case]
        assert f["model_param_tensors"] == TENSORS[ARCH[case]]
        # Float16Module cast the fp32 RMSNorm weights WrappedTorchNorm built to bf16
        assert f["built_param_dtypes"] == ["torch.bfloat16", "torch.float32"]
        assert f["param_dtypes"] == ["torch.bfloat16"]


@pytest.mark.parametrize("case", [c for c in CASES if "distopt" not in c])
def test_megatron_states_are_2_4_12_bytes_per_parameter(case):
    """bf16 weights, fp32 main_grad buffer, fp32 master + two fp32 AdamW moments (and AdamW's
    0-d fp32 step per tensor) on every rank: 2 + 4 + 12 bytes per local parameter."""
    for rank in (0, 1):
        rec = RECS[case, rank]
        n, m = LOCAL[case], rec["facts"]["model_param_tensors"]
        assert rec["measured"]["params"] == 2 * n
        assert rec["measured"]["grads"] == 4 * n
        assert rec["measured"]["optimizer"] == 12 * n + 4 * m
        assert rec["facts"]["param_tensors"] == m


# ---------------------------------------------------------------------------- distributed optimizer
def test_llama_distributed_optimizer_pads_and_splits_the_buffer_by_hand():
    """Every numel is a multiple of 64, so no parameter is shifted; 100672 is padded to the next
    multiple of lcm(2, 128): 100736. Placed in reverse order (output 16384, final norm 64, then
    layer 1's fc2 5120, fc1 10240, MLP norm 64, QKV 12288, projection 6144, attention norm 64)
    they end at 50368 = 100736 / 2: rank 0 holds those 8 tensors whole, rank 1 the other 7
    (50304 elements)."""
    assert 100736 % 128 == 0 and 100736 - 128 < LLAMA <= 100736
    assert 16384 + 64 + 5120 + 10240 + 64 + 12288 + 6144 + 64 == 100736 // 2 == 50368
    for rank, (elems, tensors) in enumerate(((50368, 8), (LLAMA - 50368, 7))):
        rec = RECS["llama-dp2-distopt", rank]
        assert rec["facts"]["buffers"][0]["numel"] == 100736
        assert rec["measured"]["params"] == 2 * 100736  # the param_data buffer, padding included
        assert rec["measured"]["grads"] == 4 * 100736
        assert rec["facts"]["master_elements"] == elems
        assert rec["facts"]["param_tensors"] == tensors
        assert rec["measured"]["optimizer"] == 12 * elems + 4 * tensors
        # the named differences from the same layout
        assert DIFFERENCES["megatron-distopt-param-padding"].bytes(rec) == 2 * 64
        assert DIFFERENCES["megatron-distopt-grad-padding"].bytes(rec) == 4 * 64
        half = -(-LLAMA // 2)
        assert DIFFERENCES["megatron-distopt-shard-split"].bytes(rec) == 12 * (elems - half)


def test_mixtral_distributed_optimizer_shards_only_the_dense_buffer():
    """EP = 2 on 2 ranks leaves an expert data-parallel group of 1: the experts' buffer (30720 =
    240 x 128, unpadded) is whole on each rank; the dense 70464 is padded to 70528 and split at
    35264 = output 16384 + final norm 64 + layer 1's router 256, MLP norm 64, QKV 12288,
    projection 6144 and attention norm 64 (7 tensors); rank 1 holds 35200 in 6."""
    assert 16384 + 64 + 256 + 64 + 12288 + 6144 + 64 == 70528 // 2
    for rank, (dense, tensors) in enumerate(((35264, 7), (MIX_DENSE - 35264, 6))):
        rec = RECS["mixtral-ep2-distopt", rank]
        assert [b["numel"] for b in rec["facts"]["buffers"]] == [70528, MIX_EXPERT]
        assert rec["measured"]["params"] == 2 * (70528 + MIX_EXPERT)
        assert rec["facts"]["master_elements"] == dense + MIX_EXPERT
        assert rec["facts"]["param_tensors"] == tensors + 8  # + the 8 local expert matrices
        assert rec["measured"]["optimizer"] == 12 * (dense + MIX_EXPERT) + 4 * (tensors + 8)


# ---------------------------------------------------------------------------- saved tensors
# one dense Llama layer on CPU, per storage (T = 64 tokens):
_NORM_CPU = 4 * T * H + 4 * T + 4 * T * H  # nn.RMSNorm composite: fp32 input, rstd, normalised
_ATTN = (
    _NORM_CPU  # attention norm
    + 2 * T * H  # its bf16 output, the QKV input
    + 4 * 2 * S * HD  # RoPE cos and sin for Q and K, (s, 1, 1, head_dim) bf16
    + 2 * T * A * HD  # Q
    + 2 * 2 * T * A * HD  # K and V repeated to the 4 query heads
    + S * S  # bool causal mask (unfused softmax)
    + 4 * B * A * S * S  # fp32 probabilities (unfused softmax)
    + 2 * B * A * S * S  # bf16 probabilities, kept by the bmm with V
    + 2 * T * A * HD  # the projection's input
    + _NORM_CPU  # MLP norm
    + 2 * T * H  # its output
)
LLAMA_LAYER = _ATTN + 2 * T * 2 * F + 2 * T * F  # fused SwiGLU input (2f) and fc2 input (f)
assert LLAMA_LAYER == 218624
# the same layer as the profile counts it on a GPU: bf16 norm inputs and fp32 rstd, no fp32
# copies, no fp32 probabilities, no mask
LLAMA_LAYER_CUDA = LLAMA_LAYER - 2 * (4 * T * H + 4 * T * H - 2 * T * H) - (S * S + 4 * B * A * S * S)
LOSS = 4 * T * V + T + 8 * T  # fp32 softmax of the logits, bool target mask, int64 target ids


def test_llama_saved_tensors_by_region_by_hand():
    for rank in (0, 1):
        rec = RECS["llama-dp2", rank]
        by = rec["facts"]["saved_by_region"]
        assert by == {"embedding": 8 * T, "layer0": LLAMA_LAYER, "layer1": LLAMA_LAYER,
                      "final": _NORM_CPU, "head": 2 * T * H, "loss": LOSS}
        assert rec["measured"]["saved"] == sum(by.values())
        assert rec["measured"]["activations"] == sum(by.values()) - 4 * T * V


def test_the_profile_layer_table_is_the_measured_layer_less_the_cpu_artefacts():
    """The megatron-core table (flash_attention=False: the local spec) on CUDA, hand-derived:
    the measured layer less the CPU composite RMSNorm and the unfused softmax's fp32 copy and
    mask; and those two named differences are exactly that, per layer."""
    from parmem.activations import layer_terms
    from parmem.distributed.runs_megatron_core import model_spec

    spec = model_spec("llama")
    got = sum(x.bytes for x in layer_terms(spec, S, B, flash=False, act_bytes=2,
                                           engine="megatron-core", place="layer"))
    assert got == LLAMA_LAYER_CUDA == 135680
    rec = RECS["llama-dp2", 0]
    rms = T * H * ((4 - 2) + 4)  # per norm: fp32 input instead of bf16, + fp32 normalised
    assert DIFFERENCES["cpu-rmsnorm"].bytes(rec) == (2 * L + 1) * rms
    assert DIFFERENCES["megatron-cpu-unfused-softmax"].bytes(rec) == L * (4 * B * A * S * S + S * S)
    assert DIFFERENCES["megatron-ce-target-mask"].bytes(rec) == T


def test_tensor_parallel_layer_halves_the_heads_and_the_mlp():
    """TP = 2 without sequence parallelism: norms and their outputs whole, Q, K, V, the scores,
    the projection input and the MLP on 2 of 4 heads and f/2; the embedding keeps a bool mask of
    the ids outside its vocabulary half; the loss softmax covers V/2."""
    layer = (2 * _NORM_CPU + 2 * 2 * T * H + 4 * 2 * S * HD + 2 * T * A // 2 * HD * 4
             + S * S + 4 * B * A // 2 * S * S + 2 * B * A // 2 * S * S
             + 2 * T * 2 * F // 2 + 2 * T * F // 2)
    assert layer == 154112
    for rank in (0, 1):
        rec = RECS["llama-tp2", rank]
        assert rec["facts"]["saved_by_region"] == {
            "embedding": 8 * T + T, "layer0": layer, "layer1": layer, "final": _NORM_CPU,
            "head": 2 * T * H, "loss": 4 * T * V // 2 + T + 8 * T}
        assert DIFFERENCES["megatron-vocab-parallel-input-mask"].bytes(rec) == T
        assert DIFFERENCES["megatron-cpu-unfused-softmax"].bytes(rec) == L * (
            4 * B * A // 2 * S * S + S * S)


# MoE layer: the dense MLP's 2·T·(2f + f) replaced by the router's int64 top-k ids (8Tk) and
# fp32 top-k softmax (4Tk), the dispatcher's bool routing map and bf16 routing probabilities
# (T·E each, as E/ep local experts x T·ep gathered tokens), and per (token, expert) pair R this
# rank's experts receive: the int64 sorted index (8), the dispatched input (2h), the fused
# weighted SwiGLU input and fc2 input (2·3·ef) and the permuted probability (2)
MOE_FIXED = _ATTN + 8 * T * K + 4 * T * K + T * E + 2 * T * E
PER_PAIR = 8 + 2 * H + 2 * 3 * EF + 2
assert (MOE_FIXED, PER_PAIR) == (187904 + 2304, 378)
QK_NORM_CPU = (4 * T * A * HD * 2 + 4 * T * A) + (4 * T * KV * HD * 2 + 4 * T * KV)


@pytest.mark.parametrize("case,extra", [("mixtral-ep2", 0), ("mixtral-ep2-distopt", 0),
                                        ("qwen3-moe-ep2", QK_NORM_CPU)])
def test_moe_layers_keep_what_their_routed_tokens_need(case, extra):
    routed = [RECS[case, r]["facts"]["routed_tokens"] for r in (0, 1)]
    for layer in range(L):
        # every token goes to k experts, on one rank or the other
        assert routed[0][layer] + routed[1][layer] == 2 * T * K
    for rank in (0, 1):
        rec = RECS[case, rank]
        by = rec["facts"]["saved_by_region"]
        for layer in range(L):
            r = routed[rank][layer]
            assert by[f"layer{layer}"] == MOE_FIXED + extra + PER_PAIR * r
        assert DIFFERENCES["megatron-moe-routed-tokens"].bytes(rec) == PER_PAIR * sum(
            r - T * K for r in routed[rank])


def test_the_profile_moe_terms_equal_the_balanced_measurement():
    """The megatron-core MoE terms at balanced routing (R = T·k) equal the measured layer's MoE
    part: no expert outputs (the weighted SwiGLU applies the probabilities), the routing
    probabilities kept by masked_select."""
    from parmem.activations import layer_terms
    from parmem.distributed.runs_megatron_core import model_spec

    names = {"router top-k indices", "router top-k probabilities", "routing map (transposed)",
             "routing probabilities (transposed)", "sorted token indices", "expert inputs",
             "expert hidden", "permuted probabilities"}
    terms = layer_terms(model_spec("mixtral"), S, B, flash=False, act_bytes=2,
                        engine="megatron-core", place="layer")
    assert sum(x.bytes for x in terms if x.name in names) == (MOE_FIXED - _ATTN) + PER_PAIR * T * K
    assert not {x.name for x in terms} - names - {
        x.name for x in layer_terms(model_spec("llama"), S, B, flash=False, act_bytes=2,
                                    engine="megatron-core", place="layer")}


# ---------------------------------------------------------------------------- the comparison
@pytest.mark.parametrize("case", CASES)
def test_every_row_is_the_estimate_plus_named_differences(case):
    for rank in (0, 1):
        rows = compare_record(RECS[case, rank])
        assert {r.category for r in rows} == {"params", "grads", "optimizer", "saved",
                                              "activations"}
        assert all(r.equal for r in rows), [r for r in rows if not r.equal]


def test_a_record_with_other_routing_or_layout_fails():
    rec = copy.deepcopy(RECS["mixtral-ep2", 0])
    rec["facts"]["routed_tokens"][0] += 1
    bad = {r.category for r in compare_record(rec) if not r.equal}
    assert bad == {"saved", "activations"}
    rec = copy.deepcopy(RECS["llama-dp2-distopt", 1])
    rec["facts"]["dp_rank"] = 0  # rank 0's shard is 64 elements larger
    bad = {r.category for r in compare_record(rec) if not r.equal}
    assert bad == {"optimizer"}
