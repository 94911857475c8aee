"""Each training engine's own loss, run on the CPU, and the peak bytes it makes.

:func:`engine_loss_peak_bytes` passes an engine's loss function to
:func:`parmem.measure.loss_peak_bytes`, which records the storages its forward and backward
create (:class:`parmem.traces.record_allocations`); each engine profile's ``loss_peak`` of
``data/engines.toml`` (bytes per logit at the loss's peak, :func:`parmem.estimate.loss_transient`)
is held against it in ``tests/test_measure.py``. The engines are imported only when their loss
is asked for (the chapters never import this module).

Sources: Transformers 5.23.0 ``transformers/loss/loss_utils.py`` (``ForCausalLMLoss``);
torchtitan 0.3.0 ``torchtitan/components/loss.py`` (``cross_entropy_loss``); Megatron-Core 0.16.1
``megatron/core/tensor_parallel/cross_entropy.py`` (``vocab_parallel_cross_entropy``). torchtitan
0.3.0's chunked loss is measured by
:func:`parmem.distributed.runs_fsdp2.chunked_loss_peak_bytes` (it imports torchtitan under the placeholders of :mod:`parmem.distributed.engine_runs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._check import choice
from .measure import loss_peak_bytes

__all__ = ["LOSS_ENGINES", "engine_loss", "engine_loss_peak_bytes"]

#: the engine profiles whose own loss :func:`engine_loss` returns, and what it runs
LOSS_ENGINES = {
    "hf": "Transformers' ForCausalLMLoss (transformers/loss/loss_utils.py)",
    "deepspeed": "Transformers' ForCausalLMLoss (DeepSpeed trains the Transformers model)",
    "fsdp2": "torchtitan's cross_entropy_loss (torchtitan/components/loss.py)",
    "megatron-core": "Megatron-Core's vocab_parallel_cross_entropy (tensor_parallel/cross_entropy.py)",
}


def engine_loss(engine: str, tp: bool = False) -> Callable[[Any, Any], Any]:
    """The loss of ``engine`` (:data:`LOSS_ENGINES`) as ``f(bf16 logits [1, T, V], int64
    targets [1, T]) -> scalar``; with ``tp``, the loss it runs under tensor parallelism (the
    vocabulary sharded over the TP group; this process's group stands for it). A loss that
    all-reduces needs a process group: Megatron-Core's at any ``t`` (a group of one rank is
    made if none exists) and torchtitan's under TP (``_LossParallelCrossEntropy``, what its
    ``cross_entropy_loss`` runs when the logits are vocab-sharded); run it on a rank,
    ``parmem.distributed.Pool(world_size=1).run("parmem.engine_losses:engine_loss_peak_bytes",
    ...)``. Transformers' loss has no TP form (``hf`` and ``deepspeed`` refuse t > 1)."""
    engine = choice("engine", engine, tuple(LOSS_ENGINES))
    if tp and engine in ("hf", "deepspeed"):
        raise ValueError(f"engine={engine!r} has no tensor-parallel loss (tp=True)")
    if engine in ("hf", "deepspeed"):
        from transformers.loss.loss_utils import ForCausalLMLoss

        # ForCausalLMLoss shifts the labels itself (it pads them: all T logits are scored)
        return lambda logits, target: ForCausalLMLoss(logits, target, vocab_size=logits.shape[-1])
    import torch.distributed as dist

    if (tp or engine == "megatron-core") and not dist.is_initialized():
        raise ValueError(
            f"engine={engine!r} needs a process group (its loss all-reduces over the "
            "tensor-parallel group): run it on a rank, parmem.distributed.Pool(world_size=1)"
            ".run('parmem.engine_losses:engine_loss_peak_bytes', ...)"
        )
    if engine == "fsdp2":
        from torchtitan.components import loss as tt  # type: ignore[import-untyped]

        if not tp:
            return tt.cross_entropy_loss
        group = dist.group.WORLD
        # cross_entropy_loss's vocab-sharded branch: the local fp32 logits, summed
        return lambda logits, target: tt._LossParallelCrossEntropy.apply(
            logits.flatten(0, 1).float(), target.flatten(0, 1), group, logits.shape[-1], "sum"
        )
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
    # Megatron's logits are [s, b, V] and its labels [s, b] (language_module.py transposes them)
    return lambda logits, target: vocab_parallel_cross_entropy(
        logits.transpose(0, 1), target.transpose(0, 1)
    ).sum()


def engine_loss_peak_bytes(
    engine: str, tokens: int, vocab: int, hidden: int = 64, tp: bool = False
) -> int:
    """:func:`parmem.measure.loss_peak_bytes` with the loss of ``engine`` (under tensor
    parallelism with ``tp``): the peak bytes of its forward and backward above the LM head's
    weight and input, measured on the CPU."""
    return loss_peak_bytes(tokens, vocab, hidden, loss=engine_loss(engine, tp))
