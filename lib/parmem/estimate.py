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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ._check import cdiv, integer
from .activations import Term, saved_tensor_bytes
from .config import (
    ADAPTER_OPTIMIZERS,
    GALORE,
    PAGED_OPTIMIZERS,
    PRECISIONS,
    ParallelConfig,
    TrainingSetup,
)
from .engines import SavedTensor, itemsizes
from .finetune_acts import (
    FROZEN_OUTER_DROPS,
    fp8_layer_terms,
    lora_layer_terms,
    offload_host_bytes,
)
from .layout import Layout, Stage, layout
from .lora import lora_modules
from .model import ModelSpec
from .pipeline import in_flight_ends, in_flight_profile
from .quant import (
    bnb_optimizer_state_bytes,
    bnb_paged_state_bytes,
    dequant_transient_bytes,
    galore_state_total,
    layer_weight_bytes,
    outer_weight_bytes,
)
from .sharding import factored_numel, largest_module_params, stage_params
from .states import apply_rule, state_rule, step_only_bytes
from .units import GIB

__all__ = [
    "MemoryBreakdown",
    "Estimate",
    "estimate",
    "activation_terms",
    "kept_logits",
    "loss_pieces",
    "loss_transient",
    "model_states_and_buffers",
]


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU of one pipeline stage. ``total`` is the larger of the step's two peaks:
    the sum of the byte fields of :attr:`FIELDS` plus ``loss`` (forward and backward,
    activations held, the loss running), and the optimizer step, when the activations and logits
    are freed and ``optimizer_step`` bytes exist (DeepSpeed's fp32 gradient partition at
    ZeRO-1/2). ``loss``: on the last stage, what the loss makes for a moment above the ``logits``
    it keeps (the engine's ``loss_peak``; 0 under the papers' accounting). ``host``: the model
    states this GPU's process keeps on the host (offload), and its activations under
    ``offload_activations``."""

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
    optimizer_step: int = 0
    loss: int = 0

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
        """Parameters, gradients and optimizer states at their largest (the optimizer step's
        own gradient copies included)."""
        return self.params + self.grads + self.optimizer + self.optimizer_step

    #: What a chart of the breakdown stacks: the fields, the loss's transient, then the
    #: optimizer step's excess.
    DRAWN = (*FIELDS, "loss", "step_extra")

    @property
    def step_extra(self) -> int:
        """How far the optimizer step's peak (activations and logits freed, ``optimizer_step``
        bytes made) rises above the forward/backward peak; 0 when it does not."""
        return max(0, self.optimizer_step - self.activations - self.logits - self.loss)

    @property
    def total(self) -> int:
        fwd_bwd: int = sum(getattr(self, f) for f in self.FIELDS) + self.loss
        return fwd_bwd + self.step_extra

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["total"] = self.total
        return d

    def gib(self) -> dict[str, float]:
        """The byte fields, the loss's transient and the total in GiB (2**30 bytes)."""
        return {f: getattr(self, f) / GIB for f in (*self.FIELDS, "loss", "total")}


_COLS = (
    ("stage", "stage"),
    ("layers", "layers"),
    ("params", "params"),
    ("grads", "grads"),
    ("optimizer", "optim"),
    ("activations", "activ"),
    ("logits", "logits"),
    ("loss", "loss"),
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
            + (_adapter_title(st) if st.adapter != "none" else "")
            + (", activations on the host" if st.offload_activations else "")
            + (f", fp8 ({st.fp8})" if st.fp8 != "none" else "")
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
                f"{self.gpus_per_node} GPUs (offloaded model states and activations)"
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
def kept_logits(lay: Layout) -> int:
    """What the loss keeps for one micro-batch on a last-stage GPU through the decoder's
    backward (the ``logits`` term): the fp32 logits, :attr:`~parmem.layout.Layout.logits_bytes`;
    or, when the loss runs in chunks (:attr:`~parmem.layout.Layout.loss_chunks`: torchtitan's
    ``ChunkedLossWrapper``, which stops the decoder's forward before the LM head and finishes
    each chunk's backward before the decoder's starts), the bf16 gradient of the rank's
    ``s/cp·b·h`` hidden states that it gathers and keeps for the decoder's backward (replicated
    over the TP group; measured: :func:`parmem.distributed.runs_fsdp2.chunked_loss_peak_bytes`)."""
    if lay.loss_chunks:
        return 2 * lay.tokens * lay.spec.hidden
    return lay.logits_bytes


def loss_pieces(lay: Layout) -> tuple[int, ...]:
    """The tensors the engine's loss makes for a moment on a last-stage GPU, one micro-batch,
    above what it keeps (:func:`kept_logits`), in bytes. Their sum is :func:`loss_transient`;
    :func:`parmem.bounds.step_events` allocates them one by one.

    * The loss over the whole micro-batch (``loss_chunks`` 0): ``(loss_peak − 4)`` bytes per
      logit on the rank, in tensors the size of the fp32 logits (an unfused cross-entropy's
      two gradients; :meth:`parmem.engines.EngineProfile.loss_peak_at`, measured with each
      engine's own loss, its vocabulary-parallel form under TP, by
      :func:`parmem.engine_losses.engine_loss_peak_bytes`).
    * In ``N`` chunks (torchtitan 0.3.0's ``ChunkedLossWrapper``, ``components/loss.py``, on an
      LM head under FSDP2 with torchtitan's mixed precision), as measured on the CPU
      (:func:`parmem.distributed.runs_fsdp2.chunked_loss_peak_bytes`,
      ``tests/test_measure.py``): the fp32 buffer that gathers the hidden states' gradient (4
      bytes per element of the rank's ``s/cp·b·h``, replicated over the TP group); the chunks'
      contiguous copies of the hidden states when ``b > 1`` and ``N > 1`` (2); the head's
      gathered bf16 weight (2 bytes per weight of the rank's ``V/t·h``: the wrapper keeps it
      unsharded through the chunks) and, when ``N > 1``, FSDP2's fp32 accumulator of its
      gradient (4: gradient sync is off until the last chunk), neither of them where the
      profile's ZeRO-3 buffers already hold the stage unsharded (``pipeline_zero3 = "stage"``
      under PP); then the larger of two moments of a chunk: its bf16 logits beside the
      cross-entropy's peak, ``(2 + loss_peak)`` bytes per logit over ``s·b·V/(t·N)`` logits; or,
      when ``N > 1``, the head's new gradient, 4 bytes per weight (bf16, and as much again beside
      it), with 2 bytes per logit and the chunk's 16-bit input gradient, ``2·s·b·h/N``. Which
      moment is larger turns on ``h`` against the ``s·b/N`` tokens of a chunk: for Llama 3 8B
      at 8 chunks of ``s·b`` = 16,384 tokens they are within a few percent.
    """
    prof, logits = lay.engine, lay.logits_bytes
    peak = prof.loss_peak_at(lay.parallel.tp)
    n = lay.loss_chunks
    if not n:
        extra = logits // 4 * (peak - 4)
        if not extra:
            return ()
        return (*[logits] * (extra // logits), *([extra % logits] if extra % logits else []))
    par, hidden = lay.parallel, lay.tokens * lay.spec.hidden
    head = logits // (4 * lay.tokens) * lay.spec.hidden  # the head's weights on the rank, V/t·h
    pieces = [4 * hidden]  # the fp32 buffer of the hidden states' gradient
    if lay.setup.micro_batch > 1 and n > 1:
        pieces.append(2 * hidden)  # the chunks' contiguous copies
    staged = par.pp > 1 and par.zero == 3 and prof.buffers.pipeline_zero3 == "stage"
    if not (staged and lay.dp_group > 1):
        pieces.append(2 * head)  # the gathered bf16 weight
        if n > 1:
            pieces.append(4 * head)  # FSDP2's fp32 gradient accumulator
    chunk = logits // 4 // n  # logits of one chunk on the rank
    cross = [2 * chunk, *[4 * chunk] * (peak // 4), *([peak % 4 * chunk] if peak % 4 else [])]
    grad = [2 * head, 2 * head, 2 * chunk, 2 * hidden // n] if n > 1 else []
    pieces += cross if sum(cross) >= sum(grad) else grad
    return tuple(pieces)


def loss_transient(lay: Layout) -> int:
    """Bytes the engine's loss makes for a moment on a last-stage GPU, one micro-batch, above
    the logits it keeps: the sum of :func:`loss_pieces` (``(loss_peak − 4)·s·b·V/t`` for a loss
    over the whole micro-batch; torchtitan's chunked loss as measured there)."""
    return sum(loss_pieces(lay))


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
      profile pads it); 0 when the loss runs in chunks (:func:`kept_logits`);
    * ``loss``: on the last stage, what the engine's loss makes for a moment above those logits
      while it runs forward and backward, one micro-batch (:func:`loss_transient`): over the
      whole micro-batch ``(loss_peak − 4)·s·b·V/t`` bytes (``loss_peak`` of ``[engines.*]``,
      ``loss_peak_tp`` when t > 1: torchtitan's vocabulary-parallel loss holds 16,
      measured with each engine's own loss:
      :func:`parmem.engine_losses.engine_loss_peak_bytes`; 12 for an unfused ``F.cross_entropy`` on
      fp32-cast logits, 6 for Megatron-Core's in-place vocab-parallel loss, 4 (none) under the
      papers' accounting); in torchtitan's ``N`` chunks (``setup.loss_chunks``, by default 8 for
      the Llama 3 models torchtitan 0.3.0 builds itself) one chunk's ``(2 + loss_peak)`` bytes
      per logit, the fp32 buffer of the hidden states' gradient and the LM head's accumulated
      gradient (:func:`loss_pieces`). The activations are all held at that moment (the backward
      starts there), so it adds to the stage's peak, less the working set of the layer that
      recomputation rebuilds next (the two do not exist at once);
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
    lay = layout(spec, parallel, setup, layers_per_stage)  # checks the types and every rule
    par, setup = lay.parallel, lay.setup
    if world_size is not None:
        par.check_world_size(world_size)
    gpn = (
        min(8, par.world_size) if gpus_per_node is None else integer("gpus_per_node", gpus_per_node)
    )
    prof = lay.engine
    full, kept, stage_b, first_b, last_b = _activation_bytes(lay)
    in_flight = in_flight_profile(setup.schedule, par.pp, setup.num_microbatches, par.vpp)
    # micro-batches through the model's first chunk (the embedding's output) and its last (the
    # logits): the end stages' own counts, but under ZB-V both chunks of rank 0's V
    ends = in_flight_ends(setup.schedule, par.pp, setup.num_microbatches, par.vpp)
    states: dict[tuple[int, int, bool, bool], tuple[int, int, int, int, int, int]] = {}
    stages = []
    for st in lay.stages:
        key = (st.layers, st.moe_layers, st.first, st.last)
        if key not in states:
            states[key] = _stage_states(lay, st)
        n_params, p_bytes, g_bytes, o_bytes, host, step = states[key]
        units = in_flight[st.index]
        layer_units = units * (st.layers // par.vpp)  # layer-micro-batches held at the peak
        act = kept * layer_units + (full - kept if layer_units else 0)
        notes = [
            f"{units} micro-batch{'es' if units != 1 else ''} in flight"
            if par.vpp == 1
            else f"{units} chunk-micro-batches in flight (v={par.vpp})"
        ]
        mb_units = cdiv(units, par.vpp)
        if setup.adapter != "none" or setup.offload_activations:
            ft_act, ft_host, ft_notes = _finetune_parts(lay, st, kept, mb_units * bool(layer_units))
            act, host = act + ft_act, host + ft_host
            notes += ft_notes
        # the tensors the stage's layers share, and the first and the last stage's own
        first_u, last_u = ends if par.pp > 1 else (mb_units, mb_units)
        act += stage_b * bool(st.layers) * mb_units + first_b * st.first * first_u
        act += last_b * st.last * last_u
        logits = kept_logits(lay) * last_u if st.last else 0
        # the loss's transient (one micro-batch) runs before the last layer's backward rebuilds
        # its tensors (full - kept, already in act): the peak holds the larger of the two
        loss = max(0, loss_transient(lay) - (full - kept)) if st.last and layer_units else 0
        comm, comm_notes = _comm_buffers(lay, st, g_bytes)
        notes += comm_notes
        if step:
            notes.append(f"{prof.name}: fp32 gradient partition during the optimizer step only")
        stages.append(
            MemoryBreakdown(
                stage=st.index,
                layers=st.layers,
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
                optimizer_step=step,
                loss=loss,
            )
        )
    return Estimate(spec=spec, parallel=par, setup=setup, stages=tuple(stages), gpus_per_node=gpn)


def _adapter_title(st: TrainingSetup) -> str:
    quant = f" {st.base_quant}" + ("" if st.double_quant else " (no double quant)")
    return (
        f", {st.adapter}{quant if st.adapter == 'qlora' else ''} r={st.lora_rank} "
        f"on {st.lora_targets}" + (" with dropout" if st.lora_dropout else "")
    )


def activation_terms(lay: Layout) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """The bytes of each saved tensor of one micro-batch on one rank, from the profile's tables
    (:func:`~parmem.activations.saved_tensor_bytes`): (every tensor of one layer, the tensors one
    layer keeps under the setup's recompute policy, the tensors every stage keeps once, the first
    stage's own, the last stage's own). Kept: all under no recompute; all but the core under
    selective; the layer's input (the layout's boundary tensor) under full (Korthikanti et al.
    2022 Table 2). :func:`estimate` sums them; :func:`parmem.bounds.step_events` allocates them
    one by one."""
    spec, par, setup = lay.spec, lay.parallel, lay.setup
    if setup.offload_activations:
        return _offloaded_terms(lay)
    layer, stage, first, last = saved_tensor_bytes(
        spec,
        setup.seq_len,
        setup.micro_batch,
        places=("layer", "stage", "first", "last"),
        tp=par.tp,
        sp=par.sp,
        cp=par.cp,
        flash=lay.flash,
        dropout=lay.dropout,
        act_bytes=lay.act_bytes,
        capacity_factor=setup.capacity_factor,
        engine=setup.engine,
        autocast=setup.precision == "bf16-autocast",
    )
    if setup.adapter != "none":  # frozen weights: their gradients' operands are not kept
        first = [(x, n) for x, n in first if x.name not in FROZEN_OUTER_DROPS]
        last = [(x, n) for x, n in last if x.name not in FROZEN_OUTER_DROPS]
        full = [t.bytes for t in _lora_terms(lay, input_grad=True)]
        if setup.adapter == "qlora":  # the backward's dequantised weight, one at a time
            stage = [*stage, (_DEQUANT, _dequant_bytes(lay))]
    elif setup.fp8 == "te":  # fp8 inputs and this micro-batch's fp8 weights (TE's source)
        if lay.dropout:
            raise ValueError("fp8='te' with dropout is not modelled (dropout=False)")
        terms = fp8_layer_terms(spec, setup.seq_len, setup.micro_batch, "te", lay.act_bytes,
                                flash=lay.flash)  # fmt: skip
        full = [t.bytes for t in terms]
    else:  # no FP8, or torchao's Float8Linear, which keeps what nn.Linear keeps (measured)
        full = [n for x, n in layer if not x.only_selective]
    if setup.recompute == "none":
        kept = full
    elif setup.recompute == "selective":
        kept = [n for x, n in layer if not x.core]
    else:
        kept = [lay.boundary_bytes]
    shared, own_first, own_last = ([n for _, n in place] for place in (stage, first, last))
    return full, kept, shared, own_first, own_last


#: the entry :func:`activation_terms` adds for QLoRA's dequantised weight
_DEQUANT = SavedTensor(name="dequantised 4-bit weight (transient)", width="one")


def _dequant_bytes(lay: Layout) -> int:
    """The largest transient bitsandbytes makes to dequantise a 4-bit weight in the backward
    (:func:`parmem.quant.dequant_transient_bytes`, compute dtype = the activations')."""
    setup = lay.setup
    return dequant_transient_bytes(
        lay.spec,
        setup.base_quant,
        lay.act_bytes,
        double_quant=setup.double_quant,
        dtype_16=_sizes(lay)["param"],
    )


def first_layer_kept(lay: Layout) -> list[int] | None:
    """What the model's first layer keeps per micro-batch when it differs from every other
    layer's ``kept`` of :func:`activation_terms`, else ``None``: under LoRA without
    recomputation, layer 0's input needs no gradient (the embedding is frozen), so its first norm
    and its q/k/v dropout keep nothing (:func:`parmem.finetune_acts.lora_layer_terms`,
    ``input_grad=False``)."""
    setup = lay.setup
    if setup.adapter == "none" or setup.recompute != "none" or setup.offload_activations:
        return None
    return [t.bytes for t in _lora_terms(lay, input_grad=False)]


def _lora_terms(lay: Layout, input_grad: bool) -> list[Term]:
    """One layer's saved tensors under the setup's LoRA or QLoRA (CUDA, fp32 adapters)."""
    setup = lay.setup
    return lora_layer_terms(
        lay.spec,
        setup.seq_len,
        setup.micro_batch,
        setup.lora_rank,
        setup.lora_targets,
        setup.lora_dropout,
        lay.act_bytes,
        flash=lay.flash,
        base="4bit" if setup.adapter == "qlora" else "16bit",
        input_grad=input_grad,
    )


def offloaded_layer_bytes(lay: Layout) -> int:
    """The bytes ``save_on_cpu`` copies to the host for one layer and one micro-batch
    (:func:`parmem.finetune_acts.offload_host_bytes`): the estimate's ``host`` holds them for
    every layer, and the GPU holds at most one layer's copies again while its backward runs."""
    setup = lay.setup
    kw: dict[str, Any] = {}
    if setup.adapter != "none":
        kw = {
            "mode": "lora",
            "rank": setup.lora_rank,
            "targets": setup.lora_targets,
            "dropout": setup.lora_dropout,
            "base": "4bit" if setup.adapter == "qlora" else "16bit",
        }
    return offload_host_bytes(lay.spec, setup.seq_len, setup.micro_batch, lay.act_bytes, **kw)


def _offloaded_terms(
    lay: Layout,
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """:func:`activation_terms` under ``offload_activations``: every decoder layer's saved
    tensors go to the host as they are saved (``save_on_cpu`` around each layer), so a layer
    keeps nothing on the GPU (``kept`` empty) and its backward brings its copies back (the
    working set, ``full``: one layer's host bytes at most); the stage's shared tensors and the
    first and the last stage's own stay, as without offload."""
    base = replace(lay.setup, offload_activations=False)
    plain = layout(lay.spec, lay.parallel, base, lay.layers_per_stage)
    _, _, stage, first, last = activation_terms(plain)
    return [offloaded_layer_bytes(lay)], [], stage, first, last


def _activation_bytes(lay: Layout) -> tuple[int, int, int, int, int]:
    """(all, kept) activation bytes of one layer and one micro-batch, and per micro-batch the
    tensors every stage keeps once (shared by its layers) and the first and the last stage's
    own tensors: the sums of :func:`activation_terms`."""
    full, kept, stage_b, first_b, last_b = (sum(x) for x in activation_terms(lay))
    return full, kept, stage_b, first_b, last_b


def _reduce_bucket(lay: Layout) -> int:
    """The profile's 16-bit gradient-reduction bucket (DeepSpeed at ZeRO >= 1)."""
    if lay.parallel.zero < 1:
        return 0
    return _sizes(lay)["param"] * lay.engine.buffers.reduce_bucket


def _sizes(lay: Layout) -> dict[str, int]:
    st = lay.setup
    return itemsizes(PRECISIONS[st.precision], st.grad_dtype, st.master_weights)


def _zero3_buffers(lay: Layout, stage: Stage) -> tuple[int, str]:
    """The profile's ZeRO-3 buffers on a stage with layers, and a note: the gathered weights of
    the current and the prefetched layer when d·cp > 1 (``layers``), or DeepSpeed's estimator's
    4 × the largest module (``largest-module``, 2 × 16-bit); one layer's unsharded gradient in
    ``zero3_grads`` (FSDP2's reduce-scatter input). Under pipeline parallelism a profile whose
    ``pipeline_zero3`` is ``stage`` keeps the whole stage unsharded between micro-batches: its
    16-bit weights and its gradient accumulators in ``zero3_grads`` (torchtitan sets
    ``reshard_after_forward=False`` with PP, and the pipeline schedule reduce-scatters the
    gradients once, after the last micro-batch)."""
    par, prof = lay.parallel, lay.engine
    b, spec = prof.buffers, lay.spec
    if par.zero != 3 or not stage.layers:
        return 0, ""
    sizes = _sizes(lay)
    gathered = lay.dp_group > 1
    if gathered and par.pp > 1 and b.pipeline_zero3 == "stage":
        note = f"{prof.name} under PP: the stage's weights and gradients stay unsharded"
        return (sizes["param"] + sizes[b.zero3_grads]) * stage.params, note
    layer = sum(stage_params(spec, par.tp, par.ep, 1, False, False)) if gathered else 0
    zero3 = sizes[b.zero3_grads] * layer
    if b.zero3_params == "layers":  # the current layer and the prefetched next one
        zero3 += 2 * sizes["param"] * layer
    elif b.zero3_params == "largest-module":
        largest = largest_module_params(spec, par.tp, prof.vocab_multiple, par.ep)
        zero3 += 2 * sizes["param"] * largest
    return zero3, ""


def _comm_buffers(lay: Layout, st: Stage, grad_bytes: int) -> tuple[int, list[str]]:
    """The stage's ``comm_buffers`` (see :func:`estimate`) and the notes naming them."""
    prof, par, notes = lay.engine, lay.parallel, []
    bucket = _reduce_bucket(lay)
    zero3, zero3_note = _zero3_buffers(lay, st)
    comm = lay.comm_buffer_bytes + bucket + zero3
    if zero3_note:
        notes.append(zero3_note)
    if lay.dp_group > 1 and par.zero == 0 and lay.setup.buckets == "copy":
        comm += grad_bytes
        notes.append("DDP buckets hold a second copy of the gradients")
    if bucket:
        notes.append(
            f"{prof.name}: gradient-reduction bucket of {prof.buffers.reduce_bucket:,} elements"
        )
    return comm, notes


def model_states_and_buffers(
    spec: ModelSpec,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    *,
    layers_per_stage: Sequence[int] | None = None,
) -> list[dict[str, int]]:
    """Per stage, the parts of :func:`estimate` that do not depend on the profile's activation
    table: ``params``, ``grads``, ``optimizer``, ``optimizer_step``, ``host`` and
    ``comm_buffers``, in bytes on one GPU. For a layout whose saved tensors the profile refuses
    (a structural feature its table does not model, such as multi-latent attention under
    ``fsdp2``), :func:`estimate` raises, while these remain exact: the recorded engine runs
    (:mod:`parmem.engine_records`) compare them alone for such a model."""
    lay = layout(spec, parallel, setup, layers_per_stage)
    out = []
    for st in lay.stages:
        _, p_bytes, g_bytes, o_bytes, host, step = _stage_states(lay, st)
        comm, _ = _comm_buffers(lay, st, g_bytes)
        out.append({"params": p_bytes, "grads": g_bytes, "optimizer": o_bytes,
                    "optimizer_step": step, "host": host, "comm_buffers": comm})  # fmt: skip
    return out


def _stage_states(lay: Layout, st: Stage) -> tuple[int, int, int, int, int, int]:
    """(parameters, their bytes, gradient bytes, optimizer bytes, host bytes, optimizer-step
    bytes) on one GPU of a stage: dense parameters ZeRO-sharded over the layout's d·cp group,
    expert parameters over its d·cp/e expert-data group, each category as the engine profile
    says."""
    par, setup = lay.parallel, lay.setup
    if setup.adapter != "none":
        return _adapter_states(lay, st)
    if setup.optimizer == GALORE:
        return _galore_states(lay, st)
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
        where = (par.tp, par.ep, st.layers, st.first, st.last, lay.engine.vocab_multiple)
        fac = factored_numel(lay.spec, *where, start=st.start)
    dense = apply_rule(rule, st.dense_params, lay.dp_group, fac[0])
    expert = apply_rule(rule, st.expert_params, lay.expert_dp_group, fac[1])
    return (
        st.params,
        dense.params + expert.params,
        dense.grads + expert.grads,
        dense.optimizer + expert.optimizer,
        dense.host + expert.host,
        step_only_bytes(rule, dense.step, expert.step),
    )


def _finetune_parts(lay: Layout, st: Stage, kept: int, units: int) -> tuple[int, int, list[str]]:
    """What a fine-tuning setup changes on a stage holding ``units`` micro-batches of its layers:
    (activation bytes to add, host bytes to add, notes). Layer 0 under LoRA keeps less than the
    others (:func:`first_layer_kept`); offloaded activations go to the host, every layer's copies
    (:func:`offloaded_layer_bytes`; layer 0's counted as the others')."""
    act, host, notes = 0, 0, []
    kept0 = first_layer_kept(lay) if st.first else None
    if kept0 is not None:
        act = (sum(kept0) - kept) * units  # layer 0: its input needs no gradient
    if lay.setup.offload_activations:
        host = offloaded_layer_bytes(lay) * st.layers * units
        notes.append(
            f"activations: {host / GIB:.2f} GiB on the host (save_on_cpu), one layer's copies "
            "back on the GPU in its backward"
        )
    if lay.setup.adapter != "none":
        notes.append(_adapter_note(lay, st))
    return act, host, notes


def _adapter_note(lay: Layout, st: Stage) -> str:
    """What the stage trains, and the part of a paged optimizer's states in unified memory."""
    setup = lay.setup
    numels = adapter_tensors(lay, st)
    note = f"{setup.adapter}: {sum(numels):,} trainable parameters (fp32), the rest frozen"
    if setup.optimizer in PAGED_OPTIMIZERS:
        paged = bnb_paged_state_bytes(numels, optim=ADAPTER_OPTIMIZERS[setup.optimizer])
        note += f"; {paged / GIB:.2f} GiB of optimizer states in CUDA unified memory (pageable)"
    return note


def adapter_tensors(lay: Layout, st: Stage) -> list[int]:
    """The element counts of the LoRA tensors (each ``lora_A`` and ``lora_B``) of the stage's
    layers, in layer order (:func:`parmem.lora.lora_modules`)."""
    spec, setup = lay.spec, lay.setup
    r = setup.lora_rank
    mods = lora_modules(spec, setup.lora_targets)
    out = []
    for i in range(st.start, st.start + st.layers):
        for m in mods:
            if m.in_layer(spec, i):
                (a0, a1), (b0, b1) = m.a_shape(r), m.b_shape(r)
                out += [a0 * a1, b0 * b1]
    return out


def _adapter_states(lay: Layout, st: Stage) -> tuple[int, int, int, int, int, int]:
    """:func:`_stage_states` of a fine-tuning setup (``adapter`` ``"lora"`` or ``"qlora"``,
    the Transformers Trainer with PEFT 0.21.2 and bitsandbytes 0.50.2): the frozen weights as
    loaded (16-bit, or 4-bit linear layers with their quantisation state,
    :func:`parmem.quant.layer_weight_bytes`), neither gradients nor optimizer states for them;
    the adapters in fp32 (PEFT's ``autocast_adapter_dtype=True`` upcasts them) with fp32
    gradients and the optimizer's states tensor by tensor, as bitsandbytes allocates them for
    its 8-bit and paged optimizers (:func:`parmem.quant.bnb_optimizer_state_bytes`) and as
    ``torch.optim.AdamW`` does (two fp32 moments)."""
    spec, setup = lay.spec, lay.setup
    param = _sizes(lay)["param"]
    if setup.adapter == "qlora":
        q, dq = setup.base_quant, setup.double_quant
        layers = range(st.start, st.start + st.layers)
        base = sum(layer_weight_bytes(spec, i, q, dq, param).total for i in layers)
        base += outer_weight_bytes(spec, "first", q, dq, param).total if st.first else 0
        base += outer_weight_bytes(spec, "last", q, dq, param).total if st.last else 0
    else:
        base = param * st.params
    numels = adapter_tensors(lay, st)
    n = sum(numels)
    opt = bnb_optimizer_state_bytes(numels, optim=ADAPTER_OPTIMIZERS[setup.optimizer]) if n else 0
    return st.params + n, base + 4 * n, 4 * n, opt, 0, 0


def _galore_states(lay: Layout, st: Stage) -> tuple[int, int, int, int, int, int]:
    """:func:`_stage_states` of full fine-tuning with GaLore's AdamW (``engine="hf"``, one
    stage, no ZeRO): every weight and gradient as the profile keeps them, and the optimizer's
    states as galore_torch 1.0 allocates them, in the gradients' dtype
    (:func:`parmem.quant.galore_state_total`: the projected matrices' moments and projections,
    the other tensors' two moments). GaLore's per-layer updates, which free each gradient as
    soon as it is applied, are not modelled: the full gradients are kept."""
    rule = state_rule(lay.setup.engine, lay.setup.precision, "adamw", 0)
    plain = apply_rule(rule, st.params, lay.dp_group)
    size = _sizes(lay)["grad"]
    opt = galore_state_total(lay.spec, lay.setup.galore_rank, itemsize=size)
    return st.params, plain.params, plain.grads, opt, 0, 0
