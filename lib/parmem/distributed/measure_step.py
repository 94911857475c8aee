"""One training step of a reader's shrunk model, measured on this rank (``parmem measure``'s worker).

:func:`step` runs in every rank of a :class:`parmem.distributed.Pool` (gloo on CPU; NCCL with one
GPU per rank, ``Pool(backend="nccl")``). For each config it is given (the shrunk model at the two
depths of :func:`parmem.measure_model.shrink`) it builds the model with Transformers from the
config (``AutoModelForCausalLM.from_config``, ``attn_implementation`` "sdpa" or "eager"), runs
one step of AdamW as the Trainer does (``train()``, the loss from ``labels``, ``use_cache=False``)
and returns, per depth, the bytes this rank held:

* ``params``, ``grads``, ``optimizer``: :func:`parmem.measure.state_bytes` after
  ``optimizer.step()``, before ``zero_grad`` (DTensor shards by their local part);
* ``saved``: :class:`parmem.measure.SavedTensorsMeter` around the forward (parameters
  excluded; under FSDP2 the unsharded parameters of the modules in their forward too);
* ``num_params``, ``param_tensors``: what Transformers built (the parent checks the count
  against the spec);
* ``peak`` on a GPU: ``torch.cuda.max_memory_allocated`` over the build and the step (reset
  first); ``None`` on CPU.

Modes. ``"ddp"``: the model in ``dtype`` (bf16: the ``hf`` profile's 16-bit weights, as
``from_pretrained(dtype="auto")`` keeps a 16-bit checkpoint) wrapped in
``DistributedDataParallel`` (``gradient_as_bucket_view`` from ``buckets``: Accelerate's default
is ``False``, "copy"). ``"fsdp2"``: the fp32 model, ``fully_shard`` on every decoder layer and
then the root with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, as torchtitan
applies FSDP2 (the ``fsdp2`` profile); every FSDP module sums its reduce-scatter without a
pre-multiplied divisor (gloo has no ``PREMUL_SUM``; the divisor is applied after, so the
gradients are the same). A parameter whose first dimension the ranks do not divide would be
padded by FSDP2, which the profile does not model: the run is refused by name (``refused``).

On a GPU the optimizer is ``AdamW(fused=True)`` under DDP (the Trainer's default
``adamw_torch_fused``), so its step counters are device memory as on CPU; the code path is the
same, with the device from :func:`parmem.distributed.launcher.device`. It is not run by the test suite
(no GPU there); the CPU path is.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

from parmem._check import choice, integer
from parmem.distributed.launcher import device as _device
from parmem.distributed.launcher import world_size
from parmem.measure import SavedTensorsMeter, state_bytes, storage_key_and_bytes

__all__ = ["step", "one_step", "build", "shard_fsdp2", "quiet"]

_MODES = ("ddp", "fsdp2")


def step(
    configs: list[dict[str, Any]],
    seq_len: int = 32,
    micro_batch: int = 1,
    dtype: str = "bf16",
    attn: str = "sdpa",
    mode: str = "ddp",
    buckets: str = "copy",
) -> list[dict[str, Any]]:
    """One measured step per config of ``configs`` on this rank (see the module doc)."""
    integer("seq_len", seq_len, 2, 1 << 16)
    integer("micro_batch", micro_batch, 1, 1 << 10)
    choice("dtype", dtype, ("bf16", "fp32"))
    choice("attn", attn, ("sdpa", "eager"))
    choice("mode", mode, _MODES)
    choice("buckets", buckets, ("copy", "view"))
    with quiet():
        return [one_step(c, seq_len, micro_batch, dtype, attn, mode, buckets) for c in configs]


@contextlib.contextmanager
def quiet():
    """Transformers' warnings about a config built without weights, and DTensor's about random
    ops on a CPU mesh, are not the reader's concern here."""
    import warnings

    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(level)


def build(cfg: dict[str, Any], attn: str, dtype: str):
    """The model of the Transformers config dict ``cfg`` (``AutoModelForCausalLM.from_config``
    with ``attn_implementation=attn``, no KV cache), in ``dtype`` (``"bf16"`` or ``"fp32"``),
    in training mode, seeded."""
    import torch
    import transformers

    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **kw)
    config.use_cache = False
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    return model.to(torch.bfloat16 if dtype == "bf16" else torch.float32).train()


def _layers(model) -> list:
    body = getattr(model, "model", None) or getattr(model, "transformer", None)
    layers = getattr(body, "layers", None) or getattr(body, "h", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers found (model.layers / h)")
    return list(layers)


def _uneven(model, d: int) -> str:
    """The first parameter whose first dimension ``d`` does not divide, or ``""``."""
    for name, p in model.named_parameters():
        if p.dim() and p.shape[0] % d:
            return f"{name} {tuple(p.shape)}"
    return ""


class _LiveParamsMeter(SavedTensorsMeter):
    """A :class:`SavedTensorsMeter` that also skips the storages in ``live`` at the moment a
    tensor is saved: FSDP2's unsharded parameters of the modules in their forward (the set is
    filled and emptied by forward hooks, so a storage freed and reused later is counted)."""

    def __init__(self, live: set) -> None:
        super().__init__()
        self._live = live

    def _pack(self, t):
        if storage_key_and_bytes(t)[0] in self._live:
            return t
        return super()._pack(t)


def shard_fsdp2(model, live: set) -> Any:
    """``fully_shard`` each decoder layer, then the root (torchtitan's policy), with forward
    hooks that keep ``live`` = the storages of the unsharded parameters in use."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(_device().type, (world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in _layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)

    held: dict[int, set] = {}

    def enter(mod, *_):  # runs after FSDP's own pre-forward: the parameters are unsharded
        held[id(mod)] = {storage_key_and_bytes(p)[0] for p in mod.parameters()}
        live.update(held[id(mod)])

    def leave(mod, *_):
        live.difference_update(held.pop(id(mod), set()))

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
            m.register_forward_pre_hook(enter)
            m.register_forward_hook(leave)
    return model


def one_step(
    cfg: dict[str, Any], seq_len: int, micro_batch: int, dtype: str, attn: str, mode: str,
    buckets: str,
) -> dict[str, Any]:  # fmt: skip
    """Build the model of ``cfg``, run one measured step, free it; the bytes (module doc)."""
    import torch
    import torch.distributed as dist

    dev = _device()
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    model = build(cfg, attn, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    d = world_size()
    out: dict[str, Any] = {"num_params": n_params, "param_tensors": n_tensors}
    live: set = set()
    if mode == "fsdp2":
        bad = _uneven(model, d)
        if bad:
            return {**out, "refused": f"FSDP2 pads {bad}: {d} ranks do not divide its first "
                    "dimension, and the fsdp2 profile does not model the padding; choose "
                    "--width-factor/--vocab/--dp so that they do"}  # fmt: skip
        model = shard_fsdp2(model.to(dev), live)
        module = model
        meter: SavedTensorsMeter = _LiveParamsMeter(live)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = model.to(dev)
        module = model
        model = DDP(model, gradient_as_bucket_view=buckets == "view")
        meter = SavedTensorsMeter(exclude=module.parameters())
    fused = {"fused": True} if cuda and mode == "ddp" else {}
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4, **fused)
    g = torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0)
    ids = torch.randint(0, int(cfg["vocab_size"]), (micro_batch, seq_len), generator=g).to(dev)
    with meter:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt.step()
    st = state_bytes(module, opt)
    out.update(
        params=st.params,
        grads=st.grads,
        optimizer=st.optimizer,
        saved=meter.bytes,
        peak=int(torch.cuda.max_memory_allocated(dev)) if cuda else None,
    )
    del model, module, opt, loss, meter
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out
