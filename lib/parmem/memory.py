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

from .activations import RECOMPUTE, SCHEDULES, in_flight_units, layer_terms
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

    The world size is d·t·p·cp; expert parallelism reuses data-parallel ranks, so e must divide d.
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
        if self.dp % self.ep:
            raise ValueError(f"ep={self.ep} must divide dp={self.dp} (experts are sharded over "
                             "data-parallel ranks)")
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
    a2a_buffers = 2 * e_act * s_local * b * spec.top_k * h if spec.is_moe and par.ep > 1 else 0
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
        units = in_flight_units(setup.schedule, p, setup.num_microbatches, i, par.vpp)
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

