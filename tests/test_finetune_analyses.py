"""parmem.finetune_analyses (chapter 23) and its explorer.

Expected values are hand arithmetic from published shapes, not parmem's output:

* Llama-2-7B and -70B, Llama-3-8B: the config.json of each Hugging Face checkpoint
  (``meta-llama/Llama-2-7b-hf``: hidden 4096, intermediate 11008, 32 layers, 32 heads, vocabulary
  32000; ``Llama-2-70b-hf``: 8192, 28672, 80 layers, 64 heads, 8 key/value heads; ``Meta-Llama-3-8B``:
  4096, 14336, 32 layers, 8 key/value heads, vocabulary 128256; head_dim 128 throughout);
* LoRA's r·(in + out) per adapted weight (Hu et al. 2022, §4.1; PEFT's lora_A and lora_B);
* bitsandbytes 0.50.2's 4-bit storage (``functional.py`` ``quantize_4bit``): two codes a byte,
  a uint8 absmax per block of 64 with an fp32 offset, an fp32 absmax per 256 blocks, the
  16-entry fp32 code and the 256-entry fp32 nested code; ``Optimizer2State.init_state``: two
  uint8 states and two fp32 absmax per 256 elements, two shared 256-entry maps, fp32 states for
  32-bit optimizers, paged for tensors of at least 10**5 elements;
* torch AdamW's moments in the parameters' dtype (``torch/optim/adamw.py``: ``zeros_like(p)``);
* GaLore's projector (galore_torch 1.0 ``galore_projector.py``, ``std``: right projection when
  rows >= cols) on every nn.Linear inside ``self_attn``/``mlp`` (GaLore's ``torchrun_main.py``);
* FLOPs: 2 per multiply-add per token, the backward of a frozen matmul one forward's work;
* PCIe Gen5 x16: 64 GB/s per direction (NVIDIA H100 datasheet, 128 GB/s both ways).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from parmem import ModelSpec, ParallelConfig, estimate
from parmem.finetune_analyses import (
    adapter_optimizer_rows,
    crossover_dp,
    finetune_setup,
    fp8_rows,
    full_rank_state_rows,
    linear_input_bytes,
    longest_seq,
    method_rows,
    offload_row,
    paged_state_bytes,
    quantized_vs_sharded,
    resident_peak,
    trainable_params,
)
from parmem.quant import galore_state_total

L7, H7, F7, V7 = 32, 4096, 11008, 32000
L70, H70, F70, KV70 = 80, 8192, 28672, 1024
L8, H8, F8, KV8, V8 = 32, 4096, 14336, 1024, 128256
S7 = ModelSpec.preset("llama-2-7b")


def _weights7() -> list[int]:
    """The seven projections of one Llama-2-7B layer (elements)."""
    return [H7 * H7] * 4 + [H7 * F7] * 3


def _psi7() -> int:
    return 2 * V7 * H7 + L7 * (sum(_weights7()) + 2 * H7) + H7


def _nf4(n: int) -> int:
    blocks = math.ceil(n / 64)
    return n // 2 + 16 * 4 + blocks + 4 + 4 * math.ceil(blocks / 256) + 256 * 4


def _lora7(r: int) -> int:
    """r·(in + out) over the seven projections of 32 layers."""
    return L7 * r * (4 * (H7 + H7) + 3 * (H7 + F7))


def test_trainable_counts_by_hand():
    assert _psi7() == 6_738_415_616  # the published 6.74B
    assert trainable_params(S7, finetune_setup("full", 2048)) == _psi7()
    assert trainable_params(S7, finetune_setup("lora", 2048, rank=16)) == _lora7(16) == 39_976_960


def test_method_rows_states_by_hand():
    rows = {(r["method"], r["recompute"]): r for r in method_rows(S7, 2048)}
    psi, n = _psi7(), _lora7(16)
    full = rows["full", "none"]
    assert (full["weights"], full["gradients"], full["optimizer"]) == (2 * psi, 2 * psi, 4 * psi)
    lora = rows["lora", "none"]
    assert (lora["weights"], lora["gradients"], lora["optimizer"]) == (2 * psi + 4 * n, 4 * n,
                                                                       8 * n)
    kept16 = 2 * (2 * V7 * H7 + L7 * 2 * H7 + H7)  # embedding, LM head, norms in bf16
    nf4 = L7 * sum(_nf4(w) for w in _weights7()) + kept16
    assert rows["qlora", "full"]["weights"] == nf4 + 4 * n
    # fp32 adapters on every linear layer keep an fp32 copy of each input: more than full
    # training's bf16 inputs; q and v alone keep less (the frozen weights' inputs go)
    assert lora["activations"] > full["activations"]
    qv = method_rows(S7, 2048, methods=("lora",), recomputes=("none",), targets="qv")[0]
    assert qv["activations"] < full["activations"]
    assert rows["lora", "full"]["activations"] < lora["activations"] / 10


def test_paged_states_and_the_resident_peak():
    r = 64
    n = _lora7(r)
    paged = finetune_setup("qlora", 2048, recompute="full", rank=r, optimizer="paged-adamw")
    assert paged_state_bytes(S7, paged) == 8 * n  # every adapter tensor >= 10**5 elements
    eight = finetune_setup("qlora", 2048, recompute="full", rank=r, optimizer="paged-adam-8bit")
    assert paged_state_bytes(S7, eight) == 2 * n
    assert paged_state_bytes(S7, finetune_setup("qlora", 2048, rank=r)) == 0
    total = estimate(S7, ParallelConfig(), paged).peak_bytes
    assert resident_peak(S7, paged) == total - 8 * n
    plain = finetune_setup("qlora", 2048, rank=r)
    assert resident_peak(S7, plain) == estimate(S7, ParallelConfig(), plain).peak_bytes
    rows = {x["optimizer"]: x for x in adapter_optimizer_rows(S7, paged)}
    assert rows["adamw"]["states"] == rows["paged-adamw"]["states"] == 8 * n
    assert rows["adamw"]["paged"] == 0 and rows["paged-adamw"]["paged"] == 8 * n
    # AdamW8bit: a byte per moment, two fp32 absmax per 256 elements (every adapter tensor,
    # r x 4096, 4096 x r or r x 11008, is a whole number of blocks of 256), two shared maps
    assert rows["adam-8bit"]["states"] == 2 * n + 8 * (n // 256) + 2048
    with pytest.raises(ValueError, match="adapter"):
        adapter_optimizer_rows(S7, finetune_setup("full", 2048))


def test_longest_seq_is_the_boundary():
    setup = finetune_setup("lora", 512, recompute="full")
    cap = 16 * 10**9
    s = longest_seq(S7, setup, cap)
    par = ParallelConfig()

    def peak(n):
        return estimate(S7, par, replace(setup, seq_len=n)).peak_bytes

    assert s > 0 and peak(s) <= cap < peak(s + 1)
    assert longest_seq(S7, setup, 2 * _psi7() - 1) == 0  # not even the frozen weights
    paged = finetune_setup("qlora", 512, recompute="full", rank=64, optimizer="paged-adamw")
    assert longest_seq(S7, paged, 6 * 2**30, paged_out=True) > longest_seq(S7, paged, 6 * 2**30)


def test_galore_and_full_rank_states_by_hand():
    r = 1024
    # right projection (rows >= cols): P r x cols, moments rows x r; left: P rows x r, r x cols
    qkvo = 4 * (r * H7 + 2 * H7 * r)
    gate_up = 2 * (r * H7 + 2 * F7 * r)  # (11008, 4096): right
    down = H7 * r + 2 * r * F7  # (4096, 11008): left
    layer = qkvo + gate_up + down + 2 * 2 * H7  # the two norms: two full moments
    outer = 2 * (2 * V7 * H7 + H7)  # embedding, LM head, final norm
    assert galore_state_total(S7, r, itemsize=2) == 2 * (L7 * layer + outer)
    rows = {x["optimizer"]: x["states"] for x in full_rank_state_rows(S7, (r,))}
    psi = _psi7()
    assert rows["AdamW"] == 4 * psi  # two bf16 moments
    assert rows["AdamW 8-bit"] == 2 * psi + 8 * (psi // 256) + 2048  # every tensor >= 4096
    assert rows[f"GaLore r={r}"] == galore_state_total(S7, r)
    with pytest.raises(ValueError, match="mixture of experts"):
        galore_state_total(ModelSpec.preset("mixtral-8x7b"), 128)


def test_fp8_rows_by_hand():
    spec, s = ModelSpec.preset("llama-3-8b"), 8192
    w = 2 * H8 * H8 + 2 * H8 * KV8 + 3 * H8 * F8  # one layer's projections
    psi = 2 * V8 * H8 + L8 * (w + 2 * H8) + H8
    rows = {r["recipe"]: r for r in fp8_rows(spec, s)}
    base = rows["bf16, no FP8"]
    assert base["states"] == 8 * psi
    assert rows["torchao float8 (measured)"] == {**base, "recipe": "torchao float8 (measured)"}
    # TE: the bf16 qkv, fc1 and down-projection inputs (2sh + 2sh + 2sf) give way to seven
    # fp8 copies (q, k, v, o, gate, up: s·h each; down: s·f) and seven fp32 scales
    saved = (4 * s * H8 + 2 * s * F8) - (6 * s * H8 + s * F8 + 7 * 4)
    cached = rows["Transformer Engine, cached fp8 weights (source)"]
    assert cached["activations"] == base["activations"] - L8 * saved
    assert cached["fp8 weights"] == L8 * (2 * w + 7 * 4)
    fresh = rows["Transformer Engine (source)"]
    assert fresh["activations"] == base["activations"] - L8 * saved + L8 * (2 * w + 7 * 4)
    assert linear_input_bytes(spec, s) == L8 * (3 * 2 * s * H8 + 2 * s * F8)


def test_offload_row_by_hand():
    s, r = 4096, 16
    setup = finetune_setup("lora", s, rank=r)
    mfu = 0.5
    row = offload_row(S7, setup, "h100-sxm", mfu)
    assert row["pcie_s"] == 2 * row["host"] / 64e9
    w = sum(_weights7())
    core = 4 * s * s * H7
    layer = 2 * s * w + core
    head = 2 * s * H7 * V7
    a = 2 * s * _lora7(r)
    fwd = L7 * layer + head + a
    bwd = L7 * (layer - core) + head + 2 * L7 * core + 2 * a  # frozen: input gradients only
    rate = 989e12 * mfu
    assert row["compute_s"] == pytest.approx((fwd + bwd) / rate, rel=1e-12)
    assert row["recompute_s"] == pytest.approx((L7 * layer + a) / rate, rel=1e-12)
    assert row["offloaded"] < row["kept"] and row["host"] > 0
    with pytest.raises(ValueError, match="recompute"):
        offload_row(S7, finetune_setup("lora", s, recompute="full"), "h100-sxm", mfu)


def test_quantized_copy_against_sharded_weights_by_hand():
    spec = ModelSpec.preset("llama-2-70b")
    per_layer = [H70 * H70] * 2 + [H70 * KV70] * 2 + [H70 * F70] * 3
    psi = 2 * V7 * H70 + L70 * (sum(per_layer) + 2 * H70) + H70
    assert psi == 68_976_648_192  # the published 69.0B
    w4 = L70 * sum(_nf4(n) for n in per_layer) + 2 * (2 * V7 * H70 + L70 * 2 * H70 + H70)
    assert quantized_vs_sharded(spec, 8) == {"lora_sharded": math.ceil(2 * psi / 8),
                                             "qlora_whole": w4}
    d = crossover_dp(spec)
    assert math.ceil(2 * psi / d) < w4 <= math.ceil(2 * psi / (d - 1))
    assert d == 4


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="method"):
        finetune_setup("dora", 2048)
    with pytest.raises(ValueError, match="optimizer"):
        finetune_setup("full", 2048, optimizer="paged-adamw")
    with pytest.raises(ValueError, match="capacity"):
        longest_seq(S7, finetune_setup("lora", 512), 0)
    with pytest.raises(ValueError, match="mfu"):
        offload_row(S7, finetune_setup("lora", 512), "h100-sxm", 0)


def test_explore_finetune_draws_every_option_from_its_defaults():
    """From the defaults, each control moved alone through every option draws a figure (no
    invalid combination along any control), and the calculator link carries the setup."""
    pytest.importorskip("ipywidgets")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parmem.book.widgets import explore_finetune

    box = explore_finetune()
    values = {k: c.value for k, c in box._controls.items()}
    for name, control in box._controls.items():
        for option in control.options:
            value = option[1] if isinstance(option, tuple) else option
            fig = box._render(**{**values, name: value})
            assert hasattr(fig, "savefig"), (name, value, fig)
            plt.close(fig)
    html = box.children[-1].value
    assert "engine=hf" in html and "adapter=lora" in html and "precision=bf16" in html
