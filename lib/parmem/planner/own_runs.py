"""The planner fitted to the reader's own runs: ``parmem calibrate`` (issue 29).

The planner's time model carries assumptions fitted to published runs
(:mod:`parmem.planner.calibration`) and scored on runs it never saw
(:mod:`parmem.planner.heldout`): the kernels' busy fraction of the peak (``mfu``), the share
of each kind of communication that hides behind computation (``tp_overlap``, ``dp_overlap_on``,
``pp_overlap``, ``ep_overlap``). A reader's cluster is not the clusters of those tables: its
kernels, its network, its software versions differ. This module reads the reader's own
measured steps (a training log: :mod:`parmem.planner.logs`; or rows in the schema of
``data/measured_runs.toml``), fits the chosen assumptions to them, says how well the fit
predicts a run it did not see (leave one run out), and plans with the fitted values.

What a run is modelled with is what its log says: a Megatron-LM log prints its arguments at
start-up (``megatron/training/arguments.py``, ``_print_args``), so the layout (tensor, pipeline,
context, expert parallel sizes, the distributed optimizer, sequence parallelism, micro and
global batch, sequence length, recomputation, virtual stages) comes from it, and the model's
dimensions there are checked against ``--model`` (a mismatch is an error naming the argument,
never a silently different model). A run that did not overlap its data-parallel reductions
(Megatron's ``overlap_grad_reduce`` false, its default) is timed with the non-overlapping
value (``dp_overlap``), whatever is fitted; an FP8 run is refused (the time model has BF16 GEMM
rates only).

The fit minimises the mean absolute relative error of the step time (as
:func:`parmem.planner.heldout.summary` scores), one assumption at a time: first over its whole
range (a grid of 11 values, then a golden-section search in the best value's neighbourhood),
then, in up to five more rounds while any value still moves, a golden-section search around the
value the others' changes left it at (coordinate descent; one round when one assumption is
fitted). More assumptions than runs are refused: they cannot be determined. An assumption the runs' step times do not depend on (``dp_overlap_on`` for runs without
data parallelism) is reported as not determined and keeps its value. With as many runs as
fitted assumptions the fit is exact in sample and says nothing about other layouts: the
leave-one-run-out error (each run modelled with the values fitted to the others) is the
honest number, and :class:`Calibration` gives it whenever there are two runs or more.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Unpack

from ..config import ParallelConfig, TrainingSetup, even_split, vpp_schedule
from ..model import ModelSpec
from .heldout import MeasuredRun, run_from_row, step_seconds
from .inputs import AssumptionOptions, Assumptions, Cluster
from .logs import StepLog
from .result import Plan
from .search import evaluate, plan

__all__ = [
    "FITTABLE",
    "OwnRun",
    "Calibration",
    "run_from_log",
    "runs_from_toml",
    "megatron_layout",
    "titan_layout",
    "scaled_cluster",
    "calibrate",
    "group_runs",
    "cluster_tables",
    "CalibrationStudy",
    "calibration_study",
    "LINK_SCALES",
]

#: The assumptions ``parmem calibrate`` can fit, with the range searched (those of
#: :class:`~parmem.planner.Assumptions`). The kernel scales by GPU generation
#: (``mfu_ampere_scale``, ``mfu_hopper_scale``) are not among them: on one cluster they and
#: ``mfu`` are one number.
FITTABLE: dict[str, tuple[float, float]] = {
    "mfu": (0.02, 1.0),
    "tp_overlap": (0.0, 1.0),
    "dp_overlap_on": (0.0, 1.0),
    "dp_overlap": (0.0, 1.0),
    "pp_overlap": (0.0, 1.0),
    "ep_overlap": (0.0, 1.0),
    "attention_efficiency": (0.1, 2.0),
    "inter_node_scale": (0.05, 4.0),
    "intra_node_scale": (0.05, 4.0),
}
#: the fittable values that are the cluster's, not the planner's assumptions: factors on the
#: bandwidth of the GPU preset's links (``Hardware.inter_node``, the network between nodes;
#: ``Hardware.intra_node``, NVLink): a reader's network is not the datasheet's
LINK_SCALES = {"inter_node_scale": "inter_node", "intra_node_scale": "intra_node"}

#: the assumptions ``parmem plan`` has a flag for besides :data:`FITTABLE`'s
_PLAN_FLAGS = ("headroom", "mfu_ampere_scale", "mfu_hopper_scale")

_GRID = 11
_GOLDEN_STEPS = 10
_ROUNDS = 6


@dataclass(frozen=True)
class OwnRun:
    """One measured run of the reader's: its name (the log's path, or the row's key), the run as
    the held-out scoring models it, the assumptions this run is timed with whatever is fitted
    (``fixed``: what its log says it did, e.g. no overlapped gradient reduction; a value that is
    another assumption's name takes that assumption's value), and notes on what was read and
    decided."""

    name: str
    run: MeasuredRun
    fixed: Mapping[str, float | str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def scaled_cluster(cluster: Cluster, scales: Mapping[str, float]) -> Cluster:
    """``cluster`` with its links' bandwidths multiplied by the factors in ``scales``
    (:data:`LINK_SCALES`' names; others are ignored)."""
    hw = cluster.hardware
    links = {link: replace(getattr(hw, link), bandwidth=getattr(hw, link).bandwidth * scales[n])
             for n, link in LINK_SCALES.items() if n in scales and scales[n] != 1.0}  # fmt: skip
    if not links:
        return cluster
    return Cluster(replace(hw, **links), cluster.gpus_per_node, cluster.nodes)


def _model_time(r: OwnRun, kw: Mapping[str, Any]) -> float:
    m = r.run
    alias = {k: kw.get(v, getattr(Assumptions(), v)) if isinstance(v, str) else v
             for k, v in r.fixed.items()}  # fmt: skip
    kw = {**kw, **alias}
    cluster = scaled_cluster(m.cluster, kw)
    a = {k: v for k, v in kw.items() if k not in LINK_SCALES}
    c = evaluate(m.spec, cluster, m.parallel, m.setup,
                 layers_per_stage=even_split(m.spec.layers, m.parallel.pp),
                 **a)  # fmt: skip
    return c.step_time


def _mean_error(runs: Iterable[OwnRun], kw: Mapping[str, Any]) -> float:
    errs = [abs(_model_time(r, kw) / r.run.step_time - 1) for r in runs]
    return sum(errs) / len(errs)


def _golden(f: Callable[[float], float], lo: float, hi: float) -> float:
    """The minimum of ``f`` on ``[lo, hi]`` by golden-section search (``f`` unimodal there)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(_GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def _alone(runs: list[OwnRun], kw: Mapping[str, Any], name: str, lo: float, hi: float) -> bool:
    """Whether one run alone, of several, moves with ``name`` across its range: the value would
    fit that run exactly and tell nothing (``inter_node_scale`` fitted to one multi-node run
    among single-node ones), so it counts as not determined."""
    if len(runs) < 2:
        return False
    moved = 0
    for r in runs:
        a, b = _model_time(r, {**kw, name: lo}), _model_time(r, {**kw, name: hi})
        moved += abs(a - b) > 1e-9 * a
        if moved > 1:
            return False
    return moved == 1


def _fit(
    runs: list[OwnRun], names: tuple[str, ...], start: Mapping[str, Any]
) -> tuple[dict[str, float], tuple[str, ...]]:
    """Coordinate descent over ``names`` from ``start``: (fitted values, names not determined)."""
    kw = dict(start)
    base = Assumptions.from_kwargs({k: v for k, v in kw.items() if k not in LINK_SCALES})  # type: ignore[arg-type]
    values = {n: float(kw.get(n, 1.0)) if n in LINK_SCALES else float(getattr(base, n))
              for n in names}  # fmt: skip
    flat: set[str] = set()
    for round_ in range(_ROUNDS if len(names) > 1 else 1):
        moved = False
        for n in names:
            lo, hi = FITTABLE[n]
            cell = (hi - lo) / (_GRID - 1)

            def err(x: float, n: str = n) -> float:
                return _mean_error(runs, {**kw, **values, n: x})

            if round_ == 0 and _alone(runs, {**kw, **values}, n, lo, hi):
                flat.add(n)
                continue
            if round_ == 0:  # the whole range on a grid, then the best cell's neighbourhood
                grid = [lo + cell * i for i in range(_GRID)]
                errs = [err(x) for x in grid]
                if max(errs) - min(errs) < 1e-9:
                    flat.add(n)
                    continue
                i = min(range(_GRID), key=errs.__getitem__)
                here, at = grid[i], errs[i]
            elif n in flat:
                continue
            else:  # later rounds: around the value the others moved away from
                here, at = values[n], err(values[n])
            best = _golden(err, max(lo, here - cell), min(hi, here + cell))
            if err(best) > at:
                best = here
            if abs(best - values[n]) > 0.02 * cell:
                moved = True
            values[n] = best
        if not moved:
            break
    return values, tuple(n for n in names if n in flat)


@dataclass(frozen=True)
class Calibration:
    """The answer of :func:`calibrate`: the runs, the assumptions fitted (``fitted``; those in
    ``undetermined`` kept their starting value), the starting assumptions (``start``: the
    defaults with what was given), each run's modelled step time before the fit (``before``),
    after it (``after``, in sample) and with the values fitted to the other runs only
    (``held_out``; ``None`` where the other runs are fewer than the fitted values)."""

    runs: tuple[OwnRun, ...]
    names: tuple[str, ...]
    start: dict[str, Any]
    fitted: dict[str, float]
    undetermined: tuple[str, ...]
    before: tuple[float, ...]
    after: tuple[float, ...]
    held_out: tuple[float | None, ...]

    @property
    def options(self) -> dict[str, Any]:
        """The assumptions to plan with: the starting ones and the fitted values (the link
        factors of :data:`LINK_SCALES` apart: :meth:`cluster` applies them)."""
        fitted = {n: v for n, v in self.fitted.items() if n not in self.undetermined}
        return {k: v for k, v in {**self.start, **fitted}.items() if k not in LINK_SCALES}

    def cluster(self, cluster: Cluster) -> Cluster:
        """``cluster`` with the fitted link factors applied (:func:`scaled_cluster`)."""
        fitted = {n: v for n, v in self.fitted.items() if n not in self.undetermined}
        return scaled_cluster(cluster, {**self.start, **fitted})

    def errors(self, which: str) -> list[float]:
        """Relative step-time errors of the runs (``which``: "before", "after" or "held_out";
        modelled over measured, minus 1), leaving out runs without a value."""
        times = getattr(self, which)
        return [t / r.run.step_time - 1 for t, r in zip(times, self.runs, strict=True)
                if t is not None]  # fmt: skip

    def mean_error(self, which: str) -> float:
        """Mean absolute relative error of :meth:`errors` (NaN when there is none)."""
        e = [abs(x) for x in self.errors(which)]
        return sum(e) / len(e) if e else math.nan

    def flags(self) -> str:
        """The fitted values as ``parmem plan`` flags (``--mfu 0.512 ...``)."""
        return " ".join(
            f"--{n.replace('_', '-')} {v:.3f}"
            for n, v in self.options.items()
            if n in FITTABLE or n in _PLAN_FLAGS
        )

    def plan(
        self,
        spec: ModelSpec,
        cluster: Cluster,
        global_batch: int,
        seq_len: int,
        **kw: Any,
    ) -> Plan:
        """:func:`~parmem.planner.plan` with the fitted assumptions, on ``cluster`` with the
        fitted link factors (``kw``: its other arguments; an assumption given there wins)."""
        return plan(spec, self.cluster(cluster), global_batch, seq_len, **{**self.options, **kw})

    def rows(self) -> list[dict[str, Any]]:
        """One row per run: name, layout, measured and modelled step seconds, errors."""
        out = []
        for i, r in enumerate(self.runs):
            m, ho = r.run, self.held_out[i]
            p = m.parallel
            out.append({
                "run": r.name,
                "layout": f"t{p.tp} p{p.pp} d{p.dp} cp{p.cp} e{p.ep} z{p.zero} "
                          f"b{m.setup.micro_batch} m{m.setup.num_microbatches} "
                          f"{m.setup.recompute}",
                "measured_s": m.step_time,
                "before_s": self.before[i],
                "before_error": self.before[i] / m.step_time - 1,
                "fitted_s": self.after[i],
                "fitted_error": self.after[i] / m.step_time - 1,
                "held_out_s": ho,
                "held_out_error": None if ho is None else ho / m.step_time - 1,
            })  # fmt: skip
        return out

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain values (the ``--json`` of ``parmem calibrate``)."""
        return {
            "fitted": dict(self.fitted),
            "undetermined": list(self.undetermined),
            "start": dict(self.start),
            "mean_error": {w: self.mean_error(w) for w in ("before", "after", "held_out")},
            "runs": self.rows(),
            "notes": {r.name: list(r.notes) for r in self.runs if r.notes},
            "models": sorted({r.run.spec.name for r in self.runs}),
            "plan_flags": self.flags(),
        }

    def __str__(self) -> str:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:+.1%}"

        head = ("run", "layout", "measured s", "defaults s", "err", "fitted s", "err",
                "held out s", "err")  # fmt: skip
        body = [
            [r["run"], r["layout"], f"{r['measured_s']:.3f}", f"{r['before_s']:.3f}",
             pct(r["before_error"]), f"{r['fitted_s']:.3f}", pct(r["fitted_error"]),
             "-" if r["held_out_s"] is None else f"{r['held_out_s']:.3f}",
             pct(r["held_out_error"])]
            for r in self.rows()
        ]  # fmt: skip
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
        lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
                 for row in [list(head), *body]]  # fmt: skip
        fitted = ", ".join(
            f"{n} = {v:.3f}" + (" (not determined by these runs: kept)" if n in self.undetermined
                                else f" (was {self.start.get(n, _default(n)):.3f})")
            for n, v in self.fitted.items()
        )  # fmt: skip
        lines += [
            "",
            f"fitted: {fitted}",
            f"mean |error|: {self.mean_error('before'):.1%} with the starting assumptions, "
            f"{self.mean_error('after'):.1%} fitted (in sample)"
            + (f", {self.mean_error('held_out'):.1%} leaving each run out"
               if any(h is not None for h in self.held_out) else
               "; no run can be left out (fewer runs than fitted values would remain): the fit "
               "is exact by construction, and says nothing of other layouts"),
        ]  # fmt: skip
        for r in self.runs:
            lines += [f"note ({r.name}): {n}" for n in r.notes]
        models = sorted({r.run.spec.name for r in self.runs})
        if len(models) > 1:
            lines.append(
                f"note: these runs are of {len(models)} models ({', '.join(models)}); one "
                "efficiency fitted to all of them is their average, and may predict each worse "
                "than the defaults (chapter 18: FlagPerf's H100 runs of two models): fit to "
                "runs of the model you will plan"
            )
        if self.flags():
            lines.append(f"plan with: parmem plan ... {self.flags()}")
        links = [f"{LINK_SCALES[n]} bandwidth x {v:.2f}" for n, v in self.fitted.items()
                 if n in LINK_SCALES and n not in self.undetermined]  # fmt: skip
        if links:
            lines.append(
                f"the cluster's links as fitted: {', '.join(links)} (parmem calibrate "
                "--plan plans with them; parmem plan takes the preset's)"
            )
        return "\n".join(lines)


def _default(name: str) -> float:
    return 1.0 if name in LINK_SCALES else float(getattr(Assumptions(), name))


def calibrate(
    runs: list[OwnRun],
    fit: Iterable[str] = ("mfu",),
    **assumptions: Unpack[AssumptionOptions],
) -> Calibration:
    """Fit the assumptions named in ``fit`` (of :data:`FITTABLE`) to ``runs``; ``assumptions``:
    the starting values of the rest (and of the fitted ones). Each run is modelled as
    :func:`~parmem.planner.evaluate` models its layout, with its ``fixed`` assumptions on top.
    With two runs or more, each run is also modelled with the values fitted to the others
    (``held_out``)."""
    names = tuple(dict.fromkeys(fit))
    if not runs:
        raise ValueError("runs: give at least one measured run")
    for n in names:
        if n not in FITTABLE:
            raise ValueError(f"fit: {n!r} cannot be fitted; choose from {', '.join(FITTABLE)}")
    if not names:
        raise ValueError("fit: name at least one assumption to fit")
    if len(names) > len(runs):
        raise ValueError(
            f"fit: {len(names)} assumptions cannot be determined by {len(runs)} run"
            f"{'s' if len(runs) > 1 else ''}; fit at most one per run"
        )
    start: dict[str, Any] = dict(assumptions)
    # an unknown name is an error here
    Assumptions.from_kwargs({k: v for k, v in start.items() if k not in LINK_SCALES})  # type: ignore[arg-type]
    values, flat = _fit(runs, names, start)
    before = tuple(_model_time(r, start) for r in runs)
    after = tuple(_model_time(r, {**start, **values}) for r in runs)
    held: list[float | None] = []
    for i, r in enumerate(runs):
        others = runs[:i] + runs[i + 1 :]
        if len(others) < len(names):  # the others cannot determine the values
            held.append(None)
            continue
        v, _ = _fit(others, names, start)
        held.append(_model_time(r, {**start, **v}))
    return Calibration(tuple(runs), names, start, values, flat, before, after, tuple(held))


# ----------------------------------------------------------------------------------- reading


def _setting(settings: Mapping[str, Any], name: str, default: Any = None) -> Any:
    v = settings.get(name, default)
    return default if v is None else v


#: Megatron-LM's model arguments (``megatron/training/arguments.py``) and the
#: :class:`~parmem.model.ModelSpec` value each must equal
_MEGATRON_MODEL: dict[str, Callable[[ModelSpec], int]] = {
    "num_layers": lambda s: s.layers,
    "hidden_size": lambda s: s.hidden,
    "num_attention_heads": lambda s: s.heads,
    "num_experts": lambda s: s.num_experts,
}


def _check_megatron_model(settings: Mapping[str, Any], spec: ModelSpec) -> None:
    """The model's dimensions in a Megatron-LM log's arguments must be ``spec``'s; FP8 and FP16
    runs are refused (BF16 rates only)."""
    for name, get in _MEGATRON_MODEL.items():
        if name in settings:
            have, want = _setting(settings, name, 0), get(spec)
            if int(have) != int(want):
                raise ValueError(
                    f"the log's {name} = {have} is not the model's ({spec.name}: {want}); "
                    "give the --model the run trained"
                )
    if settings.get("group_query_attention") and "num_query_groups" in settings:
        groups, kv = int(settings["num_query_groups"]), spec.kv_heads or spec.heads
        if groups != kv:
            raise ValueError(
                f"the log's num_query_groups = {groups} is not the model's key-value heads "
                f"({spec.name}: {kv})"
            )
    if spec.num_experts and settings.get("moe_router_topk") is not None:
        k = int(settings["moe_router_topk"])
        if k != spec.top_k:
            raise ValueError(
                f"the log's moe_router_topk = {k} is not the model's top_k ({spec.name}: "
                f"{spec.top_k})"
            )
    if settings.get("fp8") not in (None, False, "None"):
        raise ValueError(
            f"the log's fp8 = {settings['fp8']!r}: FP8 GEMMs are not modelled (the time model "
            "has BF16 rates only)"
        )
    if settings.get("fp16"):
        raise ValueError("the log's fp16 = True: the time model has BF16 rates only")
    if settings.get("bf16") is False and settings.get("fp16") is False:
        raise ValueError("the log's bf16 and fp16 are False (an fp32 run): the time model has "
                         "BF16 rates only")  # fmt: skip


def megatron_layout(settings: Mapping[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """The layout a Megatron-LM run used, from the arguments block of its log
    (``StepLog.settings``, :mod:`parmem.planner.logs`): ``t, p, cp, e, v, world, zero, sp, b, G,
    s, recompute, overlap_grad_reduce`` (the keys present). The model's dimensions printed
    there must equal ``spec``'s: a ``ValueError`` names the first that does not."""
    _check_megatron_model(settings, spec)
    out: dict[str, Any] = {}
    keys = {
        "tensor_model_parallel_size": "t",
        "pipeline_model_parallel_size": "p",
        "context_parallel_size": "cp",
        "expert_model_parallel_size": "e",
        "world_size": "world",
        "micro_batch_size": "b",
        "global_batch_size": "G",
        "seq_length": "s",
    }
    for name, key in keys.items():
        if settings.get(name) is not None:
            out[key] = int(settings[name])
    per_virtual = settings.get("num_layers_per_virtual_pipeline_stage")
    if per_virtual:
        out["v"] = spec.layers // (out.get("p", 1) * int(per_virtual))
    elif settings.get("virtual_pipeline_model_parallel_size"):
        out["v"] = int(settings["virtual_pipeline_model_parallel_size"])
    if "use_distributed_optimizer" in settings:
        out["zero"] = 1 if settings["use_distributed_optimizer"] else 0
    if "sequence_parallel" in settings:
        out["sp"] = bool(settings["sequence_parallel"])
    if "recompute_granularity" in settings:
        g = settings["recompute_granularity"]
        if g not in (None, "selective", "full"):
            raise ValueError(f"the log's recompute_granularity = {g!r} is not modelled")
        out["recompute"] = "none" if g is None else str(g)
    if "overlap_grad_reduce" in settings:
        out["overlap_grad_reduce"] = bool(settings["overlap_grad_reduce"])
    return out


#: the engine profile whose time models a log of each format
LOG_ENGINES = {"megatron": "megatron-core", "torchtitan": "fsdp2"}


def titan_layout(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The layout a torchtitan run used, from what its log prints (``StepLog.settings``,
    :mod:`parmem.planner.logs`): the device mesh of ``ParallelDims.build_mesh`` (``tp``, ``pp``,
    ``cp``, ``ep``, ``dp_shard``, ``dp_replicate``; the world is the product of all but ``ep``,
    which torchtitan carves out of ``dp_shard`` x ``cp``) and the trainer's "local batch size"
    (the micro-batch of one forward and backward), "global batch size" and "sequence length".
    A replicated data-parallel dimension (``dp_replicate`` > 1, HSDP) is refused: the profile
    shards over the whole data-parallel group."""
    out: dict[str, Any] = {}
    if settings.get("dp_replicate", 1) > 1:
        raise ValueError(
            f"the log's dp_replicate = {settings['dp_replicate']} (HSDP) is not modelled: the "
            "fsdp2 profile shards over the whole data-parallel group"
        )
    dims = ("dp_replicate", "dp_shard", "cp", "tp", "pp")
    if any(k in settings for k in dims):
        world = 1
        for k in dims:
            world *= max(int(settings.get(k, 1)), 1)
        out["world"] = world
    for name, key in (("tp", "t"), ("pp", "p"), ("cp", "cp"), ("ep", "e"),
                      ("local_batch_size", "b"), ("global_batch_size", "G"), ("seq_len", "s")):  # fmt: skip
        if settings.get(name) is not None and (key != "cp" or "dp_shard" in settings):
            out[key] = int(settings[name])
    return out


def _log_cluster(
    name: str, world: int | None, gpu: str, gpus_per_node: int, nodes: int | None
) -> Cluster:
    """The cluster of a run: its log's world size (checked against ``nodes``), else ``nodes``."""
    if world is not None:
        if world % gpus_per_node and world > gpus_per_node:
            raise ValueError(
                f"{name}: world_size {world} is not a multiple of --gpus-per-node {gpus_per_node}"
            )
        if nodes is not None and nodes * gpus_per_node != world:
            raise ValueError(
                f"{name}: the log's world_size is {world}, --nodes x --gpus-per-node "
                f"{nodes * gpus_per_node}"
            )
        per_node = min(gpus_per_node, world)
        return Cluster(gpu, per_node, world // per_node)
    elif nodes is None:
        raise ValueError(f"{name}: the log does not print its world size: give --nodes")
    return Cluster(gpu, gpus_per_node, nodes)


def _log_layout(log: StepLog, spec: ModelSpec) -> dict[str, Any]:
    """What a log says of its layout (Megatron's arguments, torchtitan's mesh and batch)."""
    read: dict[str, Any] = {}
    if log.format == "megatron":
        read = megatron_layout(log.settings, spec)
    elif log.format == "torchtitan":
        read = titan_layout(log.settings)
    if log.global_batch is not None:
        read.setdefault("G", log.global_batch)
    return read


def run_from_log(
    log: StepLog,
    spec: ModelSpec,
    gpu: str,
    *,
    gpus_per_node: int = 8,
    nodes: int | None = None,
    engine: str | None = None,
    **layout: Any,
) -> OwnRun:
    """One :class:`OwnRun` from a training log. ``layout``: any of ``t, p, cp, e, v, zero, sp,
    b, G, s, recompute`` (tensor, pipeline, context, expert parallel sizes, virtual stages,
    ZeRO stage, sequence parallelism, micro-batch, global batch in sequences, sequence length,
    recomputation) that the log does not print; a value the log prints and ``layout`` contradicts
    is an error naming both. ``nodes``: the log's ``world_size`` over ``gpus_per_node`` when
    it prints one. ``engine``: default by the log's format (:data:`LOG_ENGINES`)."""
    notes: list[str] = []
    given = {k: v for k, v in layout.items() if v is not None}
    read = _log_layout(log, spec)
    for k, v in given.items():
        if k in read and read[k] != v:
            raise ValueError(f"{log.name}: the log says {k} = {read[k]!r}, the flags {v!r}")
    lay = {**read, **given}
    engine = engine or LOG_ENGINES.get(log.format)
    if engine is None:
        raise ValueError(f"{log.name}: a {log.format} log does not say its engine: give --engine")
    cluster = _log_cluster(log.name, lay.pop("world", None), gpu, gpus_per_node, nodes)
    for need, flag in (("G", "--global-batch"), ("s", "--seq"), ("b", "--micro-batch")):
        if need not in lay:
            raise ValueError(f"{log.name}: the log does not say {flag[2:]}: give {flag}")
    t, p, cp, e = (int(lay.get(k, 1)) for k in ("t", "p", "cp", "e"))
    n = cluster.world_size
    if n % (t * p * cp):
        raise ValueError(f"{log.name}: {n} GPUs do not divide into t={t} x p={p} x cp={cp}")
    d = n // (t * p * cp)
    b, G, s = int(lay["b"]), int(lay["G"]), int(lay["s"])
    if G % (d * b):
        raise ValueError(f"{log.name}: global batch {G} is not a multiple of d={d} x b={b}")
    v = int(lay.get("v", 1))
    zero = int(lay.get("zero", 3 if engine == "fsdp2" else 0))
    par = ParallelConfig(dp=d, tp=t, pp=p, cp=cp, ep=e, sp=bool(lay.get("sp", t > 1)),
                         zero=zero, vpp=v)  # fmt: skip
    setup = TrainingSetup(
        seq_len=s,
        micro_batch=b,
        num_microbatches=G // (d * b),
        recompute=str(lay.get("recompute", "none")),
        schedule=vpp_schedule(v),
        flash_attention=True,
        dropout=False,
        engine=engine,
    )
    if log.tokens_per_s_per_gpu is not None:
        step = step_seconds(G, s, log.tokens_per_s_per_gpu, n)
        notes.append(
            f"step time from the log's tokens per second per GPU "
            f"({log.tokens_per_s_per_gpu:,.0f}): {G} x {s} tokens / ({n} GPUs x that)"
        )
    else:
        step = log.step_time
    if not (step > 0 and math.isfinite(step)):
        raise ValueError(f"{log.name}: no step time could be read")
    notes.append(
        f"{len(log.kept)} of {len(log.steps)} logged steps used (median); "
        f"warm-up left out: {len(log.steps) - len(log.kept)}"
    )
    fixed: dict[str, float | str] = {}
    said = lay.get("overlap_grad_reduce")
    # Megatron-LM overlaps the gradient reduction only with --overlap-grad-reduce (off by
    # default; versions before the flag never did): a log that does not say so did not
    if d > 1 and (said is False or (said is None and log.format == "megatron")):
        fixed["dp_overlap_on"] = "dp_overlap"
        why = (
            "overlap_grad_reduce = False"
            if said is False
            else ("the log does not print overlap_grad_reduce, off by default")
        )
        notes.append(
            f"the run did not overlap its gradient reduction ({why}): timed with dp_overlap "
            "(the non-overlapping engines' value), not dp_overlap_on"
        )  # fmt: skip
    run = MeasuredRun(log.name, "own", "own", spec, cluster, par, setup, step)
    return OwnRun(log.name, run, fixed, tuple(notes))


def runs_from_toml(path: str | os.PathLike[str]) -> list[OwnRun]:
    """The reader's runs written as ``data/measured_runs.toml`` writes them (groups of
    ``rows``, each row with ``gpus``, ``t``, ``p``, ``cp``, ``e``, ``zero``, ``seq_len``, a
    global batch and ``tokens_per_s_per_gpu`` or ``step_time_s``; the group's ``model``, ``gpu``,
    ``gpus_per_node`` and ``profile``, the engine)."""
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{os.fspath(path)}: not TOML ({e})") from None
    out = []
    for name, group in data.items():
        if not isinstance(group, dict) or not group.get("rows"):
            raise ValueError(f"{os.fspath(path)}: [{name}] has no rows")
        for i, row in enumerate(group["rows"]):
            m = run_from_row(f"{name}[{i}]", group, row, org=name)
            out.append(OwnRun(m.key, replace(m, group=name)))
    return out


def group_runs(group: str, gpu: str | None = None) -> list[OwnRun]:
    """The scorable rows of one group of ``data/measured_runs.toml`` (one source's table) on one
    GPU preset (``gpu``; needed when the group's rows name several) as :class:`OwnRun` s: one
    cluster's runs, what a reader with them would calibrate on."""
    from .heldout import measured_runs

    runs = [r for r in measured_runs() if r.group == group]
    gpus = sorted({r.cluster.hardware.name for r in runs})
    if gpu is None and len(gpus) > 1:
        raise ValueError(f"group={group!r} has runs on {', '.join(gpus)}: give gpu= one of them")
    runs = [r for r in runs if gpu is None or r.cluster.hardware.name == gpu]
    if not runs:
        raise ValueError(
            f"group={group!r}, gpu={gpu!r}: no scorable rows in data/measured_runs.toml"
        )
    return [OwnRun(r.key, r) for r in runs]


def cluster_tables() -> dict[tuple[str, str], list[OwnRun]]:
    """Every group of ``data/measured_runs.toml`` split by GPU preset, as :class:`OwnRun` s:
    each one cluster's runs (:func:`group_runs`), keyed by (group, GPU); only rows the planner
    times (a layout it cannot express is left out)."""
    from .heldout import Scored, measured_runs, score

    timed = {s.run.key for s in score() if isinstance(s, Scored)}
    out: dict[tuple[str, str], list[OwnRun]] = {}
    for r in measured_runs():
        if r.key in timed:
            out.setdefault((r.group, r.cluster.hardware.name), []).append(OwnRun(r.key, r))
    return out


@dataclass(frozen=True)
class CalibrationStudy:
    """One cluster's runs predicted three ways, as mean absolute step-time errors (fractions)
    and the worst: with the defaults (``defaults``); each from ``fit`` fitted to the cluster's
    other runs (``others``, :func:`calibrate`'s held-out); and each from ``fit`` fitted to one
    other run alone, over every pair (``one``: a reader who measured a single layout; None
    where ``fit`` names more than one run can determine)."""

    group: str
    gpu: str
    runs: int
    defaults: tuple[float, float]
    others: tuple[float, float]
    one: tuple[float, float] | None


def calibration_study(
    tables: Mapping[tuple[str, str], list[OwnRun]] | None = None, fit: Iterable[str] = ("mfu",)
) -> list[CalibrationStudy]:
    """What calibrating on a cluster's own runs buys (:func:`calibrate`, fitting ``fit``), per
    cluster of ``tables`` (default :func:`cluster_tables`; a cluster whose other runs cannot
    determine ``fit``, one run a fitted value, is left out): each run predicted with the
    defaults, from the cluster's other runs, and from a single other run. The source tables
    stand in for a reader's cluster; nothing is fitted to the run being predicted."""
    names = tuple(fit)
    out = []
    for (group, gpu), runs in sorted((cluster_tables() if tables is None else tables).items()):
        if len(runs) <= len(names):
            continue
        c = calibrate(runs, fit=names)
        defaults = [abs(e) for e in c.errors("before")]
        others = [abs(e) for e in c.errors("held_out")]
        one: list[float] = []
        for i, r in enumerate(runs if len(names) == 1 else ()):
            alone = calibrate([r], fit=names)
            kw = {**alone.start, **{n: v for n, v in alone.fitted.items()
                                    if n not in alone.undetermined}}  # fmt: skip
            one += [abs(_model_time(o, kw) / o.run.step_time - 1) for j, o in enumerate(runs)
                    if j != i]  # fmt: skip
        out.append(CalibrationStudy(group, gpu, len(runs), _mean_worst(defaults),
                                    _mean_worst(others),
                                    _mean_worst(one) if one else None))  # fmt: skip
    return out


def _mean_worst(errors: list[float]) -> tuple[float, float]:
    return sum(errors) / len(errors), max(errors)
