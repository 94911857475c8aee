"""Fine-tuning's activation memory (issue 31) against the real libraries, measured on CPU.

One decoder layer of a tiny Transformers 5.23 model (parmem.distributed.engine_runs.HF_TINY:
h = 64, query heads x head_dim = 96, key/value heads x head_dim = 48, f = 80, expert f = 40;
s = 24, b = 3) is trained

* with PEFT 0.21.2 LoRA (``get_peft_model``, ranks 4/8/16, targets all-linear, q+v and others,
  ``lora_dropout`` 0 and 0.1, bf16 and fp32, SDPA and eager, adapters fp32 as PEFT's default
  ``autocast_adapter_dtype=True`` makes them, or 16-bit), on Llama, Mistral, Qwen2, Qwen3,
  Granite, Mixtral and Qwen3-MoE;
* with QLoRA: the frozen projections bitsandbytes 0.50.2 ``Linear4bit`` (NF4), which runs
  forward and backward on CPU;
* with torchao 0.18 float8 training (``Float8Linear``, which runs on CPU);
* under ``torch.autograd.graph.save_on_cpu(pin_memory=True)``, every host copy counted.

The bytes kept for backward are counted by storage (parmem.measure.SavedTensorsMeter,
parameters excluded; the layer is the second of two unless said, so that its input requires
grad); each must equal parmem.finetune_acts's prediction on device "cpu" to the byte, plus the
``hf`` profile's ``stage`` table (the rotary cos and sin every layer keeps). The lead's four
measurements (issue 31, /tmp/probe_lora_act.py: Llama tiny, one layer, bf16, SDPA, r = 8) are
re-measured here: full 165,312; LoRA all-linear 257,184; LoRA q_proj,v_proj 139,680; LoRA
all-linear with dropout 0.1 344,736.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from parmem import ModelSpec  # noqa: E402
from parmem.activations import layer_terms  # noqa: E402
from parmem.distributed.engine_runs import hf_spec  # noqa: E402
from parmem.distributed.finetune_runs import offload_layer, peft_layer  # noqa: E402
from parmem.finetune_acts import (  # noqa: E402
    fp8_layer_bytes,
    fp8_layer_terms,
    fp8_weight_cache_bytes,
    lora_layer_bytes,
    lora_layer_terms,
    lora_projections,
    offload_host_bytes,
    offload_pcie_seconds,
)

S, B = 24, 3
T = S * B
QV = ("q_proj", "v_proj")
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def _act(dtype):
    return 2 if dtype == "bf16" else 4


def _hf(spec, act, attn="sdpa", place="layer"):
    """The ``hf`` profile's full-training bytes of one table on device cpu."""
    terms = layer_terms(
        spec, S, B, flash=attn == "sdpa", dropout=False, act_bytes=act, engine="hf", device="cpu",
        place=place,
    )  # fmt: skip
    return sum(t.bytes for t in terms)


def _lora(family="llama", dtype="bf16", attn="sdpa", rank=8, targets="all-linear", dropout=0.0,
          layer=1, layers=2, mode="lora", adapter_fp32=True):  # fmt: skip
    """(measured, predicted) for one LoRA/QLoRA case."""
    r = peft_layer(family, dtype, attn, mode, rank, targets, dropout, layer, layers, S, B,
                   adapter_fp32=adapter_fp32)  # fmt: skip
    spec = hf_spec(family, attn, layers)
    act = _act(dtype)
    pred = lora_layer_bytes(
        spec, S, B, rank, targets, dropout > 0, act, "cpu", attn == "sdpa",
        "4bit" if mode == "qlora" else "16bit", adapter_itemsize=4 if adapter_fp32 else act,
        input_grad=layer > 0,
    )  # fmt: skip
    return r, pred + _hf(spec, act, attn, "stage")


# ------------------------------------------------------------------ the lead's four numbers
@pytest.mark.parametrize(
    "mode, targets, dropout, lead",
    [
        ("full", "all-linear", 0.0, 165_312),
        ("lora", "all-linear", 0.0, 257_184),
        ("lora", QV, 0.0, 139_680),
        ("lora", "all-linear", 0.1, 344_736),
    ],
)
def test_lead_measurements_are_reproduced(mode, targets, dropout, lead):
    """Llama tiny, one layer (its input needs no grad: the embedding is frozen), bf16, SDPA."""
    if mode == "full":
        r = peft_layer("llama", "bf16", "sdpa", "full", layer=0, layers=1)
        spec = hf_spec("llama", "sdpa", 1)
        pred = _hf(spec, 2) + _hf(spec, 2, place="stage")
    else:
        r, pred = _lora(targets=targets, dropout=dropout, layer=0, layers=1)
    assert r["measured"] == lead
    assert pred == lead


# ------------------------------------------------------------------ LoRA, measured
LORA_CASES = [
    dict(),
    dict(dtype="fp32"),
    dict(dropout=0.1),
    dict(dtype="fp32", dropout=0.1),
    dict(targets=QV),
    dict(targets=QV, rank=16, dropout=0.1),
    dict(rank=4, attn="eager"),
    dict(dtype="fp32", attn="eager"),
    dict(attn="eager", dropout=0.1, targets=("o_proj", "down_proj")),
    dict(adapter_fp32=False),
    dict(adapter_fp32=False, attn="eager", targets=("k_proj", "o_proj", "up_proj")),
    dict(adapter_fp32=False, dropout=0.1),
    dict(family="qwen3", rank=4),
    dict(family="qwen3", dtype="fp32", targets=QV, dropout=0.1),
    dict(family="qwen3", targets=QV, layer=0, layers=1),
    dict(family="qwen3", rank=16, attn="eager", dtype="fp32"),
    dict(family="mistral", targets=("q_proj", "k_proj", "down_proj")),
    dict(family="qwen2", rank=16),
    dict(family="granite", dtype="fp32", targets=("o_proj", "up_proj")),
    dict(family="mixtral", targets=QV),
    dict(family="mixtral", targets=ATTN, dropout=0.1, rank=4),
    dict(family="mixtral", targets=ATTN, dtype="fp32", layer=0, layers=1),
    dict(family="qwen3_moe", targets=ATTN),
    dict(family="qwen3_moe", targets=QV, dtype="fp32", dropout=0.1, rank=16),
    dict(layer=0, layers=1, dtype="fp32", dropout=0.1),
    dict(layer=0, layers=1, targets=("q_proj",), rank=4),
]


@pytest.mark.parametrize(
    "case", LORA_CASES, ids=lambda c: "-".join(map(str, c.values())) or "llama"
)
def test_lora_layer_keeps_exactly_what_finetune_acts_predicts(case):
    r, pred = _lora(**case)
    assert r["measured"] == pred, (r["measured"], pred, r["records"])
    spec = hf_spec(case.get("family", "llama"))
    wanted = {f"{'self_attn' if m in ATTN else 'mlp'}.{m}" for m in lora_projections(
        spec, case.get("targets", "all-linear"))}  # fmt: skip
    assert set(r["modules"]) == wanted


def test_parmem_lora_presets_name_the_same_projections():
    for family in ("llama", "mixtral"):
        spec = hf_spec(family)
        for preset, names in (("attention", ATTN), ("qv", QV)):
            a = lora_layer_bytes(spec, S, B, 8, preset, True, 2)
            assert a == lora_layer_bytes(spec, S, B, 8, list(names), True, 2)


def test_lora_tensors_are_the_ones_peft_code_names():
    """bf16 Llama, all-linear, r = 8: PEFT casts x to the fp32 adapters' dtype once per target
    (q, k, v: three (72, 64) copies, not one), and lora_B keeps seven (72, 8) fp32 outputs;
    the 16-bit inputs the frozen projections would keep are gone (no bf16 (72, 64) tensor)."""
    r = peft_layer("llama", "bf16")
    recs = [(dt, shape) for _, dt, shape in r["records"]]
    assert recs.count(("torch.float32", (T, 8))) == 7
    assert recs.count(("torch.float32", (T, 64))) == 5  # q, k, v, gate, up
    assert ("torch.bfloat16", (T, 64)) not in recs


def test_lora_on_frozen_weights_can_keep_more_than_full_training():
    """The lead's observation, measured: fp32 copies per target outweigh the dropped inputs."""
    full = peft_layer("llama", "bf16", mode="full")["measured"]
    lora = peft_layer("llama", "bf16")["measured"]
    qv = peft_layer("llama", "bf16", targets=QV)["measured"]
    assert qv < full < lora


# ------------------------------------------------------------------ QLoRA
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("targets", ["all-linear", QV])
def test_qlora_keeps_what_16bit_lora_keeps(dtype, targets):
    """bitsandbytes' MatMul4Bit keeps its packed weight in ctx.tensors, no activation."""
    pytest.importorskip("bitsandbytes")
    r, pred = _lora(dtype=dtype, targets=targets, mode="qlora")
    assert "Linear4bit" in r["kinds"]
    assert r["measured"] == pred
    assert r["measured"] == peft_layer("llama", dtype, targets=targets)["measured"]


# ------------------------------------------------------------------ FP8 (torchao)
@pytest.mark.parametrize("family, dtype", [("llama", "bf16"), ("qwen3", "bf16"),
                                           ("mixtral", "bf16"), ("llama", "fp32")])  # fmt: skip
def test_torchao_float8_keeps_the_hf_table(family, dtype):
    pytest.importorskip("torchao")
    r = peft_layer(family, dtype, mode="fp8")
    assert "Float8Linear" in r["kinds"]
    spec = hf_spec(family)
    act = _act(dtype)
    pred = fp8_layer_bytes(spec, S, B, "torchao", act, "cpu") + _hf(spec, act, place="stage")
    assert r["measured"] == pred
    assert r["measured"] == peft_layer(family, dtype, mode="full")["measured"]
    assert fp8_weight_cache_bytes(spec, "torchao") == 0


# ------------------------------------------------------------------ offload (save_on_cpu)
OFFLOAD_CASES = [
    dict(),
    dict(dtype="fp32"),
    dict(family="qwen3"),
    dict(family="qwen2"),
    dict(family="mixtral"),
    dict(mode="lora"),
    dict(mode="lora", targets=QV, dropout=0.1),
    dict(mode="lora", dtype="fp32"),
    dict(mode="lora", adapter_fp32=False, targets=("o_proj", "gate_proj", "down_proj")),
    dict(mode="qlora"),
    dict(family="qwen3_moe", mode="lora", targets=QV),
]


@pytest.mark.parametrize(
    "case", OFFLOAD_CASES, ids=lambda c: "-".join(map(str, c.values())) or "llama"
)
def test_save_on_cpu_copies_exactly_what_finetune_acts_predicts(case):
    mode = case.get("mode", "full")
    if mode == "qlora":
        pytest.importorskip("bitsandbytes")
    r = offload_layer(**case)
    spec = hf_spec(case.get("family", "llama"))
    act = _act(case.get("dtype", "bf16"))
    pred = offload_host_bytes(
        spec, S, B, act, "cpu", mode="full" if mode == "full" else "lora",
        targets=case.get("targets", "all-linear"), dropout=case.get("dropout", 0) > 0,
        adapter_itemsize=4 if case.get("adapter_fp32", True) else act,
        base="4bit" if mode == "qlora" else "16bit",
    )  # fmt: skip
    assert r["host_bytes"] == pred, (r["host_bytes"], pred, r["packs"])
    # the host copies exceed the storages kept (copies per saving op, parameters)
    assert r["param_bytes"] > 0


def test_offload_pcie_seconds_is_two_copies():
    assert offload_pcie_seconds(10**9, 25e9) == 2 * 10**9 / 25e9
    with pytest.raises(ValueError, match="pcie_bytes_per_s"):
        offload_pcie_seconds(1, 0)
    with pytest.raises(ValueError, match="nbytes"):
        offload_pcie_seconds(-1, 1e9)


# ------------------------------------------------------------------ CUDA and TE (not measured)
def test_cuda_differs_from_cpu_by_the_dropout_masks_only():
    """[devices.cuda]: native_dropout's mask is bool (1 byte); on CPU the (fp32) input dtype."""
    spec = hf_spec("llama")
    for drop in (False, True):
        cpu = lora_layer_bytes(spec, S, B, 8, "all-linear", drop, 2, "cpu")
        cuda = lora_layer_bytes(spec, S, B, 8, "all-linear", drop, 2, "cuda")
        widths = 64 * 3 + 96 + 64 * 2 + 80  # q, k, v | o | gate, up | down inputs
        assert cpu - cuda == (T * widths * 3 if drop else 0)


def test_te_fp8_from_its_source():
    """Not measured (TE has no CPU build): the arithmetic of TE's documented storage on Llama-2-7B's
    published shapes (h 4096, f 11008, 32 layers): Hopper fp8 weight + transpose, fp32 scale."""
    spec = ModelSpec.preset("llama-2-7b")
    per_layer = 2 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 7 * 4
    assert fp8_weight_cache_bytes(spec, "te") == 32 * per_layer
    cached = fp8_layer_bytes(spec, 4096, 1, "te", weight_cache=True)
    assert fp8_layer_bytes(spec, 4096, 1, "te") - cached == per_layer
    names = [t.name for t in fp8_layer_terms(spec, 4096, 1, "te")]
    assert "qkv input" not in names and "q_proj fp8 input (transpose)" in names
    with pytest.raises(ValueError, match="device='cuda'"):
        fp8_layer_bytes(spec, 4096, 1, "te", device="cpu")
    with pytest.raises(ValueError, match="mixture of experts"):
        fp8_weight_cache_bytes(ModelSpec.preset("mixtral-8x7b"), "te")


# ------------------------------------------------------------------ refusals
def test_moe_all_linear_is_refused_because_peft_wraps_the_experts():
    r = peft_layer("mixtral", "bf16", targets="all-linear")
    assert "mlp.experts" in r["modules"]  # PEFT 0.21.2's ParamWrapper on the fused experts
    with pytest.raises(ValueError, match="ParamWrapper"):
        lora_layer_bytes(hf_spec("mixtral"), S, B, 8, "all-linear", False, 2)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(rank=0), "rank"),
        (dict(dropout=1), "dropout"),
        (dict(act_itemsize=3), "act_itemsize"),
        (dict(act_itemsize=4, adapter_itemsize=2), "adapter_itemsize"),
        (dict(device="tpu"), "device"),
        (dict(base="8bit"), "base"),
        (dict(targets=5), "targets"),
        (dict(targets=("lm_head",)), "lm_head"),
        (dict(input_grad=False, targets=("v_proj",)), "input_grad=False"),
        (dict(input_grad=False, flash=False), "input_grad=False"),
    ],
)
def test_bad_lora_input_is_refused_by_name(kw, match):
    args = dict(rank=8, targets="all-linear", dropout=False, act_itemsize=2)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        lora_layer_terms(hf_spec("llama"), S, B, **args)


@pytest.mark.parametrize("family", ["gpt2", "gemma", "qwen2_moe", "llama+dropout"])
def test_unmeasured_layers_are_refused(family):
    spec = hf_spec(family, "eager")  # eager: the +dropout case keeps its attention dropout
    with pytest.raises(ValueError):
        lora_layer_bytes(spec, S, B, 8, "qv", False, 2)
    with pytest.raises(ValueError):
        offload_host_bytes(spec, S, B, 2)
