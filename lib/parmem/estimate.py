"""Per-GPU training memory under a parallel layout.

:func:`estimate` answers "how many bytes does each GPU hold?" for a model
(:class:`~parmem.model.ModelSpec`), a layout (:class:`~parmem.config.ParallelConfig`: d, t, p, e,
cp, SP, ZeRO stage, v) and a training setup (:class:`~parmem.config.TrainingSetup`: s, b, m,
precision, optimizer, recompute, schedule). It returns one :class:`MemoryBreakdown` per pipeline
stage, because stages differ: the first holds the embedding and the most in-flight micro-batches,
the last the LM head and the logits.

Sources, by term:

* model states: Rajbhandari et al. 2020 (ZeRO), see :mod:`parmem.states`;
* parameters per GPU: the sharding table of :mod:`parmem.sharding` (Shoeybi et al. 2019 §3);
* activations: Korthikanti et al. 2022 (see :mod:`parmem.activations`);
* pipeline: embedding on the first stage, final norm and LM head on the last, in-flight
  micro-batches from :func:`parmem.pipeline.in_flight_units` (Narayanan et al. 2021 §2.2);
* experts: sharded over e, their gradients and optimizer states over the expert-data-parallel group
  of d·cp/e ranks (Lepikhin et al. 2021; Megatron-Core MoE);
* the engine: ``setup.engine`` names a profile of :mod:`parmem.engines` (``paper`` by default)
  whose data sets the model-state categories, the saved tensors, the buffers and the vocabulary
  padding. There is one estimator; a profile never forks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ._check import cdiv, integer
from .activations import saved_tensor_bytes
from .config import PRECISIONS, ParallelConfig, TrainingSetup, check_layout
from .engines import EngineProfile, engine, itemsizes
from .model import ModelSpec
from .pipeline import in_flight_profile
from .sharding import (
    factored_numel,
    largest_module_params,
    moe_layer_count,
    stage_params,
    vocab_rows,
)
from .states import apply_rule, state_rule
from .units import GIB

__all__ = ["MemoryBreakdown", "Estimate", "estimate"]


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU of one pipeline stage. ``total`` is the sum of the other byte fields,
    except ``host``: the model states this GPU's process keeps on the host (offload)."""

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
    host: int = 0

    FIELDS = (
        "params",
        "grads",
        "optimizer",
        "activations",
        "logits",
        "comm_buffers",
        "cuda_context",
    )

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return sum(getattr(self, f) for f in self.FIELDS)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["total"] = self.total
        return d

    def gib(self) -> dict[str, float]:
        """The byte fields and the total in GiB (2**30 bytes)."""
        return {f: getattr(self, f) / GIB for f in (*self.FIELDS, "total")}


_COLS = (
    ("stage", "stage"),
    ("layers", "layers"),
    ("params", "params"),
    ("grads", "grads"),
    ("optimizer", "optim"),
    ("activations", "activ"),
    ("logits", "logits"),
    ("comm_buffers", "comm"),
    ("cuda_context", "ctx"),
    ("total", "total"),
)


@dataclass(frozen=True)
class Estimate:
    """The result of :func:`estimate`: one :class:`MemoryBreakdown` per pipeline stage."""

    spec: ModelSpec
    parallel: ParallelConfig
    setup: TrainingSetup
    stages: tuple[MemoryBreakdown, ...]
    gpus_per_node: int = 8

    @property
    def host_bytes_per_node(self) -> int:
        """Host memory of one node for offloaded model states: ``gpus_per_node`` GPUs times the
        largest per-GPU host share (exact when a node's GPUs hold the same stage)."""
        return self.gpus_per_node * max(s.host for s in self.stages)

    @property
    def peak(self) -> MemoryBreakdown:
        """The stage with the largest total (the first such stage on a tie)."""
        return max(self.stages, key=lambda s: s.total)

    @property
    def peak_bytes(self) -> int:
        return self.peak.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.spec.name,
            "parallel": asdict(self.parallel),
            "setup": asdict(self.setup),
            "stages": [s.to_dict() for s in self.stages],
            "peak_stage": self.peak.stage,
            "peak_bytes": self.peak_bytes,
            "host_bytes_per_node": self.host_bytes_per_node,
        }

    def _rows(self) -> list[list[str]]:
        rows = []
        for s in self.stages:
            row = [str(s.stage), str(s.layers)]
            row += [f"{getattr(s, k) / GIB:.2f}" for k, _ in _COLS[2:]]
            rows.append(row)
        return rows

    def _title(self) -> str:
        st = self.setup
        return (
            f"{self.spec.name} | {self.parallel} | s={st.seq_len}, b={st.micro_batch}, "
            f"m={st.num_microbatches}, {st.precision}, {st.optimizer}, "
            f"recompute={st.recompute}, {st.schedule}"
            + (f", engine={st.engine}" if st.engine != "paper" else "")
            + (f", offload={st.offload}" if st.offload != "none" else "")
        )

    def __str__(self) -> str:
        heads = [h for _, h in _COLS]
        rows = self._rows()
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        lines = [self._title(), "GiB per GPU (2**30 bytes)", fmt.format(*heads)]
        lines += [fmt.format(*r) for r in rows]
        lines.append(
            f"peak: stage {self.peak.stage}, {self.peak_bytes / GIB:.2f} GiB "
            f"({self.peak_bytes:,} bytes)"
        )
        if self.host_bytes_per_node:
            lines.append(
                f"host: {self.host_bytes_per_node / GIB:.2f} GiB per node of "
                f"{self.gpus_per_node} GPUs (offloaded model states)"
            )
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        peak = self.peak.stage
        head = "".join(f"<th>{h}</th>" for _, h in _COLS)
        body = []
        for s, row in zip(self.stages, self._rows(), strict=True):
            style = ' style="font-weight:bold"' if s.stage == peak else ""
            body.append(f"<tr{style}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
        return (
            f"<div><p><code>{html.escape(self._title())}</code></p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<p>GiB per GPU (2<sup>30</sup> bytes). Peak: stage {peak}, "
            f"{self.peak_bytes / GIB:.2f} GiB.</p></div>"
        )


# ---------------------------------------------------------------------------- estimator
def estimate(
    spec: ModelSpec,
    parallel: ParallelConfig | None = None,
    setup: TrainingSetup | None = None,
    *,
    layers_per_stage: Sequence[int] | None = None,
    world_size: int | None = None,
    gpus_per_node: int | None = None,
) -> Estimate:
    """Per-GPU memory of every pipeline stage for ``spec`` trained with ``parallel``/``setup``.

    Each stage's :class:`MemoryBreakdown` holds, in bytes:

    * ``params``, ``grads``, ``optimizer``: the stage's parameters on one GPU after TP/EP sharding,
      then ZeRO sharding over d·cp ranks (experts over d·cp/e), per the engine profile's
      model-state categories (:func:`~parmem.states.model_state_bytes`); offloaded states go to
      ``host`` instead;
    * ``activations``: the profile's saved tensors (:func:`~parmem.activations.layer_terms`) per
      layer, times the layers a micro-batch occupies on the stage, times the micro-batches in
      flight (:func:`~parmem.pipeline.in_flight_units`). Selective recompute keeps the non-core
      terms, full recompute only each layer's 16-bit input; both add the working set of the one
      layer being recomputed. Every stage adds the tensors its layers share (the profile's
      ``stage`` table: Transformers' rotary cos and sin). The first stage adds its own tensors (the paper: the
      embedding-dropout mask), the last its final-norm and LM-head inputs (Korthikanti et al.
      2022 §4.3);
    * ``logits``: the fp32 logits the cross-entropy keeps, 4·s·b·V/t bytes per micro-batch in
      flight on the last stage (vocab-parallel cross-entropy, Megatron-LM; V padded as the
      profile pads it);
    * ``comm_buffers``: TP collective output (one 16-bit s·b·h tensor), PP send and receive
      buffers, DDP gradient buckets with ``grad_buckets="copy"``, the ZeRO-3 gather of the current
      and the prefetched layer (or the profile's ZeRO-3 buffers), the profile's gradient-reduction
      bucket, MoE dispatch buffers;
    * ``cuda_context``: ``setup.cuda_context``.

    ``layers_per_stage`` gives an uneven split (default: as even as possible, extras first).
    ``world_size``, when given, must equal d·t·p·cp. ``gpus_per_node`` (default: 8, or the world
    size if smaller) sets :attr:`Estimate.host_bytes_per_node`.
    """
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    par = parallel if parallel is not None else ParallelConfig()
    if setup is None:
        setup = TrainingSetup(seq_len=min(2048, spec.max_positions))
    lps = check_layout(spec, par, setup, layers_per_stage)  # checks the types first
    if world_size is not None:
        par.check_world_size(world_size)
    gpn = (
        min(8, par.world_size) if gpus_per_node is None else integer("gpus_per_node", gpus_per_node)
    )
    prof = engine(setup.engine)
    dropout = setup.dropout_for(spec)
    full, kept, stage_b, first_b, last_b = _activation_bytes(spec, par, setup, dropout)
    buffers = _buffers(spec, par, setup)
    zero3, bucket = _engine_buffers(spec, par, setup, prof)
    ddp_copy = par.dp * par.cp > 1 and par.zero == 0 and setup.buckets == "copy"
    bucket_note = (
        f"{prof.name}: gradient-reduction bucket of {prof.buffers.reduce_bucket:,} elements"
    )
    in_flight = in_flight_profile(setup.schedule, par.pp, setup.num_microbatches, par.vpp)
    states: dict[tuple[int, int, bool, bool], tuple[int, int, int, int, int]] = {}
    stages = []
    for i, n_layers in enumerate(lps):
        first, last, start = i == 0, i == par.pp - 1, sum(lps[:i])
        key = (n_layers, moe_layer_count(spec, start, n_layers), first, last)
        if key not in states:
            states[key] = _stage_states(spec, par, setup, prof, (start, n_layers), first, last)
        n_params, p_bytes, g_bytes, o_bytes, host = states[key]
        units = in_flight[i]
        layer_units = units * (n_layers // par.vpp)  # layer-micro-batches held at the peak
        act = kept * layer_units + (full - kept if layer_units else 0)
        notes = [
            f"{units} micro-batch{'es' if units != 1 else ''} in flight"
            if par.vpp == 1
            else f"{units} chunk-micro-batches in flight (v={par.vpp})"
        ]
        mb_units = cdiv(units, par.vpp)
        if n_layers:
            act += stage_b * mb_units
        if first:
            act += first_b * mb_units
        logits = 0
        if last:
            act += last_b * mb_units
            rows = vocab_rows(spec, par.tp, prof.vocab_multiple)
            logits = 4 * (setup.seq_len // par.cp) * setup.micro_batch * rows * mb_units
        comm = buffers + bucket + (zero3 if n_layers else 0)
        if ddp_copy:
            comm += g_bytes
            notes.append("DDP buckets hold a second copy of the gradients")
        if bucket:
            notes.append(bucket_note)
        stages.append(
            MemoryBreakdown(
                stage=i,
                layers=n_layers,
                num_params=n_params,
                params=p_bytes,
                grads=g_bytes,
                optimizer=o_bytes,
                activations=act,
                logits=logits,
                comm_buffers=comm,
                cuda_context=setup.cuda_context,
                notes=tuple(notes),
                host=host,
            )
        )
    return Estimate(spec=spec, parallel=par, setup=setup, stages=tuple(stages), gpus_per_node=gpn)


def _boundary(spec: ModelSpec, par: ParallelConfig, setup: TrainingSetup) -> int:
    """One s·b·h activation tensor on this GPU (s/cp tokens; divided by t under SP)."""
    act = PRECISIONS[setup.precision]["act"]
    return (
        act
        * (setup.seq_len // par.cp)
        * setup.micro_batch
        * spec.hidden
        // (par.tp if par.sp else 1)
    )


def _activation_bytes(
    spec: ModelSpec, par: ParallelConfig, setup: TrainingSetup, dropout: bool
) -> tuple[int, int, int, int, int]:
    """(all, kept) activation bytes of one layer and one micro-batch, and per micro-batch the
    tensors every stage keeps once (shared by its layers) and the first and the last stage's
    own tensors, from the profile's saved-tensor tables
    (:func:`~parmem.activations.layer_terms`). Kept: all under no recompute; all but the core
    under selective; the layer's input under full (Korthikanti et al. 2022 Table 2)."""
    layer, stage, first, last = saved_tensor_bytes(
        spec,
        setup.seq_len,
        setup.micro_batch,
        places=("layer", "stage", "first", "last"),
        tp=par.tp,
        sp=par.sp,
        cp=par.cp,
        flash=setup.flash_attention,
        dropout=dropout,
        act_bytes=PRECISIONS[setup.precision]["act"],
        capacity_factor=setup.capacity_factor,
        engine=setup.engine,
    )
    full = sum(n for x, n in layer if not x.only_selective)
    if setup.recompute == "none":
        kept = full
    elif setup.recompute == "selective":
        kept = sum(n for x, n in layer if not x.core)
    else:
        kept = _boundary(spec, par, setup)
    stage_b, first_b, last_b = (sum(n for _, n in place) for place in (stage, first, last))
    return full, kept, stage_b, first_b, last_b


def _buffers(spec: ModelSpec, par: ParallelConfig, setup: TrainingSetup) -> int:
    """Communication buffers every stage holds: the TP all-reduce (or SP all-gather) output,
    one s·b·h tensor; the pipeline's send and receive buffers; the MoE dispatch send and
    receive buffers, padded to the capacity factor."""
    act = PRECISIONS[setup.precision]["act"]
    tokens = (setup.seq_len // par.cp) * setup.micro_batch
    out = act * tokens * spec.hidden if par.tp > 1 else 0
    if par.pp > 1:
        out += 2 * _boundary(spec, par, setup)
    if spec.is_moe and par.ep > 1:
        out += int(2 * act * tokens * spec.top_k * spec.hidden * setup.capacity_factor)
    return out


def _engine_buffers(
    spec: ModelSpec, par: ParallelConfig, setup: TrainingSetup, prof: EngineProfile
) -> tuple[int, int]:
    """(ZeRO-3 buffers of a stage with layers, gradient-reduction bucket) of the profile:
    the gathered weights of the current and the prefetched layer when d·cp > 1 (``layers``), or
    DeepSpeed's estimator's 4 × the largest module (``largest-module``, 2 × 16-bit); one layer's
    unsharded gradient in ``zero3_grads`` (FSDP2's reduce-scatter input); the 16-bit
    reduction bucket DeepSpeed allocates at ZeRO >= 1."""
    b = prof.buffers
    sizes = itemsizes(PRECISIONS[setup.precision], setup.grad_dtype, setup.master_weights)
    bucket = sizes["param"] * b.reduce_bucket if par.zero >= 1 else 0
    if par.zero != 3:
        return 0, bucket
    gathered = par.dp * par.cp > 1
    layer = sum(stage_params(spec, par.tp, par.ep, 1, False, False)) if gathered else 0
    zero3 = sizes[b.zero3_grads] * layer
    if b.zero3_params == "layers":  # the current layer and the prefetched next one
        zero3 += 2 * sizes["param"] * layer
    elif b.zero3_params == "largest-module":
        zero3 += 2 * sizes["param"] * largest_module_params(spec, par.tp, prof.vocab_multiple)
    return zero3, bucket


def _stage_states(
    spec: ModelSpec,
    par: ParallelConfig,
    setup: TrainingSetup,
    prof: EngineProfile,
    layers: tuple[int, int],
    first: bool,
    last: bool,
) -> tuple[int, int, int, int, int]:
    """(parameters, their bytes, gradient bytes, optimizer bytes, host bytes) on one GPU of a
    stage: dense parameters ZeRO-sharded over d·cp, expert parameters over the d·cp/e
    expert-data ranks, each category as the engine profile says. ``layers``: (first layer,
    how many), so that dense and MoE layers (and the MTP modules on the last stage) count."""
    start, n_layers = layers
    where = (par.tp, par.ep, n_layers, first, last, prof.vocab_multiple)
    dense_n, expert_n = stage_params(spec, *where, start=start)
    rule = state_rule(
        setup.engine,
        setup.precision,
        setup.optimizer,
        par.zero,
        setup.offload,
        setup.grad_dtype,
        setup.master_weights,
    )
    fac: tuple[int | None, int | None] = (None, None)
    if rule.preset.factored and not rule.opt_sharded:
        fac = factored_numel(spec, *where, start=start)
    group = par.dp * par.cp
    dense = apply_rule(rule, dense_n, group, fac[0])
    expert = apply_rule(rule, expert_n, group // par.ep, fac[1])
    return (
        dense_n + expert_n,
        dense.params + expert.params,
        dense.grads + expert.grads,
        dense.optimizer + expert.optimizer,
        dense.host + expert.host,
    )
