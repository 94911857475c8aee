"""Two parallel axes at once: tensor parallelism inside groups of t ranks, data parallelism
(plain, or ZeRO-1) across the d = world / t groups.

Ranks are ordered as in Megatron-LM, tensor-parallel rank varying fastest: rank = i_dp · t + i_tp.
The t ranks of a TP group are neighbours (on a cluster: inside one node, on NVLink); the d ranks
of a DP group are t apart. Each DP replica is a :class:`~parmem.distributed.tp.TPGPT` (the tiny GPT of
:mod:`parmem.distributed.tp`, :class:`parmem.reference.TinyGPT`, sharded over its TP group) and trains on
its own b sequences of the global batch of d · b.

After the backward pass every rank's local gradients are flattened into one buffer (as
Megatron-LM's contiguous gradient buffer) and reduced over the DP group:

* ``zero=0``: one all-reduce, then divide by d; Adam on every local parameter;
* ``zero=1`` (Rajbhandari et al. 2020 §5.1; Megatron-LM's distributed optimizer): one
  reduce-scatter, Adam on this rank's 1/d shard of the flat parameters only (so its two moments
  are 1/d of the size), then an all-gather of the updated parameters.

Parameters live in one flat buffer too (every parameter is a view into it) so that the shard
Adam updates is the parameters themselves, not a copy.

Every collective is recorded while the step runs: the f/g operators of :mod:`parmem.distributed.tp`
(which call ``torch.distributed.all_reduce`` and ``all_gather``) and the DP reduction. For each the
record holds the size of the full tensor and the group size; :func:`parmem.comm.collective_bytes`
turns it into bytes sent per rank with the ring algorithm (the ring itself is measured on real
sends in :mod:`parmem.distributed.collectives`). :func:`demo` compares the totals with
:func:`parmem.comm.step_comm` for the same layout. Three collectives of the tiny GPT are not in
that model (it counts transformer layers only) and are named: the vocabulary-parallel
embedding's forward all-reduce, the LM head's backward all-reduce (its f operator) and the
all-gather of the logits (Megatron-LM fuses a vocabulary-parallel cross-entropy instead).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from parmem.distributed.launcher import device, rank, world_size

__all__ = ["make_groups", "CommLog", "demo"]


def make_groups(t: int):
    """(tp_group, dp_group, i_tp, i_dp) of this rank for tensor-parallel size ``t``.

    Every rank creates every group, in the same order (``new_group`` is collective)."""
    n, r = world_size(), rank()
    if t < 1 or n % t:
        raise ValueError(f"tp={t} must divide the world size {n}")
    d = n // t
    tp_group = dp_group = None
    for i in range(d):
        ranks = list(range(i * t, (i + 1) * t))
        g = dist.new_group(ranks)
        if r in ranks:
            tp_group = g
    for j in range(t):
        ranks = list(range(j, n, t))
        g = dist.new_group(ranks)
        if r in ranks:
            dp_group = g
    return tp_group, dp_group, r % t, r // t


class CommLog:
    """Records collectives: (category, what, op, size of the full tensor in bytes, group size).

    Inside ``with log.patch(category, group):`` calls to ``torch.distributed.all_reduce`` and
    ``torch.distributed.all_gather`` (list form) are recorded too; ``add`` records a collective
    issued explicitly."""

    def __init__(self):
        self.ops: list[tuple[str, str, str, int, int]] = []

    def add(self, category: str, what: str, op: str, size: int, n: int) -> None:
        if n > 1 and size:
            self.ops.append((category, what, op, size, n))

    @contextlib.contextmanager
    def patch(self, category: str, what: str = "tensor-parallel"):
        real_ar, real_ag = dist.all_reduce, dist.all_gather

        def all_reduce(t, *args, group=None, **kw):
            self.add(
                category,
                what,
                "all_reduce",
                t.numel() * t.element_size(),
                dist.get_world_size(group),
            )
            return real_ar(t, *args, group=group, **kw)

        def all_gather(parts, t, *args, group=None, **kw):
            self.add(
                category,
                what,
                "all_gather",
                sum(p.numel() * p.element_size() for p in parts),
                dist.get_world_size(group),
            )
            return real_ag(parts, t, *args, group=group, **kw)

        dist.all_reduce, dist.all_gather = all_reduce, all_gather
        try:
            yield self
        finally:
            dist.all_reduce, dist.all_gather = real_ar, real_ag

    def bytes_by(self, category: str, op: str | None = None) -> int:
        """Bytes this rank sends for the recorded collectives of ``category`` (ring algorithm)."""
        from parmem.comm import collective_bytes

        return sum(
            collective_bytes(o, s, n)
            for c, _, o, s, n in self.ops
            if c == category and (op is None or o == op)
        )


def _flatten_params(model: nn.Module, pad_to: int) -> torch.Tensor:
    """Move every parameter into one flat buffer (padded to a multiple of ``pad_to``) and make
    each parameter a view into it; returns the buffer."""
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    flat = torch.zeros(-(-n // pad_to) * pad_to, dtype=params[0].dtype, device=params[0].device)
    i = 0
    for p in params:
        k = p.numel()
        flat[i : i + k].copy_(p.data.reshape(-1))
        p.data = flat[i : i + k].view_as(p)
        i += k
    return flat


def demo(
    tp: int = 1,
    zero: int = 0,
    vocab: int = 64,
    hidden: int = 32,
    heads: int = 4,
    layers: int = 2,
    seq: int = 16,
    batch: int = 2,
    lr: float = 1e-3,
) -> dict:
    """One Adam step of a d × t layout (d = world / ``tp``) against one process on the whole batch.

    ``batch`` is b, the sequences per replica (global batch d · b). Returns per rank:

    * ``d``, ``t``, ``zero``; ``grad_err`` (the DP-reduced gradient shard against the
      single-process gradient, sliced as this rank's TP shard) and ``param_err`` (parameters after
      one Adam step against single-process Adam), fp32;
    * ``params``, ``grads``, ``optimizer``: bytes measured with :func:`parmem.measure.state_bytes`
      (Adam's moments for the flat shard, and its 4-byte ``step`` counter), beside
      ``*_estimate`` from :func:`parmem.estimate` (fp32, AdamW, ZeRO ``zero`` over d);
    * ``tp_bytes``, ``dp_bytes``: bytes sent for the recorded collectives, beside
      ``tp_bytes_model`` / ``dp_bytes_model`` from :func:`parmem.comm.step_comm` and
      ``tp_bytes_extras`` (the three named collectives outside the model's layers);
      ``tp_collectives``, ``dp_collectives``: how many were issued.
    """
    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.comm import all_gather_bytes, all_reduce_bytes, step_comm
    from parmem.distributed.collectives import all_gather_tensor, reduce_scatter_tensor
    from parmem.distributed.tp import TPGPT, tp_slice
    from parmem.measure import state_bytes
    from parmem.reference import TinyGPT, tiny_spec

    if zero not in (0, 1):
        raise ValueError(f"zero={zero!r} must be 0 or 1 in this demo")
    n, dev = world_size(), device()
    tp_group, dp_group, i_tp, i_dp = make_groups(tp)
    t, d = tp, n // tp
    for name, v in (("heads", heads), ("vocab", vocab), ("4*hidden", 4 * hidden)):
        if v % t:
            raise ValueError(f"{name}={v} must be divisible by tp={t}")

    spec = tiny_spec(
        vocab=vocab, hidden=hidden, layers=layers, heads=heads, seq=seq, position="rotary"
    )
    torch.manual_seed(0)
    full = TinyGPT(spec, dtype=torch.float32, dropout_p=0.0).to(dev)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, vocab, (seq, d * batch), generator=g).to(dev)
    target = torch.randint(0, vocab, (seq, d * batch), generator=g).to(dev)

    def loss_of(model, cols):
        logits = model(tokens[:, cols])
        return nn.functional.cross_entropy(logits.flatten(0, 1), target[:, cols].flatten())

    # single-process reference: the whole global batch, one Adam step
    model = TPGPT(full, tp_group).to(dev)  # built before the reference step changes `full`
    ref_opt = torch.optim.Adam(full.parameters(), lr=lr)
    loss_of(full, slice(None)).backward()
    ref_grads = [p.grad.detach().clone() for p in full.parameters()]
    ref_opt.step()

    flat = _flatten_params(model, pad_to=d if zero else 1)
    shard = flat.numel() // d
    mine = slice(i_dp * shard, (i_dp + 1) * shard) if zero else slice(None)
    master = nn.Parameter(flat[mine])  # a view: Adam updates the model's own parameters
    opt = torch.optim.Adam([master], lr=lr)

    log = CommLog()
    with log.patch("tp"):
        loss_of(model, slice(i_dp * batch, (i_dp + 1) * batch)).backward()
    grads = torch.zeros_like(flat)
    torch.cat(
        [p.grad.reshape(-1) for p in model.parameters()],
        out=grads[: sum(p.numel() for p in model.parameters())],
    )
    size = grads.numel() * grads.element_size()
    if zero == 0:
        log.add("dp", "gradient all-reduce", "all_reduce", size, d)
        dist.all_reduce(grads, group=dp_group)
        reduced = grads / d
    else:
        log.add("dp", "gradient reduce-scatter", "reduce_scatter", size, d)
        reduced = torch.empty(shard, device=dev)
        reduce_scatter_tensor(reduced, grads, group=dp_group)
        reduced /= d
    ref_flat = torch.zeros_like(flat)
    torch.cat(
        [
            tp_slice(gr, p, i_tp, t).reshape(-1)
            for gr, p in zip(ref_grads, model.parameters(), strict=True)
        ],
        out=ref_flat[: sum(p.numel() for p in model.parameters())],
    )
    grad_err = float((reduced - ref_flat[mine]).abs().max())
    sb = state_bytes(model)  # parameters and gradients, before the step
    master.grad = reduced
    opt.step()
    master.grad = None
    if zero == 1:
        log.add("dp", "updated-parameter all-gather", "all_gather", size, d)
        all_gather_tensor(flat, flat[mine].clone(), group=dp_group)
    param_err = max(
        float((p.detach() - tp_slice(q.detach(), p, i_tp, t)).abs().max())
        for p, q in zip(model.parameters(), full.parameters(), strict=True)
    )
    opt_bytes = state_bytes(nn.Module(), opt).optimizer

    par = ParallelConfig(dp=d, tp=t, zero=zero)
    setup = TrainingSetup(seq_len=seq, micro_batch=batch, precision="fp32")
    est = estimate(spec, par, setup).stages[0]
    com = step_comm(spec, par, setup)
    x = seq * batch * hidden * 4
    extras = 2 * all_reduce_bytes(x, t) + all_gather_bytes(seq * batch * vocab * 4, t)
    return {
        "d": d,
        "t": t,
        "zero": zero,
        "grad_err": grad_err,
        "param_err": param_err,
        "params": sb.params,
        "params_estimate": est.params,
        "grads": sb.grads,
        "grads_estimate": est.grads,
        "optimizer": opt_bytes,
        "optimizer_estimate": est.optimizer,
        "adam_step_bytes": 4,
        "tp_bytes": log.bytes_by("tp"),
        "tp_bytes_model": com.tp,
        "tp_bytes_extras": extras,
        "dp_bytes": log.bytes_by("dp"),
        "dp_bytes_model": com.dp,
        "tp_collectives": sum(1 for o in log.ops if o[0] == "tp"),
        "dp_collectives": sum(1 for o in log.ops if o[0] == "dp"),
    }
