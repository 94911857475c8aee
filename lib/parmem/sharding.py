"""Every parameter tensor of a model, its shape, and how parallelism splits it: one table.

This module is the one home of parameter counting. :func:`~parmem.table.layer_tensors` and
:func:`~parmem.table.model_tensors` (their rows are written in :mod:`parmem.table` and re-exported here)
describe a model as data, in the spirit of the tensor-parallel plans of
picotron and torchtitan (``{"attention.wq": ColwiseParallel()}``): each :class:`Tensor` names its
shape and its *split*:

==============  =========================================================================
split           what one rank of a tensor-parallel group of ``t`` holds
==============  =========================================================================
``column``      the output features divided by t (Q, column-parallel FC1/gate/up, their biases)
``kv``          K or V by key/value heads: kv_heads/t heads, or one whole head when
                t > kv_heads (each head then kept by t/kv_heads ranks)
``row``         the input features divided by t (attention output, FC2/down)
``vocab``       the vocabulary rows, ⌈V/t⌉ each (vocab-parallel embedding and LM head), or
                the padded vocabulary's rows (Megatron pads V to a multiple of 128·t)
``replicated``  everything (norms, row-parallel biases, learned positions, the MoE router,
                MLA's down-projections to the latent)
==============  =========================================================================

Routed experts (``expert=True``) are further divided over the ``e`` expert-parallel ranks.
Source: Shoeybi et al. 2019 (Megatron-LM) §3 for the column/row/vocab splits and the replicated
norms and row-parallel biases; Ainslie et al. 2023 / Megatron-Core for grouped-query K/V; Lepikhin
et al. 2021 (GShard) for experts over e.

Everything else derives from this table: the whole model's counts (:func:`param_counts`,
``ModelSpec.num_params``), one GPU's share of a pipeline stage (:func:`stage_params`, used by the
estimator, the communication model and the planner), the TP table of the book
(:func:`tp_param_counts`), the weight matrices quantisation touches (:func:`linear_shapes`),
serving shards, the allocator's tensor list (:func:`stage_tensor_numels`) and the matmul weights
that set the FLOPs (:func:`layer_matmul_params`).

The functions take any object with :class:`~parmem.model.ModelSpec`'s shape attributes; this
module imports nothing else from ``parmem`` but the validators and the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._check import cdiv, integer, normalised_cache
from .table import (
    PLACES,
    SPLITS,
    Tensor,
    layer_groups,
    layer_tensors,
    model_tensors,
    moe_layer_count,
)

if TYPE_CHECKING:  # pragma: no cover
    from .model import ModelSpec

__all__ = [
    "SPLITS",
    "PLACES",
    "Tensor",
    "ShardCount",
    "layer_tensors",
    "layer_groups",
    "moe_layer_count",
    "model_tensors",
    "local_numel",
    "kv_heads_local",
    "vocab_rows",
    "check_heads",
    "check_tp",
    "param_counts",
    "layer_params",
    "stage_params",
    "stage_tensors",
    "stage_tensor_numels",
    "tp_param_counts",
    "linear_shapes",
    "layer_matmul_params",
    "largest_module_params",
    "factored_numel",
]


# ---------------------------------------------------------------------------- one rank's share
def check_tp(spec: Any, tp: int, ep: int = 1) -> None:
    """Raise ``ValueError`` unless ``tp`` (and ``ep``) can split ``spec`` as the table says:
    t divides the heads and the MLP widths, t and kv_heads divide one another, e the experts."""
    check_heads(spec, tp)
    ep = integer("ep", ep)
    if getattr(spec, "mtp_layers", 0) and spec.hidden % tp:
        raise ValueError(f"tp={tp} must divide hidden={spec.hidden} (the MTP projection)")
    if spec.ffn_hidden % tp:
        raise ValueError(f"tp={tp} must divide ffn_hidden={spec.ffn_hidden}")
    if spec.num_experts:
        if spec.expert_ffn_hidden % tp:
            raise ValueError(f"tp={tp} must divide expert_ffn_hidden={spec.expert_ffn_hidden}")
        if spec.num_experts % ep:
            raise ValueError(f"ep={ep} must divide num_experts={spec.num_experts}")
    elif ep > 1:
        raise ValueError(f"ep={ep} needs a mixture-of-experts model ({spec.name} is dense)")


def check_heads(spec: Any, tp: int) -> None:
    """Raise ``ValueError`` unless ``tp`` can split the attention: t divides the query heads, and
    t and kv_heads divide one another."""
    tp = integer("tp", tp)
    if spec.heads % tp:
        raise ValueError(f"tp={tp} must divide heads={spec.heads}")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        raise ValueError(f"tp={tp} and kv_heads={spec.kv_heads}: one must divide the other")


def kv_heads_local(spec: Any, tp: int) -> int:
    """Key/value heads on one tensor-parallel rank: kv_heads/t, or 1 when t > kv_heads (the
    head is then duplicated on t/kv_heads ranks, as Megatron-Core and vLLM do)."""
    return max(int(spec.kv_heads) // tp, 1)


def vocab_rows(spec: Any, tp: int, multiple: int = 1) -> int:
    """Vocabulary rows of the embedding (or LM head) on one rank: ⌈V/t⌉, or with vocabulary
    padding the padded V' / t, V' the smallest multiple of ``multiple`` · t not below V
    (Megatron-LM's ``vocab_size_with_padding``, ``--make-vocab-size-divisible-by 128``: V = 32000
    at t = 8 pads to 32768). ``multiple=1`` is no padding: ⌈V/t⌉."""
    return cdiv(spec.vocab_size, multiple * tp) * multiple


def local_shape(spec: Any, x: Tensor, tp: int = 1, vocab_multiple: int = 1) -> tuple[int, int]:
    """(rows, cols) of one copy of tensor ``x`` on one rank of a tensor-parallel group of
    ``tp`` (the split column of the module docstring)."""
    if x.split == "column":
        return x.rows // tp, x.cols
    if x.split == "row":
        return x.rows, x.cols // tp
    if x.split == "kv":
        return kv_heads_local(spec, tp) * spec.head_dim, x.cols
    if x.split == "vocab":
        return vocab_rows(spec, tp, vocab_multiple), x.cols
    return x.rows, x.cols


def local_numel(spec: Any, x: Tensor, tp: int = 1, ep: int = 1, vocab_multiple: int = 1) -> int:
    """Elements of tensor ``x`` (all its local copies) on one rank of ``tp`` × ``ep``."""
    rows, cols = local_shape(spec, x, tp, vocab_multiple)
    return rows * cols * (x.count // ep if x.expert else x.count)


@normalised_cache(maxsize=1024)
def layer_params(spec: Any, tp: int = 1, ep: int = 1, moe: bool | None = None) -> tuple[int, int]:
    """(dense, expert) parameters of one layer on one rank of ``tp`` × ``ep`` (an MoE layer of a
    model with experts unless ``moe=False``)."""
    dense = expert = 0
    for x in layer_tensors(spec, moe):
        n = local_numel(spec, x, tp, ep)
        if x.expert:
            expert += n
        else:
            dense += n
    return dense, expert


def _stage_layers(spec: Any, n: int, first: bool, last: bool, start: int | None) -> int:
    """The first layer of a stage of ``n`` layers: ``start`` when given, else 0 on the first
    stage and L - n on the others (the deepest layers: for a model whose first layers are
    dense, the largest stage a middle one can be)."""
    if start is not None:
        return integer("start", start, 0, max(spec.layers - n, 0))
    return 0 if first else spec.layers - n


def _own(x: Tensor, first: bool, last: bool, mtp: bool) -> bool:
    """Whether a stage keeps model tensor ``x`` (the first, the last, MTP on the last)."""
    if x.component in ("mtp", "mtp_experts") and not mtp:
        return False
    return (x.place == "first" and first) or (x.place == "last" and last)


def stage_tensors(
    spec: Any,
    n_layers: int | None = None,
    first: bool = True,
    last: bool = True,
    *,
    start: int | None = None,
    mtp: bool = True,
) -> tuple[tuple[tuple[int, tuple[Tensor, ...]], ...], tuple[Tensor, ...]]:
    """What a pipeline stage holds, as :func:`stage_params` counts it: (its layers as
    :func:`~parmem.table.layer_groups` groups them, the model tensors it keeps: the embedding on
    the ``first`` stage, the final norm and LM head on the ``last``, MTP there unless
    ``mtp=False``)."""
    n = spec.layers if n_layers is None else n_layers
    groups = layer_groups(spec, _stage_layers(spec, n, first, last, start), n)
    whole = model_tensors(spec, pipeline=not (first and last))
    return groups, tuple(x for x in whole if _own(x, first, last, mtp))


def stage_params(
    spec: Any,
    tp: int = 1,
    ep: int = 1,
    n_layers: int | None = None,
    first: bool = True,
    last: bool = True,
    vocab_multiple: int = 1,
    *,
    start: int | None = None,
    mtp: bool = True,
) -> tuple[int, int]:
    """(dense, expert) parameters one GPU of a pipeline stage holds before ZeRO sharding.

    ``n_layers`` transformer layers (default: all) from layer ``start`` (default:
    :func:`_stage_layers`), dense and MoE layers as :func:`~parmem.table.layer_groups` counts them, plus the
    embedding on the ``first`` stage and the final norm and LM head on the ``last`` (a tied LM
    head counts once on a single stage and is copied on the last stage of a pipeline), and the
    MTP modules on the last stage unless ``mtp=False`` (serving without speculative decoding).
    Expert parameters are kept apart because ZeRO shards them over the expert-data-parallel
    group. ``vocab_multiple`` pads the vocabulary (:func:`vocab_rows`).
    """
    n = spec.layers if n_layers is None else n_layers
    dense = expert = 0
    for count, tensors in layer_groups(spec, _stage_layers(spec, n, first, last, start), n):
        d, e = layer_params(spec, tp, ep, _is_moe(tensors))
        dense, expert = dense + count * d, expert + count * e
    for x in model_tensors(spec, pipeline=not (first and last)):
        if _own(x, first, last, mtp):
            if x.expert:
                expert += local_numel(spec, x, tp, ep, vocab_multiple)
            else:
                dense += local_numel(spec, x, tp, ep, vocab_multiple)
    return dense, expert


def _is_moe(tensors: tuple[Tensor, ...]) -> bool:
    """Whether a layer's tensors are an MoE layer's (it has routed experts)."""
    return any(x.expert for x in tensors)


def factored_numel(
    spec: Any,
    tp: int = 1,
    ep: int = 1,
    n_layers: int | None = None,
    first: bool = True,
    last: bool = True,
    vocab_multiple: int = 1,
    *,
    start: int | None = None,
) -> tuple[int, int]:
    """(dense, expert) elements of a factored second moment for the parameters of
    :func:`stage_params`: rows + columns of each local matrix, every value of a vector
    (Shazeer & Stern 2018, Adafactor §3)."""

    def second_moment(x: Tensor) -> int:
        rows, cols = local_shape(spec, x, tp, vocab_multiple)
        copies = x.count // ep if x.expert else x.count
        return copies * (rows + cols if cols > 1 else rows)

    n = spec.layers if n_layers is None else n_layers
    out = [0, 0]  # dense, expert
    for count, tensors in layer_groups(spec, _stage_layers(spec, n, first, last, start), n):
        for x in tensors:
            out[x.expert] += count * second_moment(x)
    for x in model_tensors(spec, pipeline=not (first and last)):
        if _own(x, first, last, True):
            out[x.expert] += second_moment(x)
    return out[0], out[1]


def largest_module_params(spec: Any, tp: int = 1, vocab_multiple: int = 1, ep: int = 1) -> int:
    """Parameters of the largest module on one rank, as Transformers 5.23 builds the modules:
    what DeepSpeed's ``model_to_params`` (``runtime/zero/stage3.py``, fed to
    ``estimate_zero3_model_states_mem_needs``) calls ``largest_layer_params``, the largest
    ``sum(p.numel() for p in m.parameters(recurse=False))`` over ``model.modules()``.

    A module is a weight with its bias (``name.weight`` and ``name.bias``: an ``nn.Linear``, a
    norm), the embedding or the LM head. The shared experts of a layer are one MLP of
    shared_experts · expert_ffn_hidden (DeepseekV3MoE's ``shared_experts``,
    Qwen2MoeSparseMoeBlock's ``shared_expert``): each of its projections is one module of all
    their rows. The routed experts of a layer are ONE module whose fused 3-D parameters hold
    every expert (MixtralExperts, PhimoeExperts, GraniteMoeExperts, Qwen2MoeExperts,
    Qwen3MoeExperts, DeepseekV2Experts, DeepseekV3Experts: ``gate_up_proj`` (E, 2f, h) and
    ``down_proj`` (E, h, f); Llama4TextExperts and GptOssExperts their transposes, GptOssExperts
    also ``gate_up_proj_bias`` and ``down_proj_bias``): all of a layer's expert tensors, biases
    included, summed. Under expert parallelism (``ep``) the module holds its rank's E/e local
    experts (DeepSpeed's own MoE layer, which the deepspeed profile does not describe, keeps one
    module per expert instead). Modules that fuse tensors this table keeps apart, such as GPT-2's
    ``c_attn`` or Phi-3's ``qkv_proj`` and ``gate_up_proj``, are larger than this table's
    largest entry."""
    sizes: dict[str, int] = {}
    tensors = (*layer_tensors(spec, False), *layer_tensors(spec), *model_tensors(spec))
    for x in dict.fromkeys(tensors):
        # "experts.gate.weight" -> "experts" (the fused block), "attn.q.weight" -> "attn.q"
        module = x.name.rsplit(".", 2 if x.expert else 1)[0]
        sizes[module] = sizes.get(module, 0) + local_numel(spec, x, tp, ep, vocab_multiple)
    return max(sizes.values())


def stage_tensor_numels(
    spec: Any,
    tp: int = 1,
    ep: int = 1,
    n_layers: int | None = None,
    first: bool = True,
    last: bool = True,
    *,
    start: int | None = None,
) -> list[int]:
    """Element counts of the tensors one GPU of a stage holds, one entry per tensor (an expert's
    matrices are one entry per local expert), layer by layer, then the first stage's and the
    last stage's own tensors. Their sum is :func:`stage_params` (dense + expert)."""
    n = spec.layers if n_layers is None else n_layers
    out: list[int] = []
    for count, tensors in layer_groups(spec, _stage_layers(spec, n, first, last, start), n):
        per_layer: list[int] = []
        for x in tensors:
            copies = x.count // ep if x.expert else x.count
            per_layer += [local_numel(spec, x, tp, ep) // copies] * copies
        out += per_layer * count
    for x in model_tensors(spec, pipeline=not (first and last)):
        if _own(x, first, last, True):
            out.append(local_numel(spec, x, tp, ep))
    return out


# ---------------------------------------------------------------------------- whole-model views
def param_counts(spec: Any) -> dict[str, int]:
    """Parameters of the whole model by component (all layers summed): ``embedding``,
    ``positions``, ``attention``, ``mlp`` (dense layers) and/or ``experts`` /
    ``shared_experts`` / ``router`` (MoE layers), ``norms`` (every layer's, the q/k and MLA
    latent norms and the final one), ``lm_head`` (0 when tied), and with MTP modules ``mtp`` and
    ``mtp_experts`` (their routed experts)."""
    return dict(_param_counts(spec))


@normalised_cache(maxsize=256)
def _param_counts(spec: Any) -> tuple[tuple[str, int], ...]:
    keys = ["embedding", "positions", "attention", "norms"]
    keys += ["experts", "shared_experts", "router"] if spec.num_experts else []
    keys += ["mlp"] if moe_layer_count(spec) < spec.layers else []
    keys += ["mtp", "mtp_experts"] if getattr(spec, "mtp_layers", 0) else []
    out = dict.fromkeys([*keys, "lm_head"], 0)
    for count, tensors in layer_groups(spec):
        for x in tensors:
            out[x.component] += x.numel * count
    for x in model_tensors(spec):
        out[x.component] += x.numel
    return tuple(out.items())


@dataclass(frozen=True)
class ShardCount:
    """One component of the model and how tensor parallelism splits it.

    ``full`` parameters in the whole model, ``per_rank`` on one tensor-parallel rank, ``split``
    says how (``"replicated"`` when every rank keeps all of it)."""

    component: str
    full: int
    per_rank: int
    split: str

    @property
    def replicated(self) -> bool:
        return self.split == "replicated"


_GROUP_SPLIT = {
    "embedding": "vocabulary rows",
    "positions": "replicated",
    "attention Q, O": "heads",
    "attention latent": "replicated",
    "MLP": "inner width",
    "shared experts": "inner width",
    "experts": "experts over e, width over t",
    "router": "replicated",
    "row-parallel biases": "replicated",
    "norms": "replicated",
    "LM head": "vocabulary rows",
    "MTP module": "as its layer, on the last stage",
}


def tp_param_counts(spec: ModelSpec, tp: int = 1, ep: int = 1) -> list[ShardCount]:
    """Parameters of the whole model (all layers) by component, and what one rank of a
    tensor-parallel group of ``tp`` (and expert-parallel group of ``ep``) holds: the table of
    :func:`~parmem.table.layer_tensors` and :func:`~parmem.table.model_tensors` grouped as the book's TP chapters show it
    (Megatron-LM's layout, Shoeybi et al. 2019 §3). The per-rank sum equals the parameters
    :func:`parmem.estimate` puts on a single-stage GPU."""
    if isinstance(spec, str) or not hasattr(spec, "head_dim"):
        raise ValueError(f"spec must be a ModelSpec (ModelSpec.preset(name)), got {spec!r}")
    check_tp(spec, tp, ep)
    full: dict[str, int] = {}
    local: dict[str, int] = {}
    rows = [(x, k) for k, group in layer_groups(spec) for x in group]
    for x, times in rows + [(x, 1) for x in model_tensors(spec)]:
        full[x.group] = full.get(x.group, 0) + times * x.numel
        local[x.group] = local.get(x.group, 0) + times * local_numel(spec, x, tp, ep)
    order = (
        "embedding",
        "positions",
        "attention Q, O",
        "attention K, V",
        "attention latent",
        "experts",
        "shared experts",
        "router",
        "MLP",
        "row-parallel biases",
        "norms",
        "LM head",
        "MTP module",
    )
    kv_split = (
        "kv heads" if tp <= spec.kv_heads else f"kv heads, each kept by {tp // spec.kv_heads} ranks"
    )
    return [
        ShardCount(g, full[g], local[g], kv_split if g == "attention K, V" else _GROUP_SPLIT[g])
        for g in order
        if g in full
    ]


def linear_shapes(spec: Any) -> list[tuple[str, int, int, int]]:
    """(name, in_features, out_features, count over all layers) of every transformer-layer weight
    matrix (the ones weight quantisation touches; the router, embeddings and LM head are not
    among them). Dense and MoE layers of one model each add their own matrices."""
    out: dict[tuple[str, int, int], int] = {}
    for k, group in layer_groups(spec):
        for x in group:
            if x.kind == "linear":
                key = (x.name.removesuffix(".weight").replace(".", "_"), x.cols, x.rows)
                out[key] = out.get(key, 0) + x.count * k
    return [(*key, n) for key, n in out.items()]


def layer_matmul_params(spec: Any) -> int:
    """Weights one token multiplies through in one layer: Q, K, V, output, the MLP (for MoE the
    router, the ``top_k`` routed experts and the shared experts); biases and norms excluded.
    An MoE layer for a model with experts: for DeepSeek-V3 and Llama-4 Maverick the dense
    layers multiply through as many MLP weights as an MoE layer's top_k + shared experts (3 ·
    7168 · 18432 = 9 · 3 · 7168 · 2048), so only the router's E · h differs."""
    total = 0
    for x in layer_tensors(spec):
        if x.kind in ("linear", "router"):
            total += x.rows * x.cols * (spec.top_k if x.expert else x.count)
    return total
