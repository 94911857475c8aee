"""Data parallelism and ZeRO: DDP, DDP + ``ZeroRedundancyOptimizer`` (ZeRO-1), FSDP2 (ZeRO-3).

Rajbhandari et al. 2020 (ZeRO) §5: with d data-parallel ranks, stage 1 shards the optimizer
states, stage 2 also the gradients, stage 3 also the parameters. :func:`demo` trains the same
fp32 MLP with Adam three ways for a few steps, on a global batch split over the ranks, and
returns per rank: the largest parameter difference from single-process training on the whole
batch, and the measured parameter / gradient / optimizer-state bytes
(:func:`parmem.measure.state_bytes`: DTensor shards by their local part, storages once) beside
:func:`parmem.model_state_bytes` for fp32 Adam (4 + 4 + 8 bytes per parameter).

Differences from the estimate that are real and named, not hidden in a tolerance:

* Adam keeps a ``step`` counter per parameter tensor (a 0-d fp32 tensor, 4 bytes each), which
  the per-parameter formula leaves out: ``optimizer_bytes = estimate + 4 · n_tensors``.
* ``ZeroRedundancyOptimizer`` shards whole tensors (greedy by size), not a flat buffer, so its
  shard is Ψ/d only when the tensors divide evenly (they do for the default model at d = 2, 4);
  ``owned_params`` is the count it assigned to this rank.

:func:`demo_ddp_buckets` shows DDP's hidden gradient copy: with the default
``gradient_as_bucket_view=False`` the all-reduce buckets are a second 4Ψ bytes beside ``.grad``;
with ``True`` each ``.grad`` is a view into its bucket.

:func:`demo_comm` records the collectives of one training step of DDP and of DDP +
``ZeroRedundancyOptimizer``: DDP's gradient all-reduces through a communication hook, the
optimizer's parameter broadcasts by wrapping ``torch.distributed.broadcast``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parmem.distributed.launcher import device, rank, world_size

__all__ = ["make_model", "demo", "demo_ddp_buckets", "demo_losses", "demo_comm"]


def make_model(layers: int = 4, hidden: int = 64) -> nn.Sequential:
    """``layers`` × (Linear(h, h) → tanh), fp32; Ψ = layers · (h² + h)."""
    return nn.Sequential(
        *[m for _ in range(layers) for m in (nn.Linear(hidden, hidden), nn.Tanh())]
    )


def _batches(steps: int, batch: int, hidden: int, dev):
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(batch, hidden, generator=g).to(dev),
            torch.randn(batch, hidden, generator=g).to(dev),
        )
        for _ in range(steps)
    ]


def _train(model, opt, batches, shard) -> list:
    """Train; return the (full) gradients of the first step, before any update."""
    first: list = []
    for x, y in batches:
        opt.zero_grad()
        nn.functional.mse_loss(model(shard(x)), shard(y)).backward()
        if not first:
            first = [_full(p.grad).detach().clone() for p in model.parameters()]
        opt.step()
    return first


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _start(layers: int, hidden: int, batch: int):
    """World size, rank, device, the seeded reference model and a copy of its initial weights."""
    d, r, dev = world_size(), rank(), device()
    if batch % d:
        raise ValueError(f"batch={batch} must be divisible by world size={d}")
    torch.manual_seed(0)
    ref = make_model(layers, hidden).to(dev)
    return d, r, dev, ref, {k: v.clone() for k, v in ref.state_dict().items()}


def demo(
    layers: int = 4, hidden: int = 64, steps: int = 3, batch: int = 16, lr: float = 1e-2
) -> dict:
    """DDP, ZeRO-1 and FSDP2 against single-process Adam; per-rank state bytes vs. the estimate.

    Returns per rank ``num_params`` (Ψ), ``num_tensors`` and, for ``ddp``, ``zero1``, ``fsdp2``:
    ``grad_err`` (max abs difference of the first step's all-reduced gradient from the
    full-batch gradient), ``param_err`` (of the full parameters after ``steps`` Adam steps: Adam's
    update m/√v turns last-bit differences of near-zero gradients into differences of a step's
    size, so this is looser than ``grad_err``),
    ``params``/``grads``/``optimizer`` measured and ``*_estimate`` from
    :func:`parmem.model_state_bytes` (fp32, d = world size, ZeRO 0/1/3); ZeRO-1 adds
    ``owned_params``/``owned_tensors``; on CUDA each adds ``cuda_peak`` (max allocated bytes).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parmem import model_state_bytes
    from parmem.measure import cuda_peak_bytes

    d, r, dev, ref, init = _start(layers, hidden, batch)
    n_params = sum(p.numel() for p in ref.parameters())
    n_tensors = len(list(ref.parameters()))
    data = _batches(steps, batch, hidden, dev)
    ref_grads = _train(ref, torch.optim.Adam(ref.parameters(), lr=lr), data, lambda t: t)

    def local(t):
        return t.chunk(d)[r]

    def fresh():
        m = make_model(layers, hidden).to(dev)
        m.load_state_dict(init)
        return m

    out: dict = {"num_params": n_params, "num_tensors": n_tensors}
    # DDP: everything replicated
    cuda_peak_bytes(reset=True)  # each variant's CUDA peak is its own (no-op on CPU)
    ddp = DDP(fresh())
    opt = torch.optim.Adam(ddp.parameters(), lr=lr)
    grads = _train(ddp, opt, data, local)
    out["ddp"] = _row(
        ddp.module, opt, ref, model_state_bytes(n_params, d, 0, "fp32"), grads, ref_grads
    )
    # ZeRO-1: optimizer states sharded by whole tensors
    cuda_peak_bytes(reset=True)  # each variant's CUDA peak is its own (no-op on CPU)
    ddp = DDP(fresh())
    zopt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    grads = _train(ddp, zopt, data, local)
    row = _row(
        ddp.module, zopt.optim, ref, model_state_bytes(n_params, d, 1, "fp32"), grads, ref_grads
    )
    owned = [p for g in zopt.optim.param_groups for p in g["params"]]
    row["owned_params"], row["owned_tensors"] = sum(p.numel() for p in owned), len(owned)
    out["zero1"] = row
    # FSDP2: parameters, gradients and optimizer states sharded (ZeRO-3)
    cuda_peak_bytes(reset=True)  # each variant's CUDA peak is its own (no-op on CPU)
    model = fresh()
    for lin in model:
        if isinstance(lin, nn.Linear):
            fully_shard(lin)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    grads = _train(model, opt, data, local)
    out["fsdp2"] = _row(
        model, opt, ref, model_state_bytes(n_params, d, 3, "fp32"), grads, ref_grads
    )
    return out


def _row(model, opt, ref, est, grads, ref_grads) -> dict:
    from parmem.measure import cuda_peak_bytes, state_bytes

    sb = state_bytes(model, opt)
    extra = {"cuda_peak": cuda_peak_bytes()} if torch.cuda.is_available() else {}
    err = max(
        float((_full(p).detach() - q.detach()).abs().max())
        for p, q in zip(model.parameters(), ref.parameters(), strict=True)
    )
    grad_err = max(float((a - b).abs().max()) for a, b in zip(grads, ref_grads, strict=True))
    return {
        "grad_err": grad_err,
        "param_err": err,
        "params": sb.params,
        "params_estimate": est.params,
        "grads": sb.grads,
        "grads_estimate": est.grads,
        "optimizer": sb.optimizer,
        "optimizer_estimate": est.optimizer,
        **extra,
    }


def demo_ddp_buckets(layers: int = 4, hidden: int = 64) -> dict:
    """DDP's gradient buckets with ``gradient_as_bucket_view`` False and True.

    ``grads``: distinct storages behind ``.grad`` (a view into a bucket shares its storage, so with
    ``True`` this *is* the bucket memory). ``buckets``: DDP's own report of its bucket sizes
    (``_get_ddp_logging_data()["bucket_sizes"]``; the buckets themselves are internal to the C++
    reducer). ``grad_views_share_buckets``: every ``.grad`` lives in a storage of a bucket's size.
    On CUDA, ``cuda_allocated`` is the allocator's growth from DDP construction to after backward.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parmem import model_state_bytes
    from parmem.distributed.dp import ddp_bucket_sizes
    from parmem.measure import state_bytes

    d, dev = world_size(), device()
    out: dict = {}
    for view in (False, True):
        torch.manual_seed(0)
        model = make_model(layers, hidden).to(dev)
        n = sum(p.numel() for p in model.parameters())
        cuda = dev.type == "cuda"
        before = torch.cuda.memory_allocated(dev) if cuda else 0
        ddp = DDP(model, gradient_as_bucket_view=view)
        ddp(torch.randn(8, hidden, device=dev)).sum().backward()
        sizes = ddp_bucket_sizes(ddp)
        grads = state_bytes(model).grads
        share = all(p.grad.untyped_storage().nbytes() in sizes for p in model.parameters())
        row = {
            "grads": grads,
            "buckets": sum(sizes),
            "grad_views_share_buckets": share,
            "gradient_memory": grads if view else grads + sum(sizes),
            "grads_estimate": model_state_bytes(n, d, 0, "fp32").grads,
        }
        if cuda:
            row["cuda_allocated"] = torch.cuda.memory_allocated(dev) - before
        out["view" if view else "copy"] = row
        del ddp
    dist.barrier()
    return out


def demo_losses(
    layers: int = 4, hidden: int = 64, steps: int = 5, batch: int = 16, lr: float = 1e-2
) -> dict:
    """The loss curve of single-process Adam beside DDP, ZeRO-1 and FSDP2 on the same batches.

    Every variant starts from the same weights and sees the same ``steps`` global batches of
    ``batch`` samples; the distributed ones split each batch evenly over the ranks. A step's loss
    is taken before the update; for the distributed runs it is the mean over ranks of the shard
    losses, which is the full-batch mean-squared error because the shards are equal. Returns
    ``{"reference" | "ddp" | "zero1" | "fsdp2": [loss per step]}``, the same list on every rank,
    and ``max_diff``: the largest difference of a distributed curve from the reference (float
    rounding: the ranks sum the same numbers in another order).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    d, r, dev, ref, init = _start(layers, hidden, batch)
    data = _batches(steps, batch, hidden, dev)

    def curve(model, opt, distributed: bool) -> list[float]:
        out = []
        for x, y in data:
            if distributed:
                x, y = x.chunk(d)[r], y.chunk(d)[r]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            value = loss.detach().clone()
            if distributed:
                dist.all_reduce(value)
                value /= d
            out.append(float(value))
        return out

    def fresh():
        m = make_model(layers, hidden).to(dev)
        m.load_state_dict(init)
        return m

    curves = {"reference": curve(ref, torch.optim.Adam(ref.parameters(), lr=lr), False)}
    ddp = DDP(fresh())
    curves["ddp"] = curve(ddp, torch.optim.Adam(ddp.parameters(), lr=lr), True)
    ddp = DDP(fresh())
    curves["zero1"] = curve(
        ddp,
        ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr),
        True,
    )
    model = fresh()
    for lin in model:
        if isinstance(lin, nn.Linear):
            fully_shard(lin)
    fully_shard(model)
    curves["fsdp2"] = curve(model, torch.optim.Adam(model.parameters(), lr=lr), True)
    diff = max(
        abs(a - b)
        for k in ("ddp", "zero1", "fsdp2")
        for a, b in zip(curves[k], curves["reference"], strict=True)
    )
    return {**curves, "max_diff": diff}


def demo_comm(layers: int = 4, hidden: int = 64, batch: int = 16, lr: float = 1e-2) -> dict:
    """The collectives one training step issues under DDP and under DDP + ZeRO-1
    (``ZeroRedundancyOptimizer``), recorded, not assumed.

    DDP's all-reduces run in its C++ reducer, so a communication hook
    (``register_comm_hook``) records each bucket's bytes before the default all-reduce; the
    optimizer's ``_sync_params`` calls ``torch.distributed.broadcast``, which is wrapped to record
    the source rank and the bytes of each call. Only the step is recorded (DDP's one-time
    broadcast of the initial weights is not). Returns ``num_params`` and, for ``ddp`` and
    ``zero1``: ``all_reduce`` (bucket sizes in bytes), ``broadcast`` (``[src, bytes]`` pairs) and
    ``bytes_sent``: this rank's bytes under the ring and chain algorithms of
    :mod:`parmem.comm` (a rank sends in every broadcast but the one whose tail it is, the rank just
    before the source).
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parmem.comm import all_reduce_bytes, broadcast_bytes

    d, r, dev, ref, init = _start(layers, hidden, batch)
    ((x, y),) = _batches(1, batch, hidden, dev)
    out: dict = {"num_params": sum(p.numel() for p in ref.parameters())}
    for name in ("ddp", "zero1"):
        model = make_model(layers, hidden).to(dev)
        model.load_state_dict(init)
        ddp = DDP(model)
        rec: dict = {"all_reduce": [], "broadcast": []}

        def hook(state, bucket, rec=rec):
            buf = bucket.buffer()
            rec["all_reduce"].append(buf.numel() * buf.element_size())
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, hook)
        if name == "ddp":
            opt = torch.optim.Adam(ddp.parameters(), lr=lr)
        else:
            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
        original = dist.broadcast

        def counting(tensor, src, *args, rec=rec, original=original, **kwargs):
            rec["broadcast"].append([src, tensor.numel() * tensor.element_size()])
            return original(tensor, src, *args, **kwargs)

        dist.broadcast = counting
        try:
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x.chunk(d)[r]), y.chunk(d)[r]).backward()
            opt.step()
        finally:
            dist.broadcast = original
        rec["bytes_sent"] = sum(all_reduce_bytes(n, d) for n in rec["all_reduce"]) + sum(
            broadcast_bytes(n, d) for src, n in rec["broadcast"] if (src - 1) % d != r
        )
        out[name] = rec
    return out
