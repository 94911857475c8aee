"""Activation memory of fine-tuning: LoRA and QLoRA on frozen weights, FP8 training, offload.

Everything here is the ``hf`` profile's ``layer`` table (``data/engines.toml``, evaluated by
:func:`parmem.activations.layer_terms`: a Transformers 5.23 decoder layer as the Trainer runs it)
changed by what the fine-tuning method changes, term by term:

* **LoRA** (PEFT 0.21.2, ``peft/tuners/lora/layer.py`` ``Linear.forward``:
  ``result = base_layer(x); x = _cast_input_dtype(x, lora_A.weight.dtype);
  result = result + lora_B(lora_A(dropout(x))) * scaling``). The base weights are frozen, and
  autograd saves an operand only for a gradient that will be computed (PyTorch's generated
  ``VariableType`` code, ``tools/autograd/gen_variable_type.py``, guards each saved input by
  ``should_compute_output`` of the gradients that use it; confirmed by the measurements): a
  frozen ``F.linear`` keeps no input, a frozen norm weight's ``weight * x`` keeps no ``x``. What the full-training table keeps only for a weight's gradient is dropped
  (:data:`FROZEN_DROPS`); each adapter adds its own tensors (:func:`lora_layer_terms`).
  **QLoRA**: bitsandbytes 0.50.2 ``MatMul4Bit`` (``bitsandbytes/autograd/_functions.py``) keeps
  only its packed weight, in ``ctx.tensors`` (a parameter, not an activation), so a 4-bit frozen
  base keeps what a 16-bit one keeps.
* **FP8** (:func:`fp8_layer_bytes`): torchao 0.18 ``Float8Linear`` keeps the high-precision input
  and the weight's transposed view (``torchao/float8/float8_linear.py``
  ``matmul_with_hp_or_float8_args.forward``: ``ctx.save_for_backward(input_hp, weight_hp_t)``)
  exactly as ``nn.Linear`` does; Transformer Engine is modelled from its source, not measured.
* **Offload** (:func:`offload_host_bytes`): ``torch.autograd.graph.save_on_cpu`` copies every
  saved tensor to the host, once per saving operation, parameters included.

Every rule but Transformer Engine's was measured on CPU against the real libraries
(tests/test_finetune_acts.py, through :mod:`parmem.distributed.finetune_runs`); the
``device="cuda"`` numbers differ only by the ``[devices.cuda]`` element sizes (LoRA: 1-byte
dropout masks instead of the adapter dtype), not measured on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._check import boolean, choice, integer, number
from .activations import Term, layer_terms
from .engines import activation_itemsizes, devices
from .lora import lora_modules
from .model import ModelSpec

__all__ = [
    "LORA_FAMILIES",
    "PROJECTIONS",
    "FROZEN_DROPS",
    "FROZEN_OUTER_DROPS",
    "lora_projections",
    "lora_layer_terms",
    "lora_layer_bytes",
    "fp8_layer_terms",
    "fp8_layer_bytes",
    "fp8_weight_cache_bytes",
    "offload_host_bytes",
    "offload_pcie_seconds",
    "FP8_RECIPES",
]

#: The Transformers families whose LoRA layer was measured equal to :func:`lora_layer_terms`
#: (``""``: a spec built by hand with the same structure). GPT-2 (Conv1D), the Gemma norms,
#: Qwen2-MoE's shared expert and the GeLU MLPs are not measured and are refused.
LORA_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "granite", "mixtral", "qwen3_moe")
#: The projections of a Llama-style decoder layer, by the module name PEFT targets
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTN = PROJECTIONS[:4]
#: which input each projection reads: the attention norm's output, the attention output, the
#: MLP norm's output, the SwiGLU product
_INPUT = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "o_proj": "proj",
    "gate_proj": "fc1",
    "up_proj": "fc1",
    "down_proj": "down",
}
#: The ``hf`` table entries kept only for a frozen weight's gradient (measured: absent under
#: LoRA): the norms' ``weight * x`` operand and the projections' inputs. ``projection input``
#: is dropped with eager attention only (with SDPA it is SDPA's own saved output); ``mlp hidden``
#: and ``expert hidden`` lose their down-projection input (one of four f-wide tensors) and
#: ``expert inputs`` goes (the grouped_mm's operand for the expert weights' gradient).
FROZEN_DROPS = (
    "attn norm normalised",
    "mlp norm normalised",
    "q norm normalised",
    "k norm normalised",
    "qkv input",
    "fc1 input",
    "expert inputs",
)
_QUARTER = ("mlp hidden", "expert hidden")
#: The ``first`` and ``last`` entries of the ``hf`` table that only a frozen embedding's or LM
#: head's (or final norm weight's) gradient needs, absent under LoRA (measured on a whole tiny
#: Llama with labels: nn.Embedding keeps its ids for the weight's gradient only; the LM head's
#: input and the final norm's ``weight * x`` operand likewise)
FROZEN_OUTER_DROPS = ("embedding input ids", "final norm normalised", "LM-head input")
#: FP8 recipes: torchao 0.18 float8 training; Transformer Engine on Hopper with per-tensor
#: scaling (delayed or current), from its source
FP8_RECIPES = ("torchao", "te")


def _widths(spec: ModelSpec) -> dict[str, int]:
    """Input width of each input kind (h, a·head_dim, f)."""
    return {"qkv": spec.hidden, "proj": spec.o_dim, "fc1": spec.hidden, "down": spec.ffn_hidden}


def _weights(spec: ModelSpec) -> dict[str, int]:
    """Weight elements of each projection (``in_features x out_features``)."""
    h, kv = spec.hidden, spec.kv_heads * spec.head_dim
    out = {"q_proj": h * spec.q_dim, "k_proj": h * kv, "v_proj": h * kv, "o_proj": spec.o_dim * h}
    if not spec.is_moe:
        out.update(gate_proj=h * spec.ffn_hidden, up_proj=h * spec.ffn_hidden)
        out["down_proj"] = spec.ffn_hidden * h
    return out


def _check_spec(spec: ModelSpec, what: str) -> None:
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if spec.family and spec.family not in LORA_FAMILIES:
        raise ValueError(
            f"{what}: model_type={spec.family!r} is not measured (measured: "
            f"{', '.join(LORA_FAMILIES)})"
        )
    odd = [
        (spec.norm != "rmsnorm", f"norm={spec.norm!r}"),
        (spec.ffn_kind != "swiglu", f"ffn_kind={spec.ffn_kind!r}"),
        (spec.position != "rotary", f"position={spec.position!r}"),
        (spec.attention == "mla", "multi-head latent attention"),
        (spec.shared_experts > 0, "shared experts"),
        (spec.num_moe_layers not in (0, spec.layers), "dense layers among expert layers"),
        (spec.sandwich_norm, "sandwich norms"),
        (spec.has_dropout, f"model dropout={spec.dropout}"),
    ]
    for bad, name in odd:
        if bad:
            raise ValueError(f"{what}: {name} is not modelled (a Llama-style layer is)")


def lora_projections(spec: ModelSpec, targets: str | Iterable[str]) -> tuple[str, ...]:
    """The projections of one decoder layer that PEFT's ``target_modules`` wraps, by module name,
    in :data:`PROJECTIONS` order: :func:`parmem.lora.lora_modules` (PEFT 0.21.2's resolution of
    ``"all-linear"``, ``"attention"``, ``"qv"`` or a list of names). Refused: a target PEFT
    0.21.2 adapts through ``ParamWrapper`` (the fused experts and the router a mixture of experts
    gets from ``"all-linear"``, ``peft/utils/transformers_weight_conversion.py``), whose saved
    tensors are not modelled."""
    if not isinstance(targets, str | list | tuple):
        raise ValueError(f"targets={targets!r:.60} must be a string or a list of module names")
    names = lora_modules(spec, targets if isinstance(targets, str) else tuple(targets))
    out = set()
    for m in names:
        leaf = m.name.rsplit(".", 1)[-1]
        if m.wrapper != "Linear" or leaf not in PROJECTIONS:
            raise ValueError(
                f"targets={targets!r}: PEFT adapts {m.name} ({m.wrapper}), whose saved tensors "
                "are not modelled (the attention and dense-MLP projections are)"
            )
        out.add(leaf)
    return tuple(t for t in PROJECTIONS if t in out)


def _frozen(terms: list[Term], flash: bool, input_grad: bool, mods: tuple[str, ...]) -> list[Term]:
    """The full-training terms a frozen layer still keeps (:data:`FROZEN_DROPS`); without
    ``input_grad`` also not the attention norm's (its input and weight need no gradient), nor
    the key norm's when k_proj has no adapter."""
    out = []
    for t in terms:
        if t.name in FROZEN_DROPS or (t.name == "projection input" and not flash):
            continue
        if t.name in _QUARTER:
            t = Term(t.name, t.bytes * 3 // 4, "down-projection input dropped (frozen)", t.core)
        if not input_grad:
            if t.name == "attn norm input (fp32)":
                continue
            if t.name == "norm statistics":
                t = Term(t.name, t.bytes // 2, "the MLP norm's only", t.core)
            if t.name.startswith("k norm") and "k_proj" not in mods:
                continue
        out.append(t)
    return out


def _adapter_terms(
    spec: ModelSpec,
    tokens: int,
    rank: int,
    mods: tuple[str, ...],
    dropout: bool,
    sizes: tuple[int, int, int],
    flash: bool,
    input_grad: bool,
) -> list[Term]:
    """What the adapters add: per target the lora_A output (kept by lora_B) and lora_A's input
    (a dropout output and its mask, or ``_cast_input_dtype``'s own copy, or the shared input)."""
    act, ad, mask = sizes
    widths = _widths(spec)
    out: list[Term] = []
    for m in mods:
        n = tokens * widths[_INPUT[m]]
        if dropout:
            out.append(Term(f"{m} LoRA dropout output", n * ad, "kept by lora_A"))
            if input_grad or m not in _ATTN[:3]:  # dropout of an input without grad keeps none
                out.append(Term(f"{m} LoRA dropout mask", n * mask, "kept by the dropout"))
        elif ad != act:
            out.append(Term(f"{m} LoRA input copy", n * ad, "x.to(lora_A dtype), kept by lora_A"))
        out.append(Term(f"{m} lora_A output", tokens * rank * ad, "kept by lora_B"))
    if not dropout and ad == act:  # lora_A keeps the base layer's own input, once per input
        for kind in dict.fromkeys(_INPUT[m] for m in mods):
            if kind == "proj" and flash:
                continue  # SDPA's saved output, already counted
            out.append(Term(f"{kind} input (kept by lora_A)", tokens * widths[kind] * act))
    return out


def lora_layer_terms(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    rank: int,
    targets: str | Iterable[str],
    dropout: bool,
    act_itemsize: int,
    device: str = "cuda",
    flash: bool = True,
    base: str = "16bit",
    *,
    adapter_itemsize: int = 4,
    input_grad: bool = True,
) -> list[Term]:
    """The tensors one decoder layer keeps for backward when its weights are frozen and PEFT
    LoRA adapters of rank ``rank`` on ``targets`` (:func:`lora_projections`) are trained, with
    ``lora_dropout > 0`` when ``dropout``. Source: PEFT 0.21.2 ``peft/tuners/lora/layer.py``
    ``Linear.forward`` (``bnb.py`` ``Linear4bit.forward`` for ``base="4bit"``), Transformers 5.23
    (the ``hf`` table of ``data/engines.toml``), measured on CPU to the byte.

    * the ``hf`` table minus what only a frozen weight's gradient needed (:data:`FROZEN_DROPS`);
    * per target: lora_A's output, ``rank`` wide, kept by lora_B, in the adapter dtype;
    * per target, lora_A's input: with dropout the dropout's output (adapter dtype) and its mask
      (1 byte on CUDA, the adapter dtype on CPU); without, when the adapter dtype differs from
      the activations' (PEFT's default ``autocast_adapter_dtype=True`` keeps 16-bit models'
      adapters in fp32: ``adapter_itemsize=4``), each target's own cast copy; else the base
      layer's input itself, once per distinct input.

    ``base="4bit"``: bitsandbytes ``Linear4bit`` frozen projections (QLoRA, compute dtype = the
    activation dtype, no ``prepare_model_for_kbit_training``): the same bytes. ``input_grad``:
    whether the layer's input requires grad (every layer after the first; the first only when
    the embedding output is made to, ``model.enable_input_require_grads()``); ``False`` needs
    ``q_proj`` among the targets and SDPA (``flash``). The rotary cos/sin (the ``stage`` table)
    are kept as in full training."""
    _check_spec(spec, "LoRA")
    integer("seq_len", seq_len)
    integer("micro_batch", micro_batch)
    integer("rank", rank)
    boolean("dropout", dropout)
    choice("act_itemsize", act_itemsize, (2, 4))
    choice("adapter_itemsize", adapter_itemsize, (2, 4) if act_itemsize == 2 else (4,))
    choice("device", device, devices())
    boolean("flash", flash)
    choice("base", base, ("16bit", "4bit"))
    boolean("input_grad", input_grad)
    mods = lora_projections(spec, targets)
    if not input_grad and not (flash and "q_proj" in mods):
        raise ValueError(
            "input_grad=False (the first layer, frozen embeddings) is modelled with flash=True "
            "and q_proj among the targets only: otherwise parts of the attention keep no tensor"
        )
    full = layer_terms(
        spec,
        seq_len,
        micro_batch,
        flash=flash,
        dropout=False,
        act_bytes=act_itemsize,
        engine="hf",
        device=device,
    )
    mask = activation_itemsizes(device, adapter_itemsize, 0)["mask"]
    sizes = (act_itemsize, adapter_itemsize, mask)
    tokens = seq_len * micro_batch
    kept = _frozen(full, flash, input_grad, mods)
    return kept + _adapter_terms(spec, tokens, rank, mods, dropout, sizes, flash, input_grad)


def lora_layer_bytes(*args: Any, **kwargs: Any) -> int:
    """Bytes of :func:`lora_layer_terms`, with the same arguments: one decoder layer under
    LoRA/QLoRA, one micro-batch (the ``layer`` table; the rotary cos/sin of the ``stage`` table
    come once per stage)."""
    return sum(t.bytes for t in lora_layer_terms(*args, **kwargs))


# ---------------------------------------------------------------------------- FP8 training
def _te_terms(spec: ModelSpec, tokens: int, flash: bool, weight_cache: bool) -> list[Term]:
    """Transformer Engine's te.Linear in place of each projection (Accelerate's
    ``convert_model``): FROM TE's SOURCE, NOT MEASURED (see :func:`fp8_layer_terms`)."""
    widths = _widths(spec)
    weights = _weights(spec)
    out = []
    for m in PROJECTIONS:
        n = tokens * widths[_INPUT[m]] + 4
        out.append(Term(f"{m} fp8 input (transpose)", n, "TE: columnwise fp8 copy + fp32 scale"))
        if not weight_cache:
            w = 2 * weights[m] + 4
            out.append(Term(f"{m} fp8 weight", w, "TE: rowwise + transpose fp8, fp32 scale"))
    return out


def fp8_layer_terms(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    recipe: str = "torchao",
    act_itemsize: int = 2,
    device: str = "cuda",
    flash: bool = True,
    weight_cache: bool = False,
) -> list[Term]:
    """The tensors one decoder layer keeps for backward when its projections train in FP8.

    ``recipe="torchao"`` (torchao 0.18 ``convert_to_float8_training``, tensorwise dynamic
    scaling): ``Float8Linear`` casts input and weight to fp8 inside
    ``matmul_with_hp_or_float8_args.forward`` (``torchao/float8/float8_linear.py``) and saves
    ``(input_hp, weight_hp_t)``: the high-precision input and a view of the weight, exactly what
    ``nn.Linear`` saves, so the layer keeps the ``hf`` table unchanged (measured on CPU, where
    ``Float8Linear`` runs forward and backward). torch.compile's partitioner may choose other
    tensors; eager mode is what this models.

    ``recipe="te"``: FROM TRANSFORMER ENGINE'S SOURCE, NOT MEASURED (TE 2.20.0.dev0, commit
    d0067d0, ``transformer_engine/pytorch/module/linear.py`` ``_linear_forward``;
    ``tensor/float8_tensor.py`` ``inner_tensor_specs``), for an HF layer whose ``nn.Linear``
    are ``te.Linear`` (Accelerate's ``convert_model``), on Hopper with per-tensor scaling: each
    te.Linear quantizes its own input and keeps only the columnwise (transposed) fp8 copy, 1 byte
    per element plus a 1-element fp32 ``_scale_inv`` (``update_usage(rowwise_usage=False,
    columnwise_usage=True)``), instead of the 16-bit input (q, k and v each keep one); the
    16-bit ``qkv input``, ``fc1 input`` and down-projection input go; with SDPA the attention
    output stays (SDPA keeps it). It saves ``wt_save = weightmat``: without a weight cache
    (``is_first_microbatch=None``, what an HF forward passes) a fresh fp8 weight per projection
    and micro-batch, rowwise ``_data`` and ``_transpose`` (2 bytes per weight) and a scale;
    ``weight_cache=True`` (``is_first_microbatch`` given, Megatron-style) saves the cached
    workspace instead, counted once by :func:`fp8_weight_cache_bytes`. Dense layers, CUDA only.
    """
    _check_spec(spec, "FP8")
    integer("seq_len", seq_len)
    integer("micro_batch", micro_batch)
    choice("recipe", recipe, FP8_RECIPES)
    choice("act_itemsize", act_itemsize, (2, 4))
    choice("device", device, devices())
    boolean("flash", flash)
    boolean("weight_cache", weight_cache)
    full = layer_terms(
        spec,
        seq_len,
        micro_batch,
        flash=flash,
        dropout=False,
        act_bytes=act_itemsize,
        engine="hf",
        device=device,
    )
    if recipe == "torchao":
        if weight_cache:
            raise ValueError("weight_cache=True: torchao's Float8Linear caches no fp8 weight")
        return full
    if device != "cuda" or spec.is_moe or act_itemsize != 2:
        raise ValueError(
            "recipe='te' is modelled for dense layers with 16-bit activations on device='cuda' "
            "(Transformer Engine has no CPU kernels; its grouped experts are not modelled)"
        )
    gone = ("qkv input", "fc1 input") + (() if flash else ("projection input",))
    kept = [
        Term(t.name, t.bytes * 3 // 4, "down-projection input: TE's fp8 copy instead", t.core)
        if t.name == "mlp hidden"
        else t
        for t in full
        if t.name not in gone
    ]
    return kept + _te_terms(spec, seq_len * micro_batch, flash, weight_cache)


def fp8_layer_bytes(*args: Any, **kwargs: Any) -> int:
    """Bytes of :func:`fp8_layer_terms`, with the same arguments (one layer, one micro-batch;
    the ``stage`` table apart)."""
    return sum(t.bytes for t in fp8_layer_terms(*args, **kwargs))


def fp8_weight_cache_bytes(spec: ModelSpec, recipe: str = "torchao") -> int:
    """fp8 weight copies kept between micro-batches, whole model (decoder projections).

    ``torchao``: 0 (``Float8Linear`` casts the weight inside each matmul and keeps no fp8 copy;
    torchao/float8/float8_linear.py). ``te``: FROM TE'S SOURCE, NOT MEASURED: with
    ``is_first_microbatch`` passed, ``Linear.forward`` keeps ``_fp8_workspaces["weight"]``
    (``module/linear.py``), on Hopper a rowwise fp8 copy, its transpose and a 1-element fp32
    ``_scale_inv`` (``tensor/float8_tensor.py``): 2 bytes per weight + 4 per projection, for
    the seven projections of every layer (dense layers only)."""
    _check_spec(spec, "FP8")
    choice("recipe", recipe, FP8_RECIPES)
    if recipe == "torchao":
        return 0
    if spec.is_moe:
        raise ValueError("recipe='te' with a mixture of experts is not modelled")
    return spec.layers * sum(2 * w + 4 for w in _weights(spec).values())


# ---------------------------------------------------------------------------- offload
#: terms two operations save (each packs its own host copy): a norm's fp32 input (``pow`` and
#: the ``* rsqrt`` multiply), its rsqrt output (``rsqrt`` and the multiply), the two grouped_mm's
#: offsets
_TWICE = (
    "attn norm input (fp32)",
    "mlp norm input (fp32)",
    "norm statistics",
    "q norm input (fp32)",
    "k norm input (fp32)",
    "q norm statistics",
    "k norm statistics",
    "grouped_mm offsets",
)


def _packs(name: str, spec: ModelSpec, mods: tuple[str, ...] | None, shared: bool) -> int:
    """How many saving operations pack the term ``name`` (``mods``: LoRA targets, None in full
    training; ``shared``: lora_A keeps the base layer's input itself)."""
    if name in _TWICE:
        return 2
    if mods is None:  # full training: q, k, v (gate, up) each keep their input
        extra = {"qkv input": 3, "fc1 input": 1 if spec.is_moe else 2, "projection input": 2}
        return extra.get(name, 1)
    if name == "projection input":  # SDPA's output, and o_proj's lora_A when it keeps it
        return 2 if shared and "o_proj" in mods else 1
    if name.endswith("input (kept by lora_A)"):
        return sum(_INPUT[m] == name.split()[0] for m in mods)
    return 1


def _param_packs(
    spec: ModelSpec, act: int, mods: tuple[str, ...] | None, rank: int, ad: int, base: str
) -> int:
    """Parameter bytes packed per layer: every weight a matmul or a norm multiply saves for
    its input's gradient (frozen or not), the adapters' A and B."""
    norms = 2 * spec.hidden + (2 * spec.head_dim if spec.qk_norm else 0)
    linear = sum(_weights(spec).values())
    if base == "4bit":  # MatMul4Bit keeps its weight in ctx.tensors, outside the hooks
        linear = 0
    if spec.is_moe:
        e, h, f = spec.num_experts, spec.hidden, spec.expert_ffn_hidden
        linear += e * h + 3 * e * f * h  # the router, the fused gate_up and down experts
    out = (norms + linear) * act
    if mods:
        w = _widths(spec)
        outs = {m: _weights(spec)[m] // w[_INPUT[m]] for m in mods}
        out += sum(rank * (w[_INPUT[m]] + outs[m]) for m in mods) * ad
    return out


def offload_host_bytes(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    act_itemsize: int,
    device: str = "cuda",
    *,
    mode: str = "full",
    rank: int = 8,
    targets: str | Iterable[str] = "all-linear",
    dropout: bool = False,
    adapter_itemsize: int = 4,
    base: str = "16bit",
) -> int:
    """Bytes ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` copies to the host for one
    decoder layer (any but the first) and one micro-batch, SDPA attention, ``mode`` ``"full"``
    training or ``"lora"`` (with ``rank``, ``targets``, ``dropout``, ``adapter_itemsize``,
    ``base`` as in :func:`lora_layer_terms`).

    Source: torch 2.13 ``torch/autograd/graph.py`` ``save_on_cpu``: its pack hook allocates
    ``torch.empty(tensor.size(), ...)`` and copies each tensor it is given, once per saving
    operation, so unlike the storage count of :func:`parmem.activations.layer_terms` a tensor
    two operations save is copied twice (a norm's fp32 input and rsqrt, q/k/v's shared input,
    SDPA's output that o_proj also keeps, the rotary cos and sin kept by q and by k, in every
    layer), a view is copied as its own elements, and every parameter a matmul or a norm
    multiply saves for its input's gradient is copied too, frozen or not (a 4-bit base is not:
    bitsandbytes' MatMul4Bit keeps its weight outside the hooks). Measured on CPU to the byte.
    On the GPU the layer then keeps no saved tensor: the host copies stand in for all of them
    (the residual stream between layers is an input of the next layer, live only until that
    layer's forward has packed it); what is saved outside the ``save_on_cpu`` region (the LM
    head's input, the logits) stays. Backward copies the same bytes back
    (:func:`offload_pcie_seconds`)."""
    choice("mode", mode, ("full", "lora"))
    choice("act_itemsize", act_itemsize, (2, 4))
    if mode == "full":
        _check_spec(spec, "offload")
        terms = layer_terms(
            spec,
            seq_len,
            micro_batch,
            flash=True,
            dropout=False,
            act_bytes=act_itemsize,
            engine="hf",
            device=device,
        )
        mods = None
        shared = False
    else:
        terms = lora_layer_terms(
            spec,
            seq_len,
            micro_batch,
            rank,
            targets,
            dropout,
            act_itemsize,
            device,
            True,
            base,
            adapter_itemsize=adapter_itemsize,
        )
        mods = lora_projections(spec, targets)
        shared = not dropout and adapter_itemsize == act_itemsize
    stage = layer_terms(
        spec,
        seq_len,
        micro_batch,
        flash=True,
        dropout=False,
        act_bytes=act_itemsize,
        engine="hf",
        device=device,
        place="stage",
    )
    n = sum(t.bytes * _packs(t.name, spec, mods, shared) for t in terms)
    n += 2 * sum(t.bytes for t in stage)  # cos and sin, kept by q's and k's rotary multiply
    return n + _param_packs(spec, act_itemsize, mods, rank, adapter_itemsize, base)


def offload_pcie_seconds(nbytes: int, pcie_bytes_per_s: float) -> float:
    """Seconds of host-device traffic for ``nbytes`` offloaded: two copies, device-to-host in
    forward (``save_on_cpu``'s pack hook, ``packed.copy_(tensor, non_blocking=True)``) and
    host-to-device in backward (its unpack hook, ``tensor.to(device, non_blocking=True)``),
    torch 2.13 ``torch/autograd/graph.py``; ``pcie_bytes_per_s`` is the link's achieved
    bandwidth in one direction (pinned memory). Overlap with compute is not modelled."""
    nbytes = integer("nbytes", nbytes, 0)
    bw = number("pcie_bytes_per_s", pcie_bytes_per_s, 0.0, lo_open=True)
    return 2 * nbytes / bw
