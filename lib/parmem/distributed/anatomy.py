"""Where the memory goes, measured: one training step of a small GPT on every rank.

Each rank trains :class:`parmem.reference.TinyGPT` (16-bit weights, fp32 master weights and
AdamW moments, :class:`~parmem.reference.MixedPrecisionAdamW`) for one step under DDP with
``gradient_as_bucket_view=True``, and measures:

* parameters, gradients and optimizer states (:func:`parmem.measure.state_bytes`);
* activations kept for backward, logits included (:class:`parmem.measure.SavedTensorsMeter`).

:func:`demo` returns those beside :func:`parmem.estimate` for the same spec with d = world size,
and the small terms the estimate leaves out, each named and computed from its shape:

* ``norm_statistics``: every LayerNorm saves a mean and an rstd per token (16-bit on CPU,
  fp32 on CUDA), 2·(2L + 1)·s·b values (:func:`parmem.reference.norm_stat_bytes`);
* ``token_ids``, ``labels``, ``position_ids``: int64 indices the embedding and the loss keep;
* ``loss_weight``: a 0-d fp32 total weight the NLL loss keeps;
* ``adam_steps``: one 0-d fp32 ``step`` counter per parameter tensor;
* ``causal_mask_buffers``: the additive causal masks (a module buffer, not model state).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parmem.distributed.launcher import device, rank, world_size

__all__ = ["compare", "demo", "named_extras"]


def named_extras(
    spec,
    seq: int,
    batch: int,
    n_param_tensors: int,
    device="cpu",
    dtype=torch.bfloat16,
    *,
    layers: int | None = None,
    first: bool = True,
    last: bool = True,
    units: int = 1,
) -> dict:
    """The bytes :func:`parmem.estimate` leaves out on purpose for a
    :class:`parmem.reference.TinyGPT` of ``spec`` in ``dtype`` on ``device``, each from its shape
    (see the module doc), for ``units`` micro-batches of ``batch`` sequences of ``seq`` tokens.

    The whole model by default; a pipeline stage (:class:`parmem.distributed.pp.GPTStage`) of ``layers``
    layers, ``first`` (it holds the embeddings: token and position ids) and/or ``last`` (the final
    LayerNorm and the loss: labels, loss weight):

    * ``norm_statistics``: two LayerNorms per layer plus the final one
      (:func:`parmem.reference.norm_stat_bytes`);
    * ``token_ids``, ``position_ids`` (int64, s·b and s; the position table only), ``labels``
      (int64, s·b) and the 0-d fp32 ``loss_weight``;
    * ``adam_steps``: one 0-d fp32 ``step`` counter per parameter tensor (optimizer states);
    * ``causal_mask_buffers``: each layer's additive causal mask (a buffer, not model state).
    """
    from parmem.reference import norm_stat_bytes

    layers = spec.layers if layers is None else layers
    sb = seq * batch
    norms = 2 * layers + (1 if last else 0)
    mask = torch.empty((), dtype=dtype).element_size()
    return {
        "norm_statistics": units * norm_stat_bytes(sb, norms, spec.norm, device, dtype),
        "token_ids": units * 8 * sb if first else 0,
        "position_ids": units * 8 * seq if first and spec.position == "learned" else 0,
        "labels": units * 8 * sb if last else 0,
        "loss_weight": units * 4 if last else 0,
        "adam_steps": 4 * n_param_tensors,
        "causal_mask_buffers": layers * spec.max_positions**2 * mask,
    }


def demo(
    vocab: int = 512,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    seq: int = 32,
    batch: int = 2,
    tied: bool = False,
) -> dict:
    """One DDP training step of TinyGPT; per-rank measured bytes and the estimate."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.measure import SavedTensorsMeter, state_bytes
    from parmem.reference import MixedPrecisionAdamW, TinyGPT, tiny_spec

    spec = tiny_spec(vocab=vocab, hidden=hidden, layers=layers, heads=heads, seq=seq, tied=tied)
    dev = device()
    torch.manual_seed(0)  # same initial weights on every rank
    model = TinyGPT(spec).to(dev).train()
    ddp = DDP(model, gradient_as_bucket_view=True)
    opt = MixedPrecisionAdamW(model.parameters())
    g = torch.Generator().manual_seed(1234 + rank())  # each rank its own data shard
    ids = torch.randint(0, vocab, (seq, batch), generator=g).to(dev)
    labels = torch.randint(0, vocab, (seq, batch), generator=g).to(dev)
    with SavedTensorsMeter(exclude=model.parameters()) as meter:
        loss = ddp(ids, labels)
    loss.backward()
    opt.step()
    st = state_bytes(model, opt)
    est = estimate(
        spec, ParallelConfig(dp=world_size()), TrainingSetup(seq_len=seq, micro_batch=batch)
    ).stages[0]
    n_tensors = sum(1 for _ in model.parameters())
    # the weights must be identical on every rank after the all-reduced step
    flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    return {
        "rank": rank(),
        "loss": float(loss.detach()),
        "max_weight_diff_vs_rank0": float((flat - ref).abs().max()),
        "measured": {
            "params": st.params,
            "grads": st.grads,
            "optimizer": st.optimizer,
            "activations_and_logits": meter.bytes,
            "buffers": st.buffers,
        },
        "estimate": {
            "params": est.params,
            "grads": est.grads,
            "optimizer": est.optimizer,
            "activations": est.activations,
            "logits": est.logits,
        },
        "extras": named_extras(spec, seq, batch, n_tensors, dev),
        "num_params": spec.num_params(),
    }


def compare(result: dict, activations_label: str = "activations + logits") -> list[dict]:
    """Rows of measured vs estimated bytes for one rank's :func:`demo` result (or one stage of
    :func:`parmem.distributed.pp.demo_gpt`, which reports the same keys), with the named extras that
    explain every difference; ``unexplained`` is what is left (0 when theory holds)."""
    m, e, x = result["measured"], result["estimate"], result["extras"]
    act_extra = (
        x["norm_statistics"] + x["token_ids"] + x["labels"] + x["position_ids"] + x["loss_weight"]
    )
    rows = [
        ("parameters", m["params"], e["params"], 0, ""),
        ("gradients", m["grads"], e["grads"], 0, ""),
        ("optimizer states", m["optimizer"], e["optimizer"], x["adam_steps"], "Adam step counters"),
        (
            activations_label,
            m["activations_and_logits"],
            e["activations"] + e["logits"],
            act_extra,
            "norm statistics, token/label/position ids, loss weight",
        ),
        ("buffers", m["buffers"], 0, x["causal_mask_buffers"], "causal masks"),
    ]
    return [
        {
            "term": t,
            "measured": mv,
            "estimate": ev,
            "named extras": xv,
            "unexplained": mv - ev - xv,
            "what the extras are": why,
        }
        for t, mv, ev, xv, why in rows
    ]
