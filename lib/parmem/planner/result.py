"""What :func:`parmem.planner.plan` returns: ranked :class:`Candidate` layouts in a :class:`Plan`,
shown as a text table, HTML, a dict (JSON) or engine launch recipes (:meth:`Plan.recipe`,
:meth:`Plan.emit`)."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from .._check import integer
from ..config import ParallelConfig, TrainingSetup
from ..engines import engine as engine_profile
from ..estimate import Estimate
from ..model import ModelSpec
from ..units import GIB
from .accuracy import AccuracyDict, StepTimeAccuracy, step_time_accuracy
from .cost import StepTime
from .emit import EMITTER_OF, EMITTERS, ENGINES, PROFILES, Recipe
from .inputs import Assumptions, Cluster

__all__ = ["Candidate", "CandidateDict", "ClusterDict", "Plan", "PlanDict", "PlanStats"]


class CandidateDict(TypedDict):
    """:meth:`Candidate.to_dict`: one layout as JSON-ready values (``parallel`` and
    ``peak_breakdown`` as :func:`dataclasses.asdict` and
    :meth:`~parmem.estimate.MemoryBreakdown.to_dict` give them)."""

    label: str
    parallel: dict[str, Any]
    micro_batch: int
    num_microbatches: int
    recompute: str
    schedule: str
    layers_per_stage: list[int]
    step_time_s: float
    time_s: dict[str, float]
    critical_stage: int
    tokens_per_s: float
    model_flops_per_gpu: float
    hardware_flops_per_gpu: float
    mfu: float
    peak_bytes: int
    peak_stage: int
    peak_breakdown: dict[str, Any]


class PlanStats(TypedDict):
    """:attr:`Plan.stats`: families searched, feasible non-dominated layouts, estimate() calls,
    wall seconds of the search."""

    families: int
    feasible: int
    estimates: int
    seconds: float


class ClusterDict(TypedDict):
    """The ``cluster`` entry of :meth:`Plan.to_dict`."""

    gpu: str
    gpus_per_node: int
    nodes: int
    world_size: int
    memory_bytes: int
    usable_bytes: int


class PlanDict(TypedDict):
    """:meth:`Plan.to_dict`: the request, the answer and the search statistics as JSON-ready
    values (``assumptions`` as :func:`dataclasses.asdict` gives them)."""

    model: str
    cluster: ClusterDict
    global_batch: int
    seq_len: int
    assumptions: dict[str, Any]
    candidates: list[CandidateDict]
    pareto: list[CandidateDict]
    rejected: dict[str, str]
    message: str | None
    stats: PlanStats
    engine: str
    step_time_accuracy: PlanAccuracyDict | None


class PlanAccuracyDict(AccuracyDict):
    """:attr:`Plan.step_time_accuracy` as :meth:`Plan.to_dict` gives it, with the plan's
    :meth:`~Plan.accuracy_caveats`."""

    caveats: list[str]


@dataclass(frozen=True, repr=False)
class Candidate:
    """One feasible layout with its memory (a real :func:`~parmem.estimate.estimate`) and
    modelled speed."""

    parallel: ParallelConfig
    setup: TrainingSetup
    estimate: Estimate
    layers_per_stage: tuple[int, ...]
    time: StepTime
    critical_stage: int
    tokens_per_s: float
    model_flops_per_gpu: float
    hardware_flops_per_gpu: float
    peak_flops: float
    global_batch: int
    exact: bool = True

    @property
    def step_time(self) -> float:
        """Modelled seconds per optimizer step."""
        return self.time.total

    @property
    def peak_bytes(self) -> int:
        """Peak bytes of the fullest GPU (the estimate's peak stage)."""
        return self.estimate.peak_bytes

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: useful FLOP/s per GPU over the GPU's peak."""
        return self.model_flops_per_gpu / self.peak_flops

    @property
    def bubble_fraction(self) -> float:
        """Share of the step spent in the pipeline bubble."""
        return self.time.bubble / self.step_time

    def __repr__(self) -> str:
        return (
            f"<Candidate {self.label()}: {self.step_time:.3f} s/step, "
            f"peak {self.peak_bytes / GIB:.1f} GiB>"
        )

    def label(self) -> str:
        """The layout in one line: ``t=8, p=2, d=4, ZeRO-1, SP, selective recompute, b=1``."""
        par, st = self.parallel, self.setup
        parts = [f"t={par.tp}", f"p={par.pp}", f"d={par.dp}"]
        if par.cp > 1:
            parts.append(f"cp={par.cp}")
        if par.ep > 1:
            parts.append(f"e={par.ep}")
        if par.vpp > 1:
            parts.append(f"v={par.vpp}" + (" (ZB-V)" if st.schedule == "zbv" else ""))
        parts.append(f"ZeRO-{par.zero}")
        if par.sp:
            parts.append("SP")
        parts += [f"{st.recompute} recompute", f"b={st.micro_batch}"]
        return ", ".join(parts)

    def to_dict(self) -> CandidateDict:
        """The layout, its times, speed and memory as plain JSON-ready values."""
        st = self.setup
        return {
            "label": self.label(),
            "parallel": asdict(self.parallel),
            "micro_batch": st.micro_batch,
            "num_microbatches": st.num_microbatches,
            "recompute": st.recompute,
            "schedule": st.schedule,
            "layers_per_stage": list(self.layers_per_stage),
            "step_time_s": self.step_time,
            "time_s": self.time.as_dict(),
            "critical_stage": self.critical_stage,
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_gpu": self.model_flops_per_gpu,
            "hardware_flops_per_gpu": self.hardware_flops_per_gpu,
            "mfu": self.mfu,
            "peak_bytes": self.peak_bytes,
            "peak_stage": self.estimate.peak.stage,
            "peak_breakdown": self.estimate.peak.to_dict(),
        }


@dataclass(repr=False)
class Plan:
    """The answer of :func:`parmem.planner.plan`.

    ``candidates``: the ``top`` fastest feasible layouts, fastest first, each with a real
    :func:`~parmem.estimate.estimate` and exact communication; ``best``: the first (``None``
    when nothing fits); ``rejected``: family → why it was rejected; ``pareto``: the layouts no
    other is both faster and smaller than; ``points``: (peak bytes, step seconds) of every
    feasible layout estimated; ``message``: why nothing fits (``None`` otherwise); ``stats``:
    search counts and seconds; ``engine``: the profile every layout was searched, sized and
    timed with (:meth:`recipe` writes that engine's launch recipe).
    """

    spec: ModelSpec
    cluster: Cluster
    global_batch: int
    seq_len: int
    assumptions: Assumptions
    candidates: list[Candidate]
    rejected: dict[str, str]
    pareto: list[Candidate]
    points: list[tuple[int, float]]
    message: str | None
    stats: PlanStats
    engine: str = "paper"

    @property
    def best(self) -> Candidate | None:
        """The fastest candidate (``None`` when nothing fits)."""
        return self.candidates[0] if self.candidates else None

    @property
    def step_time_accuracy(self) -> StepTimeAccuracy | None:
        """How far the step time of an engine profile's plan is from measured runs it was not
        fitted to (:mod:`parmem.planner.accuracy`), for the default assumptions; ``None`` for
        the ``paper`` profile, whose defaults are fitted to the published runs of 2021."""
        if engine_profile(self.engine).defaults.timing == "papers":
            return None
        return step_time_accuracy()

    def accuracy_caveats(self) -> list[str]:
        """What the best layout's plan has that the measured runs behind
        :attr:`step_time_accuracy` do not: an engine profile, a GPU, a precision, an adapter or
        attention without FlashAttention that no scored run used, and the assumptions of the
        step time it sets away from the fitted defaults (``headroom`` moves memory only)."""
        acc, best = self.step_time_accuracy, self.best
        if acc is None or best is None:
            return []
        out = []
        gpu, st = self.cluster.hardware.name, best.setup
        if self.engine not in acc.engines:
            out.append(f"no measured run of engine {self.engine!r}")
        if gpu not in acc.gpus:
            out.append(f"none on {gpu}")
        if st.precision not in acc.precisions:
            out.append(f"none in {st.precision}")
        if st.adapter != "none":
            out.append(f"none with adapter {st.adapter!r}")
        profile = engine_profile(self.engine).defaults
        if not (profile.flash_attention if st.flash_attention is None else st.flash_attention):
            out.append("none without FlashAttention")
        default = Assumptions()
        moved = [k for k, v in asdict(self.assumptions).items()
                 if k != "headroom" and v != acc.fitted.get(k, getattr(default, k))]  # fmt: skip
        if moved:
            out.append(f"this plan sets {', '.join(moved)}")
        return out

    def accuracy_text(self) -> str:
        """:attr:`step_time_accuracy` as the line the plan prints under its best layout, with
        its :meth:`accuracy_caveats`; empty for the ``paper`` profile or when nothing fits."""
        acc = self.step_time_accuracy
        if acc is None or self.best is None:
            return ""
        caveats = self.accuracy_caveats()
        line = acc.line(self.engine)
        return line + (f" (not what was measured: {'; '.join(caveats)})" if caveats else "")

    def __repr__(self) -> str:
        head = f"<Plan {self.spec.name} on {self.cluster}: "
        best = self.best
        if best is None:
            return head + f"{self.message}>"
        return head + f"{len(self.candidates)} candidates, best {best.label()}>"

    @property
    def usable_bytes(self) -> int:
        """GPU memory a layout may use: ``(1 − headroom)`` of the GPU."""
        return self.assumptions.usable_bytes(self.cluster.hardware)

    # ------------------------------------------------------------------ display
    _HEAD = (
        "#",
        "t",
        "p",
        "d",
        "cp",
        "e",
        "v",
        "ZeRO",
        "SP",
        "recompute",
        "b",
        "m",
        "peak GiB",
        "step s",
        "tokens/s",
        "TFLOP/s",
        "MFU",
        "bubble",
        "comm",
    )

    def _rows(self) -> list[list[str]]:
        rows = []
        for i, c in enumerate(self.candidates, 1):
            par, st = c.parallel, c.setup
            rows.append(
                [
                    str(i),
                    str(par.tp),
                    str(par.pp),
                    str(par.dp),
                    str(par.cp),
                    str(par.ep),
                    str(par.vpp),
                    str(par.zero),
                    "yes" if par.sp else "no",
                    st.recompute,
                    str(st.micro_batch),
                    str(st.num_microbatches),
                    f"{c.peak_bytes / GIB:.1f}",
                    f"{c.step_time:.3f}",
                    f"{c.tokens_per_s:,.0f}",
                    f"{c.model_flops_per_gpu / 1e12:.0f}",
                    f"{c.mfu:.1%}",
                    f"{c.time.bubble / c.step_time:.1%}",
                    f"{c.time.comm / c.step_time:.1%}",
                ]
            )
        return rows

    def _title(self) -> str:
        hw = self.cluster.hardware
        return (
            f"{self.spec.name} on {self.cluster} ({self.cluster.world_size} GPUs, "
            f"{hw.memory_gib:.0f} GiB, {self.usable_bytes / GIB:.1f} GiB usable), "
            f"global batch {self.global_batch} x {self.seq_len} tokens"
        )

    def table(self) -> str:
        """The ranked candidates as a fixed-width text table."""
        if not self.candidates:
            return self.message or "no candidates"
        rows = self._rows()
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(self._HEAD)]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        return "\n".join([fmt.format(*self._HEAD), *(fmt.format(*r) for r in rows)])

    def _rejected_lines(self, limit: int = 12) -> list[str]:
        items = list(self.rejected.items())
        lines = [f"  {k}: {v}" for k, v in items[:limit]]
        if len(items) > limit:
            lines.append(f"  ... and {len(items) - limit} more (Plan.rejected)")
        return lines

    def __str__(self) -> str:
        lines = [self._title()]
        b = self.best
        if b is None:
            lines.append(self.message or "no candidates")
        else:
            lines += [
                "TFLOP/s = model FLOP/s per GPU (no recompute counted); MFU of "
                f"{b.peak_flops / 1e12:.0f} TFLOP/s peak; bubble and comm: share of "
                "the step",
                self.table(),
                "",
                f"best: {b.label()}",
                "step time (s): "
                + ", ".join(f"{k} {v:.3f}" for k, v in b.time.as_dict().items() if v),
                *([text] if (text := self.accuracy_text()) else []),
                str(b.estimate),
            ]
        if self.rejected:
            lines += ["", f"rejected families ({len(self.rejected)}):", *self._rejected_lines()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        title = f"<p><b>{html.escape(self._title())}</b></p>"
        best = self.best
        if best is None:
            return f"<div>{title}<p>{html.escape(self.message or 'no candidates')}</p></div>"
        head = "".join(f"<th>{h}</th>" for h in self._HEAD)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
            for r in self._rows()
        )
        rej = "".join(
            f"<li><code>{html.escape(k)}</code>: {html.escape(v)}</li>"
            for k, v in list(self.rejected.items())[:12]
        )
        more = len(self.rejected) - 12
        rej += f"<li>… and {more} more</li>" if more > 0 else ""
        return (
            f"<div>{title}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            f"</table><p>TFLOP/s: model FLOP/s per GPU. Best: "
            f"<code>{html.escape(best.label())}</code></p>"
            f"{best.estimate._repr_html_()}"
            f"<details><summary>rejected families ({len(self.rejected)})</summary>"
            f"<ul>{rej}</ul></details></div>"
        )

    def to_dict(self) -> PlanDict:
        """The request, the assumptions, the candidates, the Pareto front, the rejected families
        and the search statistics as plain JSON-ready values."""
        hw = self.cluster.hardware
        return {
            "model": self.spec.name,
            "cluster": {
                "gpu": hw.name,
                "gpus_per_node": self.cluster.gpus_per_node,
                "nodes": self.cluster.nodes,
                "world_size": self.cluster.world_size,
                "memory_bytes": hw.memory_bytes,
                "usable_bytes": self.usable_bytes,
            },
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "assumptions": asdict(self.assumptions),
            "candidates": [c.to_dict() for c in self.candidates],
            "pareto": [c.to_dict() for c in self.pareto],
            "rejected": dict(self.rejected),
            "message": self.message,
            "stats": self.stats,
            "engine": self.engine,
            "step_time_accuracy": None
            if (acc := self.step_time_accuracy) is None or self.best is None
            else {**acc.to_dict(), "caveats": self.accuracy_caveats()},
        }

    # ------------------------------------------------------------------ engines
    def recipe(self, engine: str | None = None, candidate: Candidate | int | None = None) -> Recipe:
        """The layout (default: the best; an ``int`` picks a rank, 0-based) as a launch
        :class:`~parmem.planner.emit.recipe.Recipe` for the engine the plan was sized for
        (``engine=None``, or its name): ``"megatron"`` (Megatron-LM's ``pretrain_gpt.py`` with its
        flags and environment; a plan of ``engine="megatron-core"``), ``"deepspeed"`` (a
        ``ds_config.json`` and its launch; Megatron-DeepSpeed when ``p > 1``; a plan of
        ``engine="deepspeed"``) or ``"torchtitan"`` (``torchtitan.train`` with command-line
        overrides; a plan of ``engine="fsdp2"``). Each names the engine version it targets
        (``parmem.planner.emit.TARGETS``). A recipe for another engine than the plan's raises
        ``ValueError``: its memory and step time were not the ones planned."""
        own = EMITTER_OF.get(self.engine)
        if engine is None:
            if own is None:
                raise ValueError(
                    f"engine={self.engine!r} writes no recipe: plan with engine= one of "
                    f"{tuple(PROFILES.values())} to emit its recipe"
                )
            engine = own
        if engine not in ENGINES:
            raise ValueError(f"engine={engine!r} must be one of {ENGINES}")
        if PROFILES[engine] != self.engine:
            raise ValueError(
                f"engine={engine!r}: this plan was sized and timed with engine={self.engine!r}; "
                f"plan with engine={PROFILES[engine]!r} to emit a {engine} recipe"
            )
        if candidate is None or isinstance(candidate, int):
            if not self.candidates:
                raise ValueError(f"nothing to emit: {self.message}")
            rank = 0 if candidate is None else candidate
            candidate = self.candidates[integer("candidate", rank, 0, len(self.candidates) - 1)]
        elif not isinstance(candidate, Candidate):
            raise ValueError(
                f"candidate={candidate!r:.60} must be a Candidate or its rank (an int), or None"
            )
        return EMITTERS[engine](self, candidate)

    def emit(self, engine: str | None = None, candidate: Candidate | int | None = None) -> str:
        """:meth:`recipe` as the shell script a user pastes: the target engine version, notes,
        the environment, the files to write and the launch command."""
        return str(self.recipe(engine, candidate))
