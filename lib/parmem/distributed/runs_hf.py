"""The Transformers Trainer's own training step on CPU gloo ranks, what every rank held, beside
the ``hf`` profile (``scripts/record_engine_runs.py --engine hf``; the records are read by
:mod:`parmem.engine_records`).

Each case builds a tiny Transformers 5.23 causal LM from a config (:data:`TINY`: Llama, Mixtral,
Qwen3-MoE), in bf16 (``from_config(dtype=torch.bfloat16)``: what ``from_pretrained`` does with
a 16-bit checkpoint and ``dtype="auto"``) with SDPA attention, and runs one optimizer step of
``transformers.Trainer`` on it: ``TrainingArguments(bf16=True, use_cpu=True, max_steps=1,
report_to=[], save_strategy="no", dataloader_num_workers=0)``, the default optimizer
(``adamw_torch_fused``: ``torch.optim.AdamW(fused=True)``) and an in-memory dataset of
``micro_batch`` sequences per rank (``input_ids`` with ``labels`` equal to them). The Trainer
does all of it through Accelerate 1.16's ``Accelerator`` (``Trainer.
create_accelerator_and_postprocess``): ``accelerator.prepare`` wraps the model in
``DistributedDataParallel`` (Accelerate's ``DistributedDataParallelKwargs``:
``gradient_as_bucket_view=False``, ``bucket_cap_mb=25``; the Trainer sets
``find_unused_parameters=True`` for a model without gradient checkpointing) and wraps its
forward in ``torch.autocast(dtype=torch.bfloat16)`` (``mixed_precision="bf16"``). The precision
the profile models for this is ``"bf16"``: 16-bit weights, gradients and AdamW moments (the
moments are ``zeros_like`` the parameters), no fp32 master copy; autocast on bf16 weights casts
nothing (its weight casts return the bf16 parameters themselves) and keeps the ``bf16`` layer
table (measured: equal to it to the byte).

The worker sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` from the pool's process group, which Accelerate's ``PartialState`` (CPU:
``DistributedType.MULTI_CPU``, gloo) finds initialised and uses; Accelerate's shared state is
reset before and after every case, so cases can follow each other in one pool.

Measured per rank, by a ``TrainerCallback`` at ``on_optimizer_step`` (after
``optimizer.step()``, before the Trainer's ``model.zero_grad()``):

* ``params``, ``grads``, ``optimizer``: :func:`parmem.measure.state_bytes` of the model and the
  optimizer under Accelerate's ``AcceleratedOptimizer``;
* ``comm_buffers``: DDP's gradient buckets, the sizes the reducer reports
  (``DistributedDataParallel._get_ddp_logging_data()["bucket_sizes"]``, bytes); with
  ``gradient_as_bucket_view=False`` they are a second copy of the gradients (``grad_buckets=
  "copy"``);
* ``saved``: the distinct storages autograd saved during the model's forward (a
  :class:`parmem.measure.SavedTensorsMeter` entered by a forward pre-hook and left by a forward
  hook on the Transformers model, so the forward the Trainer runs, loss included), the storages
  of the parameters the model holds at that moment left out. Held against the estimate's
  ``activations + logits``.

What the CPU run changes: the device (``use_cpu=True``); Accelerate places the model on
``torch.device("cpu", 0)`` (the local rank modulo the device count), and ``Module.to`` copies
every CPU parameter once for it, so the parameters the forward sees are not the ones built (the
meter reads them at the forward). Nothing else: Llama's, Mixtral's and Qwen3-MoE's layers keep
the same tensors on CPU and CUDA without dropout (``[devices]`` of ``data/engines.toml``: their
RMSNorm is Transformers' own, not ``nn.RMSNorm``).

Named differences (:data:`parmem.engine_records.DIFFERENCES`), both real on a GPU:

* ``adamw-fused-step-counters`` (``optimizer``): the fused AdamW keeps each parameter
  tensor's ``step`` as a 0-d fp32 tensor on the parameter's device;
* ``trainer-loss-divisor`` (``saved``): the Trainer passes ``num_items_in_batch`` to the model,
  and the loss's division by it keeps the 0-d fp32 divisor.

Left out (:data:`REFUSED`): FSDP. The ``hf`` profile models the Trainer without sharding
(``zero_stages = [0]``); :func:`fsdp_step` runs the Trainer with Accelerate's FSDP2 plugin (on
CPU only through ``_cpu_fsdp_trainer``) and returns the measurement beside what the
estimate can be asked instead. What that run shows: Accelerate upcasts the bf16 weights to fp32
before ``fully_shard`` (``fsdp2_prepare_model``: fp32 master weights whenever
``mixed_precision`` is not ``"no"``) and computes in bf16 (``MixedPrecisionPolicy(param_dtype=
bf16, reduce_dtype=bf16)``), so each rank holds 4 + 4 + 8 bytes per parameter over d (plus the
step counters): the ``fsdp2`` profile's states at ``zero=3``. The layers keep the ``hf``
profile's bf16 table (torchtitan's table, the ``fsdp2`` profile's, is another model's code), the
all-gather output is a layer's bf16 weights as in the ``fsdp2`` profile, but the reduce-scatter
input is bf16 (the ``fsdp2`` profile: fp32, torchtitan's ``reduce_dtype``), and FSDP2's
``cast_forward_inputs`` casts the Trainer's ``num_items_in_batch`` to bf16 (a 2-byte divisor,
which rounds a token count above 256 to 8 significant bits).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from parmem._check import choice, integer

__all__ = [
    "ENGINE",
    "TINY",
    "CASES",
    "REFUSED",
    "SEQ_LEN",
    "MICRO_BATCH",
    "tiny_config",
    "record",
    "fsdp_step",
]

#: the parmem profile these runs are held against
ENGINE = "hf"

_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=40, vocab_size=512)
#: Tiny configs (Transformers ``model_type`` -> config fields; two layers each, untied
#: embeddings). Llama: h = 128, query width 4 x 40 = 160, key/value width 2 x 40 = 80,
#: f = 224, V = 512. Mixtral: h = 64, 4 experts of f = 96, top-2. Qwen3-MoE: h = 64, 4 experts of
#: f = 48, top-2, per-head q/k RMSNorms, ``norm_topk_prob`` false (its default); every layer is
#: an MoE layer (``decoder_sparse_step`` 1), so ``intermediate_size`` builds nothing.
TINY: dict[str, dict[str, Any]] = {
    "llama": dict(_ATTN, hidden_size=128, intermediate_size=224),
    "mixtral": dict(
        _ATTN, hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2
    ),
    "qwen3_moe": dict(
        _ATTN,
        hidden_size=64,
        intermediate_size=160,
        moe_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
    ),
}
_LAYERS = 2
#: tokens per sequence and sequences per rank (``per_device_train_batch_size``)
SEQ_LEN, MICRO_BATCH = 32, 2

#: case -> (world size, keyword arguments of :func:`record`)
CASES: dict[str, tuple[int, dict]] = {
    "ddp-llama": (2, {"family": "llama"}),
    "ddp-mixtral": (2, {"family": "mixtral"}),
    "ddp-qwen3-moe": (2, {"family": "qwen3_moe"}),
}

#: cases not recorded, and why (see :func:`fsdp_step`)
REFUSED: dict[str, str] = {
    "fsdp-llama": (
        "the hf profile models the Trainer without sharding (zero_stages = [0]: 'The Trainer "
        "alone neither shards'); with Accelerate's FSDP2 plugin the Trainer upcasts the bf16 "
        "weights to fp32 shards (fsdp2_prepare_model), which is the fsdp2 profile's model "
        "states (engine='fsdp2', zero=3), while the layers keep the hf profile's bf16 table, "
        "not torchtitan's: no single profile models the run (fsdp_step reports both sides)"
    ),
}

#: the Trainer's settings every case shares (TrainingArguments keywords)
_ARGS: dict[str, Any] = dict(
    max_steps=1,
    use_cpu=True,
    bf16=True,
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    eval_strategy="no",
    dataloader_num_workers=0,
    disable_tqdm=True,
    ddp_backend="gloo",
)


def tiny_config(family: str):
    """The Transformers config of :data:`TINY` ``family`` (two layers, ``use_cache=False``)."""
    import transformers

    choice("family", family, tuple(TINY))
    return transformers.AutoConfig.for_model(
        family, **TINY[family], num_hidden_layers=_LAYERS, use_cache=False
    )


def _env() -> None:
    """The variables Accelerate's CPU state reads (``get_cpu_distributed_information``), from
    the process group the pool initialised."""
    import torch.distributed as dist

    r, w = dist.get_rank(), dist.get_world_size()
    os.environ.update(
        RANK=str(r),
        WORLD_SIZE=str(w),
        LOCAL_RANK=str(r),
        LOCAL_WORLD_SIZE=str(w),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=os.environ.get("MASTER_PORT", "29500"),
    )


def _reset() -> None:
    """Forget Accelerate's shared state (a singleton per process) and the variables
    ``TrainingArguments`` exports, so the next case starts afresh in the same rank."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    for k in [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_"))]:
        del os.environ[k]


def _meter(model):
    """A :class:`parmem.measure.SavedTensorsMeter` that leaves out the storages of the
    parameters ``model`` holds when a tensor is saved: the DDP parameters, or the unsharded
    bf16 parameters FSDP2 swaps in for a layer's forward (and frees after it, so a later
    activation may reuse their addresses: they are never recorded)."""
    from parmem.measure import SavedTensorsMeter, storage_key_and_bytes

    class Meter(SavedTensorsMeter):
        def _pack(self, t):
            held = {storage_key_and_bytes(p)[0] for p in model.parameters()}
            if storage_key_and_bytes(t)[0] in held:
                return t
            return super()._pack(t)

    return Meter()


def _cpu_fsdp_trainer():
    """``transformers.Trainer`` whose Accelerate state takes the FSDP plugin on CPU.
    Accelerate 1.16 (``AcceleratorState.__init__``, state.py) turns a ``fsdp_plugin`` into
    ``DistributedType.FSDP`` only for accelerator types (``MULTI_GPU``, ``MULTI_XPU``, ...);
    under ``MULTI_CPU`` it drops the plugin and the Trainer runs DDP. This subclass sets what
    that branch sets (the plugin, its mixed precision, the distributed type) right after the
    Trainer creates its ``Accelerator``."""
    import transformers
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    class CpuFsdpTrainer(transformers.Trainer):
        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            state = self.accelerator.state
            plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
            plugin.set_mixed_precision(state.mixed_precision)
            state.distributed_type = DistributedType.FSDP
            state.fsdp_plugin = plugin
            self.is_fsdp_enabled = True

    return CpuFsdpTrainer


def _train(family: str, fsdp: bool, seq_len: int, micro_batch: int) -> dict[str, Any]:
    """One Trainer step of the tiny ``family`` model on this rank; what it held."""
    import torch
    import torch.distributed as dist
    import transformers

    from parmem.distributed.engine_runs import record_comms
    from parmem.measure import state_bytes
    from parmem.model import ModelSpec

    _env()
    _reset()
    cfg = tiny_config(family)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
    )
    spec = ModelSpec.from_hf_config(cfg.to_dict(), name=f"tiny-{family}")
    num_params = sum(p.numel() for p in model.parameters())
    if spec.num_params() != num_params:
        raise AssertionError(f"spec counts {spec.num_params()}, the model has {num_params}")
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(micro_batch * dist.get_world_size()):
        ids = torch.randint(0, cfg.vocab_size, (seq_len,), generator=g)
        data.append({"input_ids": ids, "labels": ids})

    box: dict[str, Any] = {}

    def enter(mod, *_):  # runs after FSDP2's own pre-forward (the root's weights unsharded)
        box["meter"] = _meter(mod).__enter__()

    def leave(*_):
        box["meter"].__exit__(None, None, None)

    hooks = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
    trainer: Any = None

    class Probe(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if fsdp:  # Accelerate's FSDP2 divides itself: its own reduction, no forced sum
                box["comms"] = record_comms(trainer.model_wrapped, force_sum=False)

        def on_optimizer_step(self, args, state, control, **kw):
            opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
            wrapped = trainer.model_wrapped
            box["wrapper"] = type(wrapped).__name__
            box["states"] = state_bytes(trainer.model, opt)
            box["optimizer"] = (type(opt).__name__, bool(opt.defaults.get("fused")))
            box["state_dtypes"] = sorted(
                {
                    f"{k}:{str(v.dtype).removeprefix('torch.')}:{v.device.type}"
                    for s in opt.state.values()
                    for k, v in s.items()
                    if isinstance(v, torch.Tensor)
                }
            )
            box["param_dtypes"] = sorted(
                {str(p.dtype).removeprefix("torch.") for p in trainer.model.parameters()}
            )
            acc = trainer.accelerator
            box["accelerator"] = {
                "autocast": bool(acc.native_amp),
                "mixed_precision": str(acc.mixed_precision),
                "distributed_type": str(acc.distributed_type),
            }
            if hasattr(wrapped, "_get_ddp_logging_data"):
                box["ddp"] = wrapped._get_ddp_logging_data()

    kw: dict[str, Any] = {}
    if fsdp:
        layer_cls = type(model.model.layers[0]).__name__
        kw = dict(
            fsdp=True,
            fsdp_config={
                "version": 2,
                "reshard_after_forward": True,
                "transformer_layer_cls_to_wrap": [layer_cls],
            },
        )
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="parmem-hf-"),
        per_device_train_batch_size=micro_batch,
        seed=0,
        **_ARGS,
        **kw,
    )
    cls = _cpu_fsdp_trainer() if fsdp else transformers.Trainer
    try:
        trainer = cls(model=model, args=args, train_dataset=data, callbacks=[Probe()])
        trainer.train()
    finally:
        for h in hooks:
            h.remove()
        _reset()
    meter = box["meter"]
    return {
        "spec": spec,
        "num_params": num_params,
        "states": box["states"],
        "saved": meter.bytes,
        "saved_by_dtype": meter.by_dtype,
        "saved_records": meter.records,
        **{k: box[k] for k in ("wrapper", "optimizer", "state_dtypes", "param_dtypes")},
        "ddp": box.get("ddp"),
        "comms": box.get("comms"),
        **box["accelerator"],
    }


def _setup(seq_len: int, micro_batch: int) -> dict[str, Any]:
    """The :class:`~parmem.config.TrainingSetup` fields of the runs: bf16 weights (the Trainer's
    bf16=True on a bf16 model), AdamW, SDPA, DDP's copying buckets."""
    return dict(
        seq_len=seq_len,
        micro_batch=micro_batch,
        precision="bf16",
        optimizer="adamw",
        flash_attention=True,
        grad_buckets="copy",
        engine=ENGINE,
    )


def record(
    case: str, family: str, seq_len: int = SEQ_LEN, micro_batch: int = MICRO_BATCH
) -> dict[str, Any]:
    """Pool worker: one Trainer step (DDP) of case ``case`` on this rank; returns the rank's
    record (:mod:`parmem.engine_records`)."""
    import torch.distributed as dist

    integer("seq_len", seq_len, 2, 4096)
    integer("micro_batch", micro_batch, 1, 64)
    r = _train(family, False, seq_len, micro_batch)
    st, ddp = r["states"], r["ddp"]
    buckets = [int(x) for x in str(ddp["bucket_sizes"]).split(",") if x.strip()]
    if int(ddp["gradient_as_bucket_view"]):
        raise AssertionError("DDP ran with gradient_as_bucket_view=True: the buckets are views")
    return {
        "rank": dist.get_rank(),
        "stage": 0,
        "model": r["spec"].to_dict(),
        "parallel": {"dp": dist.get_world_size()},
        "setup": _setup(seq_len, micro_batch),
        "measured": {
            "params": st.params,
            "grads": st.grads,
            "optimizer": st.optimizer,
            "comm_buffers": sum(buckets),
            "saved": r["saved"],
        },
        "named": {
            "optimizer": ["adamw-fused-step-counters"],
            "saved": ["trainer-loss-divisor"],
        },
        "facts": {
            "num_params": r["num_params"],
            "param_tensors": st.detail["num_param_tensors"],
            "grad_tensors": st.detail["num_grads"],
            "optimizer_tensors": st.detail["num_optimizer_tensors"],
            "buffers": st.buffers,
            "optimizer": f"{r['optimizer'][0]}(fused={r['optimizer'][1]})",
            "optimizer_state": r["state_dtypes"],
            "param_dtypes": r["param_dtypes"],
            "wrapper": r["wrapper"],
            "ddp_bucket_sizes": buckets,
            "ddp_bucket_cap_bytes": int(ddp["bucket_cap_bytes"]),
            "ddp_gradient_as_bucket_view": bool(int(ddp["gradient_as_bucket_view"])),
            "distributed_type": r["distributed_type"],
            "mixed_precision": r["mixed_precision"],
            "autocast": r["autocast"],
            "saved_by_dtype": r["saved_by_dtype"],
            "tokens_per_rank": seq_len * micro_batch,
        },
        "notes": [
            "Trainer(use_cpu=True) on gloo ranks: Accelerate's MULTI_CPU DDP",
            "Accelerate moves the model to torch.device('cpu', 0): Module.to copies each "
            "CPU parameter once; the saved-tensor meter leaves out the parameters the model "
            "holds at the forward",
        ],
    }


def _estimate_or_refusal(spec, parallel: dict, setup: dict) -> Any:
    """The estimate's stage 0, or the text of the ``ValueError`` that refuses it."""
    from parmem import ParallelConfig, TrainingSetup, estimate

    try:
        return estimate(spec, ParallelConfig(**parallel), TrainingSetup(**setup)).stages[0]
    except ValueError as e:
        return str(e)


def fsdp_step(
    family: str = "llama", seq_len: int = SEQ_LEN, micro_batch: int = MICRO_BATCH
) -> dict[str, Any]:
    """Pool worker: one Trainer step with Accelerate's FSDP2 plugin (``fsdp_config``
    ``version=2``, full shard, one FSDP module per decoder layer plus the root) on this rank,
    beside what the estimate can be asked (the case of :data:`REFUSED`).

    Returns the measured ``params``, ``grads``, ``optimizer`` (this rank's shards),
    ``param_tensors``, ``saved`` (the unsharded parameters left out), the largest all-gather
    output and reduce-scatter input of a decoder layer (bytes, dtype), and ``hf`` (the ``hf``
    profile asked with ``zero=3``: the text of its refusal), ``fsdp2`` (the ``fsdp2``
    profile's stage 0 with ``zero=3``, precision ``bf16-mixed``) and ``hf_ddp`` (the ``hf``
    profile's stage 0 for DDP, whose layer tables the run keeps)."""
    import torch.distributed as dist

    r = _train(family, True, seq_len, micro_batch)
    st, d = r["states"], dist.get_world_size()
    spec = r["spec"]
    layers = [k.split(":", 1)[1] for k in r["comms"] if k.startswith("all_gather:model.layers")]
    gather = max(r["comms"][f"all_gather:{n}"][0] for n in layers)
    reduce = max(r["comms"][f"reduce_scatter:{n}"][0] for n in layers)
    fsdp2 = dict(_setup(seq_len, micro_batch), engine="fsdp2", precision="bf16-mixed")
    del fsdp2["grad_buckets"]
    return {
        "rank": dist.get_rank(),
        "num_params": r["num_params"],
        "params": st.params,
        "grads": st.grads,
        "optimizer": st.optimizer,
        "param_tensors": st.detail["num_param_tensors"],
        "saved": r["saved"],
        "all_gather": gather,
        "reduce_scatter": reduce,
        "wrapper": r["wrapper"],
        "state_dtypes": r["state_dtypes"],
        "param_dtypes": r["param_dtypes"],
        "hf": _estimate_or_refusal(spec, {"dp": d, "zero": 3}, _setup(seq_len, micro_batch)),
        "fsdp2": _estimate_or_refusal(spec, {"dp": d, "zero": 3}, fsdp2),
        "hf_ddp": _estimate_or_refusal(spec, {"dp": d}, _setup(seq_len, micro_batch)),
    }
