"""Fine-tuning on one card (chapter 23): full fine-tuning, LoRA and QLoRA side by side, the
optimizers an adapter or a full-rank model can use, FP8 and activation offload. Each function is
a short walk over :func:`parmem.estimate` (the ``hf`` profile: the Transformers 5.23 Trainer,
PEFT 0.21.2, bitsandbytes 0.50.2) and the fine-tuning modules :mod:`parmem.lora`,
:mod:`parmem.quant` and :mod:`parmem.finetune_acts`, whose docstrings name the library code
each byte follows; what is added here is said in each docstring.

* :func:`finetune_setup`, :func:`method_rows`: one job as full fine-tuning, LoRA and QLoRA;
* :func:`paged_state_bytes`, :func:`resident_peak`, :func:`longest_seq`: what a paged optimizer
  can leave on the host, and the longest sequence that fits a card;
* :func:`adapter_optimizer_rows`, :func:`full_rank_state_rows`: the
  optimizers of adapters, and of full-rank training (AdamW, 8-bit AdamW, GaLore);
* :func:`fp8_rows`, :func:`linear_input_bytes`: what FP8 training changes in a step;
* :func:`offload_row`: activation offload against recomputation, bytes and seconds;
* :func:`quantized_vs_sharded`, :func:`crossover_dp`: a 4-bit copy on every GPU against 16-bit
  weights sharded d ways.

Bytes are ints; each function returns plain data that a table or a figure of
:mod:`parmem.book` shows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ._check import MAX_SEQ_LEN, cdiv, choice, instance, integer, number
from .activations import layer_terms
from .config import ADAPTER_OPTIMIZERS as BNB_NAMES
from .config import PAGED_OPTIMIZERS, ParallelConfig, TrainingSetup
from .estimate import adapter_tensors, estimate
from .finetune_acts import fp8_layer_bytes, fp8_weight_cache_bytes, offload_pcie_seconds
from .flops import lora_flops_per_sequence, step_flops
from .hardware import Hardware, hardware_preset
from .layout import layout
from .lora import lora_params
from .model import ModelSpec
from .quant import (
    bnb_optimizer_state_bytes,
    bnb_paged_state_bytes,
    galore_groups,
    galore_state_total,
    model_weight_bytes,
)

__all__ = [
    "METHODS",
    "ADAPTER_OPTIMIZERS",
    "finetune_setup",
    "trainable_params",
    "method_rows",
    "paged_state_bytes",
    "resident_peak",
    "longest_seq",
    "adapter_optimizer_rows",
    "full_rank_state_rows",
    "fp8_rows",
    "linear_input_bytes",
    "offload_row",
    "quantized_vs_sharded",
    "crossover_dp",
]

#: full fine-tuning (every weight trained), LoRA on 16-bit weights, LoRA on 4-bit weights
METHODS = ("full", "lora", "qlora")
#: the optimizers the chapter compares for adapters (:data:`parmem.config.ADAPTER_OPTIMIZERS`
#: without its ``adam`` alias): torch AdamW, bitsandbytes' AdamW8bit, PagedAdamW (32-bit) and
#: PagedAdamW8bit
ADAPTER_OPTIMIZERS = tuple(n for n in BNB_NAMES if n != "adam")


# ---------------------------------------------------------------------------- the methods
def finetune_setup(
    method: str,
    seq_len: int,
    micro_batch: int = 1,
    *,
    recompute: str = "none",
    rank: int = 16,
    targets: str = "all-linear",
    optimizer: str = "adamw",
    offload: bool = False,
    dropout: bool = False,
) -> TrainingSetup:
    """The :class:`~parmem.config.TrainingSetup` of one fine-tuning ``method`` (:data:`METHODS`)
    as the Transformers Trainer runs it on a bf16 checkpoint (``engine="hf"``,
    ``precision="bf16"``, SDPA): ``"full"`` trains every weight (bf16 weights, gradients and
    AdamW moments), ``"lora"``/``"qlora"`` train PEFT adapters of ``rank`` on ``targets`` over
    frozen 16-bit or NF4 weights. ``recompute="full"`` is gradient checkpointing; ``offload``
    is ``save_on_cpu`` around each layer. TrainingSetup checks every field."""
    choice("method", method, METHODS)
    return TrainingSetup(
        seq_len=seq_len,
        micro_batch=micro_batch,
        engine="hf",
        precision="bf16",
        recompute=recompute,
        optimizer=optimizer,
        adapter="none" if method == "full" else method,
        lora_rank=rank,
        lora_targets=targets,
        lora_dropout=dropout,
        offload_activations=offload,
    )


def trainable_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Parameters the setup trains: all of them without an adapter, else PEFT's count
    (:func:`parmem.lora.lora_params`)."""
    instance("setup", setup, TrainingSetup, "TrainingSetup(seq_len=...)")
    if setup.adapter == "none":
        instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")
        return spec.num_params()
    return lora_params(spec, setup.lora_rank, setup.lora_targets)


def method_rows(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int = 1,
    *,
    methods: tuple[str, ...] = METHODS,
    recomputes: tuple[str, ...] = ("none", "full"),
    rank: int = 16,
    targets: str = "all-linear",
    dp: int = 1,
) -> list[dict[str, Any]]:
    """One row per method and recomputation: the peak GPU of :func:`parmem.estimate` on
    ``ParallelConfig(dp=dp)`` with :func:`finetune_setup` (AdamW), as ``method``,
    ``recompute``, ``trainable`` (:func:`trainable_params`), the byte fields ``weights`` (as
    stored: 16-bit, or NF4 with its quantisation state, plus fp32 adapters), ``gradients``,
    ``optimizer``, ``activations`` (logits included), ``buffers`` and ``total``, and the
    ``estimate``."""
    rows = []
    for method in methods:
        for rec in recomputes:
            setup = finetune_setup(method, seq_len, micro_batch, recompute=rec, rank=rank,
                                   targets=targets)  # fmt: skip
            est = estimate(spec, ParallelConfig(dp=dp), setup)
            st = est.peak
            rows.append(
                {
                    "method": method,
                    "recompute": rec,
                    "trainable": trainable_params(spec, setup),
                    "weights": st.params,
                    "gradients": st.grads,
                    "optimizer": st.optimizer,
                    "activations": st.activations + st.logits,
                    "buffers": st.comm_buffers,
                    "total": st.total,
                    "estimate": est,
                }
            )
    return rows


# ---------------------------------------------------------------------------- paged states
def _adapter_numels(spec: ModelSpec, setup: TrainingSetup, dp: int) -> list[int]:
    lay = layout(spec, ParallelConfig(dp=dp), setup)
    return [n for st in lay.stages for n in adapter_tensors(lay, st)]


def paged_state_bytes(spec: ModelSpec, setup: TrainingSetup, dp: int = 1) -> int:
    """The adapters' optimizer-state bytes a paged optimizer keeps in CUDA unified memory
    (:func:`parmem.quant.bnb_paged_state_bytes`, bitsandbytes 0.50.2 ``get_state_buffer``):
    allocated on the GPU, and the bytes the driver may move to the host when the GPU runs out.
    0 for an optimizer that is not paged or a setup without adapters."""
    return _paged(spec, setup, dp)[0]


def _paged(spec: ModelSpec, setup: TrainingSetup, dp: int) -> tuple[int, int]:
    """(every paged state byte, the paged states of the largest adapter tensor)."""
    instance("setup", setup, TrainingSetup, "TrainingSetup(seq_len=...)")
    if setup.adapter == "none" or setup.optimizer not in PAGED_OPTIMIZERS:
        return 0, 0
    numels = _adapter_numels(spec, setup, integer("dp", dp))
    if not numels:
        return 0, 0
    optim = BNB_NAMES[setup.optimizer]
    return bnb_paged_state_bytes(numels, optim), bnb_paged_state_bytes([max(numels)], optim)


def resident_peak(spec: ModelSpec, setup: TrainingSetup, dp: int = 1) -> int:
    """The GPU's peak when the driver has moved the paged optimizer states
    (:func:`paged_state_bytes`) to the host: the larger of the estimate's peak less those bytes
    (forward and backward), and the optimizer step with the activations freed, which brings
    back one tensor's states at a time (bitsandbytes 0.50.2 ``optim/optimizer.py``
    ``Optimizer8bit.step``: ``prefetch_state(p)`` just before ``update_step`` of each
    parameter): weights, gradients, the states that are not paged, the largest tensor's paged
    states and the buffers. Equal to the estimate without a paged optimizer."""
    st = estimate(spec, ParallelConfig(dp=integer("dp", dp)), setup).peak
    paged, largest = _paged(spec, setup, dp)
    step = st.params + st.grads + st.optimizer - paged + largest + st.comm_buffers
    return max(st.total - paged, step)


def longest_seq(
    spec: ModelSpec,
    setup: TrainingSetup,
    capacity: int,
    *,
    paged_out: bool = False,
    dp: int = 1,
) -> int:
    """The longest sequence (tokens) whose step fits ``capacity`` bytes: the estimate's peak
    (or :func:`resident_peak` when ``paged_out``) at most ``capacity``, at ``setup``'s
    micro-batch (its ``seq_len`` is ignored); 0 when one token does not fit. Doubling, then
    bisection: the answer fits and one token more does not. This judges the estimate alone
    against the card; :func:`parmem.fit.max_seq_len` applies the book's stricter rule."""
    instance("setup", setup, TrainingSetup, "TrainingSetup(seq_len=...)")
    cap = integer("capacity", capacity)
    par = ParallelConfig(dp=integer("dp", dp))

    def need(s: int) -> int:
        run = replace(setup, seq_len=s)
        return resident_peak(spec, run, dp) if paged_out else estimate(spec, par, run).peak_bytes

    if need(1) > cap:
        return 0
    lo, hi = 1, 2
    while hi <= MAX_SEQ_LEN and need(hi) <= cap:
        lo, hi = hi, 2 * hi
    if hi > MAX_SEQ_LEN:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= cap else (lo, mid)
    return lo


# ---------------------------------------------------------------------------- optimizers
def adapter_optimizer_rows(
    spec: ModelSpec,
    setup: TrainingSetup,
    optimizers: tuple[str, ...] = ADAPTER_OPTIMIZERS,
    dp: int = 1,
) -> list[dict[str, Any]]:
    """``setup`` (an adapter setup) with each optimizer of ``optimizers``: ``optimizer``,
    ``states`` (the estimate's optimizer bytes: bitsandbytes' tensors as
    :func:`parmem.quant.bnb_optimizer_state_bytes` counts them, torch AdamW's two fp32
    moments), ``paged`` (:func:`paged_state_bytes`), ``total`` (the estimate's peak) and
    ``resident`` (:func:`resident_peak`)."""
    instance("setup", setup, TrainingSetup, "TrainingSetup(seq_len=...)")
    if setup.adapter == "none":
        raise ValueError("setup.adapter='none': adapter optimizers need adapter 'lora' or 'qlora'")
    rows = []
    for name in optimizers:
        choice("optimizers", name, ADAPTER_OPTIMIZERS)
        run = replace(setup, optimizer=name)
        st = estimate(spec, ParallelConfig(dp=integer("dp", dp)), run).peak
        rows.append({"optimizer": name, "states": st.optimizer,
                     "paged": paged_state_bytes(spec, run, dp), "total": st.total,
                     "resident": resident_peak(spec, run, dp)})  # fmt: skip
    return rows


def full_rank_state_rows(
    spec: ModelSpec, galore_ranks: tuple[int, ...] = (256, 1024), itemsize: int = 2
) -> list[dict[str, Any]]:
    """Optimizer states for training every weight of ``spec`` whose parameters and gradients
    have ``itemsize`` bytes: torch AdamW (two moments in the parameters' dtype,
    ``torch/optim/adamw.py`` ``_init_group``: ``zeros_like(p)``), bitsandbytes' AdamW8bit over
    every tensor (:func:`parmem.quant.bnb_optimizer_state_bytes`) and GaLore at each rank of
    ``galore_ranks`` (:func:`parmem.quant.galore_state_total`). Rows: ``optimizer``, ``states``,
    ``of AdamW`` (the fraction)."""
    size = choice("itemsize", integer("itemsize", itemsize), (2, 4))
    shapes, other, outer = galore_groups(spec)
    numels = [r * c for r, c in shapes] * spec.layers + other * spec.layers + outer
    adamw = 2 * size * sum(numels)
    rows = [("AdamW", adamw), ("AdamW 8-bit", bnb_optimizer_state_bytes(numels, "adamw8bit"))]
    rows += [(f"GaLore r={r}", galore_state_total(spec, r, itemsize=size)) for r in galore_ranks]
    return [{"optimizer": n, "states": b, "of AdamW": b / adamw} for n, b in rows]


# ---------------------------------------------------------------------------- FP8
def _hf_layer(spec: ModelSpec, seq_len: int, micro_batch: int) -> list[Any]:
    return layer_terms(spec, seq_len, micro_batch, flash=True, dropout=False, act_bytes=2,
                       engine="hf")  # fmt: skip


def linear_input_bytes(spec: ModelSpec, seq_len: int, micro_batch: int = 1) -> int:
    """The 16-bit inputs the linear layers of every decoder layer keep for backward in a bf16
    step (the ``hf`` table: ``qkv input``, ``projection input``, ``fc1 input`` and the
    down-projection's quarter of ``mlp hidden``, as :mod:`parmem.finetune_acts` splits it),
    for one micro-batch: all that an FP8 recipe could keep in one byte instead of two."""
    n = 0
    for t in _hf_layer(spec, seq_len, micro_batch):
        if t.name in ("qkv input", "projection input", "fc1 input"):
            n += t.bytes
        elif t.name == "mlp hidden":
            n += t.bytes // 4
    return spec.layers * n


def fp8_rows(spec: ModelSpec, seq_len: int, micro_batch: int = 1) -> list[dict[str, Any]]:
    """One bf16 training step of ``spec`` on one GPU (``engine="hf"``,
    ``precision="bf16-mixed"``: the Trainer on a bf16 checkpoint, 2 + 2 + 4 bytes per
    parameter, SDPA, no recomputation) and the same step with its projections in FP8: each
    decoder layer's saved tensors become :func:`parmem.finetune_acts.fp8_layer_bytes` of the
    recipe (torchao's ``Float8Linear``, measured; Transformer Engine from its source, not
    measured, without and with its fp8 weight cache,
    :func:`parmem.finetune_acts.fp8_weight_cache_bytes`). FP8 recipes keep the weights,
    gradients and optimizer states as they were. Rows: ``recipe``, ``states``,
    ``activations`` (logits included), ``fp8 weights``, ``total``."""
    s = integer("seq_len", seq_len)
    b = integer("micro_batch", micro_batch)
    setup = TrainingSetup(seq_len=s, micro_batch=b, engine="hf", precision="bf16-mixed")
    st = estimate(spec, ParallelConfig(), setup).peak
    states = st.params + st.grads + st.optimizer
    acts = st.activations + st.logits
    base = sum(t.bytes for t in _hf_layer(spec, s, b))
    recipes = (
        ("bf16, no FP8", None, False),
        ("torchao float8 (measured)", "torchao", False),
        ("Transformer Engine (source)", "te", False),
        ("Transformer Engine, cached fp8 weights (source)", "te", True),
    )
    rows = []
    for name, recipe, cache in recipes:
        delta = 0 if recipe is None else spec.layers * (
            fp8_layer_bytes(spec, s, b, recipe, weight_cache=cache) - base)  # fmt: skip
        weights = fp8_weight_cache_bytes(spec, "te") if cache else 0
        total = states + acts + delta + weights + st.comm_buffers
        rows.append({"recipe": name, "states": states, "activations": acts + delta,
                     "fp8 weights": weights, "total": total})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------- offload
def offload_row(
    spec: ModelSpec, setup: TrainingSetup, hardware: Hardware | str, mfu: float
) -> dict[str, Any]:
    """Activation offload against gradient checkpointing for ``setup`` (one micro-batch a step,
    one GPU, no recomputation asked): the peak with every activation kept (``kept``), with
    ``save_on_cpu`` (``offloaded``, and ``host``: the bytes it copies to the host,
    :func:`parmem.finetune_acts.offload_host_bytes` for every layer) and with full recomputation
    (``recomputed``); the seconds of the two copies over the GPU's host link
    (``pcie_s``: :func:`parmem.finetune_acts.offload_pcie_seconds` at the link's bandwidth per
    direction, ``Hardware.pcie``), of the step's compute (``compute_s``:
    :func:`parmem.flops.step_flops`, with the adapters' FLOPs, at ``mfu`` of the GPU's bf16 peak)
    and of the forward recomputation adds (``recompute_s``). Overlap of the copies with
    compute is not modelled: offload costs nothing only while ``pcie_s`` hides under compute."""
    instance("setup", setup, TrainingSetup, "TrainingSetup(seq_len=...)")
    hw = hardware if isinstance(hardware, Hardware) else hardware_preset(hardware)
    u = number("mfu", mfu, 0.0, 1.0, lo_open=True)
    if setup.recompute != "none" or setup.num_microbatches != 1:
        raise ValueError(
            "setup: offload_row compares offload with recomputation from a step without "
            "recomputation (recompute='none') and one micro-batch (num_microbatches=1)"
        )
    par = ParallelConfig()
    kept = estimate(spec, par, replace(setup, offload_activations=False)).peak
    off = estimate(spec, par, replace(setup, offload_activations=True)).peak
    rec = estimate(spec, par, replace(setup, offload_activations=False, recompute="full")).peak
    adapter = None
    if setup.adapter != "none":
        adapter = lora_flops_per_sequence(spec, setup.seq_len, setup.lora_rank, setup.lora_targets)
    b, s = setup.micro_batch, setup.seq_len
    flops = step_flops(spec, b, s, "none", adapter=adapter)
    extra = step_flops(spec, b, s, "full", adapter=adapter) - flops
    rate = hw.peak_flops_bf16 * u
    return {"kept": kept.total, "offloaded": off.total, "host": off.host,
            "recomputed": rec.total, "pcie_s": offload_pcie_seconds(off.host, hw.pcie.bandwidth),
            "compute_s": flops / rate, "recompute_s": extra / rate}  # fmt: skip


# ---------------------------------------------------------------------------- 4-bit vs shards
def quantized_vs_sharded(spec: ModelSpec, dp: int, quant: str = "nf4") -> dict[str, int]:
    """The frozen weights on one GPU of ``dp``: LoRA under ZeRO-3/FSDP with the 16-bit weights
    sharded evenly (``lora_sharded``: ⌈2Ψ/d⌉ bytes; FSDP pads each tensor to a multiple of d
    rows, fewer than d rows a tensor, not counted) against QLoRA under plain DDP, the whole
    4-bit model on every GPU (``qlora_whole``: :func:`parmem.quant.model_weight_bytes`, its
    16-bit embeddings, norms and LM head included). Weights only: the ``hf`` profile runs DDP,
    so neither the sharded job's gathered layers nor its other states are counted here."""
    d = integer("dp", dp)
    w16 = model_weight_bytes(spec, "none").total
    return {"lora_sharded": cdiv(w16, d), "qlora_whole": model_weight_bytes(spec, quant).total}


def crossover_dp(spec: ModelSpec, quant: str = "nf4") -> int:
    """The smallest d for which LoRA's 16-bit weights sharded d ways are fewer bytes per GPU
    than QLoRA's whole 4-bit copy (:func:`quantized_vs_sharded`): ⌈2Ψ/d⌉ < W₄ holds from
    d = ⌈2Ψ/(W₄ − 1)⌉ on (1 when even d = 1 does)."""
    w16 = model_weight_bytes(spec, "none").total
    w4 = model_weight_bytes(spec, quant).total
    return 1 if w16 < w4 else cdiv(w16, w4 - 1)
