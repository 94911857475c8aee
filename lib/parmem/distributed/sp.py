"""Sequence parallelism (Korthikanti et al. 2022 §4.2.2): split the LayerNorm/dropout region by s.

Tensor parallelism leaves the LayerNorms, dropouts and residual adds replicated: every rank keeps
their 10sbh activation bytes per layer. Sequence parallelism splits those along the sequence, so
each rank holds [s/t, b, h]. The tensor-parallel f and g become:

* g  = all-gather along s before the column-parallel linear (backward: reduce-scatter);
* ḡ = reduce-scatter along s after the row-parallel linear (backward: all-gather).

An all-reduce is a reduce-scatter followed by an all-gather, so the bytes moved are the same as
tensor parallelism's. The column-parallel linear saves only its s/t input slice and all-gathers it
again in backward (:class:`AllGatherLinear`, Megatron-LM's
``LinearWithGradAccumulationAndAsyncCommunication``), so every activation is divided by t:
sbh(34 + 5as/h)/t per layer (Table 2). The LayerNorm weights and the row-parallel biases then see
only s/t tokens on each rank: their gradients are summed over the group
(:func:`allreduce_sequence_parallel_grads`).

:func:`demo` returns per rank: output/gradient errors against the single-process layer (fp32,
dropout off) and the saved-activation bytes of one layer (bf16, dropout on) with and without
sequence parallelism, against :func:`parmem.activations.per_layer_bytes`. On CPU attention is the
explicit path with ``torch.native_dropout`` (1-byte masks), because CPU SDPA with dropout upcasts
16-bit inputs to fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parmem.distributed.collectives import all_gather_tensor, reduce_scatter_tensor
from parmem.distributed.launcher import device, rank, world_size

__all__ = [
    "AllGatherSeq",
    "ReduceScatterSeq",
    "AllGatherLinear",
    "all_gather_seq",
    "reduce_scatter_seq",
    "all_gather_linear",
    "allreduce_sequence_parallel_grads",
    "COMM",
    "COMM_BYTES",
    "demo",
]

#: collectives issued since the last reset
COMM = {"fwd_all_gather": 0, "fwd_reduce_scatter": 0, "bwd_all_gather": 0, "bwd_reduce_scatter": 0}
#: bytes of the full tensor of each of those collectives (the all-gather's output, the
#: reduce-scatter's input), in the order they ran
COMM_BYTES: dict[str, list[int]] = {k: [] for k in COMM}


def _note(key: str, full_bytes: int) -> None:
    COMM[key] += 1
    COMM_BYTES[key].append(full_bytes)


def _nbytes(x, times: int = 1) -> int:
    return x.numel() * x.element_size() * times


def _gather(x, group):
    t = dist.get_world_size(group)
    out = torch.empty((t * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    all_gather_tensor(out, x.contiguous(), group)
    return out


def _scatter(x, group):
    t = dist.get_world_size(group)
    if x.shape[0] % t:
        raise ValueError(f"tp={t} must divide the sequence length {x.shape[0]}")
    out = torch.empty((x.shape[0] // t, *x.shape[1:]), dtype=x.dtype, device=x.device)
    reduce_scatter_tensor(out, x.contiguous(), group)
    return out


class AllGatherSeq(torch.autograd.Function):
    """g: [s/t, b, h] → [s, b, h] by all-gather; backward reduce-scatters the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        _note("fwd_all_gather", _nbytes(x, dist.get_world_size(group)))
        return _gather(x, group)

    @staticmethod
    def backward(ctx, grad):
        _note("bwd_reduce_scatter", _nbytes(grad))
        return _scatter(grad, ctx.group), None


class ReduceScatterSeq(torch.autograd.Function):
    """ḡ: partial sums [s, b, h] → this rank's summed slice [s/t, b, h]; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        _note("fwd_reduce_scatter", _nbytes(x))
        return _scatter(x, group)

    @staticmethod
    def backward(ctx, grad):
        _note("bwd_all_gather", _nbytes(grad, dist.get_world_size(ctx.group)))
        return _gather(grad, ctx.group), None


class AllGatherLinear(torch.autograd.Function):
    """Y = all_gather(X_i)·Wᵀ + b, saving only X_i (s/t rows) for backward.

    Backward gathers X again for ∂L/∂W = ∂L/∂Yᵀ·X and reduce-scatters ∂L/∂X = ∂L/∂Y·W
    (Korthikanti et al. 2022 §4.2.2: "we store only the sequence-parallel shard ... and perform an
    extra all-gather in the backward pass").
    """

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        _note("fwd_all_gather", _nbytes(x, dist.get_world_size(group)))
        return torch.nn.functional.linear(_gather(x, group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        _note("bwd_all_gather", _nbytes(x, dist.get_world_size(ctx.group)))  # the re-gather
        full = _gather(x, ctx.group)
        grad_in = grad.matmul(weight)
        _note("bwd_reduce_scatter", _nbytes(grad_in))
        grad_x = _scatter(grad_in, ctx.group)
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_w = g2.t().matmul(full.reshape(-1, full.shape[-1]))
        grad_b = g2.sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


def all_gather_seq(x, group=None):
    return AllGatherSeq.apply(x, group)


def reduce_scatter_seq(x, group=None):
    return ReduceScatterSeq.apply(x, group)


def all_gather_linear(x, weight, bias=None, group=None):
    return AllGatherLinear.apply(x, weight, bias, group)


def allreduce_sequence_parallel_grads(layer, group=None) -> int:
    """Sum over the group the gradients of parameters replicated in the sequence-split region
    (LayerNorms and row-parallel biases) of a sequence-parallel layer. Returns the count."""
    params = [*layer.ln1.parameters(), *layer.ln2.parameters(), layer.proj.bias, layer.fc2.bias]
    n = 0
    for p in params:
        if p is not None and p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            n += 1
    return n


def _err(a, b) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


def demo(
    hidden: int = 32, heads: int = 4, seq: int = 16, batch: int = 2, dropout_p: float = 0.1
) -> dict:
    """A sequence-parallel GPT layer vs. the single-process one; saved bytes with/without SP.

    Returns per rank: ``out_err``, ``input_grad_err``, ``grad_err`` (fp32, dropout off; this
    rank's s/t slice of the reference); ``saved_bytes_tp`` and ``saved_bytes_sp`` (one bf16 layer,
    dropout ``dropout_p``, TP alone and TP + SP) beside ``table2_tp``/``table2_sp``
    (:func:`~parmem.activations.per_layer_bytes`), ``norm_stat_bytes_sp`` and ``layer_terms_sp``;
    collectives issued in forward and backward of the SP layer (``fwd_all_gather`` ...
    ``bwd_reduce_scatter``: counts; ``collective_bytes``: the full-tensor bytes of each call, by
    the same keys).
    """
    from parmem.activations import layer_terms, per_layer_bytes
    from parmem.distributed.tp import ParallelGPTLayer
    from parmem.measure import SavedTensorsMeter
    from parmem.reference import GPTLayer, norm_stat_bytes, norm_stat_itemsize, tiny_spec

    t, r, dev = world_size(), rank(), device()
    if seq % t or heads % t:
        raise ValueError(f"world size={t} must divide seq={seq} and heads={heads}")
    # 1. equality, fp32, dropout off
    torch.manual_seed(0)
    ref = GPTLayer(hidden, heads, dropout_p=0.0, dtype=torch.float32, max_seq_len=seq).to(dev)
    lay = ParallelGPTLayer(ref, sequence_parallel=True)
    x = torch.randn(seq, batch, hidden, device=dev, requires_grad=True)
    xl = x.detach().chunk(t, dim=0)[r].clone().requires_grad_()
    out_ref = ref(x)
    out_ref.square().sum().backward()
    out = lay(xl)
    out.square().sum().backward()  # the sum over ranks of these is the reference loss
    allreduce_sequence_parallel_grads(lay)
    grad_err = 0.0
    for p, q in zip(lay.parameters(), ref.parameters(), strict=True):
        g = q.grad
        for dim in range(g.dim()):
            if p.shape[dim] != g.shape[dim]:
                g = g.chunk(t, dim=dim)[r]
        grad_err = max(grad_err, _err(p.grad, g))

    # 2. saved activations of one layer, bf16, dropout on: TP alone vs TP + SP
    bf = torch.bfloat16
    base = GPTLayer(hidden, heads, dropout_p=dropout_p, dtype=bf, max_seq_len=seq).to(dev)
    measured = {}
    for sp in (False, True):
        layer = ParallelGPTLayer(base, sequence_parallel=sp)
        xs = torch.randn(
            seq // t if sp else seq, batch, hidden, device=dev, dtype=bf, requires_grad=True
        )
        for k in COMM:
            COMM[k] = 0
            COMM_BYTES[k].clear()
        with SavedTensorsMeter(exclude=layer.parameters()) as meter:
            y = layer(xs)
        measured[sp] = meter.bytes
        if sp:
            fwd = dict(COMM)
            y.sum().backward()
    spec = tiny_spec(vocab=64, hidden=hidden, layers=1, heads=heads, seq=seq)
    return {
        "out_err": _err(out, out_ref.detach().chunk(t, dim=0)[r]),
        "input_grad_err": _err(xl.grad, x.grad.chunk(t, dim=0)[r]),
        "grad_err": grad_err,
        "saved_bytes_tp": measured[False],
        "saved_bytes_sp": measured[True],
        "table2_tp": per_layer_bytes(seq, batch, hidden, heads, tp=t),
        "table2_sp": per_layer_bytes(seq, batch, hidden, heads, tp=t, sp=True),
        "layer_terms_sp": sum(
            x.bytes
            for x in layer_terms(
                spec, seq, batch, tp=t, sp=True, norm_stat_bytes=norm_stat_itemsize(dev, bf)
            )
        ),
        "norm_stat_bytes_sp": norm_stat_bytes(seq * batch // t, 2, device=dev, dtype=bf),
        "fwd_all_gather": fwd["fwd_all_gather"],
        "fwd_reduce_scatter": fwd["fwd_reduce_scatter"],
        "bwd_all_gather": COMM["bwd_all_gather"],
        "bwd_reduce_scatter": COMM["bwd_reduce_scatter"],
        "collective_bytes": {k: list(v) for k, v in COMM_BYTES.items()},
    }


def _selective_layer(full, sequence_parallel: bool):
    """A :class:`~parmem.distributed.tp.ParallelGPTLayer` whose attention core (QKᵀ, softmax, dropout,
    the product with V) runs under ``torch.utils.checkpoint`` and is recomputed in backward:
    Korthikanti et al. 2022 §5, selective activation recomputation."""
    from torch.utils.checkpoint import checkpoint

    from parmem.distributed.tp import ParallelGPTLayer

    class SelectiveRecomputeLayer(ParallelGPTLayer):
        def core(self, q, k, v):
            # reentrant checkpoint saves its inputs (views of the QKV output) and nothing else
            return checkpoint(super().core, q, k, v, use_reentrant=True)

    return SelectiveRecomputeLayer(full, sequence_parallel=sequence_parallel)


#: the six rows of Korthikanti et al. 2022 Table 2: (sequence parallel, recompute)
TABLE2_CASES = {
    "tp": (False, "none"),
    "tp+sp": (True, "none"),
    "tp+selective": (False, "selective"),
    "tp+sp+selective": (True, "selective"),
    "full": (False, "full"),
    "tp+sp+full": (True, "full"),
}


def demo_recompute(
    hidden: int = 32, heads: int = 4, seq: int = 16, batch: int = 2, dropout_p: float = 0.1
) -> dict:
    """Saved-activation bytes per rank of one bf16 GPT layer in every case of Table 2.

    Tensor parallelism over all ranks, with and without sequence parallelism, with no, selective
    (the attention core under ``torch.utils.checkpoint``) and full (the whole layer under it)
    recomputation. Returns per case: ``measured`` bytes (:class:`~parmem.measure.SavedTensorsMeter`),
    ``table2`` (:func:`parmem.activations.per_layer_bytes`), ``norm_stats`` (LayerNorm mean and
    rstd, kept unless the whole layer is recomputed), and ``grad_err``: the largest difference of
    the input gradient from the same layer without recomputation (same dropout masks, so 0).
    """
    from torch.utils.checkpoint import checkpoint

    from parmem.activations import per_layer_bytes
    from parmem.distributed.tp import ParallelGPTLayer
    from parmem.measure import SavedTensorsMeter
    from parmem.reference import GPTLayer, norm_stat_bytes

    t, dev, bf = world_size(), device(), torch.bfloat16
    if seq % t or heads % t:
        raise ValueError(f"world size={t} must divide seq={seq} and heads={heads}")
    torch.manual_seed(0)
    base = GPTLayer(hidden, heads, dropout_p=dropout_p, dtype=bf, max_seq_len=seq).to(dev)
    x = torch.randn(seq, batch, hidden, device=dev, dtype=bf)
    out, reference = {}, {}
    for name, (sp, recompute) in TABLE2_CASES.items():
        if recompute == "selective":
            layer = _selective_layer(base, sp)
        else:
            layer = ParallelGPTLayer(base, sequence_parallel=sp)
        xi = (x.chunk(t, dim=0)[rank()] if sp else x).clone().requires_grad_()
        torch.manual_seed(1)  # the same dropout masks in every case
        with SavedTensorsMeter(exclude=layer.parameters()) as meter:
            y = checkpoint(layer, xi, use_reentrant=True) if recompute == "full" else layer(xi)
        y.float().square().sum().backward()
        if recompute == "none":
            reference[sp] = xi.grad
        out[name] = {
            "measured": meter.bytes,
            "table2": per_layer_bytes(seq, batch, hidden, heads, tp=t, sp=sp, recompute=recompute),
            "norm_stats": 0
            if recompute == "full"
            else norm_stat_bytes(seq * batch // (t if sp else 1), 2, device=dev, dtype=bf),
            "grad_err": float((xi.grad.float() - reference[sp].float()).abs().max()),
        }
    return out


__all__ += ["TABLE2_CASES", "demo_recompute"]
