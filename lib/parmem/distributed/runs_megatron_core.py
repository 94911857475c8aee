"""Megatron-Core 0.16.1's own training step on CPU gloo ranks, recorded beside the
``megatron-core`` profile (``scripts/record_engine_runs.py --engine megatron-core``).

Each case builds a tiny ``GPTModel`` from Megatron-Core's local (Transformer-Engine-free) layer
spec (``get_gpt_layer_local_spec``) on the pool's ranks, as Megatron-LM's training loop builds it
(``megatron/training/training.py`` ``get_model``): ``TransformerConfig(use_cpu_initialization=True,
bf16=True, params_dtype=bfloat16)``, the model wrapped in ``Float16Module`` (which casts every
weight to bf16, the RMSNorm weights included: ``WrappedTorchNorm`` builds them in fp32), then in
Megatron-Core's ``DistributedDataParallel`` (``grad_reduce_in_fp32=True``, the fp32 ``main_grad``
buffers that ``--bf16`` forces), and Megatron-Core's optimizer (``get_megatron_optimizer``:
``Float16OptimizerWithFloat16Params``, or the ``DistributedOptimizer`` with
``use_distributed_optimizer=True``; its inner optimizer is ``torch.optim.AdamW``, Megatron's
fallback without TE or Apex, ``megatron/core/optimizer/__init__.py``). One micro-batch runs
forward with labels (``GPTModel`` computes the loss with ``vocab_parallel_cross_entropy``),
backward, ``finish_grad_sync`` and ``optimizer.step()`` (gradient clipping at 1.0 included).

Per rank at the end of the step: ``params`` (the weights' storages: with the distributed
optimizer, DDP's bf16 ``param_data`` buffer, padding included), ``grads`` (DDP's fp32
``grad_data`` buffers, and any ``.grad``), ``optimizer`` (every tensor of the inner AdamW's
``state`` and the fp32 master weights it steps on: its ``param_groups``), all storages counted
once (:func:`parmem.measure.tensor_storage_bytes`); and the tensors one micro-batch's forward
keeps for backward (:class:`parmem.measure.SavedTensorsMeter`, parameters excluded), per
region (embedding, each decoder layer, final norm, LM head, loss): ``saved`` is all of them,
``activations`` all but the fp32 softmax of the logits the cross-entropy keeps (the estimate's
``logits``). Fused bias-SwiGLU is on (``bias_activation_fusion=True``, Megatron-LM's
``--bias-swiglu-fusion`` default).

Cases (world size 2; Llama-style: RMSNorm, SwiGLU, RoPE, GQA, untied embeddings, no bias, no
dropout; Mixtral-style: the same with 4 experts of top-2 routing; Qwen3-MoE-style: Mixtral's
with q/k RMSNorm): DP = 2 with Megatron's ``Float16OptimizerWithFloat16Params`` and with the
``DistributedOptimizer``; TP = 2 (no sequence parallelism: see below); DP = 2 x EP = 2 for the
MoE models (the experts split over the two ranks, the dense part replicated).

What a CPU run changes. Patches, applied inside the worker only and undone after each case
(:func:`cpu_patches`):

1. ``torch.cuda.current_device()`` returns ``"cpu"`` (every buffer Megatron allocates asks it
   for its device: ``param_and_grad_buffer.py``, ``rotary_pos_embedding.py`` get_emb, the
   router, ``DistributedOptimizer``).
2. A ``TorchFunctionMode`` maps a factory call's ``device="cuda"`` to ``"cpu"`` and
   ``Tensor.cuda()`` to the tensor itself (``optimizer.py``'s ``found_inf``, ``clip_grads.py``,
   ``transformer/utils.py`` get_default_causal_mask).
3. ``Tensor.type()`` (no arguments) names a CPU tensor as its CUDA type (``torch.BFloat16Tensor``
   -> ``torch.cuda.BFloat16Tensor``): ``Float16OptimizerWithFloat16Params``,
   ``DistributedOptimizer`` and ``clip_grad_by_total_norm_fp32`` accept only those names.
4. The model-parallel RNG tracker's ``fork()`` is a no-op (its states are CUDA generator states);
   the cases have no dropout, so no random number is drawn inside a fork.
5. ``megatron.core.transformer.moe.moe_utils.te_general_gemm`` is set to ``None`` when absent:
   without Transformer Engine, 0.16.1's import fallback leaves the name undefined and the
   router's ``RouterGatingLinearFunction`` raises ``NameError: name 'te_general_gemm' is not
   defined`` (on a GPU without TE too); ``None`` is the path the function means to take.

Configuration choices a CPU run forces (the profile describes the GPU run):

* ``masked_softmax_fusion=False``: the fused causal softmax is a CUDA extension
  (``scaled_upper_triang_masked_softmax_cuda``; with fusion on, ``is_kernel_available`` imports
  ``scaled_masked_softmax_cuda`` and fails). The PyTorch fallback (``forward_torch_softmax``)
  upcasts the scores to fp32 and masks them in place, so each layer keeps an fp32 copy of the
  probabilities and the bool causal mask beside the bf16 probabilities the fused kernel keeps:
  the named CPU difference ``megatron-cpu-unfused-softmax``.
* torch's ``nn.RMSNorm`` (the local spec's ``WrappedTorchNorm`` without Apex) is the CPU
  composite: an fp32 copy of the input and the fp32 normalised tensor besides the fp32 rstd
  (``[devices.cpu]`` rmsin, rmsmid of ``data/engines.toml``): ``cpu-rmsnorm``.
* TP = 2 runs without sequence parallelism: ``WrappedTorchNorm`` asserts "sequence parallel not
  supported by torch LayerNorm" (the sequence-parallel norm of the local spec is Apex's
  ``FusedLayerNorm``, a CUDA extension).
* Flash attention is not available to the local spec (``DotProductAttention``): the layout the
  estimate is asked with is ``flash_attention=False``, the run's.

Named differences (:data:`parmem.engine_records.DIFFERENCES`; the byte functions are the
``*_bytes`` functions below, each citing its source). CPU artefacts (``gpu=False``):
``cpu-rmsnorm``, ``megatron-cpu-unfused-softmax`` and AdamW's ``adamw-step-counters``
(Megatron's fallback optimizer without TE or Apex). What a GPU run has too (``gpu=True``), not in
the profile because it has no term for it: ``megatron-distopt-param-padding``,
``megatron-distopt-grad-padding`` and ``megatron-distopt-shard-split`` (the distributed
optimizer's buffer aligns each parameter to 64 elements and the bucket to lcm(d, 128), and splits
the padded buffer, not the parameters, evenly over the d ranks: :func:`parmem.engine_records.distopt_layout`);
``megatron-moe-routed-tokens`` (dropless routing sends a data-dependent number of tokens to this
rank's experts; the profile counts the balanced s·b·k); ``megatron-ce-target-mask`` and
``megatron-vocab-parallel-input-mask`` (bool tensors of 1 byte per token, which the profile's
dtype symbols cannot express).

What the runs showed the ``megatron-core`` activation table was missing or wrong about, fixed in
``data/engines.toml`` (the local spec, ``flash_attention=False``): ``DotProductAttention`` keeps
K and V repeated to every query head under GQA; the unfused RoPE keeps cos and sin for Q and for
K in every layer; the cross-entropy keeps int64 target ids; the MoE dispatcher's
``masked_select`` keeps the transposed routing probabilities, and the experts keep no output (the
weighted SwiGLU applies the probabilities to the expert hidden).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from parmem._check import choice, integer
from parmem.engine_records import rmsnorm_elements

__all__ = [
    "ENGINE",
    "CASES",
    "ARCHS",
    "record",
    "model_spec",
    "cpu_patches",
]

ENGINE = "megatron-core"

_LLAMA = dict(
    vocab=256,
    hidden=64,
    layers=2,
    heads=4,
    kv_heads=2,
    head_dim=24,
    ffn=80,
    experts=0,
    top_k=0,
    expert_ffn=0,
    qk_norm=False,
)
#: tiny architectures: every width distinct (h = 64, query heads x head_dim = 96, key/value
#: heads x head_dim = 48, f = 80, expert f = 40), vocabulary 256 (a multiple of the profile's
#: 128 x t, so no padding)
ARCHS: dict[str, dict[str, Any]] = {
    "llama": dict(_LLAMA),
    "mixtral": dict(_LLAMA, experts=4, top_k=2, expert_ffn=40),
    "qwen3-moe": dict(_LLAMA, experts=4, top_k=2, expert_ffn=40, qk_norm=True),
}
_SEQ, _MB = 32, 2

#: case -> (world size, keyword arguments of :func:`record`)
CASES: dict[str, tuple[int, dict[str, Any]]] = {
    "llama-dp2": (2, dict(arch="llama")),
    "llama-dp2-distopt": (2, dict(arch="llama", distributed_optimizer=True)),
    "llama-tp2": (2, dict(arch="llama", tp=2)),
    "mixtral-ep2": (2, dict(arch="mixtral", ep=2)),
    "mixtral-ep2-distopt": (2, dict(arch="mixtral", ep=2, distributed_optimizer=True)),
    "qwen3-moe-ep2": (2, dict(arch="qwen3-moe", ep=2)),
}


def model_spec(arch: str):
    """The :class:`~parmem.model.ModelSpec` of the tiny architecture ``arch``."""
    from parmem.model import ModelSpec

    a = ARCHS[choice("arch", arch, tuple(ARCHS))]
    return ModelSpec(
        name=f"tiny-megatron-{arch}",
        vocab_size=a["vocab"],
        hidden=a["hidden"],
        layers=a["layers"],
        heads=a["heads"],
        kv_heads=a["kv_heads"],
        head_dim=a["head_dim"],
        ffn_hidden=a["expert_ffn"] or a["ffn"],
        ffn_kind="swiglu",
        norm="rmsnorm",
        position="rotary",
        max_positions=4 * _SEQ,
        num_experts=a["experts"],
        top_k=a["top_k"],
        expert_ffn_hidden=a["expert_ffn"],
        qk_norm=a["qk_norm"],
        dropout=0.0,
        source="parmem.distributed.runs_megatron_core.ARCHS (Megatron-Core GPTModel, local spec)",
    )


# ---------------------------------------------------------------------------- CPU patches
def _cuda_to_cpu_mode():
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaToCpu(TorchFunctionMode):
        """Patch 2 of the module doc: ``device="cuda"`` -> ``"cpu"``; ``Tensor.cuda()`` -> self."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            dev = kwargs.get("device")
            if dev is not None and torch.device(dev).type == "cuda":
                kwargs["device"] = "cpu"
            if func is torch.Tensor.cuda:
                return args[0]
            return func(*args, **kwargs)

    return CudaToCpu()


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """The five patches of the module doc, undone on leaving the ``with`` block."""
    import torch
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import moe_utils

    saved_device = torch.cuda.current_device
    saved_type = torch.Tensor.type
    had_gemm = hasattr(moe_utils, "te_general_gemm")

    def cuda_type(self, *args, **kwargs):  # patch 3
        name = saved_type(self, *args, **kwargs)
        if args or kwargs or ".cuda." in name:
            return name
        return name.replace("torch.", "torch.cuda.", 1)

    torch.cuda.current_device = lambda: "cpu"  # patch 1
    torch.Tensor.type = cuda_type
    if not had_gemm:
        moe_utils.te_general_gemm = None  # patch 5
    mrandom.initialize_rng_tracker(force_reset=True)
    tracker = mrandom.get_cuda_rng_tracker()
    tracker.fork = lambda *a, **k: contextlib.nullcontext()  # patch 4
    try:
        with _cuda_to_cpu_mode():
            yield
    finally:
        torch.cuda.current_device = saved_device
        torch.Tensor.type = saved_type
        if not had_gemm:
            del moe_utils.te_general_gemm
        del tracker.fork


# ---------------------------------------------------------------------------- the run
class _RegionMeter:
    """A :class:`parmem.measure.SavedTensorsMeter` that also notes in which region (set by
    forward pre-hooks) each distinct storage was first saved."""

    def __init__(self, exclude):
        from parmem.measure import SavedTensorsMeter

        self.region = "outside"
        self.regions: dict[tuple, str] = {}
        meter = SavedTensorsMeter(exclude=exclude)
        pack = meter._pack

        def pack_noting(t):
            from parmem.measure import storage_key_and_bytes

            key = storage_key_and_bytes(t)[0]
            if key not in meter._exclude and key not in meter._seen:
                self.regions[key] = self.region
            return pack(t)

        meter._pack = pack_noting  # type: ignore[method-assign]
        self.meter = meter

    def by_region(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, (n, _, _) in self.meter._seen.items():
            r = self.regions[key]
            out[r] = out.get(r, 0) + n
        return out

    def records(self, region: str) -> list[list]:
        return [
            [n, dt, list(shape)]
            for key, (n, dt, shape) in self.meter._seen.items()
            if self.regions[key] == region
        ]


def _config(arch: str, tp: int, ep: int):
    import torch
    from megatron.core.transformer import TransformerConfig

    a = ARCHS[arch]
    kw: dict[str, Any] = {}
    if a["experts"]:
        kw = dict(
            num_moe_experts=a["experts"],
            moe_router_topk=a["top_k"],
            moe_ffn_hidden_size=a["expert_ffn"],
            expert_model_parallel_size=ep,
        )
    return TransformerConfig(
        num_layers=a["layers"],
        hidden_size=a["hidden"],
        num_attention_heads=a["heads"],
        num_query_groups=a["kv_heads"],
        kv_channels=a["head_dim"],
        ffn_hidden_size=a["ffn"],
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        bias_activation_fusion=True,
        add_bias_linear=False,
        qk_layernorm=a["qk_norm"],
        hidden_dropout=0.0,
        attention_dropout=0.0,
        masked_softmax_fusion=False,
        use_cpu_initialization=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        tensor_model_parallel_size=tp,
        sequence_parallel=False,
        **kw,
    )


def _state(model, opt) -> dict[str, Any]:
    """params, grads, optimizer bytes (module doc) and the facts behind them."""
    import torch

    from parmem.measure import storage_key_and_bytes, tensor_storage_bytes

    params = list(model.module.parameters())
    bufs = list(model.buffers) + list(model.expert_parallel_buffers)
    p_bytes = tensor_storage_bytes(
        params + [b.param_data for b in bufs if b.param_data is not None]
    )
    inner = [o.optimizer for o in opt.chained_optimizers]
    masters = [p for o in inner for g in o.param_groups for p in g["params"]]
    grads = [p.grad for p in params] + [b.grad_data for b in bufs] + [p.grad for p in masters]
    g_bytes = tensor_storage_bytes([g for g in grads if g is not None])
    model_keys = {storage_key_and_bytes(p)[0] for p in params}
    states = [v for o in inner for st in o.state.values() for v in st.values()]
    states = [v for v in states if isinstance(v, torch.Tensor)]
    own = [m for m in masters if storage_key_and_bytes(m)[0] not in model_keys]
    return {
        "params": p_bytes,
        "grads": g_bytes,
        "optimizer": tensor_storage_bytes(states + own),
        "facts": {
            "param_tensors": sum(len(o.state) for o in inner),
            "model_param_tensors": len(params),
            "local_params": sum(p.numel() for p in params),
            "master_elements": sum(m.numel() for m in own),
            "state_tensors": len(states),
            "buffers": [
                {
                    "numel": b.grad_data.numel(),
                    "grad_dtype": str(b.grad_data.dtype),
                    "param_buffer": b.param_data is not None,
                    "expert": b in list(model.expert_parallel_buffers),
                }
                for b in bufs
            ],
            "param_dtypes": sorted({str(p.dtype) for p in params}),
        },
    }


def record(
    case: str,
    arch: str = "llama",
    tp: int = 1,
    ep: int = 1,
    distributed_optimizer: bool = False,
    seq_len: int = _SEQ,
    micro_batch: int = _MB,
) -> dict:
    """One Megatron-Core training step of case ``case`` on this rank (a
    :class:`parmem.distributed.Pool` worker); this rank's record (:mod:`parmem.engine_records`)."""
    import warnings

    import torch
    import torch.distributed as dist

    choice("arch", arch, tuple(ARCHS))
    integer("tp", tp, 1, 8)
    integer("ep", ep, 1, 8)
    integer("seq_len", seq_len, 4, 4096)
    integer("micro_batch", micro_batch, 1, 64)
    world, rank = dist.get_world_size(), dist.get_rank()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module

    a = ARCHS[arch]
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    dp_ranks = [ps.get_data_parallel_rank(), ps.get_expert_data_parallel_rank()]
    try:
        with cpu_patches(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = _config(arch, tp, ep)
            layer_spec = get_gpt_layer_local_spec(
                num_experts=a["experts"] or None,
                qk_layernorm=a["qk_norm"],
                normalization="RMSNorm",
            )
            gpt = GPTModel(
                cfg,
                layer_spec,
                vocab_size=a["vocab"],
                max_sequence_length=4 * seq_len,
                position_embedding_type="rope",
                share_embeddings_and_output_weights=False,
            )
            built_dtypes = sorted({str(p.dtype) for p in gpt.parameters()})
            model = DistributedDataParallel(
                cfg,
                DistributedDataParallelConfig(
                    grad_reduce_in_fp32=True, use_distributed_optimizer=distributed_optimizer
                ),
                Float16Module(cfg, gpt),
            )
            opt = get_megatron_optimizer(
                OptimizerConfig(
                    optimizer="adam",
                    lr=1e-3,
                    bf16=True,
                    use_distributed_optimizer=distributed_optimizer,
                    clip_grad=1.0,
                ),
                [model],
            )
            meter = _RegionMeter(exclude=list(gpt.parameters()))
            hooks = []

            def region(name):
                def pre(*_):
                    meter.region = name

                return pre

            hooks.append(gpt.embedding.register_forward_pre_hook(region("embedding")))
            for i, layer in enumerate(gpt.decoder.layers):
                hooks.append(layer.register_forward_pre_hook(region(f"layer{i}")))
            hooks.append(gpt.decoder.final_layernorm.register_forward_pre_hook(region("final")))
            hooks.append(gpt.output_layer.register_forward_pre_hook(region("head")))
            hooks.append(
                gpt.output_layer.register_forward_hook(lambda *_: setattr(meter, "region", "loss"))
            )
            moe_tokens, moe_hooks = _count_routed(gpt)
            # every rank of a tensor-parallel group reads the same tokens; data-parallel ranks
            # read their own
            g = torch.Generator().manual_seed(ps.get_data_parallel_rank())
            ids = torch.randint(0, a["vocab"], (micro_batch, seq_len), generator=g)
            pos = torch.arange(seq_len).repeat(micro_batch, 1)
            with meter.meter:
                loss = model(ids, pos, None, labels=ids)
            for h in hooks + moe_hooks:
                h.remove()
            loss.float().mean().backward()
            model.finish_grad_sync()
            ok, grad_norm, _ = opt.step()
            state = _state(model, opt)
    finally:
        ps.destroy_model_parallel()
    spec = model_spec(arch)
    num_params = sum(p.numel() for p in gpt.parameters())
    expected = _local_params(spec, tp, ep)
    if num_params != expected:
        raise AssertionError(
            f"{case}: the engine built {num_params} parameters on rank {rank}, "
            f"the spec counts {expected}"
        )
    by_region = meter.by_region()
    saved = sum(by_region.values())
    # the estimate's logits: the fp32 softmax of the logits vocab_parallel_cross_entropy keeps
    # (exp_logits, s x b x V/t); its bool target mask and int64 target ids stay activations
    logits = sum(n for n, dt, _ in meter.records("loss") if dt == "torch.float32")
    dp = world // tp
    parallel = dict(dp=dp, tp=tp, ep=ep, zero=1 if distributed_optimizer else 0)
    setup = dict(
        seq_len=seq_len,
        micro_batch=micro_batch,
        engine=ENGINE,
        flash_attention=False,
        dropout=False,
        precision="bf16-mixed",
        optimizer="adamw",
    )
    acts = ["cpu-rmsnorm", "megatron-cpu-unfused-softmax", "megatron-ce-target-mask"]
    if tp > 1:
        acts.append("megatron-vocab-parallel-input-mask")
    if a["experts"]:
        acts.append("megatron-moe-routed-tokens")
    named: dict[str, list[str]] = {
        "optimizer": ["adamw-step-counters"],
        "saved": list(acts),
        "activations": list(acts),
    }
    if distributed_optimizer:
        named["params"] = ["megatron-distopt-param-padding"]
        named["grads"] = ["megatron-distopt-grad-padding"]
        named["optimizer"].insert(0, "megatron-distopt-shard-split")
    facts = dict(state["facts"])
    facts.update(
        num_params=num_params,
        built_param_dtypes=built_dtypes,
        param_numels=[p.numel() for p in gpt.parameters()],
        param_names=[n for n, _ in gpt.named_parameters()],
        param_is_expert=[not getattr(p, "allreduce", True) for p in gpt.parameters()],
        saved_by_region=by_region,
        logits_saved=logits,
        routed_tokens=moe_tokens,
        dp_rank=dp_ranks[0],
        expert_dp_rank=dp_ranks[1],
        step_ok=bool(ok),
        grad_norm=float(grad_norm),
        loss=float(loss.detach().float().mean()),
    )
    rec = {
        "rank": rank,
        "stage": 0,
        "model": spec.to_dict(),
        "parallel": parallel,
        "setup": setup,
        "measured": {
            "params": state["params"],
            "grads": state["grads"],
            "optimizer": state["optimizer"],
            "saved": saved,
            "activations": saved - logits,
        },
        "named": {k: v for k, v in named.items() if v},
        "facts": facts,
        # (bytes, dtype, shape) of every saved storage of rank 0, the second layer left out
        "saved_records": {r: meter.records(r) for r in sorted(by_region) if r != "layer1"}
        if rank == 0
        else {},
        "notes": [
            "CPU patches 1-5 of parmem.distributed.runs_megatron_core (torch.cuda.current_device, "
            "device='cuda' -> 'cpu', Tensor.type() CUDA names, RNG tracker fork no-op, "
            "te_general_gemm = None)",
            "masked_softmax_fusion=False (the fused causal softmax is a CUDA extension)",
            "flash_attention=False: the local spec's DotProductAttention",
            "no sequence parallelism: WrappedTorchNorm refuses it",
        ],
    }
    facts["rmsnorm_elements"] = rmsnorm_elements(rec)
    return rec


def _count_routed(gpt) -> tuple[list[int], list[Any]]:
    """Per MoE layer, the number of (token, expert) pairs this rank's experts receive, filled by
    a forward pre-hook on the experts module (its ``tokens_per_expert`` argument); and the
    hooks' handles."""
    out: list[int] = []
    handles = []

    def note(i, mod, args, kwargs):
        tpe = args[1] if len(args) > 1 else kwargs["tokens_per_expert"]
        out[i] = int(tpe.sum())

    for layer in gpt.decoder.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            out.append(0)
            hook = functools.partial(note, len(out) - 1)
            handles.append(experts.register_forward_pre_hook(hook, with_kwargs=True))
    return out, handles


def _local_params(spec, tp: int, ep: int) -> int:
    """Parameters one rank holds (:func:`parmem.sharding.stage_params` over all layers)."""
    from parmem.sharding import stage_params

    return sum(stage_params(spec, tp, ep, spec.layers, True, True))
