"""Fine-tuning runs measured beside :mod:`parmem.finetune_acts`: one Transformers decoder layer
(the tiny cases of :data:`parmem.distributed.engine_runs.HF_TINY`, transformers 5.23.0) trained

* with PEFT 0.21.2 LoRA adapters on frozen weights (``get_peft_model``, ``LoraConfig(r,
  target_modules, lora_dropout)``; PEFT's default ``autocast_adapter_dtype=True`` keeps the
  adapters in fp32 when the model is 16-bit), the frozen projections optionally replaced by
  bitsandbytes 0.50.2 ``Linear4bit`` (NF4, compute dtype = the activation dtype: QLoRA);
* with torchao 0.18 float8 training (``convert_to_float8_training``: every ``nn.Linear`` of the
  decoder becomes a ``Float8Linear``, tensorwise dynamic scaling, which runs on CPU);
* under ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` (activation offload): every tensor
  its pack hook copies to the host, counted per pack call (the hook copies each saved tensor, a
  view as its own ``numel`` elements, parameters included, a storage saved twice twice).

Each run returns the bytes one layer keeps for backward (:class:`parmem.measure.SavedTensorsMeter`,
distinct storages, parameters excluded) and the (bytes, dtype, shape) of every saved storage. The
layer measured is ``layer`` of a ``layers``-layer model: layer 0's input does not require grad
when the embedding is frozen (no ``enable_input_require_grads``), every later layer's does.
torch, transformers, peft, bitsandbytes and torchao are imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parmem._check import choice, integer, number

from .engine_runs import HF_CASES, HF_TINY, during_forward

__all__ = [
    "peft_layer",
    "fp8_layer",
    "offload_layer",
    "lora_target_names",
    "stored_weight_bytes",
    "demo",
    "compare",
    "MODES",
    "VOCAB",
    "DEMO_OPTIMIZERS",
]

#: what a run trains: every weight (``full``), LoRA adapters on frozen weights (``lora``), LoRA
#: on frozen NF4 weights (``qlora``), every weight through torchao's Float8Linear (``fp8``)
MODES = ("full", "lora", "qlora", "fp8")


#: the tiny models' vocabulary (as :func:`parmem.distributed.engine_runs.hf_spec` reads them)
VOCAB = 256


def _model(case: str, dtype: str, attn: str, layers: int, seed: int):
    """Case ``case`` of :data:`~parmem.distributed.engine_runs.HF_TINY` with ``layers`` layers,
    built by Transformers from its config in ``dtype``, in train mode. SDPA runs with the
    attention dropout at 0 (CPU SDPA with dropout falls back to fp32 math; engine_runs' doc)."""
    import torch
    import transformers

    choice("dtype", dtype, ("bf16", "fp32"))
    choice("attn", attn, ("eager", "sdpa"))
    family = case.split("+")[0]
    kw = dict(HF_TINY[case], vocab_size=VOCAB, use_cache=False, num_hidden_layers=layers)
    if attn == "sdpa" and "attention_dropout" in kw:
        kw["attention_dropout"] = 0.0
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(family, **kw)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    return model.to(torch.bfloat16 if dtype == "bf16" else torch.float32).train()


def _layer(model, index: int):
    """Decoder layer ``index`` of a (possibly PEFT-wrapped) Transformers causal LM."""
    suffix = f"layers.{index}"
    for name, mod in model.named_modules():
        if name.endswith(suffix):
            return mod
    raise ValueError(f"layer={index}: the model has no module named *.{suffix}")


def _to_4bit(model, compute_dtype) -> None:
    """Replace every ``nn.Linear`` of the decoder layers by a frozen bitsandbytes ``Linear4bit``
    (NF4) holding the same weight quantized (``Params4bit`` quantizes on ``.to(device)``)."""
    import torch
    from bitsandbytes.nn import Linear4bit, Params4bit

    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"
    ]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        lin = getattr(parent, child)
        q = Linear4bit(
            lin.in_features,
            lin.out_features,
            bias=lin.bias is not None,
            compute_dtype=compute_dtype,
            quant_type="nf4",
        )
        q.weight = Params4bit(lin.weight.data.clone(), requires_grad=False, quant_type="nf4")
        if lin.bias is not None:
            q.bias = torch.nn.Parameter(lin.bias.data.clone(), requires_grad=False)
        setattr(parent, child, q.to(lin.weight.device))


def _build(
    case: str,
    dtype: str,
    attn: str,
    layers: int,
    seed: int,
    mode: str,
    rank: int,
    targets: str | tuple[str, ...],
    dropout: float,
    adapter_fp32: bool = True,
):
    import torch

    model = _model(case, dtype, attn, layers, seed)
    if mode == "fp8":
        from torchao.float8 import (  # type: ignore[import-untyped]
            Float8LinearConfig,
            convert_to_float8_training,
        )

        convert_to_float8_training(
            model,
            config=Float8LinearConfig(),
            module_filter_fn=lambda _m, fqn: ".layers." in f".{fqn}",
        )
        return model
    if mode in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        if mode == "qlora":
            _to_4bit(model, torch.bfloat16 if dtype == "bf16" else torch.float32)
        tm: Any = targets if isinstance(targets, str) else list(targets)
        cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=tm, lora_dropout=dropout)
        model = get_peft_model(model, cfg, autocast_adapter_dtype=adapter_fp32)
        model.train()
    return model


def _run(model, layer: int, seq_len: int, micro_batch: int, hooks: Callable[[], Any]) -> Any:
    """Forward the model on random ids with ``hooks()`` (a saved-tensors context) entered around
    decoder layer ``layer`` only, then backward; returns the context."""
    import torch

    with during_forward(_layer(model, layer), hooks()) as ctx:
        ids = torch.randint(0, VOCAB, (micro_batch, seq_len))
        model(input_ids=ids, use_cache=False).logits.float().sum().backward()
    return ctx


def _check(case: str, layers: int, layer: int, seq_len: int, micro_batch: int, mode: str) -> None:
    choice("family", case, HF_CASES)
    choice("mode", mode, MODES)
    integer("layers", layers, 1, 8)
    integer("layer", layer, 0, layers - 1)
    integer("seq_len", seq_len, 1, 4096)
    integer("micro_batch", micro_batch, 1, 64)


def peft_layer(
    family: str = "llama",
    dtype: str = "bf16",
    attn: str = "sdpa",
    mode: str = "lora",
    rank: int = 8,
    targets: str | tuple[str, ...] = "all-linear",
    dropout: float = 0.0,
    layer: int = 1,
    layers: int = 2,
    seq_len: int = 24,
    micro_batch: int = 3,
    seed: int = 0,
    adapter_fp32: bool = True,
) -> dict:
    """Bytes decoder layer ``layer`` of a ``layers``-layer tiny model of case ``family`` keeps
    for backward when trained in ``mode`` (:data:`MODES`), measured. ``rank``, ``targets``
    (PEFT's ``target_modules``: a module-name list or ``"all-linear"``) and ``dropout``
    (``lora_dropout``) apply to ``lora`` and ``qlora``; ``adapter_fp32``: PEFT's
    ``autocast_adapter_dtype`` (True, its default: 16-bit adapters are made fp32). Returns ``measured`` (distinct storages,
    parameters excluded), ``records``, ``modules`` (the names PEFT wrapped in that layer) and
    ``kinds`` (the class names of the layer's modules: ``Linear4bit``, ``Float8Linear``, ...)."""
    from parmem.measure import SavedTensorsMeter

    _check(family, layers, layer, seq_len, micro_batch, mode)
    integer("rank", rank, 1, 1024)
    number("dropout", dropout, 0.0, 1.0)
    model = _build(family, dtype, attn, layers, seed, mode, rank, targets, dropout, adapter_fp32)
    meter = _run(
        model,
        layer,
        seq_len,
        micro_batch,
        lambda: SavedTensorsMeter(exclude=list(model.parameters())),
    )
    return {
        "family": family,
        "mode": mode,
        "measured": meter.bytes,
        "records": meter.records,
        "modules": lora_target_names(model, layer),
        "kinds": tuple(sorted({type(m).__name__ for m in _layer(model, layer).modules()})),
    }


def fp8_layer(family: str = "llama", dtype: str = "bf16", **kw: Any) -> dict:
    """:func:`peft_layer` with ``mode="fp8"``: torchao's Float8Linear in every projection of the
    decoder layers (tensorwise dynamic scaling, the default ``Float8LinearConfig``)."""
    return peft_layer(family, dtype, mode="fp8", **kw)


class _Packs:
    """``save_on_cpu(pin_memory=True)`` whose pack hook also records the bytes of every host copy
    it makes (the copy is ``torch.empty(tensor.size())``: the tensor's own elements)."""

    def __init__(self, params: set[int]) -> None:
        import torch

        self.inner = torch.autograd.graph.save_on_cpu(pin_memory=True)
        pack = self.inner.pack_hook
        self.sizes: list[tuple[int, str, tuple, bool]] = []

        def counted(t):
            out = pack(t)
            host = out[1]
            n = host.numel() * host.element_size()
            is_param = t.untyped_storage().data_ptr() in params
            self.sizes.append((n, str(t.dtype), tuple(t.shape), is_param))
            return out

        self.inner.pack_hook = counted

    def __enter__(self) -> _Packs:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)


def offload_layer(
    family: str = "llama",
    dtype: str = "bf16",
    attn: str = "sdpa",
    mode: str = "full",
    rank: int = 8,
    targets: str | tuple[str, ...] = "all-linear",
    dropout: float = 0.0,
    layer: int = 1,
    layers: int = 2,
    seq_len: int = 24,
    micro_batch: int = 3,
    seed: int = 0,
    adapter_fp32: bool = True,
) -> dict:
    """What ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around decoder layer ``layer``
    copies to the host, measured: ``host_bytes`` (the sum over pack calls), ``packs`` ((bytes,
    dtype, shape, is a parameter) per call), ``param_bytes`` (the calls that packed a parameter of
    the model: the frozen or trained weights the matmuls save)."""
    _check(family, layers, layer, seq_len, micro_batch, mode)
    model = _build(family, dtype, attn, layers, seed, mode, rank, targets, dropout, adapter_fp32)
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    packs = _run(model, layer, seq_len, micro_batch, lambda: _Packs(ptrs))
    return {
        "family": family,
        "mode": mode,
        "host_bytes": sum(x[0] for x in packs.sizes),
        "param_bytes": sum(x[0] for x in packs.sizes if x[3]),
        "packs": packs.sizes,
    }


def lora_target_names(model, layer: int) -> tuple[str, ...]:
    """The module names (relative to decoder layer ``layer``) that carry a LoRA adapter."""
    mod = _layer(model, layer)
    return tuple(sorted(n for n, m in mod.named_modules() if hasattr(m, "lora_A") and n))


# ---------------------------------------------------------------------------- DDP demo
#: the optimizers :func:`demo` builds: torch's AdamW (what the Trainer's ``adamw_torch_fused``
#: builds) and bitsandbytes' paged 8-bit AdamW (``optim="paged_adamw_8bit"``)
DEMO_OPTIMIZERS = ("adamw", "paged-adam-8bit")


def stored_weight_bytes(model) -> int:
    """Bytes of the weights as stored: every parameter's storage (a 4-bit ``Params4bit`` is its
    packed uint8 data) plus the quantisation state bitsandbytes keeps beside each 4-bit weight
    (``QuantState``: absmax, code, offset and, with double quantisation, the nested absmax and
    code), each storage counted once."""
    import torch

    from parmem.measure import tensor_storage_bytes

    tensors = list(model.parameters())
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        while qs is not None:
            tensors += [t for t in vars(qs).values() if isinstance(t, torch.Tensor)]
            qs = getattr(qs, "state2", None)
    return tensor_storage_bytes(tensors)


def demo(
    adapter: str = "lora",
    rank: int = 8,
    targets: str = "all-linear",
    optimizer: str = "adamw",
    layers: int = 2,
    seq: int = 24,
    batch: int = 3,
) -> dict:
    """One fine-tuning step of a tiny Llama (:data:`~parmem.distributed.engine_runs.HF_TINY`,
    bf16, SDPA) on every rank of a pool under DDP (``gradient_as_bucket_view=False``, as
    Accelerate builds it): PEFT LoRA adapters (``adapter="lora"``) or the same on NF4 weights
    (``"qlora"``), trained with ``optimizer`` (:data:`DEMO_OPTIMIZERS`). Per rank: the weights as
    stored (:func:`stored_weight_bytes`), the gradients and optimizer states
    (:func:`parmem.measure.state_bytes`) and the bytes autograd keeps for backward, loss
    included (:class:`parmem.measure.SavedTensorsMeter`), beside :func:`parmem.estimate` for the
    same model, d = the pool's size and ``engine="hf"``; and the named terms the estimate counts
    differently (torch AdamW's 0-d ``step`` tensors; QLoRA's dequantised weight, a transient of
    the backward the estimate adds to the activations and autograd does not save)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.distributed.engine_runs import hf_spec
    from parmem.distributed.launcher import rank as my_rank
    from parmem.distributed.launcher import world_size
    from parmem.measure import SavedTensorsMeter, state_bytes
    from parmem.quant import dequant_transient_bytes

    choice("adapter", adapter, ("lora", "qlora"))
    choice("optimizer", optimizer, DEMO_OPTIMIZERS)
    choice("targets", targets, ("all-linear", "attention", "qv"))
    names: dict[str, str | tuple[str, ...]] = {
        "all-linear": "all-linear",
        "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
        "qv": ("q_proj", "v_proj"),
    }
    model = _build("llama", "bf16", "sdpa", layers, 0, adapter, rank, names[targets], 0.0)
    ddp = DDP(model, gradient_as_bucket_view=False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adamw":
        opt = torch.optim.AdamW(trainable, lr=1e-3)
    else:
        import bitsandbytes as bnb

        opt = bnb.optim.PagedAdamW8bit(trainable, lr=1e-3)
    g = torch.Generator().manual_seed(1234 + my_rank())  # each rank its own data shard
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    with SavedTensorsMeter(exclude=list(model.parameters())) as meter:
        loss = ddp(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt.step()
    st = state_bytes(model, opt)
    spec = hf_spec("llama", "sdpa", layers)
    setup = TrainingSetup(seq_len=seq, micro_batch=batch, engine="hf", precision="bf16",
                          adapter=adapter, lora_rank=rank, lora_targets=targets,
                          optimizer=optimizer)  # fmt: skip
    est = estimate(spec, ParallelConfig(dp=world_size()), setup).stages[0]
    flat = torch.cat([p.detach().float().flatten() for p in trainable])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    steps = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for k, t in s.items()
        if k == "step" and isinstance(t, torch.Tensor)
    )
    dequant = 0
    if adapter == "qlora":
        dequant = dequant_transient_bytes(spec, "nf4", 2, double_quant=True, dtype_16=2)
    return {
        "rank": my_rank(),
        "loss": float(loss.detach()),
        "max_adapter_diff_vs_rank0": float((flat - ref).abs().max()),
        "trainable": sum(p.numel() for p in trainable),
        "peft_trainable": model.get_nb_trainable_parameters()[0],
        "estimate_params": est.num_params,
        "measured": {
            "weights": stored_weight_bytes(model),
            "grads": st.grads,
            "optimizer": st.optimizer,
            "activations": meter.bytes,
        },
        "estimate": {
            "weights": est.params,
            "grads": est.grads,
            "optimizer": est.optimizer,
            "activations": est.activations + est.logits,
        },
        "extras": {"adam_steps": steps, "dequantised_weight": -dequant},
    }


def compare(result: dict) -> list[dict]:
    """Rows of measured vs estimated bytes of one rank's :func:`demo`, with the named terms that
    explain each difference (``unexplained``: 0 when the estimate holds)."""
    m, e, x = result["measured"], result["estimate"], result["extras"]
    rows = [
        ("weights (as stored)", "weights", 0, ""),
        ("gradients", "grads", 0, ""),
        ("optimizer states", "optimizer", x["adam_steps"], "AdamW's 0-d step tensors"),
        ("activations + loss", "activations", x["dequantised_weight"],
         "QLoRA's dequantised weight: a transient, not saved"),
    ]  # fmt: skip
    return [
        {
            "term": label,
            "measured": m[key],
            "estimate": e[key],
            "named difference": extra,
            "unexplained": m[key] - e[key] - extra,
            "what it is": why,
        }
        for label, key, extra, why in rows
    ]
