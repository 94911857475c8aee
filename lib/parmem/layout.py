"""One layout, one engine: the group sizes, the stage walk, the tensors at the boundaries and every
rule that says whether an engine can run a layout, computed once and asked by everything else.

:class:`Layout` is built from a model (:class:`~parmem.model.ModelSpec`), a parallel configuration
(:class:`~parmem.config.ParallelConfig`) and a step (:class:`~parmem.config.TrainingSetup`, whose
``engine`` names the profile of :mod:`parmem.engines`). Like torchtitan's ``ParallelDims``, it is
the one home of:

* the group sizes: the world, the ZeRO / gradient-reduction group of the dense parameters (d·cp:
  context-parallel ranks hold the same weights) and of the experts (d·cp/e, the
  expert-data-parallel group of Megatron-Core);
* the stage walk: each pipeline stage's first layer, layer count, whether it holds the embedding
  (first) or the LM head and MTP modules (last), its MoE layers and its parameters on one GPU
  (with the engine's vocabulary padding) — :attr:`Layout.stages`;
* the per-rank token count of a micro-batch (s/cp·b), the boundary tensor (one s/cp·b·h
  activation, divided by t under sequence parallelism: the pipeline's send and receive and full
  recomputation's checkpoint), the TP collective's output and the MoE dispatch buffer
  (:func:`dispatch_slots`);
* the engine's defaults (attention kernel, dropout) resolved for the setup;
* every validity rule, each naming its field and, for an engine's rule, the engine
  (:meth:`Layout.problems`).

:func:`parmem.estimate.estimate`, :func:`parmem.comm.step_comm`, the planner, the traces and the
pages ask a :class:`Layout`; none recomputes a group size or walks the stages itself.

Sources: Megatron-Core's ``parallel_state`` (group sizes, expert-data-parallel group), Narayanan
et al. 2021 §2.2 (stages, interleaving needs m a multiple of p), Korthikanti et al. 2022 §4.2.2
(sequence parallelism splits the boundary tensor over t), the engine profiles of
``data/engines.toml`` (the rules each engine sets, with their sources there).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ._check import instance, integer, normalised_cache
from .activations import layer_input_bytes
from .config import PRECISIONS, ParallelConfig, TrainingSetup, even_split
from .engines import EngineProfile, engine
from .model import ModelSpec
from .sharding import check_tp, moe_layer_count, stage_params, vocab_rows

__all__ = ["Stage", "Layout", "layout", "check_layout", "dispatch_slots"]


@dataclass(frozen=True)
class Stage:
    """One pipeline stage of a :class:`Layout`: its index, first layer, layer count, whether it
    is the first (embedding) or last (final norm, LM head, MTP modules) stage, how many of its
    layers are MoE layers, and the (dense, expert) parameters one of its GPUs holds before ZeRO
    sharding (:func:`parmem.sharding.stage_params`, the engine's vocabulary padding)."""

    index: int
    start: int
    layers: int
    first: bool
    last: bool
    moe_layers: int
    dense_params: int
    expert_params: int

    @property
    def params(self) -> int:
        """Parameters on one GPU of the stage, dense and expert."""
        return self.dense_params + self.expert_params

    @property
    def key(self) -> tuple[int, bool, bool]:
        """(layers, first, last): stages with equal keys hold the same tensors (for a model
        whose layers are alike)."""
        return (self.layers, self.first, self.last)


def dispatch_slots(tokens: int, top_k: int, capacity_factor: float | None) -> int:
    """Token slots of one MoE all-to-all on a rank that routes ``tokens`` tokens: ``tokens ·
    top_k``, times the capacity factor rounded up (``None`` or 1: no padding) — the buffer a
    dispatch sends (and its combine receives), Lepikhin et al. 2021 §3.2, Fedus et al. 2021 §2.2.
    The one rule behind the estimator's dispatch buffers and :func:`parmem.comm.collectives`."""
    slots = tokens * top_k
    if capacity_factor is None or capacity_factor == 1.0:
        return slots
    return math.ceil(Fraction(repr(capacity_factor)) * slots)


def _stage_layers(spec: ModelSpec, par: ParallelConfig, layers_per_stage: Any) -> list[int]:
    """The layers of each stage: ``layers_per_stage`` checked (p entries, integers >= 1 summing
    to L, multiples of v when interleaved), or :func:`~parmem.config.even_split`."""
    p = par.pp
    if layers_per_stage is None:
        lps = list(even_split(spec.layers, p))
    else:
        if isinstance(layers_per_stage, str | bytes) or not hasattr(layers_per_stage, "__len__"):
            raise ValueError(
                f"layers_per_stage={layers_per_stage!r} must be a list of {p} layer counts"
            )
        lps = [integer(f"layers_per_stage[{i}]", n) for i, n in enumerate(layers_per_stage)]
        if len(lps) != p:
            raise ValueError(f"layers_per_stage has {len(lps)} entries; it needs pp={p}")
        if sum(lps) != spec.layers:
            raise ValueError(
                f"layers_per_stage sums to {sum(lps)}; it must sum to layers={spec.layers}"
            )
    for i, n in enumerate(lps):
        if n % par.vpp:
            raise ValueError(f"vpp={par.vpp} must divide the {n} layers of stage {i}")
    return lps


def _engine_problems(prof: EngineProfile, par: ParallelConfig, setup: TrainingSetup) -> list[str]:
    """The engine's own rules (``[engines.*]`` and ``[engines.*.refuses]`` of
    ``data/engines.toml``) that ``par`` and ``setup`` break, each naming the engine."""
    out = []
    for check in (
        lambda: prof.check(par.zero, par.pp, setup.recompute, setup.offload),
        lambda: prof.check_optimizer(setup.optimizer),
    ):
        try:
            check()
        except ValueError as e:
            out.append(str(e))
    used = {
        "tp": (par.tp > 1, f"tp={par.tp}"),
        "sp": (par.sp, "sp=True"),
        "cp": (par.cp > 1, f"cp={par.cp}"),
        "ep": (par.ep > 1, f"ep={par.ep}"),
        "interleaved": (par.vpp > 1 and setup.schedule == "interleaved",
                        f"vpp={par.vpp} (interleaved 1F1B)"),
        "gpipe": (par.pp > 1 and setup.schedule == "gpipe", "schedule='gpipe'"),
        "1f1b": (par.pp > 1 and setup.schedule == "1f1b", "schedule='1f1b'"),
        "zbv": (par.pp > 1 and setup.schedule == "zbv", "schedule='zbv' (ZB-V)"),
    }  # fmt: skip
    for feature, (on, what) in used.items():
        why = prof.refusal(feature) if on else ""
        if why:
            out.append(f"{prof.who} cannot run {what}: {why}")
    if setup.tp_comm_overlap and prof.defaults.timing != "papers":
        if not prof.defaults.tp_comm_overlap:
            out.append(f"{prof.who} has no tp_comm_overlap=True: it has no switch that overlaps "
                       "its tensor-parallel collectives with GEMMs")  # fmt: skip
        elif prof.defaults.tp_comm_overlap_needs_sp and par.tp > 1 and not par.sp:
            out.append(f"{prof.who} cannot run tp_comm_overlap=True without sp=True: "
                       f"{prof.defaults.tp_comm_overlap} needs sequence parallelism")  # fmt: skip
        elif prof.defaults.tp_comm_overlap_compiles and par.pp > 1 and setup.schedule == "zbv":
            out.append(f"{prof.who} cannot run tp_comm_overlap=True with schedule='zbv': "
                       f"{prof.defaults.tp_comm_overlap} compiles the model, and PyTorch's ZB-V "
                       "schedule refuses compiled stages (its backward is split in two)")  # fmt: skip
    return out


def _loss_chunk_problems(
    prof: EngineProfile, spec: ModelSpec, par: ParallelConfig, setup: TrainingSetup
) -> list[str]:
    """``setup.loss_chunks`` as the engine can run it: chunks only where the engine chunks the
    loss of that model (torchtitan's ``ChunkedLossWrapper``, its own models), and a whole number
    of tokens per chunk (torchtitan checks that the rank's ``s/cp`` divides)."""
    n = setup.loss_chunks
    if n is None:  # the engine's own for the model: its rule holds too
        n = prof.default_loss_chunks(spec.name)
        if n and (setup.seq_len // par.cp) % n:
            return [f"seq_len={setup.seq_len} (cp={par.cp}): {prof.who} chunks the loss of "
                    f"{spec.name} in {n} (its own config), which must divide the rank's "
                    f"sequence, seq_len / cp = {setup.seq_len // par.cp}: choose such a seq_len, "
                    "or set loss_chunks"]  # fmt: skip
        return []
    if not n:
        return []
    if not prof.loss_chunks:
        return [f"{prof.who} cannot run loss_chunks={n}: its loss runs over the whole "
                "micro-batch (0)"]  # fmt: skip
    if spec.name not in dict(prof.native):
        return [f"{prof.who} cannot run loss_chunks={n} for {spec.name}: it trains that model "
                "through its Transformers backend, whose loss runs over the whole micro-batch "
                f"(chunked for {', '.join(k for k, _ in prof.native)})"]  # fmt: skip
    local = setup.seq_len // par.cp
    if local % n:
        return [f"loss_chunks={n} must divide the rank's sequence, seq_len / cp = {local} "
                "(torchtitan's ChunkedLossWrapper cuts it into equal chunks)"]  # fmt: skip
    return []


class Layout:
    """A model, a parallel layout and a step under one engine, checked and walked once (see the
    module docstring). Build it with :func:`layout` (cached); a layout with problems raises
    ``ValueError`` with the first (:meth:`problems` lists them all)."""

    __slots__ = (
        "spec",
        "parallel",
        "setup",
        "engine",
        "layers_per_stage",
        "flash",
        "dropout",
        "act_bytes",
        "_stages",
        "_distinct",
    )

    def __init__(
        self,
        spec: ModelSpec,
        parallel: ParallelConfig,
        setup: TrainingSetup,
        layers_per_stage: Sequence[int] | None = None,
    ) -> None:
        instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")
        instance("parallel", parallel, ParallelConfig, "ParallelConfig(dp=..., tp=..., ...)")
        instance("setup", setup, TrainingSetup, "TrainingSetup(seq_len=...)")
        self.spec, self.parallel, self.setup = spec, parallel, setup
        self.engine = engine(setup.engine)
        problems = self._rule_problems()
        if problems:
            raise ValueError(problems[0])
        self.layers_per_stage = tuple(_stage_layers(spec, parallel, layers_per_stage))
        self.flash = setup.flash
        self.dropout = setup.dropout_for(spec)
        self.act_bytes = PRECISIONS[setup.precision]["act"]
        self._stages: tuple[Stage, ...] | None = None
        self._distinct: list[tuple[Stage, int]] | None = None

    # ------------------------------------------------------------------ rules
    def _rule_problems(self) -> list[str]:
        spec, par, setup = self.spec, self.parallel, self.setup
        out: list[str] = []
        try:
            check_tp(spec, par.tp, par.ep)
        except ValueError as e:
            out.append(str(e))
        if par.pp > spec.layers:
            out.append(f"pp={par.pp} > layers={spec.layers}: every stage needs at least one layer")
        if setup.seq_len % par.cp:
            out.append(f"cp={par.cp} must divide seq_len={setup.seq_len}")
        elif par.sp and (setup.seq_len // par.cp) % par.tp:
            out.append(
                f"seq_len / cp = {setup.seq_len // par.cp} must be divisible by tp={par.tp} "
                "with sp=True (sequence parallelism splits each sequence over the TP group)"
            )
        if spec.position == "learned" and setup.seq_len > spec.max_positions:
            out.append(
                f"seq_len={setup.seq_len} > max_positions={spec.max_positions} "
                f"(learned positions of {spec.name})"
            )
        out += _engine_problems(self.engine, par, setup)
        out += _loss_chunk_problems(self.engine, spec, par, setup)
        interleaved = setup.schedule == "interleaved"
        if setup.schedule == "zbv":
            if par.vpp != 2 or par.pp < 2:
                out.append(
                    f"schedule='zbv' with pp={par.pp} and vpp={par.vpp}: ZB-V runs two model "
                    "chunks per rank in a V (vpp=2) over pp >= 2 ranks"
                )
            if setup.recompute != "none":
                out.append(
                    f"schedule='zbv' with recompute={setup.recompute!r} is not modelled: what "
                    "the split backward keeps of what recomputation rebuilds (from the input "
                    "backward until the weight backward) is not counted (use recompute='none')"
                )
        elif interleaved != (par.vpp > 1):
            out.append(
                f"schedule={setup.schedule!r} and vpp={par.vpp}: the interleaved "
                "schedule needs vpp >= 2 and vpp >= 2 needs schedule='interleaved' (or 'zbv', "
                "with vpp=2)"
            )
        elif interleaved and setup.num_microbatches % par.pp:
            out.append(
                f"num_microbatches={setup.num_microbatches} must be a multiple of "
                f"pp={par.pp} for the interleaved schedule (Megatron-LM requirement)"
            )
        return out

    def problems(self) -> list[str]:
        """Every rule the layout breaks (empty for a layout built without error)."""
        return self._rule_problems()

    # ------------------------------------------------------------------ groups
    @property
    def world_size(self) -> int:
        """d·t·p·cp GPUs."""
        return self.parallel.world_size

    @property
    def dp_group(self) -> int:
        """Ranks that hold the same dense weights and reduce their gradients together: d·cp
        (the ZeRO sharding group)."""
        return self.parallel.dp_group

    @property
    def expert_dp_group(self) -> int:
        """Ranks that hold the same experts: d·cp/e (Megatron-Core's expert-data-parallel
        group)."""
        return self.parallel.expert_dp_group

    @property
    def sp_divisor(self) -> int:
        """t under sequence parallelism, else 1: how the norm region's tokens divide."""
        return self.parallel.tp if self.parallel.sp else 1

    # ------------------------------------------------------------------ tensors
    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one rank: s/cp · b."""
        return (self.setup.seq_len // self.parallel.cp) * self.setup.micro_batch

    @property
    def boundary_bytes(self) -> int:
        """One s/cp·b·h activation on this GPU, divided by t under SP: what a pipeline stage
        sends and receives per micro-batch and what full recomputation keeps per layer."""
        par, st = self.parallel, self.setup
        return layer_input_bytes(
            self.spec.hidden, st.seq_len, st.micro_batch, tp=par.tp, sp=par.sp, cp=par.cp,
            act_bytes=self.act_bytes,
        )  # fmt: skip

    @property
    def loss_chunks(self) -> int:
        """The sequence chunks the LM head and the loss run in: ``setup.loss_chunks``, or the
        engine's for this model (:meth:`parmem.engines.EngineProfile.default_loss_chunks`);
        0: the whole micro-batch at once."""
        return self.engine.loss_chunks_for(self.spec.name, self.setup.loss_chunks)

    @property
    def logits_bytes(self) -> int:
        """The fp32 logits the cross-entropy keeps for one micro-batch on a last-stage GPU:
        4 · s/cp·b · V/t, V padded as the engine pads it (vocab-parallel cross-entropy,
        Megatron-LM)."""
        rows = vocab_rows(self.spec, self.parallel.tp, self.engine.vocab_multiple)
        return 4 * self.tokens * rows

    @property
    def tp_output_bytes(self) -> int:
        """The TP all-reduce (or SP all-gather) output, one s/cp·b·h tensor, when t > 1."""
        if self.parallel.tp == 1:
            return 0
        st = self.setup
        return layer_input_bytes(
            self.spec.hidden, st.seq_len, st.micro_batch, cp=self.parallel.cp,
            act_bytes=self.act_bytes,
        )  # fmt: skip

    @property
    def capacity_factor(self) -> float | None:
        """The MoE capacity factor, ``None`` when it pads nothing (dense, or 1.0)."""
        cf = self.setup.capacity_factor
        return cf if self.spec.is_moe and cf != 1.0 else None

    @property
    def dispatch_slots(self) -> int:
        """Token slots of one all-to-all (:func:`dispatch_slots` of the tokens this rank routes:
        s/cp·b, divided by t under SP)."""
        if not self.spec.is_moe:
            return 0
        return dispatch_slots(
            self.tokens // self.sp_divisor, self.spec.top_k or 1, self.capacity_factor
        )

    @property
    def dispatch_bytes(self) -> int:
        """One all-to-all message: the dispatch slots × h × the activation element."""
        return self.dispatch_slots * self.spec.hidden * self.act_bytes

    @property
    def comm_buffer_bytes(self) -> int:
        """Communication buffers every stage holds: the TP collective's output, the pipeline's
        send and receive buffers (two boundary tensors), the MoE dispatch send and receive
        buffers (two messages) when e > 1."""
        out = self.tp_output_bytes
        if self.parallel.pp > 1:
            out += 2 * self.boundary_bytes
        if self.spec.is_moe and self.parallel.ep > 1:
            out += 2 * self.dispatch_bytes
        return out

    # ------------------------------------------------------------------ the stage walk
    @property
    def stages(self) -> tuple[Stage, ...]:
        """Every pipeline stage, first to last (computed once)."""
        if self._stages is None:
            self._stages = self._walk()
        return self._stages

    def _walk(self) -> tuple[Stage, ...]:
        par = self.parallel
        v_shape = par.pp > 1 and self.setup.schedule == "zbv"
        return _stage_walk(
            self.spec, par.tp, par.ep, self.layers_per_stage, self.engine.vocab_multiple, v_shape
        )

    def distinct_stages(self) -> list[tuple[Stage, int]]:
        """The stages that differ, each with how many stages share it (equal layer count, MoE
        layers and ends hold and send the same), in stage order."""
        if self._distinct is None:  # asked for each time a timer is built: kept
            self._distinct = list(_distinct(self.stages))
        return list(self._distinct)

    def __repr__(self) -> str:
        return (
            f"Layout({self.spec.name}, {self.parallel}, engine={self.engine.name}, "
            f"stages={list(self.layers_per_stage)})"
        )


@normalised_cache(maxsize=1024)
def _stage_walk(
    spec: ModelSpec,
    tp: int,
    ep: int,
    lps: tuple[int, ...],
    vocab_multiple: int,
    v_shape: bool = False,
) -> tuple[Stage, ...]:
    """Every stage of the split ``lps`` with its parameters on one GPU: what depends only on the
    model, t, e, the split, the vocabulary padding and, for ZB-V (``v_shape``), the V that puts
    the first and the last chunk on rank 0 (not on ZeRO, SP, the batch or the rest of the
    schedule), so the planner's settings of one family share it."""
    p = len(lps)
    seen: dict[tuple[int, int, bool, bool], tuple[int, int]] = {}
    out, start = [], 0
    for i, n in enumerate(lps):
        first, last = i == 0, (i == 0 if v_shape else i == p - 1)
        moe = moe_layer_count(spec, start, n)
        key = (n, moe, first, last)
        if key not in seen:
            seen[key] = stage_params(spec, tp, ep, n, first, last, vocab_multiple, start=start)
        dense, expert = seen[key]
        out.append(Stage(i, start, n, first, last, moe, dense, expert))
        start += n
    return tuple(out)


@normalised_cache(maxsize=1024)
def _distinct(stages: tuple[Stage, ...]) -> tuple[tuple[Stage, int], ...]:
    groups: dict[tuple[int, int, bool, bool], list[Stage]] = {}
    for st in stages:
        groups.setdefault((st.layers, st.moe_layers, st.first, st.last), []).append(st)
    return tuple((g[0], len(g)) for g in groups.values())


@normalised_cache(maxsize=1024)
def _cached(
    spec: ModelSpec,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    lps: tuple[int, ...] | None,
) -> Layout:
    return Layout(spec, parallel, setup, lps)


def layout(
    spec: ModelSpec,
    parallel: ParallelConfig | None = None,
    setup: TrainingSetup | None = None,
    layers_per_stage: Sequence[int] | None = None,
) -> Layout:
    """The :class:`Layout` of ``spec`` under ``parallel`` and ``setup`` (defaults: one GPU, a
    2048-token step under the paper profile), built once per distinct input and remembered.
    Raises ``ValueError`` naming the field (and the engine) of the first rule the layout
    breaks."""
    instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")
    par = parallel if parallel is not None else ParallelConfig()
    st = setup if setup is not None else TrainingSetup(seq_len=min(2048, spec.max_positions))
    instance("parallel", par, ParallelConfig, "ParallelConfig(dp=..., tp=..., ...)")
    instance("setup", st, TrainingSetup, "TrainingSetup(seq_len=...)")
    if layers_per_stage is None:
        return _cached(spec, par, st, None)
    if isinstance(layers_per_stage, Sequence) and not isinstance(layers_per_stage, str | bytes):
        key = tuple(layers_per_stage)
        if all(isinstance(n, Hashable) for n in key):
            return _cached(spec, par, st, key)
    return Layout(spec, par, st, layers_per_stage)  # refuses it, naming layers_per_stage


def check_layout(
    spec: ModelSpec, par: ParallelConfig, setup: TrainingSetup, layers_per_stage: Any = None
) -> list[int]:
    """Raise ``ValueError`` unless ``par`` and ``setup`` fit ``spec`` and the engine can run
    them; return the layers of each pipeline stage (``layers_per_stage``, checked, or
    :func:`~parmem.config.even_split`). The rules are :class:`Layout`'s."""
    return list(layout(spec, par, setup, layers_per_stage).layers_per_stage)
