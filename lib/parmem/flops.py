"""Floating-point operations of a training step.

One forward pass multiplies every weight matrix once per token (2 FLOPs per multiply-add), and
attention adds the score and weighted-sum products; the backward pass costs two forwards
(Narayanan et al. 2021 §5.1, following Kaplan et al. 2020), so a step without recomputation is
three forwards. For a GPT model the sums below are exactly Narayanan et al. 2021, eq. (3)
(:func:`narayanan_flops`, tested).
"""

from __future__ import annotations

from fractions import Fraction

from ._check import boolean, choice, instance, integer
from .config import RECOMPUTE
from .engines import SELECTIVE_RULES
from .lora import lora_modules, lora_params
from .model import ModelSpec
from .sharding import layer_matmul_params
from .table import layer_tensors

__all__ = [
    "narayanan_flops",
    "flops_per_sequence",
    "step_flops",
    "lora_flops_per_sequence",
    "selective_flops_per_sequence",
]


def narayanan_flops(
    batch: int, seq_len: int, layers: int, hidden: int, vocab: int, recompute: bool = True
) -> Fraction:
    """FLOPs of one training iteration of a GPT model, Narayanan et al. 2021, eq. (3).

    With activation recomputation: ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``. Without it, one
    forward pass fewer through the layers (the LM head is never recomputed):
    ``72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))``. Returned exactly, as a ``Fraction``.
    """
    boolean("recompute", recompute)
    B, s, L, h, V = (
        Fraction(integer(name, x))
        for name, x in (
            ("batch", batch),
            ("seq_len", seq_len),
            ("layers", layers),
            ("hidden", hidden),
            ("vocab", vocab),
        )
    )
    if recompute:
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def flops_per_sequence(spec: ModelSpec, seq_len: int) -> tuple[int, int, int]:
    """Forward FLOPs of one sequence of ``seq_len`` tokens: (one layer, its attention core, the
    LM head). A layer is ``2·s·W + 4·s²·(a·d_head)``: every weight matrix ``W`` of
    :func:`parmem.sharding.layer_matmul_params` (the routed ``top_k`` experts for MoE) does a
    multiply-add per token, and the scores and the weighted sum of values each cost ``2·s²`` per
    query width. The LM head is ``2·s·h·V``."""
    instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")
    s = integer("seq_len", seq_len)
    core = 4 * s * s * spec.q_dim
    return 2 * s * layer_matmul_params(spec) + core, core, 2 * s * spec.hidden * spec.vocab_size


def selective_flops_per_sequence(spec: ModelSpec, seq_len: int, rule: str) -> int:
    """Forward FLOPs of one layer for one sequence that selective recomputation runs again,
    under ``rule`` (:data:`parmem.engines.SELECTIVE_RULES`).

    ``"core"``: the attention core, ``4·s²·(a·d_head)`` (scores and the weighted sum of values;
    Korthikanti et al. 2022 §5).

    ``"every-second-matmul"``: torchtitan's ``SelectiveAC`` (torchtitan 0.3.0,
    ``distributed/activation_checkpoint.py``): in each block it keeps the outputs of the ops of
    ``_get_default_save_ops`` (the attention kernel, ``aten.mm``/``aten.linear``, ``topk``,
    reduce-scatter, all-to-all) "except every second mm/linear", counted in forward order,
    force-recomputes the router's matmul (``force_recompute_mm_shapes_by_fqns =
    ["moe.router.gate"]``), and recomputes everything else, which includes the routed experts'
    grouped GEMMs (``torch._grouped_mm`` is not among PyTorch's compute-intensive ops). The
    attention's Q, K and V are one fused matmul (``wqkv``), as in the ``[activations.fsdp2]``
    table: for a Llama block wqkv (1st, kept), wo (2nd, recomputed), w1 (3rd, kept), w3 (4th,
    recomputed), w2 (5th, kept). Every multiply-add is ``2·s`` FLOPs per weight; the attention
    kernel is kept, so no ``s²`` term."""
    s = integer("seq_len", seq_len)
    choice("rule", rule, SELECTIVE_RULES)
    if rule == "core":
        return flops_per_sequence(spec, s)[1]
    fused = ("attn.q.weight", "attn.k.weight", "attn.v.weight")
    count = weights = 0
    for x in layer_tensors(spec):
        if x.kind == "router":
            weights += x.rows * x.cols
        elif x.kind != "linear":
            continue
        elif x.expert:
            weights += x.rows * x.cols * spec.top_k
        else:
            if x.name not in fused[1:]:  # K and V run in Q's fused matmul
                count += 1
            if count % 2 == 0:
                weights += x.rows * x.cols * x.count
    return 2 * s * weights


def lora_flops_per_sequence(spec: ModelSpec, seq_len: int, rank: int, targets: str) -> int:
    """Forward FLOPs of every LoRA adapter of the model for one sequence of ``seq_len`` tokens:
    a multiply-add per adapter value per token, ``2·s`` times :func:`parmem.lora.lora_params`
    (x·A, then ·B; Hu et al. 2022 §4.1). Adapters on fused experts (PEFT's ``ParamWrapper``),
    whose work depends on the routing, are refused."""
    s = integer("seq_len", seq_len)
    for m in lora_modules(spec, targets):
        if m.wrapper != "Linear":
            raise ValueError(
                f"targets={targets!r}: the adapter FLOPs of {m.name} (PEFT's ParamWrapper on "
                "fused experts) are not modelled"
            )
    return 2 * s * lora_params(spec, rank, targets)


def step_flops(
    spec: ModelSpec,
    global_batch: int,
    seq_len: int,
    recompute: str = "none",
    adapter: int | None = None,
    selective: str = "core",
) -> int:
    """FLOPs of one training step (all GPUs together), any :class:`~parmem.model.ModelSpec`.

    Forward + backward = 3 forward passes; ``"full"`` recomputation adds a forward through the
    layers, ``"selective"`` what the engine's rule recomputes (``selective``, one of
    :data:`parmem.engines.SELECTIVE_RULES`: the attention core by default, torchtitan's every
    second matmul: :func:`selective_flops_per_sequence`). For a GPT-shaped model this equals
    :func:`narayanan_flops` (72 form for ``"none"``, 96 form for ``"full"``).

    ``adapter``: frozen weights with adapters whose forward costs ``adapter`` FLOPs per sequence
    (:func:`lora_flops_per_sequence`): the backward of a frozen weight's matmul computes only
    its input's gradient (one forward's work instead of two), the attention core and the
    adapters still cost two forwards each (Hu et al. 2022 §4.1: the frozen weights need no
    gradients); full recomputation repeats the layers' and adapters' forward.
    """
    choice("recompute", recompute, RECOMPUTE)
    global_batch = integer("global_batch", global_batch)
    layer, core, head = flops_per_sequence(spec, seq_len)
    L = spec.layers
    if adapter is None:
        sel = selective_flops_per_sequence(spec, seq_len, selective)
        extra = {"none": 0, "selective": sel, "full": layer}[recompute]
        return global_batch * (L * (3 * layer + extra) + 3 * head)
    if selective != "core":
        raise ValueError(f"selective={selective!r} with an adapter is not modelled (the adapter "
                         "profile recomputes the attention core)")  # fmt: skip
    a = integer("adapter", adapter, 0)
    extra = {"none": 0, "selective": L * core, "full": L * layer + a}[recompute]
    fwd = L * layer + head + a
    bwd = L * (layer - core) + head + 2 * L * core + 2 * a
    return global_batch * (fwd + bwd + extra)
