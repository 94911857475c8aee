"""Communication volume and alpha-beta time of collectives and of a training step.

Two layers:

1. **Collectives.** Bytes that each GPU *sends* for one collective on a tensor of
   ``size`` bytes (the FULL tensor: the all-reduce input, the all-gather output,
   the reduce-scatter input, one rank's all-to-all buffer) over ``n`` ranks,
   with the ring algorithm (Thakur, Rabenseifner & Gropp 2005, §4; Patarasuk &
   Yuan 2009 show the ring all-reduce is bandwidth-optimal), and
   ``collective_time = steps * latency + bytes_sent / bandwidth`` (the
   alpha-beta model). Reduction arithmetic is not timed.

   Rounding: the ring splits the tensor into ``n`` chunks; when ``size`` is not a
   multiple of ``n`` every chunk is taken as ``ceil(size / n)`` bytes (the last
   chunk padded), so the results are exact integers and equal to the textbook
   ``(n-1)/n * size`` whenever ``n`` divides ``size``.

2. **A training step.** :func:`step_comm` lists every collective one GPU takes
   part in during one optimizer step (``m`` micro-batches) under DP/ZeRO, TP,
   SP, PP, CP and EP, as :class:`CommOp` records gathered in a
   :class:`CommBreakdown` (bytes per category, and alpha-beta time on a
   :class:`~parmem.hardware.Hardware`). The time is a serial sum: no overlap of
   communication with computation or with other communication.

Example:
    >>> from parmem.comm import all_reduce_bytes
    >>> all_reduce_bytes(2**30, 8) == 2**30 * 7 // 4     # 1 GiB over 8 ranks: 1.75 GiB
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._check import boolean, integer
from .activations import layer_input_bytes
from .config import PRECISIONS, ParallelConfig, TrainingSetup
from .engines import TP_OPS
from .hardware import Hardware, Link, hardware_preset, link_preset
from .layout import Layout, dispatch_slots, layout
from .lora import lora_layer_params
from .model import ModelSpec
from .states import reduced_grad_itemsize

__all__ = [
    "COLLECTIVES", "CATEGORIES", "all_reduce_bytes", "reduce_scatter_bytes",
    "all_gather_bytes", "all_to_all_bytes", "broadcast_bytes", "send_recv_bytes",
    "collective_bytes", "collective_steps", "collective_time", "CommOp", "CommBreakdown",
    "StageShape", "stage_shape", "collectives", "step_comm", "placement",
    "category_times", "op_time", "RING_OPS", "TP_OPS", "zero_redundancy_comm",
]  # fmt: skip

#: Collective names accepted by :func:`collective_bytes` and :func:`collective_time`.
COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv",
)  # fmt: skip
#: How :func:`collectives` begins the ``what`` of the expert weights' data-parallel collectives
#: (over the expert-data-parallel group, which :func:`op_time` places on its own).
EXPERT_TAG = "expert "
#: Categories of a :class:`CommBreakdown`.
CATEGORIES: tuple[str, ...] = ("dp", "tp", "sp", "pp", "ep", "cp")


def _checked(size: int, n: int) -> tuple[int, int]:
    return integer("size", size, 0), integer("n", n, 1)


def _sent(op: str, size: int, n: int) -> int:
    """Bytes one rank sends for ``op`` on a ``size``-byte tensor over ``n`` ranks (arguments
    already checked): the ring moves chunks of ⌈size/n⌉ bytes, n − 1 of them per pass."""
    if n == 1:
        return 0
    chunk = -(-size // n)
    if op == "all_reduce":
        return 2 * (n - 1) * chunk
    if op in ("broadcast", "send_recv"):
        return size
    return (n - 1) * chunk


def _steps(op: str, n: int) -> int:
    """Sequential messages of ``op`` on ``n`` ranks (arguments already checked)."""
    if n == 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1)
    if op == "send_recv":
        return 1
    return n - 1


def all_reduce_bytes(size: int, n: int) -> int:
    """Ring all-reduce: ``2 (n-1) ceil(size/n)`` bytes sent per rank (= 2(n-1)/n * size).

    A reduce-scatter then an all-gather, each ``n - 1`` steps of one chunk
    (Thakur et al. 2005, §4.5; Patarasuk & Yuan 2009, bandwidth-optimal).
    """
    size, n = _checked(size, n)
    return _sent("all_reduce", size, n)


def reduce_scatter_bytes(size: int, n: int) -> int:
    """Ring reduce-scatter of a ``size``-byte input: ``(n-1) ceil(size/n)`` (Thakur et al. 2005, §4.4)."""
    size, n = _checked(size, n)
    return _sent("reduce_scatter", size, n)


def all_gather_bytes(size: int, n: int) -> int:
    """Ring all-gather into a ``size``-byte output: ``(n-1) ceil(size/n)`` (Thakur et al. 2005, §4.1)."""
    size, n = _checked(size, n)
    return _sent("all_gather", size, n)


def all_to_all_bytes(size: int, n: int) -> int:
    """Pairwise all-to-all of a ``size``-byte buffer per rank: ``(n-1) ceil(size/n)``.

    Each rank keeps one of its ``n`` blocks and sends the others (Thakur et al.
    2005, §4.6, pairwise exchange); used by expert parallelism (Lepikhin et al.
    2020, §3.2; Fedus et al. 2021, §2.2).
    """
    size, n = _checked(size, n)
    return _sent("all_to_all", size, n)


def broadcast_bytes(size: int, n: int) -> int:
    """Pipelined ring (chain) broadcast, as NCCL runs it: every rank but the last
    forwards the whole ``size`` bytes, so the busiest rank sends ``size`` (0 if n == 1)."""
    size, n = _checked(size, n)
    return _sent("broadcast", size, n)


def send_recv_bytes(size: int) -> int:
    """Point-to-point send: ``size`` bytes (pipeline stage boundaries, Narayanan et al. 2021)."""
    return integer("size", size, 0)


def _check_op(op: str) -> None:
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective op {op!r}; known: {', '.join(COLLECTIVES)}")


def collective_bytes(op: str, size: int, n: int) -> int:
    """Bytes one rank sends for collective ``op`` (one of :data:`COLLECTIVES`).

    ``send_recv`` with ``n == 1`` is a copy to oneself and sends nothing.
    """
    _check_op(op)
    size, n = _checked(size, n)
    return _sent(op, size, n)


def collective_steps(op: str, n: int, algorithm: str = "ring") -> int:
    """Sequential messages (latency terms) of ``op`` on ``n`` ranks.

    Ring all-reduce ``2(n-1)``; reduce-scatter, all-gather, pairwise all-to-all and
    chain broadcast ``n-1``; send/recv 1; 0 when ``n == 1`` (Thakur et al. 2005, §4).
    """
    _check_op(op)
    n = integer("n", n, 1)
    if algorithm != "ring":
        raise ValueError(f"algorithm={algorithm!r} is not supported; known: ring")
    return _steps(op, n)


def collective_time(op: str, size: int, n: int, link: Link | str, algorithm: str = "ring") -> float:
    """Alpha-beta time: ``steps * link.latency + bytes_sent / link.bandwidth`` seconds.

    Source: Hockney's alpha-beta model as used by Thakur et al. 2005, §2 and §4
    (e.g. ring all-reduce ``2(n-1) alpha + 2 (n-1)/n * size * beta``). ``link`` may
    be a :class:`~parmem.hardware.Link` or a link preset name.
    """
    if isinstance(link, str):
        link = link_preset(link)
    if not isinstance(link, Link):
        raise ValueError(f"link={link!r} must be a Link or a link preset name")
    nbytes = collective_bytes(op, size, n)
    return collective_steps(op, n, algorithm) * link.latency + nbytes / link.bandwidth


@dataclass(frozen=True)
class CommOp:
    """``count`` identical collectives in one training step.

    Attributes:
        category: one of :data:`CATEGORIES`.
        what: what is communicated, e.g. ``"gradient all-reduce"``.
        op: one of :data:`COLLECTIVES`.
        size: bytes of the full tensor (see the module docstring).
        n: ranks in the group.
        count: how many per step.
    """

    category: str
    what: str
    op: str
    size: int
    n: int
    count: int

    @property
    def bytes(self) -> int:
        """Bytes this GPU sends for all ``count`` collectives."""
        return self.count * _sent(self.op, self.size, self.n)

    def time(self, link: Link, bandwidth: float | None = None, share: float = 1.0) -> float:
        """Alpha-beta time of all ``count`` collectives on ``link`` (seconds): ``share`` of the
        bytes sent at ``bandwidth`` (the link's own where not given) after the link's latency
        per step (:func:`op_time` passes a node's ports and an all-to-all's remote share)."""
        bw = link.bandwidth if bandwidth is None else bandwidth
        return self.count * (
            _steps(self.op, self.n) * link.latency + _sent(self.op, self.size, self.n) * share / bw
        )


@dataclass(frozen=True)
class CommBreakdown:
    """Every collective one GPU takes part in during one training step.

    ``breakdown.dp`` (and ``tp``, ``sp``, ``pp``, ``ep``, ``cp``) are bytes sent
    per category; ``total`` their sum; :meth:`time` the alpha-beta time.
    Collectives that send nothing (one rank, or an empty tensor) are left out of ``ops``.
    """

    ops: tuple[CommOp, ...]

    def bytes_of(self, category: str) -> int:
        """Bytes sent for ``category`` (one of :data:`CATEGORIES`)."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; known: {', '.join(CATEGORIES)}")
        return sum(o.bytes for o in self.ops if o.category == category)

    dp = property(lambda self: self.bytes_of("dp"), doc="Data-parallel / ZeRO bytes.")
    tp = property(lambda self: self.bytes_of("tp"), doc="Tensor-parallel all-reduce bytes.")
    sp = property(lambda self: self.bytes_of("sp"), doc="Sequence-parallel (TP+SP) bytes.")
    pp = property(lambda self: self.bytes_of("pp"), doc="Pipeline point-to-point bytes.")
    ep = property(lambda self: self.bytes_of("ep"), doc="Expert-parallel all-to-all bytes.")
    cp = property(lambda self: self.bytes_of("cp"), doc="Context-parallel K/V exchange bytes.")

    @property
    def total(self) -> int:
        """All bytes this GPU sends in the step."""
        return sum(o.bytes for o in self.ops)

    def as_dict(self) -> dict[str, int]:
        """Bytes per category (every category present, zeros included)."""
        return {c: self.bytes_of(c) for c in CATEGORIES}

    def to_rows(self) -> list[dict[str, object]]:
        """One dict per :class:`CommOp`, for a table."""
        return [{**dataclasses.asdict(o), "bytes": o.bytes} for o in self.ops]

    def times(
        self,
        hardware: Hardware | str,
        *,
        tp_intra: bool = True,
        cp_intra: bool = True,
        ep_intra: bool = True,
        dp_intra: bool = False,
        pp_intra: bool = False,
        **per_node: int,
    ) -> dict[str, float]:
        """Alpha-beta seconds per category on ``hardware`` (a Hardware or a preset name).

        ``<cat>_intra=True`` puts that group on the NVLink ``intra_node`` link,
        otherwise on the per-GPU ``inter_node`` link. The defaults follow
        Megatron-LM's rank order (tp, cp, ep, dp, pp from fastest-varying), which
        keeps the inner groups inside a node. SP uses the TP setting.
        ``<group>_per_node`` (``tp``, ``cp``, ``ep``, ``dp``, ``edp``, ``pp``; 1 where not given):
        how many ranks of a group that spans nodes share each node, whose network ports its
        ring collectives share (:func:`op_time`). ``**placement(parallel, gpus_per_node)``
        passes them all.
        """
        hw = hardware_preset(hardware) if isinstance(hardware, str) else hardware
        if not isinstance(hw, Hardware):
            raise ValueError(f"hardware={hardware!r} must be a Hardware or a preset name")
        known = {f"{c}_per_node" for c in ("tp", "cp", "ep", "dp", "edp", "pp")}
        for key, k in per_node.items():
            if key not in known:
                raise ValueError(f"{key}: unknown keyword; known: {', '.join(sorted(known))}")
            integer(key, k, 1)
        where: dict[str, bool | int] = dict(
            dp_intra=dp_intra,
            tp_intra=tp_intra,
            pp_intra=pp_intra,
            ep_intra=ep_intra,
            cp_intra=cp_intra,
            **per_node,
        )
        return category_times(self.ops, hw, where)

    def time(self, hardware: Hardware | str, **placement: Any) -> float:
        """Total alpha-beta seconds, serial sum of :meth:`times` (same keywords: ``bool``
        ``<group>_intra`` and ``int`` ``<group>_per_node``)."""
        times: dict[str, float] = self.times(hardware, **placement)
        return sum(times.values(), 0.0)


@dataclass(frozen=True)
class StageShape:
    """What the communication of one GPU of one pipeline stage depends on: the quantities
    :func:`step_comm` reads off a model, a layout and a setup (built by :func:`stage_shape`).

    ``params`` and ``expert_params``: parameters this GPU holds before ZeRO sharding (after TP,
    EP and PP; :func:`parmem.sharding.stage_params`). ``layers`` and ``moe_layers``: transformer
    (and MoE) layers on the stage. ``kv_hidden``: kv_heads · head_dim. ``grad_bytes``,
    ``param_bytes``, ``act_bytes``: bytes of one reduced gradient, one gathered parameter, one
    activation element. ``capacity_factor``: ``None`` (the all-to-all carries exactly
    ``top_k`` slots per token) or the GShard/Switch factor that pads its buffers.
    """

    params: int
    seq_len: int
    micro_batch: int
    hidden: int
    layers: int
    num_microbatches: int = 1
    dp: int = 1
    zero: int = 0
    grad_bytes: int = 2
    param_bytes: int = 2
    tp: int = 1
    sp: bool = False
    pp: int = 1
    v: int = 1
    stage: int = 0
    cp: int = 1
    kv_hidden: int = 0
    ep: int = 1
    moe_layers: int = 0
    expert_params: int = 0
    top_k: int = 1
    capacity_factor: float | None = None
    act_bytes: int = 2
    recompute: str = "none"
    sp_regather: bool = False

    @property
    def dp_group(self) -> int:
        """The ranks that reduce the dense gradients together: d·cp (as
        :attr:`parmem.layout.Layout.dp_group`)."""
        return self.dp * self.cp


def stage_shape(lay: Layout, stage: int, *, sp_regather: bool = False) -> StageShape:
    """The :class:`StageShape` of pipeline stage ``stage`` of a :class:`~parmem.layout.Layout`:
    the stage's parameters (the layout's stage walk, with the engine's vocabulary padding), the
    gradient element the engine reduces (:func:`~parmem.states.reduced_grad_itemsize`), the
    precision's weight and activation elements."""
    spec, par, setup = lay.spec, lay.parallel, lay.setup
    st = lay.stages[stage]
    params, expert = st.dense_params, st.expert_params
    grad_bytes = reduced_grad_itemsize(
        setup.engine, setup.precision, par.zero, setup.grad_dtype, setup.master_weights
    )
    if setup.adapter != "none":  # only the adapters train: DDP reduces their fp32 gradients
        layers = range(st.start, st.start + st.layers)
        params = sum(
            lora_layer_params(spec, setup.lora_rank, setup.lora_targets, i) for i in layers
        )
        expert, grad_bytes = 0, 4
    return StageShape(
        params=params,
        seq_len=setup.seq_len,
        micro_batch=setup.micro_batch,
        hidden=spec.hidden,
        layers=st.layers,
        num_microbatches=setup.num_microbatches,
        dp=par.dp,
        zero=par.zero,
        grad_bytes=grad_bytes,
        param_bytes=PRECISIONS[setup.precision]["param"],
        tp=par.tp,
        sp=par.sp,
        pp=par.pp,
        v=par.vpp,
        stage=stage,
        cp=par.cp,
        kv_hidden=spec.kv_dim,
        ep=par.ep,
        moe_layers=st.moe_layers,
        expert_params=expert,
        top_k=spec.top_k or 1,
        capacity_factor=lay.capacity_factor,
        act_bytes=lay.act_bytes,
        recompute=setup.recompute,
        sp_regather=sp_regather,
    )


def _zero_ops(
    add: Callable[..., None],
    params: int,
    n: int,
    zero: int,
    m: int,
    gbytes: int,
    pbytes: int,
    tag: str,
) -> None:
    """DP / ZeRO collectives for ``params`` parameters reduced over ``n`` ranks."""
    grads, weights = params * gbytes, params * pbytes
    if zero == 0:
        add("dp", f"{tag}gradient all-reduce", "all_reduce", grads, n, 1)
        return
    add("dp", f"{tag}gradient reduce-scatter", "reduce_scatter", grads, n, m if zero >= 2 else 1)
    if zero == 3:
        add("dp", f"{tag}parameter all-gather (fwd + bwd)", "all_gather", weights, n, 2 * m)
    else:
        add("dp", f"{tag}updated-parameter all-gather", "all_gather", weights, n, 1)


def collectives(x: StageShape) -> CommBreakdown:
    """Every collective one GPU of the stage described by ``x`` takes part in during one
    optimizer step of ``m = x.num_microbatches`` micro-batches. The terms (X = (s/cp)·b·h·
    act_bytes, the layer's input on this GPU):

    * **dp** (Rajbhandari et al. 2020, §7): over ``dp * cp`` ranks (CP ranks hold the same
      weights). ZeRO-0: one all-reduce of the gradients, ``2(d-1)/d * 2Ψ``; ZeRO-1: reduce-scatter
      of gradients + all-gather of updated parameters, the same bytes; ZeRO-2: the reduce-scatter
      runs every micro-batch (DeepSpeed ``engine.allreduce_gradients``: "ZeRO stage >= 2
      communicates during non gradient accumulation boundaries as well"); ZeRO-3: also
      all-gathers parameters in each micro-batch's forward and backward, ``3Ψ``-equivalent, 1.5x
      DP when m = 1 (§7.2.2). Expert parameters reduce over the expert-data-parallel group of
      ``dp * cp / ep`` ranks.
    * **tp** (Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2.2): per layer per
      micro-batch 2 all-reduces of X forward (after attention and MLP), 2 in backward, +2 with full
      recomputation (the forward runs again); selective recomputation (Korthikanti et al. 2022, §5)
      redoes only the attention core, which needs no collective.
    * **sp** (Korthikanti et al. 2022, §4.2.2): each all-reduce becomes an all-gather +
      reduce-scatter of X: the same bytes. ``sp_regather`` also counts the all-gather Megatron-LM
      repeats in backward (``LinearWithGradAccumulationAndAsyncCommunication`` saves only the
      sequence shard of a column-parallel input and re-gathers it for the weight gradient): 2 per
      layer per micro-batch.
    * **pp** (Narayanan et al. 2021, §2.2 and §4.1): per micro-batch and chunk a stage sends its
      output X (/t with SP: scatter-gather) forward unless it holds the model's last chunk, and the
      input gradient backward unless it holds the first: ``v`` sends per direction, ``v - 1`` at
      the ends.
    * **cp** (Liu et al. 2023, Ring Attention; Megatron-Core context parallelism): per layer per
      micro-batch, K and V (``2 s b kv_hidden act_bytes / t`` in full) go round the ring: an
      all-gather forward, an all-gather of K/V and a reduce-scatter of dK/dV backward, +1
      all-gather with full recomputation.
    * **ep** (Lepikhin et al. 2020, §3.2; Fedus et al. 2021, §2.2): per MoE layer per
      micro-batch, dispatch + combine all-to-alls of ``tokens * top_k * h * act_bytes`` forward
      (tokens = s·b/cp, divided by t under SP), the same backward, +2 with full recomputation;
      with a capacity factor the buffers hold ``ceil(cf * tokens * top_k)`` slots.

    Not counted: embedding / LM-head collectives (vocab-parallel all-reduce, tied-embedding
    gradient all-reduce between first and last stage), loss all-reduces, and scalars.
    """
    m, L, tp = x.num_microbatches, x.layers, x.tp
    s_local = x.seq_len // x.cp
    fwd = 2 if x.recompute == "full" else 1  # forward passes per micro-batch
    # the TP collective's message: one layer input, whole (the boundary tensor without SP)
    act = layer_input_bytes(x.hidden, x.seq_len, x.micro_batch, cp=x.cp, act_bytes=x.act_bytes)
    ops: list[CommOp] = []

    def add(cat: str, what: str, op: str, size: int, n: int, count: int) -> None:
        if n > 1 and size and count:
            ops.append(CommOp(cat, what, op, size, n, count))

    _zero_ops(add, x.params, x.dp_group, x.zero, m, x.grad_bytes, x.param_bytes, "")
    if x.expert_params:
        _zero_ops(
            add,
            x.expert_params,
            x.dp_group // x.ep,
            x.zero,
            m,
            x.grad_bytes,
            x.param_bytes,
            EXPERT_TAG,
        )
    if tp > 1 and L:
        per = 2 * L * m
        if not x.sp:
            add("tp", TP_OPS[0], "all_reduce", act, tp, per * fwd)
            add("tp", TP_OPS[1], "all_reduce", act, tp, per)
        else:
            add("sp", TP_OPS[2], "all_gather", act, tp, per * fwd)
            add("sp", TP_OPS[3], "reduce_scatter", act, tp, per * fwd)
            add("sp", TP_OPS[4], "reduce_scatter", act, tp, per)
            add("sp", TP_OPS[5], "all_gather", act, tp, per)
            if x.sp_regather:
                add("sp", TP_OPS[6], "all_gather", act, tp, per)
    if x.pp > 1:
        i, v = x.stage, x.v
        boundary = layer_input_bytes(
            x.hidden, x.seq_len, x.micro_batch, tp=tp, sp=x.sp, cp=x.cp, act_bytes=x.act_bytes
        )
        add("pp", "forward activation send", "send_recv", boundary, 2, (v - (i == x.pp - 1)) * m)
        add("pp", "backward gradient send", "send_recv", boundary, 2, (v - (i == 0)) * m)
    if x.cp > 1 and L:
        kv = 2 * x.seq_len * x.micro_batch * (x.kv_hidden // tp) * x.act_bytes
        add("cp", "K/V all-gather (ring), forward", "all_gather", kv, x.cp, L * m * fwd)
        add("cp", "K/V all-gather (ring), backward", "all_gather", kv, x.cp, L * m)
        add("cp", "dK/dV reduce-scatter (ring)", "reduce_scatter", kv, x.cp, L * m)
    if x.ep > 1 and x.moe_layers:
        slots = dispatch_slots(
            s_local * x.micro_batch // (tp if x.sp else 1), x.top_k, x.capacity_factor
        )
        buf, n = slots * x.hidden * x.act_bytes, x.moe_layers * m
        add("ep", "dispatch + combine all-to-all, forward", "all_to_all", buf, x.ep, 2 * n * fwd)
        add("ep", "dispatch + combine all-to-all, backward", "all_to_all", buf, x.ep, 2 * n)
    return CommBreakdown(tuple(ops))


def step_comm(
    spec: ModelSpec,
    parallel: ParallelConfig | None = None,
    setup: TrainingSetup | None = None,
    *,
    stage: int | None = None,
    layers_per_stage: Sequence[int] | None = None,
    sp_regather: bool = False,
) -> CommBreakdown:
    """Collectives of one GPU in one optimizer step of ``spec`` trained with
    ``parallel``/``setup``, as :func:`parmem.estimate` sees the layout (the terms and their
    sources: :func:`collectives`).

    ``stage=None`` returns the pipeline stage that sends the most bytes (ties: the first).
    ``sp_regather=True`` counts the backward re-gather of Megatron-LM's sequence-parallel
    linear layers (off by default, as in Korthikanti et al. 2022's accounting).
    """
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    par = parallel if parallel is not None else ParallelConfig()
    if setup is None:
        setup = TrainingSetup(seq_len=min(2048, spec.max_positions))
    boolean("sp_regather", sp_regather)
    lay = layout(spec, par, setup, layers_per_stage)
    if stage is not None:
        stage = integer("stage", stage, 0, par.pp - 1)
    best = None
    for i in range(par.pp) if stage is None else (stage,):
        out = collectives(stage_shape(lay, i, sp_regather=sp_regather))
        if best is None or out.total > best.total:
            best = out
    assert best is not None
    return best


def zero_redundancy_comm(
    params: int, dp: int, *, grad_bytes: int = 2, param_bytes: int = 2
) -> CommBreakdown:
    """One optimizer step of ZeRO-1 as PyTorch ships it: DDP + ``ZeroRedundancyOptimizer``.

    DDP all-reduces the full gradients (``2(d-1)/d · Ψ`` values per rank); each rank then steps on
    the parameters it owns and ``_sync_params`` broadcasts them from that rank (PyTorch,
    ``torch/distributed/optim/zero_redundancy_optimizer.py``). On the chain broadcast
    (:func:`broadcast_bytes`) a rank forwards every broadcast but the one whose tail it is: ``d-1``
    shards of ``⌈Ψ/d⌉``, so ``3(d-1)/d · Ψ`` values in all, 1.5x data parallelism. ZeRO-1 built on
    a reduce-scatter (Rajbhandari et al. 2020 §7; DeepSpeed, Megatron-LM's distributed optimizer;
    :func:`collectives`) sends ``2(d-1)/d · Ψ``. Gradient accumulation (DDP ``no_sync``) changes
    neither: both collectives run once per step.
    """
    params = integer("params", params, 0)
    d = integer("dp", dp, 1)
    grads = params * integer("grad_bytes", grad_bytes, 1)
    shard = -(-params // d) * integer("param_bytes", param_bytes, 1)
    ops = (
        CommOp("dp", "gradient all-reduce (DDP)", "all_reduce", grads, d, 1),
        CommOp("dp", "owned-parameter broadcasts", "broadcast", shard, d, d - 1),
    )
    return CommBreakdown(tuple(o for o in ops if o.n > 1 and o.size and o.count))


# ---------------------------------------------------------------------------- whole layouts
def placement(parallel: ParallelConfig, gpus_per_node: int = 8) -> dict[str, bool | int]:
    """Where the groups of ``parallel`` sit on nodes of ``gpus_per_node`` GPUs.

    Ranks are laid out as Megatron-LM does (``--order tp-cp-ep-dp-pp``, tp varying fastest): a
    group is inside a node when its size times the sizes of the faster-varying axes (its
    *stride*) is at most ``gpus_per_node``. Returns the keywords of
    :meth:`CommBreakdown.times`: ``tp_intra``, ``cp_intra``, ``ep_intra``, ``dp_intra``,
    ``pp_intra``, and, for a group that spans nodes, how many of its ranks share each node
    (``<group>_per_node``: ``gpus_per_node // stride``, at least 1 and at most the group):
    ``dp`` is the data-parallel group of the dense weights (``dp * cp`` ranks, stride ``tp``),
    ``edp`` the expert-data-parallel group (``dp * cp / ep`` ranks, stride ``tp * ep``: Megatron-Core
    orders the expert ranks tp-ep-dp-pp, with CP folded into their data-parallel axis).
    :func:`op_time` reads the ``_per_node`` counts.
    """
    g = integer("gpus_per_node", gpus_per_node, 1)
    t, cp, e, d, p = parallel.tp, parallel.cp, parallel.ep, parallel.dp, parallel.pp

    def per_node(stride: int, size: int) -> int:
        return max(1, min(size, g // stride))

    return {
        "tp_intra": t <= g,
        "cp_intra": t * cp <= g,
        "ep_intra": t * cp * e <= g,
        "dp_intra": t * cp * d <= g,
        "pp_intra": t * cp * d * p <= g,
        "tp_per_node": per_node(1, t),
        "cp_per_node": per_node(t, cp),
        "ep_per_node": per_node(t * cp, e),
        "dp_per_node": per_node(t, d * cp),
        "edp_per_node": per_node(t * e, d * cp // e),
        "pp_per_node": per_node(t * cp * d, p),
    }


#: Collectives that NCCL runs as rings, one per channel: with ``k`` ranks of the group on each
#: node, each of the ``k`` GPUs' own network port carries one channel's ring, so the group's
#: inter-node bus bandwidth is ``k`` ports' (capped by NVLink), where an all-to-all's is one
#: port's (:func:`op_time`).
RING_OPS: frozenset[str] = frozenset({"all_reduce", "reduce_scatter", "all_gather", "broadcast"})


def _group(o: CommOp) -> str:
    """The group of ``o`` for :func:`placement`'s keys: ``edp`` for the expert weights'
    data-parallel collectives (tagged :data:`EXPERT_TAG` by :func:`collectives`), else its category
    (SP runs on the TP group)."""
    if o.category == "dp" and o.what.startswith(EXPERT_TAG):
        return "edp"
    return "tp" if o.category == "sp" else o.category


def op_time(o: CommOp, hardware: Hardware, where: Mapping[str, bool | int]) -> float:
    """Alpha-beta seconds of all ``o.count`` collectives of ``o``, placed by ``where``
    (:func:`placement`'s answer): the one place a collective's link is chosen.

    A group inside a node runs on the NVLink ``intra_node`` link. A group across nodes runs on
    the ``inter_node`` link (one network port per GPU), and with ``k = where["<group>_per_node"]``
    ranks of the group on each node (1 where ``where`` does not say):

    * a ring collective (:data:`RING_OPS`) moves at ``min(k · inter_node, intra_node)`` bytes/s:
      NCCL builds one ring per channel and binds each channel to a different GPU's port, so the
      ``k`` ports of a node carry ``1/k`` of the traffic each, and the rest of each ring runs on
      NVLink. Measured: NVIDIA's NCCL team reports 192 GB/s all-reduce bus bandwidth across
      DGX A100 nodes (8 x 200 Gb/s ports, 24-25 GB/s each; NVIDIA/nccl issue 812, quoted in
      issue 1576), and bus bandwidth growing with the NICs "up to [...] the NVLink intra-node
      bandwidth" (NVIDIA/nccl issue 412).
    * an all-to-all cannot spread over several ports ("Alltoall cannot aggregate the bandwidth
      of multiple NICs", NVIDIA/nccl-tests issue 267): only the share bound for other nodes,
      ``(n - k)/(n - 1)`` of what a rank sends, crosses its own port (nccl-tests issue 130: the
      all-to-all bus bandwidth is ``N/(N-1)`` times one port's on ``N`` nodes); the rest goes
      over NVLink at the same time and is not the bottleneck.
    * a send/receive crosses one port.
    """
    g = _group(o)
    if where[f"{'dp' if g == 'edp' else g}_intra"]:  # the expert group sits where DP does
        return o.time(hardware.intra_node)
    link = hardware.inter_node
    k = where.get(f"{g}_per_node", 1)
    if k <= 1 or o.n <= 1:
        return o.time(link)
    if o.op in RING_OPS:
        return o.time(link, bandwidth=min(k * link.bandwidth, hardware.intra_node.bandwidth))
    if o.op == "all_to_all":
        return o.time(link, share=(o.n - min(k, o.n)) / (o.n - 1))
    return o.time(link)


def category_times(
    ops: Iterable[CommOp], hardware: Hardware, where: Mapping[str, bool | int]
) -> dict[str, float]:
    """Alpha-beta seconds per category of ``ops``, each timed by :func:`op_time` on the link
    ``where`` (:func:`placement`'s answer) puts it: NVLink inside a node, the per-GPU network
    ports (as many as the group has ranks on a node, for a ring) across nodes; SP runs where
    TP does."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for o in ops:
        out[o.category] += op_time(o, hardware, where)
    return out
