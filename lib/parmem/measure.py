"""Measured bytes, to hold the estimators to account.

Three meters, all counting each tensor *storage* once (two views of one buffer are one allocation):

* :class:`SavedTensorsMeter` - the bytes autograd keeps for the backward pass, observed with
  :func:`torch.autograd.graph.saved_tensors_hooks` (PyTorch docs, "Hooks for saved tensors").
  This is exactly the quantity Korthikanti et al. 2022 (§4) call "activation memory".
* :func:`state_bytes` - the live bytes of a module's parameters, gradients and buffers and of an
  optimizer's state on this rank. Distributed tensors (DTensor, as produced by FSDP2 and
  ``parallelize_module``) are counted by their local shard.
* :func:`cuda_peak_bytes` - ``torch.cuda.max_memory_allocated`` on a GPU (the caching
  allocator's high-water mark of live tensors).

And one measured step: :func:`loss_peak_bytes`, the bytes alive at once while the LM head's
loss runs forward and backward.

torch is imported lazily, so ``import parmem`` works without it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SavedTensorsMeter",
    "StateBytes",
    "state_bytes",
    "storage_key_and_bytes",
    "tensor_storage_bytes",
    "cuda_peak_bytes",
    "loss_peak_bytes",
]


def _local(t):
    """The local shard of a DTensor, or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_key_and_bytes(t) -> tuple[tuple, int]:
    """(key, bytes) of the storage behind tensor ``t`` (its local shard for a DTensor): the key
    (device type, device index, data pointer) is the same for every view of one allocation, so
    counting keys once counts each allocation once."""
    t = _local(t)
    st = t.untyped_storage()
    return (t.device.type, t.device.index, st.data_ptr()), st.nbytes()


def tensor_storage_bytes(tensors) -> int:
    """Total bytes of the distinct storages behind ``tensors`` (each storage counted once)."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        if t is None:
            continue
        key, n = storage_key_and_bytes(t)
        seen[key] = n
    return sum(seen.values())


class SavedTensorsMeter:
    """Count the bytes that autograd saves for backward inside a ``with`` block.

    Each saved tensor is recorded by the storage it lives in, so a tensor saved by two
    operations (the output of a LayerNorm that is also the input of the next Linear) or two
    views of one buffer (Q, K and V sliced from one QKV projection) count once. Parameters are
    excluded by default: they are model state, not activations.

    Example::

        with SavedTensorsMeter(exclude=model.parameters()) as meter:
            loss = model(x).sum()
        meter.bytes           # total activation bytes kept for backward
        meter.by_dtype        # {"torch.bfloat16": ..., "torch.bool": ..., "torch.float32": ...}

    Source: PyTorch, ``torch.autograd.graph.saved_tensors_hooks``.
    """

    def __init__(self, exclude=()):
        self._exclude = {storage_key_and_bytes(p)[0] for p in exclude}
        self._seen: dict[tuple, tuple[int, str, tuple]] = {}
        self._ctx = None

    def _pack(self, t):
        key, n = storage_key_and_bytes(t)
        if key not in self._exclude and key not in self._seen:
            self._seen[key] = (n, str(t.dtype), tuple(t.shape))
        return t

    @staticmethod
    def _unpack(t):
        return t

    def __enter__(self) -> SavedTensorsMeter:
        import torch

        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)

    @property
    def bytes(self) -> int:
        """Total bytes of distinct saved storages."""
        return sum(n for n, _, _ in self._seen.values())

    @property
    def by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for n, dtype, _ in self._seen.values():
            out[dtype] += n
        return dict(out)

    @property
    def records(self) -> list[tuple[int, str, tuple]]:
        """(bytes, dtype, shape of the first tensor seen) for every distinct saved storage."""
        return list(self._seen.values())


@dataclass(frozen=True)
class StateBytes:
    """Live model/optimizer state bytes on one rank (storages counted once)."""

    params: int
    grads: int
    optimizer: int
    buffers: int
    detail: dict = field(default_factory=dict, compare=False)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.buffers


def state_bytes(module, optimizer=None, extra_grad_buffers=()) -> StateBytes:
    """Measure parameter, gradient, buffer and optimizer-state bytes held by this rank.

    * parameters and their ``.grad`` (DTensor shards by their local part);
    * buffers registered on the module;
    * every tensor in ``optimizer.state`` (Adam's ``exp_avg``/``exp_avg_sq``, momentum, fp32
      masters kept as optimizer state; ZeroRedundancyOptimizer keeps only this rank's shard);
    * ``extra_grad_buffers``: tensors that hold gradients outside ``.grad`` (for example DDP's
      gradient buckets), counted in ``grads`` unless they share storage with a ``.grad``.

    The ``step`` counters Adam keeps (0-d tensors) are counted too: they are real bytes, and small.
    """
    params = list(module.parameters())
    p_bytes = tensor_storage_bytes(params)
    grads = [p.grad for p in params if p.grad is not None]
    g_all = tensor_storage_bytes([*grads, *extra_grad_buffers])
    b_bytes = tensor_storage_bytes(list(module.buffers()))
    o_tensors = []
    if optimizer is not None:
        import torch

        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    o_tensors.append(v)
    o_bytes = tensor_storage_bytes(o_tensors)
    return StateBytes(
        params=p_bytes,
        grads=g_all,
        optimizer=o_bytes,
        buffers=b_bytes,
        detail={
            "num_param_tensors": len(params),
            "num_grads": len(grads),
            "num_optimizer_tensors": len(o_tensors),
        },
    )


def cuda_peak_bytes(device=None, reset: bool = False) -> int:
    """``torch.cuda.max_memory_allocated`` (0 when CUDA is unavailable).

    With ``reset=True`` the peak counter is reset after reading, so the next call measures a
    fresh interval.
    """
    import torch

    if not torch.cuda.is_available():
        return 0
    peak = int(torch.cuda.max_memory_allocated(device))
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return peak


def loss_peak_bytes(tokens: int, vocab: int, hidden: int = 64, loss: Any = None) -> int:
    """The peak bytes of the LM head's loss, forward and backward, above the head's weight and
    its input: ``tokens`` rows of bf16 logits from a bias-free ``hidden`` → ``vocab`` linear
    layer, passed to ``loss`` (``loss(logits [1, tokens, vocab], targets [1, tokens])`` returning
    a scalar), then ``backward()``. By default ``loss`` is
    ``torch.nn.functional.cross_entropy`` on the logits cast to fp32, as a model without a fused
    loss does; :func:`parmem.engine_losses.engine_loss_peak_bytes` passes each engine's own.

    Measured on the CPU as the peak of live tensor storages that the operators create
    (:class:`parmem.traces.record_allocations`, a dispatch mode; PyTorch's own ``MemTracker``
    counts the same storages but takes 2.8 s to import), so the caller compares it with ``4·tokens·vocab``, the fp32
    logits the estimate keeps for the backward pass, and each engine profile's ``loss_peak``
    (bytes per logit) with it. The caller's reference to the bf16 logits is dropped after the
    loss, as a training loop's is.
    """
    from ._check import integer

    tokens = integer("tokens", tokens, 1, 1 << 16)
    vocab = integer("vocab", vocab, 2, 1 << 20)
    hidden = integer("hidden", hidden, 1, 1 << 12)
    if loss is not None and not callable(loss):
        raise ValueError(f"loss must be a function of (logits, targets), got {type(loss).__name__}")
    import torch
    import torch.nn.functional as F  # noqa: N812

    from .traces import record_allocations

    def plain(logits: Any, target: Any) -> Any:
        return F.cross_entropy(logits[0].float(), target[0])

    loss_fn = plain if loss is None else loss
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (1, tokens), generator=gen)
    held = x.numel() * 2 + weight.numel() * 2 + target.numel() * 8
    with record_allocations(track=(x, weight, target)) as rec:
        loss = loss_fn(F.linear(x, weight).view(1, tokens, vocab), target)
        loss.backward()
    total = rec.peak_bytes()
    # the loss scalar, x.grad and weight.grad are counted at their own moments; the returned
    # bytes are the peak less what existed before the head ran
    return total - held
