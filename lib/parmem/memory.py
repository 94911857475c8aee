"""Per-GPU training memory under a parallel layout.

:func:`estimate` answers "how many bytes does each GPU hold?" for a model
(:class:`~parmem.model.ModelSpec`), a layout (:class:`ParallelConfig`: d, t, p, e, cp, SP,
ZeRO stage, v) and a training setup (:class:`TrainingSetup`: s, b, m, precision, optimizer,
recompute, schedule). It returns one :class:`MemoryBreakdown` per pipeline stage, because stages
differ: the first holds the embedding and the most in-flight micro-batches, the last the LM head
and the logits.

Sources, by term:

* model states (parameters, gradients, optimizer): Rajbhandari et al. 2020 (ZeRO), §3.1 and §5:
  mixed-precision Adam keeps 2 + 2 + 12 bytes per parameter; ZeRO stage 1, 2, 3 shard the
  optimizer states, then the gradients, then the parameters over the data-parallel group;
* tensor-parallel sharding: Shoeybi et al. 2019 §3 (column/row-parallel layers, replicated norms
  and row-parallel biases, vocab-parallel embedding);
* activations: Korthikanti et al. 2022 (see :mod:`parmem.activations`);
* pipeline: embedding on the first stage, final norm and LM head on the last (a tied embedding is
  duplicated there when p > 1, Shoeybi et al. 2019 §3 / Megatron-LM), in-flight micro-batches per
  Narayanan et al. 2021 §2.2;
* experts: sharded over e, their gradients and optimizer states over the expert-data-parallel group
  of d·cp/e ranks (Lepikhin et al. 2021; Megatron-Core MoE).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .activations import RECOMPUTE, SCHEDULES, _in_flight_units, in_flight_units, layer_terms
from .model import ModelSpec

__all__ = ["ParallelConfig", "TrainingSetup", "MemoryBreakdown", "Estimate", "ModelStateBytes",
           "estimate", "model_state_bytes", "PRECISIONS", "OPTIMIZERS", "GIB"]

GIB = 2**30

#: bytes per parameter of (16/32-bit) weights, gradients, fp32 master copy, and activations.
PRECISIONS: dict[str, dict[str, int]] = {
    "fp32": {"param": 4, "grad": 4, "master": 0, "state": 4, "act": 4},
    "bf16-mixed": {"param": 2, "grad": 2, "master": 4, "state": 4, "act": 2},
    "fp16-mixed": {"param": 2, "grad": 2, "master": 4, "state": 4, "act": 2},
    "bf16": {"param": 2, "grad": 2, "master": 0, "state": 2, "act": 2},
}
#: optimizer states per parameter, in units of the precision's state size (adam-8bit: 1 byte).
OPTIMIZERS: dict[str, int] = {"adamw": 2, "adam-8bit": 2, "sgd-momentum": 1, "sgd": 0}
#: bitsandbytes block-wise quantisation keeps one fp32 absmax per block of 2048 values
#: (Dettmers et al. 2022, §2).
ADAM8BIT_BLOCK = 2048
GRAD_BUCKETS = ("view", "copy")


def _int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class ParallelConfig:
    """A parallel layout: data (d), tensor (t), pipeline (p), expert (e) and context (cp)
    parallel sizes, sequence parallelism, the ZeRO stage and v virtual stages per pipeline rank.

    The world size is d·t·p·cp; expert parallelism reuses the d·cp data- and context-parallel
    ranks (Megatron-Core), so e must divide d·cp.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    sp: bool = False
    zero: int = 0
    vpp: int = 1

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "ep", "cp", "vpp"):
            _int(f, getattr(self, f))
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero={self.zero!r} must be 0, 1, 2 or 3")
        if not isinstance(self.sp, bool):
            raise ValueError(f"sp={self.sp!r} must be True or False")
        if self.sp and self.tp == 1:
            raise ValueError("sp=True needs tp >= 2 (sequence parallelism splits over the TP group)")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep={self.ep} must divide dp*cp={self.dp * self.cp} (experts are "
                             "sharded over the data- and context-parallel ranks, as in "
                             "Megatron-Core)")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"vpp={self.vpp} needs pp >= 2")

    @property
    def world_size(self) -> int:
        """d·t·p·cp GPUs."""
        return self.dp * self.tp * self.pp * self.cp

    def check_world_size(self, world_size: int) -> None:
        """Raise ``ValueError`` unless d·t·p·cp equals ``world_size``."""
        if self.world_size != world_size:
            raise ValueError(f"dp*tp*pp*cp = {self.dp}*{self.tp}*{self.pp}*{self.cp} = "
                             f"{self.world_size} must equal world size={world_size}")

    def __str__(self) -> str:
        parts = [f"d={self.dp}", f"t={self.tp}", f"p={self.pp}"]
        if self.ep > 1:
            parts.append(f"e={self.ep}")
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.vpp > 1:
            parts.append(f"v={self.vpp}")
        if self.sp:
            parts.append("SP")
        parts.append(f"ZeRO-{self.zero}")
        return ", ".join(parts)


@dataclass(frozen=True)
class TrainingSetup:
    """What one training step does: sequence length s, micro-batch b, micro-batches m per step,
    number formats, optimizer, activation recomputation and pipeline schedule.

    ``grad_buckets="copy"`` models PyTorch DDP's default (``gradient_as_bucket_view=False``): the
    all-reduce buckets hold a second copy of every gradient. ``"view"`` (the default) is DDP with
    ``gradient_as_bucket_view=True`` and what Megatron-LM, DeepSpeed and FSDP do.
    ``cuda_context`` is a fixed per-GPU cost you measured (the CUDA context and kernels take
    several hundred MiB; it depends on driver, libraries and lazy loading), 0 by default.
    """

    seq_len: int
    micro_batch: int = 1
    num_microbatches: int = 1
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    recompute: str = "none"
    schedule: str = "1f1b"
    flash_attention: bool = False
    dropout: bool = True
    grad_buckets: str = "view"
    capacity_factor: float = 1.0
    cuda_context: int = 0

    def __post_init__(self) -> None:
        _int("seq_len", self.seq_len)
        _int("micro_batch", self.micro_batch)
        _int("num_microbatches", self.num_microbatches)
        _int("cuda_context", self.cuda_context, minimum=0)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} must be one of {tuple(PRECISIONS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} must be one of {tuple(OPTIMIZERS)}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute={self.recompute!r} must be one of {RECOMPUTE}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} must be one of {SCHEDULES}")
        if self.grad_buckets not in GRAD_BUCKETS:
            raise ValueError(f"grad_buckets={self.grad_buckets!r} must be one of {GRAD_BUCKETS}")
        if not self.capacity_factor >= 1.0:
            raise ValueError(f"capacity_factor={self.capacity_factor} must be >= 1.0")


# ---------------------------------------------------------------------------- model states
@dataclass(frozen=True)
class ModelStateBytes:
    """Per-GPU bytes of parameters, gradients and optimizer states."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def _optimizer_bytes(n: int, precision: str, optimizer: str) -> int:
    prec = PRECISIONS[precision]
    states = OPTIMIZERS[optimizer]
    if optimizer == "adam-8bit":
        per_state = n + 4 * _cdiv(n, ADAM8BIT_BLOCK)
    else:
        per_state = prec["state"] * n
    return prec["master"] * n + states * per_state


def model_state_bytes(num_params: int, dp: int = 1, zero: int = 0,
                      precision: str = "bf16-mixed", optimizer: str = "adamw") -> ModelStateBytes:
    """Parameters, gradients and optimizer states per GPU for Ψ = ``num_params``.

    Rajbhandari et al. 2020 (ZeRO) §5.1 for mixed-precision Adam (K = 12): without ZeRO each GPU
    holds (2 + 2 + K)Ψ bytes; stage 1 holds 2Ψ + 2Ψ + KΨ/d; stage 2 2Ψ + (2 + K)Ψ/d; stage 3
    (2 + 2 + K)Ψ/d. A sharded tensor of n values gives each rank ⌈n/d⌉ values (flat-buffer
    padding, as DeepSpeed and FSDP do). Other precisions and optimizers follow the same pattern
    with their own byte sizes (:data:`PRECISIONS`, :data:`OPTIMIZERS`; 8-bit Adam per Dettmers et
    al. 2022: two 1-byte states plus one fp32 scale per 2048 values).
    """
    _int("num_params", num_params, minimum=0)
    _int("dp", dp)
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise ValueError(f"zero={zero!r} must be 0, 1, 2 or 3")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {tuple(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} must be one of {tuple(OPTIMIZERS)}")
    shard = _cdiv(num_params, dp)
    prec = PRECISIONS[precision]
    p_n = shard if zero >= 3 else num_params
    g_n = shard if zero >= 2 else num_params
    o_n = shard if zero >= 1 else num_params
    return ModelStateBytes(params=prec["param"] * p_n, grads=prec["grad"] * g_n,
                           optimizer=_optimizer_bytes(o_n, precision, optimizer))


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU of one pipeline stage. ``total`` is the sum of the other byte fields."""

    stage: int
    layers: int
    num_params: int
    params: int
    grads: int
    optimizer: int
    activations: int
    logits: int
    comm_buffers: int
    cuda_context: int
    notes: tuple[str, ...] = field(default=(), compare=False)

    FIELDS = ("params", "grads", "optimizer", "activations", "logits", "comm_buffers",
              "cuda_context")

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return sum(getattr(self, f) for f in self.FIELDS)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["total"] = self.total
        return d

    def gib(self) -> dict[str, float]:
        """The byte fields and the total in GiB (2**30 bytes)."""
        return {f: getattr(self, f) / GIB for f in (*self.FIELDS, "total")}


_COLS = (("stage", "stage"), ("layers", "layers"), ("params", "params"), ("grads", "grads"),
         ("optimizer", "optim"), ("activations", "activ"), ("logits", "logits"),
         ("comm_buffers", "comm"), ("cuda_context", "ctx"), ("total", "total"))


@dataclass(frozen=True)
class Estimate:
    """The result of :func:`estimate`: one :class:`MemoryBreakdown` per pipeline stage."""

    spec: ModelSpec
    parallel: ParallelConfig
    setup: TrainingSetup
    stages: tuple[MemoryBreakdown, ...]

    @property
    def peak(self) -> MemoryBreakdown:
        """The stage with the largest total (the first such stage on a tie)."""
        return max(self.stages, key=lambda s: s.total)

    @property
    def peak_bytes(self) -> int:
        return self.peak.total

    def to_dict(self) -> dict:
        return {"model": self.spec.name, "parallel": asdict(self.parallel),
                "setup": asdict(self.setup), "stages": [s.to_dict() for s in self.stages],
                "peak_stage": self.peak.stage, "peak_bytes": self.peak_bytes}

    def _rows(self) -> list[list[str]]:
        rows = []
        for s in self.stages:
            row = [str(s.stage), str(s.layers)]
            row += [f"{getattr(s, k) / GIB:.2f}" for k, _ in _COLS[2:]]
            rows.append(row)
        return rows

    def _title(self) -> str:
        st = self.setup
        return (f"{self.spec.name} | {self.parallel} | s={st.seq_len}, b={st.micro_batch}, "
                f"m={st.num_microbatches}, {st.precision}, {st.optimizer}, "
                f"recompute={st.recompute}, {st.schedule}")

    def __str__(self) -> str:
        heads = [h for _, h in _COLS]
        rows = self._rows()
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        lines = [self._title(), "GiB per GPU (2**30 bytes)", fmt.format(*heads)]
        lines += [fmt.format(*r) for r in rows]
        lines.append(f"peak: stage {self.peak.stage}, {self.peak_bytes / GIB:.2f} GiB "
                     f"({self.peak_bytes:,} bytes)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        peak = self.peak.stage
        head = "".join(f"<th>{h}</th>" for _, h in _COLS)
        body = []
        for s, row in zip(self.stages, self._rows(), strict=True):
            style = ' style="font-weight:bold"' if s.stage == peak else ""
            body.append(f"<tr{style}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
        return (f"<div><p><code>{html.escape(self._title())}</code></p>"
                f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
                f"<p>GiB per GPU (2<sup>30</sup> bytes). Peak: stage {peak}, "
                f"{self.peak_bytes / GIB:.2f} GiB.</p></div>")


# ---------------------------------------------------------------------------- estimator
def _validate(spec: ModelSpec, par: ParallelConfig, setup: TrainingSetup,
              layers_per_stage) -> list[int]:
    t, p = par.tp, par.pp
    if spec.heads % t:
        raise ValueError(f"tp={t} must divide heads={spec.heads}")
    if spec.kv_heads % t and t % spec.kv_heads:
        raise ValueError(f"tp={t} and kv_heads={spec.kv_heads}: one must divide the other")
    if spec.ffn_hidden % t:
        raise ValueError(f"tp={t} must divide ffn_hidden={spec.ffn_hidden}")
    if spec.is_moe:
        if spec.expert_ffn_hidden % t:
            raise ValueError(f"tp={t} must divide expert_ffn_hidden={spec.expert_ffn_hidden}")
        if spec.num_experts % par.ep:
            raise ValueError(f"ep={par.ep} must divide num_experts={spec.num_experts}")
    elif par.ep > 1:
        raise ValueError(f"ep={par.ep} needs a mixture-of-experts model ({spec.name} is dense)")
    if p > spec.layers:
        raise ValueError(f"pp={p} > layers={spec.layers}: every stage needs at least one layer")
    if setup.seq_len % par.cp:
        raise ValueError(f"cp={par.cp} must divide seq_len={setup.seq_len}")
    if spec.position == "learned" and setup.seq_len > spec.max_positions:
        raise ValueError(f"seq_len={setup.seq_len} > max_positions={spec.max_positions} "
                         f"(learned positions of {spec.name})")
    interleaved = setup.schedule == "interleaved"
    if interleaved != (par.vpp > 1):
        raise ValueError(f"schedule={setup.schedule!r} and vpp={par.vpp}: the interleaved "
                         "schedule needs vpp >= 2 and vpp >= 2 needs schedule='interleaved'")
    if interleaved and setup.num_microbatches % p:
        raise ValueError(f"num_microbatches={setup.num_microbatches} must be a multiple of "
                         f"pp={p} for the interleaved schedule (Megatron-LM requirement)")
    if layers_per_stage is None:
        base, extra = divmod(spec.layers, p)
        lps = [base + (1 if i < extra else 0) for i in range(p)]
    else:
        lps = list(layers_per_stage)
        if len(lps) != p:
            raise ValueError(f"layers_per_stage has {len(lps)} entries; it needs pp={p}")
        for i, n in enumerate(lps):
            _int(f"layers_per_stage[{i}]", n)
        if sum(lps) != spec.layers:
            raise ValueError(f"layers_per_stage sums to {sum(lps)}; it must sum to "
                             f"layers={spec.layers}")
    if interleaved:
        for i, n in enumerate(lps):
            if n % par.vpp:
                raise ValueError(f"vpp={par.vpp} must divide the {n} layers of stage {i}")
    return lps


def _stage_params(spec: ModelSpec, par: ParallelConfig, n_layers: int, first: bool,
                  last: bool) -> tuple[int, int]:
    """(dense, expert) parameter counts held by one GPU of a stage (Shoeybi et al. 2019 §3)."""
    t, h = par.tp, spec.hidden
    d, f = spec.head_dim, spec.ffn_hidden
    q_local = spec.heads // t * d
    kv_local = max(spec.kv_heads // t, 1) * d
    attn = h * q_local + 2 * h * kv_local + q_local * h
    if spec.bias or spec.qkv_bias:
        attn += q_local + 2 * kv_local
    if spec.bias:
        attn += h  # the row-parallel output bias is replicated

    def mlp(width: int) -> int:
        w = width // t
        if spec.ffn_kind == "gelu":
            return 2 * h * w + ((w + h) if spec.bias else 0)
        return 3 * h * w + ((2 * w + h) if spec.bias else 0)

    dense_layer = attn + 2 * spec.norm_params()
    expert_layer = 0
    if spec.is_moe:
        dense_layer += spec.hidden * spec.num_experts  # router, replicated
        dense_layer += spec.shared_experts * mlp(spec.expert_ffn_hidden)
        expert_layer = spec.num_experts // par.ep * mlp(spec.expert_ffn_hidden)
    else:
        dense_layer += mlp(f)
    dense = n_layers * dense_layer
    vocab_local = _cdiv(spec.vocab_size, t)
    if first:
        dense += vocab_local * h
        if spec.position == "learned":
            dense += spec.max_positions * h
    if last:
        dense += spec.norm_params()
        if not spec.tied_embeddings or not first:
            dense += vocab_local * h  # LM head (a copy of a tied embedding when p > 1)
    return dense, n_layers * expert_layer


def estimate(spec: ModelSpec, parallel: ParallelConfig | None = None,
             setup: TrainingSetup | None = None, *, layers_per_stage=None,
             world_size: int | None = None) -> Estimate:
    """Per-GPU memory of every pipeline stage for ``spec`` trained with ``parallel``/``setup``.

    Each stage's :class:`MemoryBreakdown` holds, in bytes:

    * ``params``, ``grads``, ``optimizer``: the stage's parameters on one GPU after TP/EP sharding,
      then ZeRO sharding over d·cp ranks (experts over d·cp/e), per :func:`model_state_bytes`;
    * ``activations``: :func:`~parmem.activations.layer_terms` per layer, times the layers a
      micro-batch occupies on the stage, times the micro-batches in flight
      (:func:`~parmem.activations.in_flight_units`). Selective recompute keeps the non-core terms,
      full recompute only each layer's 16-bit input; both add the working set of the one layer
      being recomputed. The first stage adds its embedding-dropout mask, the last its final-norm
      and LM-head inputs (Korthikanti et al. 2022 §4.3);
    * ``logits``: the fp32 logits the cross-entropy keeps, 4·s·b·V/t bytes per micro-batch in
      flight on the last stage (vocab-parallel cross-entropy, Megatron-LM);
    * ``comm_buffers``: TP collective output (one 16-bit s·b·h tensor), PP send and receive
      buffers, DDP gradient buckets with ``grad_buckets="copy"``, the ZeRO-3 gather of the current
      and the prefetched layer, MoE dispatch buffers;
    * ``cuda_context``: ``setup.cuda_context``.

    ``layers_per_stage`` gives an uneven split (default: as even as possible, extras first).
    ``world_size``, when given, must equal d·t·p·cp.
    """
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    par = parallel if parallel is not None else ParallelConfig()
    if setup is None:
        setup = TrainingSetup(seq_len=min(2048, spec.max_positions))
    if world_size is not None:
        par.check_world_size(world_size)
    lps = _validate(spec, par, setup, layers_per_stage)
    prec = PRECISIONS[setup.precision]
    t, p, cp = par.tp, par.pp, par.cp
    s_local = setup.seq_len // cp
    b, h = setup.micro_batch, spec.hidden
    e_act = prec["act"]
    rep = t if par.sp else 1
    terms = layer_terms(spec, setup.seq_len, b, tp=t, sp=par.sp, cp=cp,
                        flash=setup.flash_attention, dropout=setup.dropout, act_bytes=e_act,
                        capacity_factor=setup.capacity_factor)
    full = sum(x.bytes for x in terms)
    if setup.recompute == "none":
        kept = full
    elif setup.recompute == "selective":
        kept = sum(x.bytes for x in terms if not x.core)
    else:
        kept = e_act * s_local * b * h // rep
    boundary = e_act * s_local * b * h // rep  # one s·b·h activation tensor (sharded under SP)
    zero_group = par.dp * cp
    expert_group = zero_group // par.ep
    tp_buffer = e_act * s_local * b * h if t > 1 else 0  # TP all-reduce / SP all-gather output
    p2p_buffers = 2 * boundary if p > 1 else 0          # p2p send and receive buffers
    a2a_buffers = 0  # MoE dispatch send + receive, padded to the capacity factor
    if spec.is_moe and par.ep > 1:
        a2a_buffers = int(2 * e_act * s_local * b * spec.top_k * h * setup.capacity_factor)
    zero3_gather = 0
    if par.zero == 3 and zero_group > 1:  # gathered current layer + prefetched next layer
        zero3_gather = 2 * prec["param"] * sum(_stage_params(spec, par, 1, False, False))
    ddp_copy = par.dp * cp > 1 and par.zero == 0 and setup.grad_buckets == "copy"
    states: dict[tuple, tuple] = {}
    stages = []
    for i, n_layers in enumerate(lps):
        first, last = i == 0, i == p - 1
        key = (n_layers, first, last)
        if key not in states:
            dense_n, expert_n = _stage_params(spec, par, n_layers, first, last)
            dense = model_state_bytes(dense_n, zero_group, par.zero, setup.precision,
                                      setup.optimizer)
            expert = model_state_bytes(expert_n, expert_group, par.zero, setup.precision,
                                       setup.optimizer)
            states[key] = (dense_n + expert_n, dense.params + expert.params,
                           dense.grads + expert.grads, dense.optimizer + expert.optimizer)
        n_params, p_bytes, g_bytes, o_bytes = states[key]
        units = _in_flight_units(setup.schedule, p, setup.num_microbatches, i, par.vpp)
        layer_units = units * (n_layers // par.vpp)  # layer-micro-batches held at the peak
        act = kept * layer_units + (full - kept if layer_units else 0)
        notes = [f"{units} micro-batch{'es' if units != 1 else ''} in flight"
                 if par.vpp == 1 else f"{units} chunk-micro-batches in flight (v={par.vpp})"]
        mb_units = _cdiv(units, par.vpp)
        if first and setup.dropout:
            act += s_local * b * h // rep * mb_units  # embedding dropout mask, 1 byte
        logits = 0
        if last:
            act += 2 * boundary * mb_units  # final norm input and LM-head input
            logits = 4 * s_local * b * _cdiv(spec.vocab_size, t) * mb_units
        comm = tp_buffer + p2p_buffers + a2a_buffers + (zero3_gather if n_layers else 0)
        if ddp_copy:
            comm += g_bytes
            notes.append("DDP buckets hold a second copy of the gradients")
        stages.append(MemoryBreakdown(
            stage=i, layers=n_layers, num_params=n_params, params=p_bytes, grads=g_bytes,
            optimizer=o_bytes, activations=act, logits=logits, comm_buffers=comm,
            cuda_context=setup.cuda_context, notes=tuple(notes)))
    return Estimate(spec=spec, parallel=par, setup=setup, stages=tuple(stages))


def total_model_state_floor(spec: ModelSpec, precision: str = "bf16-mixed",
                            optimizer: str = "adamw") -> int:
    """The bytes of one full copy of the model states: no layout can hold less in total."""
    return model_state_bytes(spec.num_params(), 1, 0, precision, optimizer).total


def gib(n: int) -> float:
    """Bytes to GiB (2**30), for display only."""
    return n / GIB


def fmt_gib(n: int, digits: int = 2) -> str:
    return f"{n / GIB:.{digits}f} GiB"



# ---------------------------------------------------------------------------- TP sharding
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


def tp_param_counts(spec: ModelSpec, tp: int = 1, ep: int = 1) -> list[ShardCount]:
    """Parameters of the whole model (all layers) by component, and what one rank of a
    tensor-parallel group of ``tp`` (and expert-parallel group of ``ep``) holds.

    Megatron-LM's layout (Shoeybi et al. 2019 §3): the vocabulary is split over t for the
    embedding and the LM head; Q and the output projection by heads; K and V by kv heads, and
    when t > kv_heads each rank keeps one whole kv head, so t/kv_heads ranks hold a copy of each
    (GQA); the MLP by its inner width (column-parallel FC1 or gate/up, row-parallel FC2 or down);
    column-parallel biases are split, row-parallel biases, norms, learned positions and the MoE
    router are replicated; experts are split over e, then their width over t. The per-rank sum
    equals the parameters :func:`estimate` puts on a single-stage GPU.
    """
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    _validate(spec, ParallelConfig(tp=tp, ep=ep, dp=ep), TrainingSetup(seq_len=1), None)
    t, h, L, d = tp, spec.hidden, spec.layers, spec.head_dim
    col_bias = spec.bias or spec.qkv_bias
    kv_local = max(spec.kv_heads // t, 1)

    def attn(q_heads: int, kv_heads: int) -> tuple[int, int]:
        qo = 2 * h * q_heads * d + (q_heads * d if col_bias else 0)
        kv = 2 * h * kv_heads * d + (2 * kv_heads * d if col_bias else 0)
        return qo, kv

    def mlp_split(width: int) -> int:  # weights and column biases; the row bias is replicated
        mats = 2 if spec.ffn_kind == "gelu" else 3
        return mats * h * width + ((mats - 1) * width if spec.bias else 0)

    qo_full, kv_full = attn(spec.heads, spec.kv_heads)
    qo_rank, kv_rank = attn(spec.heads // t, kv_local)
    kv_split = "kv heads" if t <= spec.kv_heads else \
        f"kv heads, each kept by {t // spec.kv_heads} ranks"
    vocab = spec.vocab_size * h
    vocab_rank = _cdiv(spec.vocab_size, t) * h
    rows = [ShardCount("embedding", vocab, vocab_rank, "vocabulary rows")]
    if spec.position == "learned":
        rows.append(ShardCount("positions", spec.max_positions * h,
                               spec.max_positions * h, "replicated"))
    rows += [ShardCount("attention Q, O", L * qo_full, L * qo_rank, "heads"),
             ShardCount("attention K, V", L * kv_full, L * kv_rank, kv_split)]
    row_bias = h if spec.bias else 0  # one row-parallel bias per MLP or expert
    if spec.is_moe:
        ef = spec.expert_ffn_hidden
        one, one_rank = mlp_split(ef) + row_bias, mlp_split(ef // t) + row_bias
        rows.append(ShardCount("experts", L * spec.num_experts * one,
                               L * spec.num_experts // ep * one_rank,
                               "experts over e, width over t"))
        if spec.shared_experts:
            rows.append(ShardCount("shared experts", L * spec.shared_experts * one,
                                   L * spec.shared_experts * one_rank, "inner width"))
        rows.append(ShardCount("router", L * h * spec.num_experts, L * h * spec.num_experts,
                               "replicated"))
    else:
        rows.append(ShardCount("MLP", L * mlp_split(spec.ffn_hidden),
                               L * mlp_split(spec.ffn_hidden // t), "inner width"))
    if spec.bias:
        n = L * (h + (0 if spec.is_moe else h))  # attention output bias (+ FC2 bias)
        rows.append(ShardCount("row-parallel biases", n, n, "replicated"))
    norms = (2 * L + 1) * spec.norm_params()
    rows.append(ShardCount("norms", norms, norms, "replicated"))
    if not spec.tied_embeddings:
        rows.append(ShardCount("LM head", vocab, vocab_rank, "vocabulary rows"))
    return rows


__all__ += ["ShardCount", "tp_param_counts"]


# ---------------------------------------------------------------------------- stage balance
def balance_layers(spec: ModelSpec, parallel: ParallelConfig | None = None,
                   setup: TrainingSetup | None = None, *,
                   world_size: int | None = None) -> tuple[int, ...]:
    """The ``layers_per_stage`` split that minimises the peak stage of :func:`estimate`.

    Pipeline stages are not equal: the first holds the embedding and (under 1F1B) the most
    micro-batches in flight, the last the final norm, the LM head and the fp32 logits. Moving
    layers away from a heavy stage lowers the peak; this function finds the best split exactly.

    Method: a stage's bytes depend only on its position ``i`` and its own layer count ``n``
    (model states of its layers and of the embedding/head it holds, ``in_flight_units`` times its
    layers' activations), so one :func:`estimate` call per (i, n) tabulates every stage's total.
    A dynamic program over the stages then finds the least possible peak ``T*`` over all splits
    (every stage keeps at least one layer, a multiple of ``vpp`` when interleaved), and a second
    one picks, among the splits whose stages all fit in ``T*``, the one closest to the even split
    (least sum of squared differences in layer counts), because the slowest stage sets the
    pipeline's pace. Cost: about ``p · L / vpp`` estimates and ``p · (L / vpp)²`` steps.

    Returns the split as a tuple of ``pp`` layer counts summing to ``spec.layers``; pass it to
    ``estimate(..., layers_per_stage=...)``. ``pp = 1`` returns ``(spec.layers,)``.
    Raises ``ValueError`` for a layout :func:`estimate` rejects.
    """
    par = parallel if parallel is not None else ParallelConfig()
    base = estimate(spec, par, setup, world_size=world_size)  # validates the layout
    setup = base.setup
    p, L, v = par.pp, spec.layers, par.vpp
    if p == 1:
        return (L,)
    counts = list(range(v, L - v * (p - 1) + 1, v))  # possible layer counts of one stage
    total: list[dict[int, int]] = [{} for _ in range(p)]
    for i in range(p):
        j = (i + 1) % p  # a stage that absorbs the layers the others do not take
        for n in counts:
            lps = [v] * p
            lps[i] = n
            lps[j] = L - n - v * (p - 2)
            total[i][n] = estimate(spec, par, setup, layers_per_stage=lps).stages[i].total

    def solve(cost) -> tuple[float, list[int]]:
        """min over splits of fold(cost(i, n)); fold is max for the peak, + for the deviation."""
        inf = float("inf")
        # best[i][r]: best value for stages i..p-1 holding r layers; choice[i][r]: n of stage i
        best = [[inf] * (L + 1) for _ in range(p + 1)]
        choice = [[0] * (L + 1) for _ in range(p)]
        best[p][0] = 0
        for i in range(p - 1, -1, -1):
            for r in range(v * (p - i), L - v * i + 1, v):
                for n in counts:
                    if n > r - v * (p - i - 1):
                        break
                    c, rest = cost(i, n), best[i + 1][r - n]
                    val = cost.fold(c, rest)
                    if val < best[i][r]:
                        best[i][r], choice[i][r] = val, n
        split, r = [], L
        for i in range(p):
            split.append(choice[i][r])
            r -= choice[i][r]
        return best[0][L], split

    def peak_cost(i, n):
        return total[i][n]

    peak_cost.fold = max
    t_star, _ = solve(peak_cost)
    mean = L / p

    def deviation_cost(i, n):
        return (n - mean) ** 2 if total[i][n] <= t_star else float("inf")

    deviation_cost.fold = lambda a, b: a + b
    _, split = solve(deviation_cost)
    return tuple(split)


__all__ += ["balance_layers"]


def microbatch_sweep(spec: ModelSpec, parallel: ParallelConfig | None = None,
                     setup: TrainingSetup | None = None, *, global_batch: int,
                     micro_batches=None) -> list[dict]:
    """Memory and pipeline bubble for every micro-batch size b at a fixed batch per step.

    ``global_batch`` is the number of sequences one pipeline (one data-parallel replica) processes
    per optimizer step, B/d; each b in ``micro_batches`` (default: every divisor of
    ``global_batch``) gives m = global_batch / b micro-batches (gradient accumulation keeps the
    batch). Sizes that the layout rejects (the interleaved schedule needs m to be a multiple of
    p) are skipped. One row per b, from :func:`estimate` and
    :func:`parmem.pipeline.bubble_fraction`:

    * ``b``, ``m``; ``in_flight``: micro-batches stage 0 holds at its peak (fractional when
      interleaved: chunks / v);
    * ``activations``: stage 0's activation bytes; ``logits``: the last stage's logits bytes;
    * ``peak_stage``, ``peak_total``: the heaviest stage and its bytes;
    * ``bubble_fraction``: idle share of the step, (p - 1)/(v m + p - 1) (Narayanan et al. 2021
      §2.2; the step-time model of their §3.4 is (m + (p - 1)/v)(t_f(b) + t_b(b)) for b-sized
      micro-batches, so a larger b buys matmul efficiency with a larger bubble).
    """
    from dataclasses import replace

    from .pipeline import bubble_fraction

    par = parallel if parallel is not None else ParallelConfig()
    if setup is None:
        setup = TrainingSetup(seq_len=min(2048, spec.max_positions))
    _int("global_batch", global_batch)
    if micro_batches is None:
        micro_batches = [b for b in range(1, global_batch + 1) if global_batch % b == 0]
    rows = []
    for b in micro_batches:
        _int("micro_batches[...]", b)
        if global_batch % b:
            raise ValueError(f"micro-batch size {b} must divide global_batch={global_batch}")
        m = global_batch // b
        if setup.schedule == "interleaved" and m % par.pp:
            continue
        est = estimate(spec, par, replace(setup, micro_batch=b, num_microbatches=m))
        units = in_flight_units(setup.schedule, par.pp, m, 0, par.vpp)
        rows.append({"b": b, "m": m, "in_flight": units if par.vpp == 1 else units / par.vpp,
                     "activations": est.stages[0].activations,
                     "logits": est.stages[-1].logits, "peak_stage": est.peak.stage,
                     "peak_total": est.peak_bytes,
                     "bubble_fraction": bubble_fraction(par.pp, m, par.vpp)})
    return rows


__all__ += ["microbatch_sweep"]


def axis_by_axis(spec: ModelSpec, parallel: ParallelConfig, setup: TrainingSetup
                 ) -> dict[str, Estimate]:
    """Estimates that add the axes of ``parallel`` one at a time, to show which term each removes.

    Starting from one GPU (the same ``setup``), the steps are: data parallelism d (no ZeRO),
    the ZeRO stage, tensor parallelism t, sequence parallelism, pipeline parallelism p (with v),
    expert parallelism e, context parallelism cp, then ``setup.recompute``. Steps that change
    nothing for this layout are skipped; the last estimate is ``estimate(spec, parallel, setup)``.
    Returns an ordered dict label → :class:`Estimate`.
    """
    from dataclasses import replace

    base = replace(setup, recompute="none", schedule="1f1b")
    steps = [("1 GPU", ParallelConfig(), base)]

    def add(label: str, **changes) -> None:
        par, st = steps[-1][1], steps[-1][2]
        st_changes = {k: changes.pop(k) for k in ("recompute", "schedule") if k in changes}
        steps.append((label, replace(par, **changes), replace(st, **st_changes)))

    p = parallel
    if p.dp > 1:
        add(f"d={p.dp}", dp=p.dp)
    if p.zero:
        add(f"+ZeRO-{p.zero}", zero=p.zero)
    if p.tp > 1:
        add(f"+t={p.tp}", tp=p.tp)
    if p.sp:
        add("+SP", sp=True)
    if p.pp > 1:
        label = f"+p={p.pp}" + (f", v={p.vpp}" if p.vpp > 1 else "")
        add(label, pp=p.pp, vpp=p.vpp, schedule=setup.schedule)
    if p.ep > 1:
        add(f"+e={p.ep}", ep=p.ep)
    if p.cp > 1:
        add(f"+cp={p.cp}", cp=p.cp)
    if setup.recompute != "none":
        add(f"+{setup.recompute} recompute", recompute=setup.recompute)
    return {label: estimate(spec, par, st) for label, par, st in steps}
