"""Fine-tuning setups in the estimator, the planner, the CLI and the pages (issue 31).

Expected values are computed here by hand from published shapes and the libraries' documented
layouts, never from parmem's output:

* PEFT's trainable count for Llama-2-7B, r = 16 on every linear layer but the head: per layer
  r·(in + out) over q, k, v, o (4096 x 4096) and gate, up (4096 -> 11008), down (11008 -> 4096),
  Hu et al. 2022 §4.1; 39,976,960 (what PEFT prints for this model, also checked against PEFT on
  the meta device in tests/test_lora_counts.py);
* the frozen weights keep no gradient and no optimizer state; PEFT makes the adapters fp32
  (``autocast_adapter_dtype=True``, peft/tuners/tuners_utils.py), so they cost 4 (weight) + 4
  (gradient) + 8 (torch AdamW's two fp32 moments) bytes each;
* bitsandbytes' NF4 with double quantisation (functional.py ``quantize_4bit``, ``QuantState``):
  per weight of n values, n/2 packed bytes, one uint8 absmax per 64 values, one fp32 absmax per
  256 blocks, a 4-byte offset, a 256-entry fp32 code for the nested absmax and a 16-entry fp32
  code (Dettmers et al. 2023 §3: 4 + 8/64 + 32/(64·256) = 4.127 bits per parameter);
* DDP (Accelerate: ``gradient_as_bucket_view=False``) reduces the trainable gradients only, and
  its buckets hold a second copy of them.
"""

from __future__ import annotations

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.config import ADAPTERS
from parmem.flops import flops_per_sequence, lora_flops_per_sequence, step_flops

LLAMA = ModelSpec.preset("llama-2-7b")
H, F, L, V = 4096, 11008, 32, 32000
PSI = 6_738_415_616  # Llama-2-7B's parameters (Touvron et al. 2023)


def lora_count(r: int) -> int:
    return L * r * (4 * (H + H) + 2 * (H + F) + (F + H))


def nf4_dq(n: int) -> int:
    blocks = -(-n // 64)
    return -(-n // 2) + blocks + 4 * -(-blocks // 256) + 4 + 256 * 4 + 16 * 4


def hf(seq: int = 2048, **kw) -> TrainingSetup:
    return TrainingSetup(seq_len=seq, engine="hf", precision="bf16", **kw)


def test_lora_count_is_peft_s_published_one():
    assert lora_count(16) == 39_976_960


@pytest.mark.parametrize("r", [8, 16, 64])
def test_lora_model_states_are_frozen_16_bit_weights_and_fp32_adapters(r):
    st = estimate(LLAMA, ParallelConfig(), hf(adapter="lora", lora_rank=r)).stages[0]
    n = lora_count(r)
    assert st.num_params == PSI + n
    assert (st.params, st.grads, st.optimizer) == (2 * PSI + 4 * n, 4 * n, 8 * n)


def test_qlora_weights_are_bitsandbytes_nf4_with_16_bit_ends():
    st = estimate(LLAMA, ParallelConfig(), hf(adapter="qlora")).stages[0]
    linear = L * (4 * nf4_dq(H * H) + 3 * nf4_dq(H * F))
    kept = 2 * (2 * V * H + (2 * L + 1) * H)  # embedding, head, the norms: bf16
    assert st.params == linear + kept + 4 * lora_count(16)


def test_8_bit_adapter_states_are_bitsandbytes_blockwise():
    """AdamW8bit: tensors of 4,096 values or more keep two uint8 moments and an fp32 absmax per
    256 values (optim/optimizer.py, Optimizer2State), plus two 256-entry fp32 maps; smaller ones
    two fp32 moments. r = 16: every lora_A (16 x 4096 or 16 x 11008) and lora_B is 8-bit."""
    st = estimate(LLAMA, ParallelConfig(), hf(adapter="lora", optimizer="adam-8bit")).stages[0]
    sizes = [16 * H] * 8 + [16 * H, 16 * F] * 2 + [16 * F, 16 * H]  # q k v o, gate up, down
    per_layer = sum(2 * n + 8 * -(-n // 256) for n in sizes)
    assert st.optimizer == L * per_layer + 2 * 4 * 256


def test_ddp_copies_and_reduces_the_adapter_gradients_only():
    st = estimate(LLAMA, ParallelConfig(dp=4), hf(adapter="lora")).stages[0]
    assert st.comm_buffers == st.grads == 4 * lora_count(16)


def test_lora_on_all_linear_layers_keeps_more_than_full_fine_tuning_and_qv_less():
    """PEFT's fp32 adapters each keep an fp32 copy of their layer's input (measured in
    tests/test_finetune_acts.py); on q and v only, the frozen projections' inputs are dropped."""
    full = estimate(LLAMA, ParallelConfig(), hf()).stages[0].activations
    lora = estimate(LLAMA, ParallelConfig(), hf(adapter="lora")).stages[0].activations
    qv = estimate(LLAMA, ParallelConfig(), hf(adapter="lora", lora_targets="qv")).stages[0]
    assert qv.activations < full < lora


def test_checkpointing_keeps_the_layer_inputs_under_adapters_too():
    rc = estimate(LLAMA, ParallelConfig(), hf(adapter="qlora", recompute="full")).stages[0]
    plain = estimate(LLAMA, ParallelConfig(), hf(adapter="qlora")).stages[0]
    assert rc.activations < plain.activations / 10
    assert rc.activations >= L * 2 * 2048 * H  # the bf16 input of every layer


def test_offloaded_activations_go_to_the_host():
    on = estimate(LLAMA, ParallelConfig(), hf(adapter="lora", offload_activations=True)).stages[0]
    off = estimate(LLAMA, ParallelConfig(), hf(adapter="lora")).stages[0]
    assert on.host > off.activations > on.activations and off.host == 0
    assert any("on the host" in n for n in on.notes)


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(adapter="lora", engine="megatron-core"), "adapter"),
        (dict(adapter="lora", engine="hf", precision="bf16-mixed"), "precision"),
        (dict(adapter="lora", engine="hf", precision="bf16", flash_attention=False), "adapter"),
        (dict(adapter="dora"), "adapter"),
        (dict(adapter="lora", engine="hf", precision="bf16", lora_rank=0), "lora_rank"),
        (dict(adapter="lora", engine="hf", precision="bf16", lora_targets="mlp"), "lora_targets"),
        (dict(adapter="qlora", engine="hf", precision="bf16", base_quant="int4"), "base_quant"),
        (dict(optimizer="paged-adamw", engine="hf", precision="bf16"), "optimizer"),
        (dict(offload_activations=True), "offload_activations"),
        (dict(offload_activations=True, engine="hf", recompute="full"), "offload_activations"),
    ],
)
def test_bad_fine_tuning_setups_are_refused_by_name(kw, field):
    with pytest.raises(ValueError, match=field):
        TrainingSetup(seq_len=512, **kw)


def test_what_is_not_modelled_is_refused():
    with pytest.raises(ValueError, match="ParamWrapper"):  # PEFT's wrapped experts
        estimate(ModelSpec.preset("mixtral-8x7b"), ParallelConfig(), hf(adapter="lora"))
    with pytest.raises(ValueError, match="optimizer='lion'"):
        estimate(LLAMA, ParallelConfig(), hf(adapter="lora", optimizer="lion"))
    with pytest.raises(ValueError, match="layernorm. is not modelled"):  # GPT-2, unmeasured
        estimate(ModelSpec.preset("gpt2"), ParallelConfig(), hf(seq=512, adapter="lora"))


def test_frozen_weights_cost_one_forward_in_backward():
    """Per sequence: forward L·layer + head + adapters; backward the input gradients of every
    matmul (L·(layer − core) + head), the attention core twice, the adapters twice."""
    layer, core, head = flops_per_sequence(LLAMA, 2048)
    a = lora_flops_per_sequence(LLAMA, 2048, 16, "all-linear")
    assert a == 2 * 2048 * lora_count(16)
    expected = (L * layer + head + a) + (L * (layer - core) + head + 2 * L * core + 2 * a)
    assert step_flops(LLAMA, 1, 2048, "none", a) == expected
    assert step_flops(LLAMA, 1, 2048, "none", a) < step_flops(LLAMA, 1, 2048, "none")


def test_the_planner_plans_fine_tuning_with_the_hf_profile():
    from parmem.planner import Cluster, plan

    c = Cluster("a100-40gb", 8, 1)
    p = plan(LLAMA, c, 64, 2048, engine="hf", precision="bf16", adapter="qlora", top=2)
    full = plan(LLAMA, c, 64, 2048, engine="hf", precision="bf16", top=2)
    assert p.best is not None and full.best is None
    assert p.best.setup.adapter == "qlora" and p.best.estimate.stages[0].grads == 4 * lora_count(16)


def test_the_cli_and_the_calculator_take_the_fields():
    from parmem.book.web import calculate
    from parmem.cli import main

    assert main(["estimate", "--model", "llama-2-7b", "--seq", "1024", "--engine", "hf",
                 "--precision", "bf16", "--adapter", "qlora", "--lora-rank", "64", "--json"]) == 0
    assert main(["estimate", "--model", "llama-2-7b", "--seq", "1024", "--adapter", "lora"]) == 2
    out = calculate({"model": "llama-2-7b", "engine": "hf", "precision": "bf16",
                     "adapter": "lora", "r": "8"})
    assert out["ok"] and out["stages"][0]["grads"] == 4 * lora_count(8)
    bad = calculate({"model": "llama-2-7b", "adapter": "lora"})
    assert not bad["ok"] and "adapter" in bad["errors"]
    assert set(ADAPTERS) == {"none", "lora", "qlora"}


def test_fp8_leaves_the_model_states_and_torchao_keeps_what_bf16_keeps():
    """torchao's Float8Linear saves the 16-bit input and the weight, as nn.Linear does (measured
    on CPU in tests/test_finetune_acts.py); Transformer Engine's te.Linear keeps a 1-byte fp8
    copy of each projection's input instead of the shared 16-bit one, and, without a weight
    cache, a fresh fp8 weight and its transpose (2 bytes per weight) per micro-batch (TE's
    source). FP8 changes no weight, gradient or optimizer byte (Micikevicius et al. 2022 §4)."""
    spec = ModelSpec.preset("llama-3-8b")
    base, ao, te = (estimate(spec, ParallelConfig(), hf(8192, fp8=r)).stages[0]
                    for r in ("none", "torchao", "te"))
    assert base.total == ao.total and base.activations == ao.activations
    assert (te.params, te.grads, te.optimizer) == (base.params, base.grads, base.optimizer)
    h, kv, f, s = 4096, 1024, 14336, 8192
    weights = h * h + 2 * h * kv + h * h + 3 * h * f  # q, k, v, o, gate, up, down
    # per layer TE drops the bf16 qkv and fc1 inputs (2sh each) and a quarter of the f-wide
    # MLP tensors (the down projection's 16-bit input, 2sf), and adds fp8 inputs: q, k, v each
    # their own (3sh), o (s·q), gate and up (2sh), down (sf), each with a 4-byte scale, and the
    # fp8 weights with their transposes (2 per weight) and 4-byte scales
    added = 3 * s * h + s * h + 2 * s * h + s * f + 7 * 4 + 2 * weights + 7 * 4
    dropped = 2 * s * h + 2 * s * h + 2 * s * f
    assert te.activations - base.activations == 32 * (added - dropped)
    with pytest.raises(ValueError, match="fp8"):
        TrainingSetup(seq_len=512, engine="hf", precision="bf16", fp8="te", adapter="lora")
    with pytest.raises(ValueError, match="fp8"):
        TrainingSetup(seq_len=512, fp8="torchao")


def test_galore_keeps_projected_moments_and_projections():
    """galore_torch 1.0 GaLoreAdamW, rank r, Llama-2-7B in bf16 (moments in the gradients'
    dtype): each attention projection (4096 x 4096) keeps a projection of r x 4096 and moments
    of 4096 x r; gate and up (11008 x 4096, m >= n) the same shapes; down (4096 x 11008, m < n)
    a projection of 4096 x r and moments of r x 11008; the norms (two of 4096 per layer), the
    embedding, the LM head and the final norm two full moments (galore_projector.py)."""
    r = 1024
    st = estimate(LLAMA, ParallelConfig(),
                  hf(optimizer="galore-adamw", galore_rank=r)).stages[0]  # fmt: skip
    proj = 4 * (r * H + 2 * H * r) + 2 * (r * H + 2 * F * r) + (H * r + 2 * r * F)
    other = 2 * 2 * H
    ends = 2 * (2 * V * H + H)
    assert st.optimizer == 2 * (L * (proj + other) + ends)
    assert (st.params, st.grads) == (2 * PSI, 2 * PSI)
    with pytest.raises(ValueError, match="galore-adamw"):
        TrainingSetup(seq_len=512, optimizer="galore-adamw")
    with pytest.raises(ValueError, match="galore_rank"):
        TrainingSetup(seq_len=512, engine="hf", optimizer="galore-adamw", galore_rank=0)
