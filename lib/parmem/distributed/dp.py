"""Data parallelism measured: what every rank keeps, what DDP adds, and what it divides.

Two workers for a :class:`~parmem.distributed.Pool`:

:func:`demo` trains :class:`parmem.reference.TinyGPT` (bf16 weights, fp32 master weights and
AdamW moments, :class:`~parmem.reference.MixedPrecisionAdamW`, dropout off) for one step with
PyTorch DDP in its default configuration (``gradient_as_bucket_view=False``) on a **fixed global
batch** of B sequences, and measures on every rank:

* parameters, gradients and optimizer states (:func:`parmem.measure.state_bytes`) and DDP's
  gradient buckets (DDP's own report, ``_get_ddp_logging_data()["bucket_sizes"]``), beside
  :func:`parmem.estimate` with d = world size and ``grad_buckets="copy"``: the replicated
  2 + 2 + 12 bytes per parameter (Rajbhandari et al. 2020, §3.1) plus 2 bytes per parameter of
  buckets (Li et al. 2020, gradient bucketing; PyTorch's ``gradient_as_bucket_view`` documentation);
* the bytes autograd saves for backward (:class:`parmem.measure.SavedTensorsMeter`) twice: with
  d = 1 (the whole global batch in one process: the single-process reference) and with d = world
  size (this rank's B/d sequences under DDP). Both equal ``estimate(...).activations + logits``
  for b = B and b = B/d plus the small terms the estimate leaves out, each named and computed from
  its shape (:func:`parmem.distributed.anatomy.named_extras`). The estimate is linear in b, so a fixed
  global batch divides each rank's activations by d.

:func:`demo_activation_sharding` measures what ZeRO-3 (FSDP2 ``fully_shard``) and tensor
parallelism each do to one transformer layer: FSDP2 divides the layer's parameters by d and leaves
its saved activations exactly as they are on one process; Megatron tensor parallelism divides the
parameters and the activations inside the column/row-parallel region by t and leaves the
LayerNorm/dropout region (10sbh) replicated (Korthikanti et al. 2022, §4.2.1, Table 2).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parmem.distributed.launcher import device, rank, world_size

__all__ = ["ddp_bucket_sizes", "ddp_bucket_bytes", "demo", "compare", "demo_activation_sharding"]

_ACT_EXTRAS = ("norm_statistics", "token_ids", "labels", "position_ids", "loss_weight")


def ddp_bucket_sizes(ddp) -> list[int]:
    """Bytes of each of a DDP module's gradient buckets, as DDP reports them after a backward
    pass (``_get_ddp_logging_data()["bucket_sizes"]``: the buckets live in the C++ reducer)."""
    sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))
    return [int(s) for s in sizes.split(",") if s.strip()]


def ddp_bucket_bytes(ddp) -> int:
    """Bytes of all of a DDP module's gradient buckets (:func:`ddp_bucket_sizes`)."""
    return sum(ddp_bucket_sizes(ddp))


def _measured_activations(model, ids, labels):
    from parmem.measure import SavedTensorsMeter

    params = model.module.parameters() if hasattr(model, "module") else model.parameters()
    with SavedTensorsMeter(exclude=params) as meter:
        loss = model(ids, labels)
    return loss, meter.bytes


def demo(
    global_batch: int = 4,
    seq: int = 32,
    vocab: int = 512,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
) -> dict:
    """One DDP step of TinyGPT on a fixed global batch; per-rank bytes beside the estimate.

    Returns per rank: ``d`` (world size), ``global_batch`` (B), ``num_params`` (Ψ);
    ``activations``, ``activations_estimate`` and ``activation_extras`` (dicts keyed by d = 1 and
    d = world size: measured saved bytes, ``estimate().activations + logits``, and the named
    extras); ``states`` and ``states_estimate`` (params, grads, optimizer, buckets) and
    ``adam_steps`` (the 4-byte step counters, the only difference); ``loss_full`` (the loss of the
    whole batch in one process), ``loss_mean`` (the mean over ranks of the shard losses, which
    must equal it), and ``max_weight_diff_vs_rank0`` after the step (0: replicas identical).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.distributed.anatomy import named_extras
    from parmem.measure import state_bytes
    from parmem.reference import MixedPrecisionAdamW, TinyGPT, tiny_spec

    d, r, dev = world_size(), rank(), device()
    if global_batch < d or global_batch % d:
        raise ValueError(
            f"global_batch={global_batch} must be a positive multiple of world "
            f"size={d} (a fixed global batch is split evenly over the ranks)"
        )
    b = global_batch // d
    spec = tiny_spec(vocab=vocab, hidden=hidden, layers=layers, heads=heads, seq=seq)
    torch.manual_seed(0)  # same initial weights on every rank
    model = TinyGPT(spec, dropout_p=0.0).to(dev).train()
    g = torch.Generator().manual_seed(1234)  # the same global batch on every rank
    ids = torch.randint(0, vocab, (seq, global_batch), generator=g).to(dev)
    labels = torch.randint(0, vocab, (seq, global_batch), generator=g).to(dev)
    n_tensors = sum(1 for _ in model.parameters())

    def setup(micro_batch: int) -> TrainingSetup:
        return TrainingSetup(
            seq_len=seq, micro_batch=micro_batch, dropout=False, grad_buckets="copy"
        )

    act, act_est, act_extra = {}, {}, {}
    # d = 1: the whole global batch in this one process, no DDP: the single-process reference
    loss_full, act[1] = _measured_activations(model, ids, labels)
    loss_full = float(loss_full.detach())
    est1 = estimate(spec, ParallelConfig(), setup(global_batch)).stages[0]
    act_est[1] = est1.activations + est1.logits
    ex = named_extras(spec, seq, global_batch, n_tensors, dev)
    act_extra[1] = sum(ex[k] for k in _ACT_EXTRAS)

    # d = world size: DDP (default buckets), this rank's b = B/d sequences
    ddp = DDP(model)  # gradient_as_bucket_view=False, PyTorch's default
    opt = MixedPrecisionAdamW(model.parameters())
    mine = slice(r * b, (r + 1) * b)
    loss, act[d] = _measured_activations(
        ddp, ids[:, mine].contiguous(), labels[:, mine].contiguous()
    )
    loss.backward()
    opt.step()
    est = estimate(spec, ParallelConfig(dp=d), setup(b)).stages[0]
    act_est[d] = est.activations + est.logits
    ex = named_extras(spec, seq, b, n_tensors, dev)
    act_extra[d] = sum(ex[k] for k in _ACT_EXTRAS)

    st = state_bytes(model, opt)
    total = loss.detach().clone()
    dist.all_reduce(total)
    flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    return {
        "rank": r,
        "d": d,
        "global_batch": global_batch,
        "num_params": spec.num_params(),
        "activations": act,
        "activations_estimate": act_est,
        "activation_extras": act_extra,
        "states": {
            "params": st.params,
            "grads": st.grads,
            "optimizer": st.optimizer,
            "buckets": ddp_bucket_bytes(ddp),
        },
        "states_estimate": {
            "params": est.params,
            "grads": est.grads,
            "optimizer": est.optimizer,
            "buckets": est.comm_buffers,
        },
        "adam_steps": ex["adam_steps"],
        "loss_full": loss_full,
        "loss_mean": float(total) / d,
        "max_weight_diff_vs_rank0": float((flat - ref).abs().max()),
    }


def compare(result: dict) -> list[dict]:
    """Rows of measured vs estimated bytes for one rank's :func:`demo` result; ``unexplained`` is
    what the estimate and the named extras leave (0 when the theory holds)."""
    d = result["d"]
    m, e = result["states"], result["states_estimate"]
    rows = [
        ("parameters", m["params"], e["params"], 0, ""),
        ("gradients (.grad)", m["grads"], e["grads"], 0, ""),
        ("DDP gradient buckets", m["buckets"], e["buckets"], 0, "grad_buckets='copy'"),
        (
            "optimizer states",
            m["optimizer"],
            e["optimizer"],
            result["adam_steps"],
            "Adam step counters",
        ),
    ]
    for k in sorted({1, d}):
        b = result["global_batch"] // k
        rows.append(
            (
                f"activations + logits, d={k} (b={b})",
                result["activations"][k],
                result["activations_estimate"][k],
                result["activation_extras"][k],
                "norm statistics, token/label/position ids, loss weight",
            )
        )
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


def demo_activation_sharding(
    hidden: int = 32, heads: int = 4, seq: int = 16, batch: int = 2, dropout_p: float = 0.1
) -> dict:
    """Saved activations and parameters of one bf16 GPT layer: unsharded, ZeRO-3, TP.

    The same layer (:class:`parmem.reference.GPTLayer`, dropout ``dropout_p``, the same input on
    every rank) runs three ways: on one process; wrapped in FSDP2 ``fully_shard`` over all ranks
    (ZeRO-3: each rank stores 1/d of the parameters and all-gathers them for the computation);
    and tensor-parallel over all ranks (:class:`parmem.distributed.tp.ParallelGPTLayer`).

    The gathered weights that the linear layers save for backward are parameters, not
    activations: FSDP2 frees them after forward and gathers them again in backward, so they are
    excluded (the layer is unsharded explicitly first, so the meter knows their storages).

    Returns per rank ``saved_bytes`` and ``param_bytes`` for ``"single"``, ``"zero3"`` and
    ``"tp"``; ``out_equal_zero3`` (FSDP2's output is bit-identical to the single-process one:
    same weights, same dropout seed); ``table2`` (Korthikanti et al. 2022 Table 2 bytes for t = 1
    and t = world size) and ``norm_stat_bytes`` (LayerNorm mean and rstd, which Table 2 leaves
    out; replicated under TP).
    """
    from torch.distributed.fsdp import fully_shard

    from parmem.activations import per_layer_bytes
    from parmem.distributed.tp import ParallelGPTLayer
    from parmem.measure import SavedTensorsMeter, state_bytes
    from parmem.reference import GPTLayer, norm_stat_bytes

    n, dev, bf = world_size(), device(), torch.bfloat16
    if heads % n or (4 * hidden) % n:
        raise ValueError(f"world size={n} must divide heads={heads} and 4*hidden={4 * hidden}")
    torch.manual_seed(0)
    single = GPTLayer(hidden, heads, dropout_p=dropout_p, dtype=bf, max_seq_len=seq).to(dev)
    x = torch.randn(seq, batch, hidden, device=dev, dtype=bf)

    def run(layer, inp, exclude):
        torch.manual_seed(1)  # the same dropout masks in every variant
        inp = inp.clone().requires_grad_()
        with SavedTensorsMeter(exclude=exclude) as meter:
            out = layer(inp)
        out.float().sum().backward()
        return out.detach(), meter.bytes

    saved, params = {}, {}
    out_single, saved["single"] = run(single, x, list(single.parameters()))
    params["single"] = state_bytes(single).params

    zero3 = GPTLayer(hidden, heads, dropout_p=dropout_p, dtype=bf, max_seq_len=seq).to(dev)
    zero3.load_state_dict(single.state_dict())
    fully_shard(zero3)
    params["zero3"] = state_bytes(zero3).params  # this rank's shards (DTensor local parts)
    zero3.unshard()  # gather now, so the meter can tell the gathered weights from activations
    out_zero3, saved["zero3"] = run(zero3, x, list(zero3.parameters()))

    tp = ParallelGPTLayer(single)
    params["tp"] = state_bytes(tp).params
    _, saved["tp"] = run(tp, x, list(tp.parameters()))
    dist.barrier()
    return {
        "rank": rank(),
        "world_size": n,
        "saved_bytes": saved,
        "param_bytes": params,
        "out_equal_zero3": bool(torch.equal(out_zero3, out_single)),
        "table2": {
            1: per_layer_bytes(seq, batch, hidden, heads),
            n: per_layer_bytes(seq, batch, hidden, heads, tp=n),
        },
        "norm_stat_bytes": norm_stat_bytes(seq * batch, 2, device=dev, dtype=bf),
    }
