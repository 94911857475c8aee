"""Tensor parallelism, Megatron style: column/row-parallel linears joined by the f/g operators.

Shoeybi et al. 2019 (Megatron-LM) §3: a column-parallel linear (weight split by output
features) feeding a row-parallel linear (weight split by input features) needs no communication
between them; the block needs one all-reduce in forward (g, after the row-parallel layer) and one
in backward (f, before the column-parallel layer). Attention splits by heads (QKV column-parallel,
output projection row-parallel), the MLP by its inner width (FC1 column, FC2 row); LayerNorms and
the row-parallel biases are replicated; the embedding and LM head split the vocabulary.

:func:`demo` builds a tiny GPT once (:class:`parmem.reference.TinyGPT` of
:func:`parmem.reference.tiny_spec`), shards it over the ranks (:class:`TPGPT`,
:class:`ParallelGPTLayer` etc.), and returns per rank: max errors of loss, logits and gradients
against the single-process model (fp32, dropout off), parameter bytes against
:func:`parmem.estimate`, saved-activation bytes of one layer (bf16, dropout on) against
Korthikanti et al. 2022 Table 2, and collectives counted. :func:`demo_dtensor` is the same layer
through DTensor ``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``).

Attention is the explicit path of :class:`parmem.reference.GPTLayer` with ``torch.native_dropout``
(1-byte masks): CPU ``scaled_dot_product_attention`` with dropout upcasts 16-bit inputs to fp32.
Dropout draws the same random numbers on every rank (same seed): fine for measuring bytes; a real
run seeds the tensor-parallel region differently per rank (Megatron's RNG tracker).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parmem.distributed.launcher import device, rank, world_size
from parmem.reference import GPTLayer, TinyGPT, norm_stat_bytes, norm_stat_itemsize, tiny_spec

__all__ = [
    "CopyToTP",
    "ReduceFromTP",
    "GatherFromTP",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "ParallelGPTLayer",
    "TPGPT",
    "COMM",
    "tp_slice",
    "demo",
    "demo_dtensor",
]

#: collectives issued by the f/g operators since the last reset (forward and backward)
COMM = {"fwd_all_reduce": 0, "bwd_all_reduce": 0}


def _tp(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


class CopyToTP(torch.autograd.Function):
    """f: identity in forward, all-reduce in backward (Shoeybi et al. 2019 §3, Fig. 3).

    Y = X·A with A = [A_1 … A_t] split by columns: rank i computes Y_i = X·A_i from the whole X.
    Backward: ∂L/∂X = Σ_i ∂L/∂Y_i · A_iᵀ, a sum of every rank's partial, hence the all-reduce.
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        COMM["bwd_all_reduce"] += 1
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce in forward, identity in backward (the conjugate of f).

    Z = Y·B with B = [B_1; …; B_t] split by rows and Y = [Y_1 … Y_t] split by columns:
    Z = Σ_i Y_i·B_i, so the forward sums every rank's partial; ∂L/∂(Y_i·B_i) = ∂L/∂Z on every rank.
    """

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        COMM["fwd_all_reduce"] += 1
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension in forward; keep this rank's slice in backward.

    Used for vocabulary-parallel logits (Megatron instead fuses a vocab-parallel cross-entropy
    that never materialises the full logits; gathering is simpler and equal in value).
    """

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        r, t = _tp(group)
        parts = [torch.empty_like(x) for _ in range(t)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        r, t = _tp(ctx.group)
        return grad.chunk(t, dim=-1)[r].contiguous(), None


def _shard(w, dim: int, group):
    r, t = _tp(group)
    if w.shape[dim] % t:
        raise ValueError(f"tp={t} must divide dimension {dim} of size {w.shape[dim]}")
    return nn.Parameter(w.detach().chunk(t, dim=dim)[r].clone())


class ColumnParallelLinear(nn.Module):
    """Y_i = f(X)·A_iᵀ + b_i: weight [out/t, in], bias [out/t] (Shoeybi et al. 2019 §3).

    With ``sequence_parallel`` the input is this rank's s/t slice of the sequence; f becomes
    an all-gather whose backward reduce-scatters (:func:`parmem.distributed.sp.all_gather_linear`,
    Korthikanti et al. 2022 §4.2.2), and only the s/t slice is saved for backward.
    """

    def __init__(self, full: nn.Linear, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = _shard(full.weight, 0, group)
        self.bias = None if full.bias is None else _shard(full.bias, 0, group)

    def forward(self, x):
        if self.sequence_parallel:
            from parmem.distributed.sp import all_gather_linear

            return all_gather_linear(x, self.weight, self.bias, self.group)
        return nn.functional.linear(CopyToTP.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Z = g(Y_i·B_iᵀ) + b: weight [out, in/t], bias [out] replicated and added once after g.

    With ``sequence_parallel`` g becomes a reduce-scatter over the sequence (Korthikanti et al.
    2022 §4.2.2) and the bias is added to this rank's s/t slice.
    """

    def __init__(self, full: nn.Linear, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = _shard(full.weight, 1, group)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, y):
        z = nn.functional.linear(y, self.weight)
        if self.sequence_parallel:
            from parmem.distributed.sp import reduce_scatter_seq

            z = reduce_scatter_seq(z, self.group)
        else:
            z = ReduceFromTP.apply(z, self.group)
        return z if self.bias is None else z + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rank i holds rows [iV/t, (i+1)V/t) of the table; out-of-range tokens give zeros; g sums."""

    def __init__(self, full: nn.Embedding, group=None):
        super().__init__()
        self.group = group
        self.weight = _shard(full.weight, 0, group)
        r, _ = _tp(group)
        self.start = r * self.weight.shape[0]

    def forward(self, tokens):
        local = tokens - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return ReduceFromTP.apply(out, self.group)


class ParallelGPTLayer(GPTLayer):
    """:class:`parmem.reference.GPTLayer` sharded over the TP group: heads and MLP width split.

    Built from a full layer (same weights, sliced); the forward and the attention are the
    reference's, with QKV/FC1 column-parallel and projection/FC2 row-parallel.
    ``sequence_parallel`` keeps the LayerNorm/dropout/residual region split along the sequence
    (input [s/t, b, h]).
    """

    def __init__(self, full: GPTLayer, group=None, sequence_parallel: bool = False):
        r, t = _tp(group)
        w = full.qkv.weight
        super().__init__(
            full.hidden,
            full.heads,
            full.fc1.out_features,
            full.dropout_p,
            w.dtype,
            tp_size=t,
            tp_rank=r,
            causal=full.causal,
            max_seq_len=full.causal_bias.shape[0] if full.causal else 1,
        )
        kw = {"group": group, "sequence_parallel": sequence_parallel}
        self.ln1.load_state_dict(full.ln1.state_dict())
        self.ln2.load_state_dict(full.ln2.state_dict())
        self.qkv, self.fc1 = (
            ColumnParallelLinear(full.qkv, **kw),
            ColumnParallelLinear(full.fc1, **kw),
        )
        self.proj, self.fc2 = RowParallelLinear(full.proj, **kw), RowParallelLinear(full.fc2, **kw)
        self.sequence_parallel = sequence_parallel


class TPGPT(nn.Module):
    """A :class:`parmem.reference.TinyGPT` sharded: vocab-parallel embedding and LM head,
    :class:`ParallelGPTLayer`; input tokens [s, b], output the gathered logits [s, b, V].

    The model must have no position table and an untied head (``tiny_spec(position="rotary")``):
    sharding those is not shown here."""

    def __init__(self, full: TinyGPT, group=None):
        super().__init__()
        if full.pos is not None or full.head is None:
            raise ValueError(
                "TPGPT needs a TinyGPT without a position table and with an untied "
                "head: tiny_spec(position='rotary', tied=False)"
            )
        self.group = group
        self.embed = VocabParallelEmbedding(full.tok, group)
        self.layers = nn.ModuleList(ParallelGPTLayer(lay, group) for lay in full.layers)
        self.ln_f = nn.LayerNorm(full.ln_f.normalized_shape, dtype=full.ln_f.weight.dtype)
        self.ln_f.load_state_dict(full.ln_f.state_dict())
        self.head = ColumnParallelLinear(full.head, group)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return GatherFromTP.apply(self.head(self.ln_f(x)), self.group)


def tp_slice(full: torch.Tensor, local: torch.Tensor, tp_rank: int, t: int) -> torch.Tensor:
    """This rank's slice of a tensor of the single-process model (a weight or its gradient): the
    ``tp_rank``-th of t chunks along the one dimension where ``local`` (the sharded tensor) is
    smaller; ``full`` itself where the two shapes agree (a replicated tensor)."""
    if full.shape == local.shape:
        return full
    dim = next(i for i, (a, b) in enumerate(zip(local.shape, full.shape, strict=True)) if a != b)
    return full.chunk(t, dim=dim)[tp_rank]


def _max_err(a, b) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


def demo(
    vocab: int = 64,
    hidden: int = 32,
    heads: int = 4,
    layers: int = 2,
    seq: int = 16,
    batch: int = 2,
) -> dict:
    """Tensor-parallel tiny GPT vs. the single-process one; per-rank bytes vs. the estimates.

    Returns per rank: ``loss_err``, ``logits_err``, ``grad_err`` (max abs difference from the
    single-process model, fp32, dropout off; gradients of sharded weights against this rank's
    slice); ``param_bytes``/``grad_bytes`` and their ``*_estimate`` from :func:`parmem.estimate`
    (t = world size, fp32); ``saved_bytes`` of one bf16 layer with dropout 0.1, beside
    ``saved_bytes_table2`` (:func:`~parmem.activations.per_layer_bytes`), ``norm_stat_bytes`` (the
    LayerNorm mean/rstd the paper leaves out) and ``saved_bytes_layer_terms`` (which includes
    them); all-reduces issued by f/g for the model and for one layer's forward.
    """
    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.activations import layer_terms, per_layer_bytes
    from parmem.measure import SavedTensorsMeter, state_bytes

    t, r, dev = world_size(), rank(), device()
    for name, v in (("heads", heads), ("vocab", vocab), ("hidden", 4 * hidden)):
        if v % t:
            raise ValueError(f"{name}={v} must be divisible by world size={t}")
    spec = tiny_spec(
        vocab=vocab, hidden=hidden, layers=layers, heads=heads, seq=seq, position="rotary"
    )
    torch.manual_seed(0)
    full = TinyGPT(spec, dtype=torch.float32, dropout_p=0.0).to(dev)
    tp = TPGPT(full).to(dev)
    tokens = torch.randint(0, vocab, (seq, batch), device=dev)
    target = torch.randint(0, vocab, (seq, batch), device=dev)

    def loss_of(model):
        logits = model(tokens)
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    ref_logits, ref_loss = loss_of(full)
    ref_loss.backward()
    COMM.update(fwd_all_reduce=0, bwd_all_reduce=0)
    logits, loss = loss_of(tp)
    fwd_comm = dict(COMM)
    loss.backward()
    model_bwd = COMM["bwd_all_reduce"]
    grad_err = max(
        _max_err(p_tp.grad, tp_slice(p_full.grad, p_tp, r, t))  # sharded: the slice
        for p_full, p_tp in zip(full.parameters(), tp.parameters(), strict=True)
    )

    setup = TrainingSetup(seq_len=seq, micro_batch=batch, precision="fp32")
    est = estimate(spec, ParallelConfig(tp=t), setup).stages[0]
    measured = state_bytes(tp)

    # saved activations of one layer: bf16, dropout on (Korthikanti et al. 2022, Table 2)
    lay = ParallelGPTLayer(GPTLayer(hidden, heads, dropout_p=0.1, max_seq_len=seq).to(dev))
    x = torch.randn(seq, batch, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
    COMM.update(fwd_all_reduce=0, bwd_all_reduce=0)
    with SavedTensorsMeter(exclude=lay.parameters()) as meter:
        lay(x)
    layer_fwd = COMM["fwd_all_reduce"]
    terms = layer_terms(
        spec, seq, batch, tp=t, norm_stat_bytes=norm_stat_itemsize(dev, torch.bfloat16)
    )
    return {
        "loss_err": abs(loss.item() - ref_loss.item()),
        "logits_err": _max_err(logits, ref_logits),
        "grad_err": grad_err,
        "param_bytes": measured.params,
        "param_bytes_estimate": est.params,
        "grad_bytes": measured.grads,
        "grad_bytes_estimate": est.grads,
        "saved_bytes": meter.bytes,
        "saved_bytes_table2": per_layer_bytes(seq, batch, hidden, heads, tp=t),
        "saved_bytes_layer_terms": sum(x.bytes for x in terms),
        "norm_stat_bytes": norm_stat_bytes(seq * batch, 2, device=dev, dtype=torch.bfloat16),
        "model_fwd_all_reduce": fwd_comm["fwd_all_reduce"],
        "model_bwd_all_reduce": model_bwd,
        "layer_fwd_all_reduce": layer_fwd,
    }


def demo_dtensor(hidden: int = 32, heads: int = 4, seq: int = 16, batch: int = 2) -> dict:
    """The reference layer through DTensor ``parallelize_module`` on a 1-D mesh of all ranks.

    QKV and FC1 are ``ColwiseParallel``, projection and FC2 ``RowwiseParallel``: the same split as
    the hand-written layers. Returns errors vs. the single-process layer and local param bytes.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from parmem.measure import state_bytes

    t, dev = world_size(), device()
    if heads % t:
        raise ValueError(f"heads={heads} must be divisible by world size={t}")
    torch.manual_seed(0)
    ref = GPTLayer(hidden, heads, dropout_p=0.0, dtype=torch.float32, max_seq_len=seq).to(dev)
    lay = GPTLayer(hidden, heads, dropout_p=0.0, dtype=torch.float32, max_seq_len=seq).to(dev)
    lay.load_state_dict(ref.state_dict())
    mesh = init_device_mesh(dev.type, (t,))
    parallelize_module(
        lay,
        mesh,
        {
            "qkv": ColwiseParallel(),
            "proj": RowwiseParallel(),
            "fc1": ColwiseParallel(),
            "fc2": RowwiseParallel(),
        },
    )
    lay.local_heads = heads // t  # the attention code views the local QKV output by heads
    x = torch.randn(seq, batch, hidden, device=dev)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out = ref(x1), lay(x2)
    out_ref.square().sum().backward()
    out.square().sum().backward()
    grad_err = max(
        _max_err(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad, q.grad)
        for p, q in zip(lay.parameters(), ref.parameters(), strict=True)
    )
    sb = state_bytes(lay)
    return {
        "out_err": _max_err(out, out_ref),
        "input_grad_err": _max_err(x2.grad, x1.grad),
        "grad_err": grad_err,
        "param_bytes": sb.params,
        "param_bytes_full": state_bytes(ref).params,
    }


def demo_states(
    vocab: int = 64,
    hidden: int = 32,
    heads: int = 4,
    layers: int = 2,
    seq: int = 16,
    batch: int = 2,
) -> dict:
    """One mixed-precision AdamW step of the tensor-parallel tiny GPT: model states per rank.

    The model is :class:`TPGPT` in bf16 with fp32 master weights and Adam moments
    (:class:`parmem.reference.MixedPrecisionAdamW`, 2 + 2 + 12 bytes per parameter). Returns per
    rank the measured ``params``/``grads``/``optimizer`` bytes (:func:`parmem.measure.state_bytes`)
    and the same from :func:`parmem.estimate` (t = world size, ``bf16-mixed``); ``adam_steps``,
    the one named extra (a 0-d fp32 ``step`` counter per parameter tensor); and the parameter
    counts this rank holds in tensors that are sharded (their shape differs from the
    single-process model's) and replicated (same shape), beside ``full_numel``.
    """
    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.measure import state_bytes
    from parmem.reference import MixedPrecisionAdamW

    t, dev = world_size(), device()
    for name, v in (("heads", heads), ("vocab", vocab), ("hidden", 4 * hidden)):
        if v % t:
            raise ValueError(f"{name}={v} must be divisible by world size={t}")
    spec = tiny_spec(
        vocab=vocab, hidden=hidden, layers=layers, heads=heads, seq=seq, position="rotary"
    )
    torch.manual_seed(0)
    full = TinyGPT(spec, dtype=torch.bfloat16, dropout_p=0.0).to(dev)
    model = TPGPT(full).to(dev)
    opt = MixedPrecisionAdamW(model.parameters())
    tokens = torch.randint(0, vocab, (seq, batch), device=dev)
    target = torch.randint(0, vocab, (seq, batch), device=dev)
    logits = model(tokens).float()
    nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
    opt.step()
    st = state_bytes(model, opt)
    est = estimate(
        spec, ParallelConfig(tp=t), TrainingSetup(seq_len=seq, micro_batch=batch)
    ).stages[0]
    pairs = list(zip(full.parameters(), model.parameters(), strict=True))
    return {
        "params": st.params,
        "grads": st.grads,
        "optimizer": st.optimizer,
        "params_estimate": est.params,
        "grads_estimate": est.grads,
        "optimizer_estimate": est.optimizer,
        "adam_steps": 4 * len(pairs),
        "sharded_numel": sum(q.numel() for p, q in pairs if p.shape != q.shape),
        "replicated_numel": sum(q.numel() for p, q in pairs if p.shape == q.shape),
        "full_numel": sum(p.numel() for p, _ in pairs),
    }


def demo_comm(
    hidden: int = 32, heads: int = 4, seq: int = 16, batch: int = 2, dropout_p: float = 0.1
) -> dict:
    """One bf16 tensor-parallel GPT layer, forward and backward: what it sends and what it keeps.

    Every call to ``torch.distributed.all_reduce`` made by f and g is recorded with the bytes of
    the tensor handed to it (``forward_all_reduce``, ``backward_all_reduce``: lists of sizes), so
    the number and size of the collectives are measured, not assumed. The same forward is
    measured with :class:`parmem.measure.SavedTensorsMeter` (``saved_bytes``) beside
    :func:`parmem.activations.per_layer_bytes` (``table2``) and the LayerNorm statistics the
    paper leaves out (``norm_stat_bytes``).
    """
    from parmem.activations import per_layer_bytes
    from parmem.measure import SavedTensorsMeter

    t, dev = world_size(), device()
    if heads % t:
        raise ValueError(f"heads={heads} must be divisible by world size={t}")
    sizes: dict[str, list[int]] = {"forward": [], "backward": []}
    phase = ["forward"]
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        sizes[phase[0]].append(tensor.numel() * tensor.element_size())
        return original(tensor, *args, **kwargs)

    torch.manual_seed(0)
    full = GPTLayer(hidden, heads, dropout_p=dropout_p, max_seq_len=seq).to(dev)
    layer = ParallelGPTLayer(full)
    x = torch.randn(seq, batch, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dist.all_reduce = counting
    try:
        with SavedTensorsMeter(exclude=layer.parameters()) as meter:
            y = layer(x)
        phase[0] = "backward"
        y.float().square().sum().backward()
    finally:
        dist.all_reduce = original
    return {
        "forward_all_reduce": sizes["forward"],
        "backward_all_reduce": sizes["backward"],
        "saved_bytes": meter.bytes,
        "table2": per_layer_bytes(seq, batch, hidden, heads, tp=t),
        "norm_stat_bytes": norm_stat_bytes(seq * batch, 2, device=dev, dtype=torch.bfloat16),
    }


__all__ += ["demo_states", "demo_comm"]
