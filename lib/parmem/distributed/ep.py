"""Expert parallelism: a mixture-of-experts layer with all-to-all dispatch and return.

A top-k router sends every token to k of E experts (Shazeer et al. 2017; GShard, Lepikhin et al.
2020 §2; Switch, Fedus et al. 2021 §2). With expert parallelism over e ranks, rank i holds experts
[iE/e, (i+1)E/e) and its own tokens; one ``all_to_all_single`` with *uneven* splits sends each
(token, choice) to the rank of its expert, the experts run, and a second all-to-all brings the
results back, where they are combined with the gate weights. Expert parameters per rank shrink by
e; the router (and in a transformer the attention and norms) stays replicated, and its gradients
are summed over the ranks like any data-parallel gradient.

Routing here: softmax over the E router logits, the top k, renormalised to sum to one (Mixtral's
choice); no capacity limit, so no token is dropped and the layer equals the single-process one.
``imbalance`` adds a constant to expert 0's logit to show what uneven routing does to the tokens
(and so the activation bytes) one rank receives.

:func:`demo` returns per rank: output and gradient errors against a single-process MoE run on all
ranks' tokens, expert parameter bytes against :func:`parmem.sharding.layer_params`, tokens per
local expert, and the dispatch buffer sizes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parmem.distributed.launcher import device, rank, world_size

__all__ = ["AllToAll", "route", "MoE", "EPMoE", "demo"]


class AllToAll(torch.autograd.Function):
    """All-to-all with uneven splits; its backward is the all-to-all with the splits swapped
    (rows that went from rank i to rank j send their gradients from j back to i)."""

    @staticmethod
    def forward(ctx, x, out_split: list[int], in_split: list[int], group):
        ctx.splits, ctx.group = (out_split, in_split), group
        out = x.new_empty(sum(out_split), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), out_split, in_split, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_split, in_split = ctx.splits
        return AllToAll.apply(grad, in_split, out_split, ctx.group), None, None, None


def _expert(hidden: int, ffn: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))


def route(router: nn.Linear, x, top_k: int, imbalance: float = 0.0):
    """(expert ids [T, k], gate weights [T, k]) for tokens x [T, h]: softmax, top-k, renormalise.

    ``imbalance`` is added to expert 0's logit (0: the router as trained)."""
    logits = router(x)
    if imbalance:
        bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        bias[0] = imbalance
        logits = logits + bias
    gates, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    return ids, gates / gates.sum(-1, keepdim=True)


class MoE(nn.Module):
    """Single-process reference: router + E expert MLPs (h → f → h, GeLU, biases)."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, imbalance: float = 0.0):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k={top_k} must be in [1, experts={experts}]")
        self.top_k, self.imbalance = top_k, imbalance
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(_expert(hidden, ffn) for _ in range(experts))

    def forward(self, x):
        ids, gates = route(self.router, x, self.top_k, self.imbalance)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel():
                out = out.index_add(0, tok, gates[tok, slot, None] * expert(x[tok]))
        return out


class EPMoE(nn.Module):
    """The same layer with experts sharded over the group; tokens travel by all-to-all."""

    def __init__(self, full: MoE, group=None):
        super().__init__()
        self.group = group
        e, r = dist.get_world_size(group), dist.get_rank(group)
        n = len(full.experts)
        if n % e:
            raise ValueError(f"experts={n} must be divisible by the expert-parallel size {e}")
        self.per_rank, self.first = n // e, r * (n // e)
        self.top_k, self.imbalance = full.top_k, full.imbalance
        self.router = full.router
        self.experts = full.experts[self.first : self.first + self.per_rank]
        self.stats: dict = {}

    def forward(self, x):
        e = dist.get_world_size(self.group)
        ids, gates = route(self.router, x, self.top_k, self.imbalance)
        flat = ids.reshape(-1)  # (token, choice) pairs, T·k of them
        order = flat.argsort(stable=True)  # grouped by expert, hence by rank
        send = x.repeat_interleave(self.top_k, dim=0)[order]
        dest = flat[order] // self.per_rank
        send_counts = torch.bincount(dest, minlength=e)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        s_split, r_split = send_counts.tolist(), recv_counts.tolist()
        recv_ids = torch.empty(sum(r_split), dtype=flat.dtype, device=x.device)
        dist.all_to_all_single(
            recv_ids, flat[order].contiguous(), r_split, s_split, group=self.group
        )
        recv = AllToAll.apply(send, r_split, s_split, self.group)
        local = recv_ids - self.first
        y = torch.zeros_like(recv)
        for j, expert in enumerate(self.experts):
            rows = (local == j).nonzero(as_tuple=True)[0]
            if rows.numel():
                y = y.index_copy(0, rows, expert(recv[rows]))
        back = AllToAll.apply(y, s_split, r_split, self.group)
        tok = torch.arange(x.shape[0], device=x.device).repeat_interleave(self.top_k)[order]
        w = gates.reshape(-1)[order, None]
        self.stats = {
            "send": s_split,
            "recv": r_split,
            "tokens_per_expert": torch.bincount(local, minlength=self.per_rank).tolist(),
            "send_bytes": send.numel() * send.element_size(),
            "recv_bytes": recv.numel() * recv.element_size(),
        }
        return torch.zeros_like(x).index_add(0, tok, w * back)


def demo(
    hidden: int = 16,
    ffn: int = 32,
    experts_per_rank: int = 2,
    top_k: int = 2,
    tokens: int = 32,
    imbalance: float = 0.0,
) -> dict:
    """EP MoE vs. the single-process MoE on all ranks' tokens; per-rank bytes and tokens.

    Returns per rank: ``out_err``, ``input_grad_err``, ``expert_grad_err``, ``router_grad_err``
    (fp32, against the single-process MoE run on every rank's tokens; the router gradient after
    its data-parallel all-reduce); ``expert_bytes`` and ``expert_bytes_estimate``
    (E/e · :func:`parmem.sharding.layer_params` · 4), ``expert_bytes_unsharded``,
    ``router_bytes``; ``tokens_per_expert`` (this rank's experts), ``tokens_received``,
    ``tokens_sent``, ``tokens_balanced`` (T·k, what every rank receives under perfect balance);
    the dispatch send/receive buffer bytes; ``saved_bytes``, the activations this rank keeps for
    backward in the expert-parallel layer (:class:`parmem.measure.SavedTensorsMeter`, parameters
    excluded), and ``saved_bytes_local``, the same rank's tokens through the whole layer in one
    process (e = 1: every expert local).
    """
    from parmem import ModelSpec
    from parmem.measure import SavedTensorsMeter
    from parmem.sharding import layer_params

    e, r, dev = world_size(), rank(), device()
    n_exp = experts_per_rank * e
    torch.manual_seed(0)
    ref = MoE(hidden, ffn, n_exp, top_k, imbalance).to(dev)
    init = {k: v.clone() for k, v in ref.state_dict().items()}
    g = torch.Generator().manual_seed(7)
    xs = torch.randn(e, tokens, hidden, generator=g).to(dev)  # every rank's tokens
    x_all = xs.reshape(-1, hidden).requires_grad_()
    ref(x_all).square().sum().backward()
    full = MoE(hidden, ffn, n_exp, top_k, imbalance).to(dev)
    full.load_state_dict(init)
    moe = EPMoE(full)
    x = xs[r].clone().requires_grad_()
    with SavedTensorsMeter(exclude=moe.parameters()) as saved_ep:
        out = moe(x)
    out.square().sum().backward()
    local = MoE(hidden, ffn, n_exp, top_k, imbalance).to(dev)  # e = 1: every expert, own tokens
    local.load_state_dict(init)
    with SavedTensorsMeter(exclude=local.parameters()) as saved_local:
        local(xs[r].clone().requires_grad_())
    dist.all_reduce(moe.router.weight.grad)  # router is replicated: data-parallel gradient
    ref_out = ref(xs[r])

    def err(a, b):
        return float((a.detach() - b.detach()).abs().max())

    grad_err = max(
        err(p.grad, q.grad)
        for p, q in zip(
            moe.experts.parameters(),
            ref.experts[moe.first : moe.first + moe.per_rank].parameters(),
            strict=True,
        )
    )
    spec = ModelSpec(
        name="tiny-moe",
        vocab_size=64,
        hidden=hidden,
        layers=1,
        heads=1,
        bias=True,
        num_experts=n_exp,
        top_k=top_k,
        expert_ffn_hidden=ffn,
    )
    expert_bytes = sum(p.numel() * p.element_size() for p in moe.experts.parameters())
    return {
        "out_err": err(out, ref_out),
        "input_grad_err": err(x.grad, x_all.grad[r * tokens : (r + 1) * tokens]),
        "expert_grad_err": grad_err,
        "router_grad_err": err(moe.router.weight.grad, ref.router.weight.grad),
        "expert_bytes": expert_bytes,
        "expert_bytes_estimate": 4 * layer_params(spec, 1, n_exp // experts_per_rank)[1],
        "expert_bytes_unsharded": 4 * layer_params(spec)[1],
        "router_bytes": moe.router.weight.numel() * 4,
        "tokens_per_expert": moe.stats["tokens_per_expert"],
        "tokens_received": sum(moe.stats["recv"]),
        "tokens_sent": sum(moe.stats["send"]),
        "tokens_balanced": tokens * top_k,
        "dispatch_send_bytes": moe.stats["send_bytes"],
        "dispatch_recv_bytes": moe.stats["recv_bytes"],
        "saved_bytes": saved_ep.bytes,
        "saved_bytes_local": saved_local.bytes,
        "saved_by_dtype": saved_ep.by_dtype,
        "saved_by_dtype_local": saved_local.by_dtype,
    }
