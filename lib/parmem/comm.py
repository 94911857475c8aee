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
import math
from dataclasses import dataclass
from fractions import Fraction

from parmem.hardware import Hardware, Link, hardware_preset, link_preset

__all__ = [
    "COLLECTIVES", "CATEGORIES", "RECOMPUTE", "all_reduce_bytes", "reduce_scatter_bytes",
    "all_gather_bytes", "all_to_all_bytes", "broadcast_bytes", "send_recv_bytes",
    "collective_bytes", "collective_steps", "collective_time", "CommOp", "CommBreakdown",
    "step_comm",
]  # fmt: skip

#: Collective names accepted by :func:`collective_bytes` and :func:`collective_time`.
COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv",
)  # fmt: skip
#: Categories of a :class:`CommBreakdown`.
CATEGORIES: tuple[str, ...] = ("dp", "tp", "sp", "pp", "ep", "cp")
#: Activation recomputation modes (Korthikanti et al. 2022, §5).
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")


def _int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be an integer")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _chunk(size: int, n: int) -> int:
    _int("size", size, 0)
    _int("n", n, 1)
    return -(-size // n)


def all_reduce_bytes(size: int, n: int) -> int:
    """Ring all-reduce: ``2 (n-1) ceil(size/n)`` bytes sent per rank (= 2(n-1)/n * size).

    A reduce-scatter then an all-gather, each ``n - 1`` steps of one chunk
    (Thakur et al. 2005, §4.5; Patarasuk & Yuan 2009, bandwidth-optimal).
    """
    return 2 * (n - 1) * _chunk(size, n)


def reduce_scatter_bytes(size: int, n: int) -> int:
    """Ring reduce-scatter of a ``size``-byte input: ``(n-1) ceil(size/n)`` (Thakur et al. 2005, §4.4)."""
    return (n - 1) * _chunk(size, n)


def all_gather_bytes(size: int, n: int) -> int:
    """Ring all-gather into a ``size``-byte output: ``(n-1) ceil(size/n)`` (Thakur et al. 2005, §4.1)."""
    return (n - 1) * _chunk(size, n)


def all_to_all_bytes(size: int, n: int) -> int:
    """Pairwise all-to-all of a ``size``-byte buffer per rank: ``(n-1) ceil(size/n)``.

    Each rank keeps one of its ``n`` blocks and sends the others (Thakur et al.
    2005, §4.6, pairwise exchange); used by expert parallelism (Lepikhin et al.
    2020, §3.2; Fedus et al. 2021, §2.2).
    """
    return (n - 1) * _chunk(size, n)


def broadcast_bytes(size: int, n: int) -> int:
    """Pipelined ring (chain) broadcast, as NCCL runs it: every rank but the last
    forwards the whole ``size`` bytes, so the busiest rank sends ``size`` (0 if n == 1)."""
    _chunk(size, n)
    return size if n > 1 else 0


def send_recv_bytes(size: int) -> int:
    """Point-to-point send: ``size`` bytes (pipeline stage boundaries, Narayanan et al. 2021)."""
    return _int("size", size, 0)


def _send_recv(size: int, n: int) -> int:
    _chunk(size, n)
    return send_recv_bytes(size) if n > 1 else 0


_BYTES = {
    "all_reduce": all_reduce_bytes,
    "reduce_scatter": reduce_scatter_bytes,
    "all_gather": all_gather_bytes,
    "all_to_all": all_to_all_bytes,
    "broadcast": broadcast_bytes,
    "send_recv": _send_recv,
}


def _check_op(op: str) -> None:
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective op {op!r}; known: {', '.join(COLLECTIVES)}")


def collective_bytes(op: str, size: int, n: int) -> int:
    """Bytes one rank sends for collective ``op`` (one of :data:`COLLECTIVES`).

    ``send_recv`` with ``n == 1`` is a copy to oneself and sends nothing.
    """
    _check_op(op)
    return _BYTES[op](size, n)


def collective_steps(op: str, n: int, algorithm: str = "ring") -> int:
    """Sequential messages (latency terms) of ``op`` on ``n`` ranks.

    Ring all-reduce ``2(n-1)``; reduce-scatter, all-gather, pairwise all-to-all and
    chain broadcast ``n-1``; send/recv 1; 0 when ``n == 1`` (Thakur et al. 2005, §4).
    """
    _check_op(op)
    _int("n", n, 1)
    if algorithm != "ring":
        raise ValueError(f"algorithm={algorithm!r} is not supported; known: ring")
    if n == 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1)
    if op == "send_recv":
        return 1
    return n - 1


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
        return self.count * collective_bytes(self.op, self.size, self.n)

    def time(self, link: Link) -> float:
        """Alpha-beta time of all ``count`` collectives on ``link`` (seconds)."""
        return self.count * collective_time(self.op, self.size, self.n, link)


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
    ) -> dict[str, float]:
        """Alpha-beta seconds per category on ``hardware`` (a Hardware or a preset name).

        ``<cat>_intra=True`` puts that group on the NVLink ``intra_node`` link,
        otherwise on the per-GPU ``inter_node`` link. The defaults follow
        Megatron-LM's rank order (tp, cp, ep, dp, pp from fastest-varying), which
        keeps the inner groups inside a node. SP uses the TP setting.
        """
        hw = hardware_preset(hardware) if isinstance(hardware, str) else hardware
        if not isinstance(hw, Hardware):
            raise ValueError(f"hardware={hardware!r} must be a Hardware or a preset name")
        intra = dict(dp=dp_intra, tp=tp_intra, sp=tp_intra, pp=pp_intra, ep=ep_intra, cp=cp_intra)
        out = dict.fromkeys(CATEGORIES, 0.0)
        for o in self.ops:
            out[o.category] += o.time(hw.intra_node if intra[o.category] else hw.inter_node)
        return out

    def time(self, hardware: Hardware | str, **placement: bool) -> float:
        """Total alpha-beta seconds, serial sum of :meth:`times` (same keywords)."""
        return sum(self.times(hardware, **placement).values())


# integer arguments of step_comm: those that must be >= 1, and those that may be 0
_COUNTS = ("seq_len", "micro_batch", "hidden", "num_microbatches", "dp", "tp", "pp", "v", "cp",
           "ep", "top_k", "grad_bytes_per_param", "param_bytes", "act_bytes")  # fmt: skip
_SIZES = ("params_per_gpu", "layers_on_stage", "moe_layers_on_stage", "expert_params_per_gpu")


def _zero_ops(add, params: int, n: int, zero: int, m: int, gbytes: int, pbytes: int, tag: str):
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


def step_comm(
    *,
    params_per_gpu: int,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    layers_on_stage: int,
    num_microbatches: int = 1,
    dp: int = 1,
    zero: int = 0,
    grad_bytes_per_param: int = 2,
    param_bytes: int = 2,
    tp: int = 1,
    sp: bool = False,
    sp_regather: bool = False,
    pp: int = 1,
    v: int = 1,
    stage: int | None = None,
    cp: int = 1,
    kv_hidden: int | None = None,
    ep: int = 1,
    moe_layers_on_stage: int = 0,
    expert_params_per_gpu: int = 0,
    top_k: int = 1,
    moe_tokens: int | None = None,
    capacity_factor: float | None = None,
    act_bytes: int = 2,
    recompute: str = "none",
) -> CommBreakdown:
    """Collectives of one GPU in one optimizer step of ``m = num_microbatches`` micro-batches.

    Args:
        params_per_gpu: Ψ held by this GPU before DP/ZeRO sharding (after TP and
            PP), excluding expert parameters.
        seq_len, micro_batch, hidden: s, b, h. layers_on_stage: transformer layers here.
        dp, zero: data-parallel size and ZeRO stage 0..3.
        grad_bytes_per_param, param_bytes: bytes of one reduced gradient and one
            gathered parameter (2 for bf16).
        tp, sp: tensor-parallel size; Megatron sequence parallelism on/off.
        sp_regather: also count the all-gather that Megatron-LM repeats in backward
            (``LinearWithGradAccumulationAndAsyncCommunication`` saves only the
            sequence shard of a column-parallel input and re-gathers it for the
            weight gradient): 2 per layer per micro-batch. Off by default, as in
            the paper's accounting.
        pp, v, stage: pipeline size, chunks per stage (interleaved), and which
            stage (``None``: the one that sends the most).
        cp, kv_hidden: context-parallel size; K/V width ``kv_heads * head_dim``
            (default ``hidden``, i.e. multi-head attention).
        ep, moe_layers_on_stage, expert_params_per_gpu, top_k: expert parallelism.
        moe_tokens: tokens this GPU routes per micro-batch (default
            ``s b / cp``, divided by ``tp`` with SP).
        capacity_factor: if set, all-to-all buffers hold ``ceil(cf * tokens * top_k)``
            slots (GShard/Switch token dropping, Fedus et al. 2021 §2.1).
        act_bytes: bytes per activation element. recompute: ``"none"``,
            ``"selective"`` or ``"full"``.

    Terms (X = (s/cp) b h act_bytes, the layer's input on this GPU):

    * **dp** (Rajbhandari et al. 2020, §7): over ``dp * cp`` ranks (CP ranks hold
      the same weights). ZeRO-0: one all-reduce of the gradients, ``2(d-1)/d * 2Ψ``;
      ZeRO-1: reduce-scatter of gradients + all-gather of updated parameters, the
      same bytes; ZeRO-2: the reduce-scatter runs every micro-batch (DeepSpeed
      ``engine.allreduce_gradients``: "ZeRO stage >= 2 communicates during non
      gradient accumulation boundaries as well"); ZeRO-3: also all-gathers
      parameters in each micro-batch's forward and backward, ``3Ψ``-equivalent,
      1.5x DP when m = 1 (§7.2.2). Expert parameters reduce over the
      expert-data-parallel group of ``dp * cp / ep`` ranks.
    * **tp** (Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4.2.2): per layer
      per micro-batch 2 all-reduces of X forward (after attention and MLP), 2 in
      backward, +2 with full recomputation (the forward runs again); selective
      recomputation (Korthikanti et al. 2022, §5) redoes only the attention core,
      which needs no collective.
    * **sp** (Korthikanti et al. 2022, §4.2.2): each all-reduce becomes an
      all-gather + reduce-scatter of X: the same bytes (plus ``sp_regather``).
    * **pp** (Narayanan et al. 2021, §2.2 and §4.1): per micro-batch and chunk a
      stage sends its output X (/t with SP: scatter-gather) forward unless it holds
      the model's last chunk, and the input gradient backward unless it holds the
      first: ``v`` sends per direction, ``v - 1`` at the ends.
    * **cp** (Liu et al. 2023, Ring Attention; Megatron-Core context parallelism):
      per layer per micro-batch, K and V (``2 s b kv_hidden act_bytes / t`` in
      full) go round the ring: an all-gather forward, an all-gather of K/V and a
      reduce-scatter of dK/dV backward, +1 all-gather with full recomputation.
    * **ep** (Lepikhin et al. 2020, §3.2; Fedus et al. 2021, §2.2): per MoE layer
      per micro-batch, dispatch + combine all-to-alls of ``tokens * top_k * h *
      act_bytes`` forward, the same backward, +2 with full recomputation.

    Not counted: embedding / LM-head collectives (vocab-parallel all-reduce,
    tied-embedding gradient all-reduce between first and last stage), loss
    all-reduces, and scalars.
    """
    given = locals()  # the arguments, for validation by name
    for name in _COUNTS:
        _int(name, given[name], 1)
    for name in _SIZES:
        _int(name, given[name], 0)
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero={zero!r} must be 0, 1, 2 or 3")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r} must be one of {', '.join(RECOMPUTE)}")
    if moe_layers_on_stage > layers_on_stage:
        raise ValueError(
            f"moe_layers_on_stage={moe_layers_on_stage} must be <= layers_on_stage={layers_on_stage}"
        )
    if seq_len % cp:
        raise ValueError(f"seq_len={seq_len} must be divisible by cp={cp}")
    s_local = seq_len // cp
    if sp and s_local % tp:
        raise ValueError(f"seq_len / cp = {s_local} must be divisible by tp={tp} with sp=True")
    kv_hidden = hidden if kv_hidden is None else _int("kv_hidden", kv_hidden, 1)
    if cp > 1 and kv_hidden % tp:
        raise ValueError(f"kv_hidden={kv_hidden} must be divisible by tp={tp}")
    if (dp * cp) % ep:
        raise ValueError(f"ep={ep} must divide dp * cp = {dp * cp} (experts shard the DP group)")
    if stage is not None and not (isinstance(stage, int) and 0 <= stage < pp):
        raise ValueError(f"stage={stage!r} must be None or an integer in 0..{pp - 1}")

    m, L = num_microbatches, layers_on_stage
    fwd = 2 if recompute == "full" else 1  # forward passes per micro-batch
    x = s_local * micro_batch * hidden * act_bytes
    ops: list[CommOp] = []

    def add(cat: str, what: str, op: str, size: int, n: int, count: int) -> None:
        ops.append(CommOp(cat, what, op, size, n, count))

    _zero_ops(add, params_per_gpu, dp * cp, zero, m, grad_bytes_per_param, param_bytes, "")
    if expert_params_per_gpu:
        e_dp = dp * cp // ep
        _zero_ops(add, expert_params_per_gpu, e_dp, zero, m, grad_bytes_per_param, param_bytes,
                  "expert ")  # fmt: skip

    if tp > 1 and L:
        per = 2 * L * m
        if not sp:
            add("tp", "forward all-reduce (attention + MLP)", "all_reduce", x, tp, per * fwd)
            add("tp", "backward all-reduce", "all_reduce", x, tp, per)
        else:
            add("sp", "forward all-gather", "all_gather", x, tp, per * fwd)
            add("sp", "forward reduce-scatter", "reduce_scatter", x, tp, per * fwd)
            add("sp", "backward reduce-scatter", "reduce_scatter", x, tp, per)
            add("sp", "backward all-gather", "all_gather", x, tp, per)
            if sp_regather:
                add("sp", "backward re-gather of saved input", "all_gather", x, tp, per)

    if pp > 1:
        sends = [(v - (i == pp - 1), v - (i == 0)) for i in range(pp)]  # (forward, backward)
        fwd_sends, bwd_sends = sends[stage] if stage is not None else max(sends, key=sum)
        boundary = x // tp if sp else x
        add("pp", "forward activation send", "send_recv", boundary, 2, fwd_sends * m)
        add("pp", "backward gradient send", "send_recv", boundary, 2, bwd_sends * m)

    if cp > 1 and L:
        kv = 2 * seq_len * micro_batch * (kv_hidden // tp) * act_bytes
        add("cp", "K/V all-gather (ring), forward", "all_gather", kv, cp, L * m * fwd)
        add("cp", "K/V all-gather (ring), backward", "all_gather", kv, cp, L * m)
        add("cp", "dK/dV reduce-scatter (ring)", "reduce_scatter", kv, cp, L * m)

    if ep > 1 and moe_layers_on_stage:
        tokens = moe_tokens
        if tokens is None:
            tokens = s_local * micro_batch // (tp if sp else 1)
        slots = _int("moe_tokens", tokens, 0) * top_k
        if capacity_factor is not None:
            if not isinstance(capacity_factor, int | float) or not capacity_factor > 0:
                raise ValueError(f"capacity_factor={capacity_factor!r} must be a number > 0")
            slots = math.ceil(Fraction(repr(capacity_factor)) * slots)
        buf, n = slots * hidden * act_bytes, moe_layers_on_stage * m
        add("ep", "dispatch + combine all-to-all, forward", "all_to_all", buf, ep, 2 * n * fwd)
        add("ep", "dispatch + combine all-to-all, backward", "all_to_all", buf, ep, 2 * n)
    return CommBreakdown(tuple(o for o in ops if o.n > 1 and o.size and o.count))


# ---------------------------------------------------------------------------- whole layouts
def placement(parallel, gpus_per_node: int = 8) -> dict[str, bool]:
    """Which groups of ``parallel`` stay inside one node of ``gpus_per_node`` GPUs.

    Ranks are laid out as Megatron-LM does (``--order tp-cp-ep-dp-pp``, tp varying fastest): a
    group is inside a node when its size times the sizes of the faster-varying axes is at most
    ``gpus_per_node``. Returns the keywords of :meth:`CommBreakdown.times`
    (``tp_intra``, ``cp_intra``, ``ep_intra``, ``dp_intra``, ``pp_intra``).
    """
    _int("gpus_per_node", gpus_per_node, 1)
    t, cp, e, d, p = parallel.tp, parallel.cp, parallel.ep, parallel.dp, parallel.pp
    g = gpus_per_node
    return {"tp_intra": t <= g, "cp_intra": t * cp <= g, "ep_intra": t * cp * e <= g,
            "dp_intra": t * cp * d <= g, "pp_intra": t * cp * d * p <= g}


def layout_comm(spec, parallel, setup, *, stage: int | None = None,
                layers_per_stage=None) -> CommBreakdown:
    """:func:`step_comm` for a model, a layout and a training setup, as :func:`parmem.estimate`
    sees them.

    The parameters each GPU holds come from the same TP/PP/EP sharding as the estimate (dense
    and expert parameters of the stage, before ZeRO); bytes per element from the setup's
    precision; every layer of an MoE model is an MoE layer; the K/V width is
    ``kv_heads * head_dim``; a ``capacity_factor`` other than 1 sizes the all-to-all buffers.
    ``stage=None`` returns the stage that sends the most bytes (ties: the first).
    """
    from .memory import PRECISIONS, _stage_params, _validate

    lps = _validate(spec, parallel, setup, layers_per_stage)
    prec = PRECISIONS[setup.precision]
    p = parallel.pp
    if stage is not None and not (isinstance(stage, int) and 0 <= stage < p):
        raise ValueError(f"stage={stage!r} must be None or an integer in 0..{p - 1}")
    cf = setup.capacity_factor if spec.is_moe and setup.capacity_factor != 1.0 else None
    best = None
    for i in range(p) if stage is None else (stage,):
        dense, expert = _stage_params(spec, parallel, lps[i], i == 0, i == p - 1)
        out = step_comm(
            params_per_gpu=dense, seq_len=setup.seq_len, micro_batch=setup.micro_batch,
            hidden=spec.hidden, layers_on_stage=lps[i], num_microbatches=setup.num_microbatches,
            dp=parallel.dp, zero=parallel.zero, grad_bytes_per_param=prec["grad"],
            param_bytes=prec["param"], tp=parallel.tp, sp=parallel.sp, pp=p, v=parallel.vpp,
            stage=i, cp=parallel.cp, kv_hidden=spec.kv_dim, ep=parallel.ep,
            moe_layers_on_stage=lps[i] if spec.is_moe else 0, expert_params_per_gpu=expert,
            top_k=spec.top_k or 1, capacity_factor=cf, act_bytes=prec["act"],
            recompute=setup.recompute)
        if best is None or out.total > best.total:
            best = out
    return best


def layout_sweep(spec, world_size: int, setup, *, global_batch: int, zero: int = 1,
                 sp: bool = True, ep: int = 1, cp: int = 1, hardware: Hardware | str = "h100-sxm",
                 gpus_per_node: int = 8, tps=None, pps=None) -> list[dict]:
    """Every d·t·p layout of ``world_size`` GPUs: peak memory and communication per GPU.

    For each t in ``tps`` and p in ``pps`` (default: all divisors of the world size) with
    d = world / (t·p·cp) an integer, the setup gets ``num_microbatches = global_batch / (d·b)``
    (``global_batch`` sequences per step, b = ``setup.micro_batch``) and ZeRO stage ``zero`` over
    d; SP is on whenever t > 1 and ``sp``. Layouts that are invalid for the model (t not dividing
    the heads, p above the layers, the batch not splitting evenly) are left out.

    Each row: ``d``, ``t``, ``p``, ``m``, ``peak_bytes`` and ``peak_stage`` (from
    :func:`parmem.estimate`), bytes sent per category (``dp``, ``tp``, ``sp``, ``pp``, ``ep``,
    ``cp``) and ``comm_bytes`` (:func:`layout_comm`), ``comm_time_s`` (serial alpha-beta time on
    ``hardware`` with groups placed by :func:`placement`), ``tp_in_node``, and ``fits`` (peak at
    most the GPU's memory).
    """
    from dataclasses import replace

    from .memory import ParallelConfig, estimate

    _int("world_size", world_size, 1)
    _int("global_batch", global_batch, 1)
    hw = hardware_preset(hardware) if isinstance(hardware, str) else hardware
    divisors = [k for k in range(1, world_size + 1) if world_size % k == 0]
    rows = []
    for t in tps or divisors:
        for p in pps or divisors:
            if world_size % (t * p * cp):
                continue
            d = world_size // (t * p * cp)
            if global_batch % (d * setup.micro_batch):
                continue
            m = global_batch // (d * setup.micro_batch)
            try:
                par = ParallelConfig(dp=d, tp=t, pp=p, ep=ep, cp=cp, sp=sp and t > 1, zero=zero)
                st = replace(setup, num_microbatches=m)
                est = estimate(spec, par, st)
                com = layout_comm(spec, par, st)
            except ValueError:
                continue
            where = placement(par, gpus_per_node)
            rows.append({"d": d, "t": t, "p": p, "m": m, "peak_bytes": est.peak_bytes,
                         "peak_stage": est.peak.stage, **com.as_dict(), "comm_bytes": com.total,
                         "comm_time_s": com.time(hw, **where), "tp_in_node": where["tp_intra"],
                         "fits": est.peak_bytes <= hw.memory_bytes})
    return rows
