"""Training steps of a full-size model, timed on this rank (the GPU check's worker).

:func:`timed` builds a Transformers model from a config dict
(:func:`parmem.measure_model.preset_config` of a :class:`~parmem.model.ModelSpec`), shards it as
the ``fsdp2`` profile describes (``fully_shard`` on every decoder layer and the root,
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, fp32 master weights:
:func:`parmem.distributed.measure_step` builds and shards it the same way), and runs ``warmup``
then ``steps`` training steps of AdamW on one micro-batch of random tokens each (forward with the
loss from ``labels``, backward, ``optimizer.step()``, ``zero_grad``), each timed from a device
synchronisation to the next. It returns the step times (seconds) and
``torch.cuda.max_memory_allocated`` over the build and the steps on a GPU (``None`` on CPU).

On a GPU the optimizer is ``AdamW(fused=True)`` (torchtitan's default implementation); on CPU
the default one. The step time of a CPU run means nothing for a GPU's; the test suite runs the
CPU path only to hold the code to account (``scripts/gpu_check.py`` runs it on a GPU).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from parmem._check import integer
from parmem.distributed.launcher import device as _device
from parmem.distributed.measure_step import build, quiet, shard_fsdp2

__all__ = ["timed"]


def timed(
    cfg: dict[str, Any],
    seq_len: int,
    micro_batch: int,
    steps: int = 10,
    warmup: int = 3,
    recompute: bool = False,
) -> dict[str, Any]:
    """Time ``steps`` training steps (after ``warmup`` untimed ones) of the model of ``cfg``
    on this rank (see the module doc). ``recompute``: every decoder layer checkpointed in full
    (Transformers' ``gradient_checkpointing_enable``, non-reentrant ``torch.utils.checkpoint``
    around each layer: the ``fsdp2`` profile's ``recompute="full"``)."""
    import torch
    import torch.distributed as dist

    integer("seq_len", seq_len, 2, 1 << 20)
    integer("micro_batch", micro_batch, 1, 1 << 10)
    integer("steps", steps, 1, 1000)
    integer("warmup", warmup, 0, 1000)
    dev = _device()
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    with quiet():
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        model = build(cfg, "sdpa", "fp32")
        if recompute:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model = shard_fsdp2(model.to(dev), set())
        n_params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **({"fused": True} if cuda else {}))
        g = torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0)
        ids = torch.randint(0, int(cfg["vocab_size"]), (micro_batch, seq_len), generator=g)
        ids = ids.to(dev)
        times = []
        for i in range(warmup + steps):
            sync()
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        peak = int(torch.cuda.max_memory_allocated(dev)) if cuda else None
        del model, opt, loss
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return {"step_s": times, "peak": peak, "num_params": n_params}
