"""Uneven memory across data-parallel ranks, measured: each rank gets a different sequence length.

Data parallelism gives every rank the same model and the same number of sequences, but not the
same sequences: with variable-length data (no packing) one rank's micro-batch can be much longer
than another's, and activation memory grows with s (and with s² where the attention scores are
stored). :func:`demo` runs one training step of :class:`parmem.reference.TinyGPT` on every rank
with that rank's own sequence length and returns:

The optimizer is mixed-precision Adam written out in :func:`adam_step` (fp32 master weights and two
fp32 moments created at the first step, as :class:`parmem.reference.MixedPrecisionAdamW` keeps
them): ``torch.optim``'s first use imports TorchDynamo, seconds per rank on a small CPU.

* the bytes autograd saved for backward (:class:`parmem.measure.SavedTensorsMeter`), which must
  equal :func:`parmem.estimate`'s activations + logits for that s plus the named extras of
  :func:`parmem.distributed.anatomy.named_extras` (norm statistics, token/label/position ids, loss weight);
* every tensor allocation and free of the step (:func:`parmem.traces.record_allocations`),
  replayed through the CUDA caching allocator's rules (:func:`parmem.allocator.replay`), with and
  without expandable segments: the reserved memory that rank would hold on a GPU;
* on a CUDA device, also ``torch.cuda.memory_stats()`` peaks of the real allocator;
* the measured activation bytes of every rank (all-gathered), so each rank can report the spread.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parmem.distributed.launcher import device, rank, world_size

__all__ = ["adam_step", "demo"]


@torch.no_grad()
def adam_step(
    params,
    state: dict,
    lr: float = 1e-3,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
) -> None:
    """One Adam step on fp32 master copies of 16-bit ``params`` (Kingma & Ba 2015, Algorithm 1);
    ``state`` maps each parameter to its master copy and moments, created at the first step."""
    b1, b2 = betas
    for p in params:
        if p.grad is None:
            continue
        if p not in state:
            state[p] = {
                "master": p.detach().float().clone(),
                "step": 0,
                "exp_avg": torch.zeros_like(p, dtype=torch.float32),
                "exp_avg_sq": torch.zeros_like(p, dtype=torch.float32),
            }
        st = state[p]
        st["step"] += 1
        g = p.grad.float()
        st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (st["exp_avg_sq"] / (1 - b2 ** st["step"])).sqrt_().add_(eps)
        st["master"].addcdiv_(st["exp_avg"], denom, value=-lr / (1 - b1 ** st["step"]))
        p.copy_(st["master"])


def demo(
    seq_lens=(512, 256, 384, 320),
    hidden: int = 64,
    heads: int = 4,
    layers: int = 2,
    batch: int = 2,
    vocab: int = 512,
) -> dict:
    """One training step per rank at sequence length ``seq_lens[rank % len(seq_lens)]``."""
    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.allocator import replay
    from parmem.distributed.anatomy import named_extras
    from parmem.measure import SavedTensorsMeter
    from parmem.reference import TinyGPT, tiny_spec
    from parmem.traces import record_allocations

    r, dev = rank(), device()
    s = int(seq_lens[r % len(seq_lens)])
    spec = tiny_spec(vocab=vocab, hidden=hidden, layers=layers, heads=heads, seq=max(seq_lens))
    torch.manual_seed(0)
    model = TinyGPT(spec).to(dev).train()
    opt_state: dict = {}
    g = torch.Generator().manual_seed(100 + r)
    ids = torch.randint(0, vocab, (s, batch), generator=g).to(dev)
    labels = torch.randint(0, vocab, (s, batch), generator=g).to(dev)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    track = [*model.parameters(), *model.buffers(), ids, labels]
    with record_allocations(track=track) as rec:
        with SavedTensorsMeter(exclude=model.parameters()) as meter:
            loss = model(ids, labels)
        loss.backward()
        adam_step(list(model.parameters()), opt_state)
        del loss
    events = rec.finish()
    cuda_stats = {}
    if cuda:
        st = torch.cuda.memory_stats(dev)
        cuda_stats = {
            k: int(st[k])
            for k in (
                "allocated_bytes.all.peak",
                "reserved_bytes.all.peak",
                "requested_bytes.all.peak",
            )
        }
    est = estimate(
        spec, ParallelConfig(dp=world_size()), TrainingSetup(seq_len=s, micro_batch=batch)
    ).stages[0]
    n_tensors = sum(1 for _ in model.parameters())
    x = named_extras(spec, s, batch, n_tensors, dev)
    extras = (
        x["norm_statistics"] + x["token_ids"] + x["labels"] + x["position_ids"] + x["loss_weight"]
    )
    classic = replay(events)
    expandable = replay(events, expandable_segments=True)
    mine = torch.tensor([meter.bytes], dtype=torch.int64, device=dev)  # NCCL: on the GPU
    every = [torch.zeros_like(mine) for _ in range(world_size())]
    dist.all_gather(every, mine)
    return {
        "rank": r,
        "seq_len": s,
        "activations": meter.bytes,
        "activations_estimate": est.activations + est.logits,
        "named_extras": extras,
        "unexplained": meter.bytes - est.activations - est.logits - extras,
        "activations_all_ranks": [int(t.item()) for t in every],
        "events": len(events),
        "requested_peak": classic.peak_requested,
        "allocated_peak": classic.peak_allocated,
        "reserved_peak": classic.peak_reserved,
        "reserved_peak_expandable": expandable.peak_reserved,
        "cuda": cuda_stats,
    }
