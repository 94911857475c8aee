"""The planner's step time on measured runs it was not fitted to (issue 29).

``data/measured_runs.toml`` holds published *measured* training throughputs from sources the
fit (:mod:`parmem.planner.calibration`, ``data/published_runs.toml``) never reads: MosaicML's
llm-foundry tables, torchtitan's and IBM's FSDP benchmarks, BigScience's BLOOM logs, BAAI's
FlagPerf, NVIDIA's Megatron-Bridge and NeMo AutoModel summaries, InternLM's 7B scaling tables. Each row gives a layout and
tokens per second per GPU (or seconds per step); the measured step time is the tokens of one
global batch over the tokens per second of all GPUs. :func:`score` models the same layout with
:func:`~parmem.planner.evaluate` (the planner's time model, with the given assumptions) and
returns the modelled step time beside the measured one. Each source names the engine profile
whose time models it (``profile``: FSDP as ``fsdp2``, Megatron-Core as ``megatron-core``), so the
time is engine-aware: those engines overlap their data-parallel collectives (``dp_overlap_on``),
the paper profile does not; where a source's code states the dtype in which it reduces
gradients (``grad_reduce``: Composer's ``PURE`` mixed precision, fms-fsdp's ``bfSixteen``, both
bf16), the run reduces in it; where its training loop runs one forward and backward per step
(``grad_accum = 1``: torchtitan's 2024 loop, fms-fsdp's), the per-rank batch is the micro-batch.
:func:`leave_one_out` fits one or several assumptions with one
organisation's rows left out at a time and scores them on them, trying every point of a grid
(:func:`grid_fit`): a search that starts from the defaults would start from values fitted with
the held-out rows themselves.

What is scored and what is not is decided row by row, and said: FP8 rows (the time model has no
FP8 GEMM rate), rows that give a utilisation only (their step time depends on the source's own
FLOP count), rows whose layout the planner's engines cannot express (CPU offload, a sharding
group smaller than the data-parallel group), documents packed into sequences, and rows whose
printed layout contradicts the recipe that ran (``left_out``) are left out with the reason
(:func:`skipped`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import product
from typing import Any, Unpack

from .._data import load_toml
from ..config import ParallelConfig, TrainingSetup, even_split, vpp_schedule
from ..hardware import Hardware, hardware_preset
from ..model import ModelSpec
from .accuracy import StepTimeAccuracy
from .inputs import AssumptionOptions, Assumptions, Cluster
from .search import evaluate, step_times

__all__ = [
    "MeasuredRun",
    "Scored",
    "Fold",
    "TableOffset",
    "by_table",
    "pooled_spread",
    "measured_runs",
    "run_from_row",
    "step_seconds",
    "skipped",
    "score",
    "summary",
    "leave_one_out",
    "pooled_folds",
    "GridFit",
    "grid_fit",
    "FIT_GRID",
    "ORGS",
    "ELEMENTWISE_RECOMPUTE",
    "MeasuredMemory",
    "measured_memory",
    "measure_accuracy",
    "accuracy_toml",
]

#: the organisation behind each group: the unit a held-out split or a leave-one-source-out
#: fold takes whole (two tables of one organisation share software and hardware)
ORGS = {
    "llmfoundry": "MosaicML",
    "torchtitan": "Meta (torchtitan)",
    "trainy": "Trainy",
    "ibm": "IBM",
    "fms": "IBM",
    "bloom": "BigScience",
    "flagperf": "BAAI",
    "megatron_bridge": "NVIDIA",
    "nemo": "NVIDIA",
    "internlm": "Shanghai AI Lab (InternLM)",
    "parmem": "this book (H200)",
}


#: Megatron-Core's ``recompute_modules`` that run no matmul again: the norms and the experts'
#: activation function (``transformer_config.py``). A measured run that recomputes only these
#: is timed exactly as ``recompute = "none"`` (the time model counts matmul and attention FLOPs),
#: and its memory is at most the estimate's for ``"none"`` (what they keep is freed)
ELEMENTWISE_RECOMPUTE = ("layernorm", "moe_act")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured row: its group and organisation, the model, the cluster, the layout, the
    global batch (sequences) and sequence length, and the measured step time (seconds).
    ``timed_as``: empty where ``parallel`` is the source's own layout; else what the source ran
    and why its time is that layout's (InternLM's ZeRO-1 sharded within a node, which all-reduces
    every gradient over the whole data-parallel group, is timed as DDP: ``zero_as_printed``).
    Only the time stands for the run then: the memory of ``parallel`` is not the run's."""

    key: str
    group: str
    org: str
    spec: ModelSpec
    cluster: Cluster
    parallel: ParallelConfig
    setup: TrainingSetup
    step_time: float
    timed_as: str = ""


@dataclass(frozen=True)
class Scored:
    """A measured run, the planner's step time for its layout, and the relative error."""

    run: MeasuredRun
    modelled: float

    @property
    def error(self) -> float:
        """Modelled over measured step time, minus 1 (positive: the model is too slow)."""
        return self.modelled / self.run.step_time - 1


def _org(group: str) -> str:
    return next(v for k, v in ORGS.items() if group.startswith(k))


def _spec(group: dict[str, Any], row: dict[str, Any]) -> ModelSpec:
    model = row.get("model", group.get("model"))
    models = group.get("models", {})
    if isinstance(model, str) and model in models:
        fields = {k: v for k, v in models[model].items() if k != "source"}
        return ModelSpec(**fields)
    if isinstance(model, dict):
        return ModelSpec(**{k: v for k, v in model.items() if k != "source"})
    return ModelSpec.preset(str(model))


def _why_not(group: dict[str, Any], row: dict[str, Any]) -> str | None:
    """Why a row cannot be scored, or None."""
    if row.get("precision", group.get("precision", "bf16")) != "bf16":
        return "FP8 GEMMs (the time model has BF16 rates only)"
    metric = group.get("metric")
    if metric not in ("tokens_per_s", "step_time") or (
        "tokens_per_s_per_gpu" not in row and "step_time_s" not in row
    ):
        return "a utilisation only (its FLOP count is the source's)"
    if row.get("cpu_offload"):
        return "CPU offload"
    if row.get("packed_documents"):
        return (
            "documents packed into each sequence with attention inside each document (the "
            "attention's cost depends on document lengths the source does not give)"
        )
    if row.get("left_out"):
        return str(row["left_out"])
    if _hsdp(row) or row.get("sharding") in ("HYBRID_SHARD", "HSDP"):
        return "a sharding group smaller than the data-parallel group (HSDP)"
    if "seq_len" not in row:
        return "no sequence length"
    other = set(row.get("recompute_modules", ())) - set(ELEMENTWISE_RECOMPUTE)
    if other:
        return (f"recompute_modules {sorted(other)} (Megatron-Core recomputes matmuls there: not "
                "a recompute mode parmem models)")  # fmt: skip
    if row.get("recompute") == "blocks":
        return ("every n-th block checkpointed in full (fms-fsdp's and torchtitan's block-wise "
                "selective checkpointing: not a recompute mode parmem models)")  # fmt: skip
    return None


def _hsdp(row: dict[str, Any]) -> bool:
    """Whether the row's FSDP sharding degree as printed (``fsdp``: NeMo AutoModel's dp_shard,
    which shards over dp_shard x cp; Megatron-Bridge's GPUs / (TP x PP)) is smaller than its
    data-parallel size d = GPUs / (t·p·cp), so that replicas of the shards exist: HSDP. An
    ``fsdp`` of 0 (DDP) or of at least d shards over the whole group, as ZeRO-3 does."""
    fsdp = int(row.get("fsdp", 0))
    if not fsdp or "gpus" not in row:
        return bool(fsdp)
    d = int(row["gpus"]) // (int(row.get("t", 1)) * int(row.get("p", 1)) * int(row.get("cp", 1)))
    return fsdp < d


def _grad_reduce(group: dict[str, Any], row: dict[str, Any]) -> str | None:
    """The dtype the source's code reduces gradients in (``grad_reduce``, a table keyed by the
    row's ``mp_mode`` where it depends on it), or None where the source does not say (the
    profile's own reduction is timed)."""
    g = row.get("grad_reduce", group.get("grad_reduce"))
    if isinstance(g, dict):
        g = g.get(row.get("mp_mode", ""))
    return None if g is None else str(g)


def _batch(row: dict[str, Any], d: int) -> int | None:
    if "batch" in row:
        return int(row["batch"])
    if "batch_per_dp" in row:
        return int(row["batch_per_dp"]) * d
    if "tokens_per_batch" in row:
        return int(row["tokens_per_batch"]) // int(row["seq_len"])
    return None


def run_from_row(
    name: str, group: dict[str, Any], row: dict[str, Any], org: str | None = None
) -> MeasuredRun:
    """One row in the schema of ``data/measured_runs.toml`` (``group``: its table) as a
    :class:`MeasuredRun`; ``org``: the organisation (default: :data:`ORGS`' for ``name``). A row
    that cannot be scored is a ``ValueError`` giving the reason (:func:`skipped`'s)."""
    if "metric" not in group:  # a reader's file: what the row gives, and nothing assumed
        # a reader's own run: nothing assumed, so the engine's own loss chunks (loss_chunks None)
        group = {"loss_chunks": None, **group,
                 "metric": "step_time" if "step_time_s" in row else "tokens_per_s"}  # fmt: skip
        for key, where in (("gpu", "the row or its group"), ("profile", "the group")):
            if key not in row and key not in group:
                raise ValueError(f"{name}: no {key} in {where} (an engine profile: fsdp2, "
                                 "megatron-core, ...)" if key == "profile" else
                                 f"{name}: no {key} in {where} (a hardware preset)")  # fmt: skip
        if "micro_batch" not in row and group.get("grad_accum") != 1:
            raise ValueError(f"{name}: no micro_batch (or grad_accum = 1 in the group)")
    why = _why_not(group, row)
    if why is None and "gpus" not in row:
        why = "no gpus"
    if why is not None:
        raise ValueError(f"{name}: {why}")
    return _run(name, group, row, org)


def _run(
    name: str, group: dict[str, Any], row: dict[str, Any], org: str | None = None
) -> MeasuredRun:
    spec = _spec(group, row)
    if spec.position == "learned" and name.startswith("llmfoundry"):
        # llm-foundry's benchmark sets the model's max_seq_len to the run's sequence length
        # (submit_benchmarks.py), so its learned position table has seq_len rows
        spec = replace(spec, max_positions=max(spec.max_positions, int(row["seq_len"])))
    gpus = int(row["gpus"])
    per_node = min(int(group.get("gpus_per_node", 8)), gpus)
    t, p, cp, e = (int(row.get(k, 1)) for k in ("t", "p", "cp", "e"))
    d = gpus // (t * p * cp)
    batch = _batch(row, d)
    if batch is None:
        raise ValueError(f"{name}: no global batch")
    seq = int(row["seq_len"])
    # a loop without gradient accumulation (grad_accum = 1) runs the rank's whole batch at once
    whole = group.get("grad_accum") == 1 and "batch_per_dp" in row
    b = int(row.get("micro_batch", row["batch_per_dp"] if whole else 1))
    if batch % (d * b):
        b = 1
    v = int(row.get("v", 1))
    zero = int(row.get("zero", 0))
    recompute = row.get("recompute", "none")
    if recompute not in ("none", "selective", "full"):  # never read as another mode
        raise ValueError(f"{name}: recompute = {recompute!r}: one of none, selective, full")
    par = ParallelConfig(dp=d, tp=t, pp=p, cp=cp, ep=e, sp=t > 1, zero=zero, vpp=v)
    setup = TrainingSetup(
        grad_dtype=_grad_reduce(group, row),
        seq_len=seq,
        micro_batch=b,
        num_microbatches=max(batch // (d * b), 1),
        recompute=recompute,
        schedule=vpp_schedule(v),
        flash_attention=True,
        dropout=False,
        engine=group.get("profile", "paper"),
        tp_comm_overlap=bool(row.get("async_tp", row.get("tp_comm_overlap", False))),
        # every run of the bundled tables computed its loss over the whole micro-batch
        # (torchtitan chunks it from 0.3.0 on, after them); a row or group may say otherwise
        loss_chunks=row.get("loss_chunks", group.get("loss_chunks", 0)),
    )
    if "step_time_s" in row:
        step = float(row["step_time_s"])
    else:
        step = step_seconds(batch, seq, float(row["tokens_per_s_per_gpu"]), gpus)
    key = f"{name} {spec.name} {gpus} GPUs t{t} p{p} cp{cp} e{e} d{d} z{zero} b{b} s{seq}"
    timed_as = (f"ZeRO as printed {row['zero_as_printed']!r}, timed as zero = {zero}"
                if "zero_as_printed" in row else "")  # fmt: skip
    return MeasuredRun(key, name, org or _org(name), spec,
                       Cluster(_gpu(group, row), per_node, max(gpus // per_node, 1)),
                       par, setup, step, timed_as)  # fmt: skip


def _gpu(group: dict[str, Any], row: dict[str, Any]) -> str | Hardware:
    """The row's GPU: a preset, or, where the source ran a variant of it, the preset with the
    variant's dense BF16 peak (``peak_flops_bf16`` of the row or its group: the H100 SXM with
    HBM2e and a lower power limit of Meta's Grand Teton hosts), NVLink bandwidth
    (``nvlink_bandwidth``, bytes/s a direction: the A800) or network bandwidth
    (``internode_bandwidth``, bytes/s a direction per GPU: a node's ports over its GPUs, where
    the cluster has fewer or slower ports than the preset's one 200 or 400 Gb/s port per GPU)."""
    where = row if "gpu" in row else group  # a row's own GPU takes its own variant only
    name = str(where.get("gpu", "h100-sxm"))
    peak, nvlink = where.get("peak_flops_bf16"), where.get("nvlink_bandwidth")
    net, hbm = where.get("internode_bandwidth"), where.get("memory_bandwidth")
    if peak is None and nvlink is None and net is None and hbm is None:
        return name
    hw = hardware_preset(name)
    if peak is not None:
        hw = replace(hw, peak_flops_bf16=float(peak))
    if hbm is not None:  # Meta's Grand Teton H100s: HBM2e at 2.4 TB/s, not the SXM's HBM3
        hw = replace(hw, memory_bandwidth=float(hbm))
    if nvlink is not None:  # NVIDIA's A800: the A100 with NVLink at 400 GB/s (200 a direction)
        hw = replace(hw, intra_node=replace(hw.intra_node, bandwidth=float(nvlink)))
    if net is not None:  # InternLM's A100 nodes: 4 x 100 Gb/s RoCE for 8 GPUs
        hw = replace(hw, inter_node=replace(hw.inter_node, bandwidth=float(net)))
    return hw


def step_seconds(batch: int, seq_len: int, tokens_per_s_per_gpu: float, gpus: int) -> float:
    """Seconds per step from a throughput per GPU: the tokens of one global batch (``batch``
    sequences of ``seq_len``) over the tokens per second of all ``gpus``."""
    return batch * seq_len / (tokens_per_s_per_gpu * gpus)


def _rows() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    data = load_toml("measured_runs.toml")
    return [(name, g, row) for name, g in data.items() for row in g.get("rows", [])]


def measured_runs() -> list[MeasuredRun]:
    """Every scorable row of ``data/measured_runs.toml`` (:func:`skipped` lists the rest)."""
    out = []
    for name, g, row in _rows():
        if _why_not(g, row) is None:
            try:
                out.append(_run(name, g, row))
            except ValueError:
                continue
    return out


def skipped() -> list[tuple[str, str]]:
    """(group, reason) of every row :func:`measured_runs` leaves out."""
    out = []
    for name, g, row in _rows():
        why = _why_not(g, row)
        if why is None:
            try:
                _run(name, g, row)
            except ValueError as e:
                why = str(e).split(": ", 1)[-1]
        if why is not None:
            out.append((name, why))
    return out


def score(
    runs: list[MeasuredRun] | None = None, **assumptions: Unpack[AssumptionOptions]
) -> list[Scored | tuple[MeasuredRun, str]]:
    """The planner's step time for each run's layout (:func:`~parmem.planner.evaluate`, which
    models a layout whether or not it fits parmem's memory estimate), or, for a layout the
    planner cannot express, the run and the reason."""
    out: list[Scored | tuple[MeasuredRun, str]] = []
    for r in measured_runs() if runs is None else runs:
        lps = even_split(r.spec.layers, r.parallel.pp)
        try:
            c = evaluate(r.spec, r.cluster, r.parallel, r.setup, layers_per_stage=lps,
                         **assumptions)  # fmt: skip
        except ValueError as e:
            out.append((r, str(e)))
            continue
        out.append(Scored(r, c.step_time))
    return out


def _step_times(
    runs: list[MeasuredRun],
) -> list[tuple[MeasuredRun, Callable[[Assumptions], float]]]:
    """Each run the planner times (a refused layout is left out, as :func:`score` reports it)
    with its step time as a function of the assumptions (:func:`~parmem.planner.search.step_times`:
    the same time as :func:`score`'s, its layout and communication built once)."""
    out = []
    for r in runs:
        try:
            at = step_times(r.spec, r.cluster, r.parallel, r.setup,
                            layers_per_stage=even_split(r.spec.layers, r.parallel.pp))  # fmt: skip
        except ValueError:
            continue
        out.append((r, at))
    return out


def summary(scored: list[Scored | tuple[MeasuredRun, str]]) -> dict[str, Any]:
    """Mean and worst absolute error over the scored runs, overall and per organisation, and how
    many the planner could not model."""
    ok = [s for s in scored if isinstance(s, Scored)]
    by_org: dict[str, list[float]] = {}
    for s in ok:
        by_org.setdefault(s.run.org, []).append(abs(s.error))
    errs = [abs(s.error) for s in ok]
    return {
        "scored": len(ok),
        "not modelled": len(scored) - len(ok),
        "mean |error|": sum(errs) / len(errs) if errs else math.nan,
        "worst |error|": max(errs, default=math.nan),
        "by organisation": {k: (len(v), sum(v) / len(v), max(v)) for k, v in by_org.items()},
    }


@dataclass(frozen=True)
class TableOffset:
    """One source table's scored rows (:func:`by_table`): its group and organisation, how many,
    the mean signed error (the table's offset: positive, the model is too slow on it), the mean
    absolute error, and the mean absolute error left once that offset is taken out."""

    group: str
    org: str
    rows: int
    offset: float
    mean: float
    mean_without_offset: float


def by_table(scored: list[Scored | tuple[MeasuredRun, str]]) -> list[TableOffset]:
    """The scored rows grouped by source table (a group of ``data/measured_runs.toml``: one
    cluster, one software version), each with its offset, in the order the tables come.

    What it separates: an error common to a whole table (a power-limited GPU, another container,
    a version's kernels: nothing the layout says) from the error that varies across its layouts
    (what the time model's shape gets wrong). A reader's own calibration (``parmem calibrate``)
    fits the first away on their cluster; a held-out organisation's offset is what no fit to the
    others can know."""
    groups: dict[str, list[Scored]] = {}
    for s in scored:
        if isinstance(s, Scored):
            groups.setdefault(s.run.group, []).append(s)
    out = []
    for group, rows in groups.items():
        errs = [s.error for s in rows]
        offset = sum(errs) / len(errs)
        out.append(TableOffset(
            group, rows[0].run.org, len(rows), offset, sum(map(abs, errs)) / len(errs),
            sum(abs(e - offset) for e in errs) / len(errs)))  # fmt: skip
    return out


def pooled_spread(tables: list[TableOffset]) -> float:
    """The mean absolute error over every row of ``tables`` (:func:`by_table`) with each table's
    own offset taken out: the error the time model's shape leaves across layouts."""
    rows = sum(t.rows for t in tables)
    return sum(t.mean_without_offset * t.rows for t in tables) / rows if rows else math.nan


@dataclass(frozen=True)
class Fold:
    """One fold of :func:`leave_one_out`: the organisation held out, the value fitted on the
    others (a dict of name to value when several are fitted), and the mean and worst absolute
    error on each side."""

    held_out: str
    value: Any
    train_mean: float
    held_out_mean: float
    held_out_worst: float
    held_out_rows: int


def pooled_folds(folds: list[Fold]) -> tuple[float, float, int]:
    """Every held-out row of ``folds`` together: the mean absolute error over them (each fold
    weighed by its rows), the worst, and how many rows."""
    rows = sum(f.held_out_rows for f in folds)
    mean = sum(f.held_out_mean * f.held_out_rows for f in folds) / rows if rows else math.nan
    return mean, max((f.held_out_worst for f in folds), default=math.nan), rows


def leave_one_out(
    name: str | tuple[str, ...],
    grid: tuple[Any, ...],
    runs: list[MeasuredRun] | None = None,
    **fixed: Any,
) -> list[Fold]:
    """Fit one assumption (``name``, e.g. ``"dp_overlap_on"``, over the values of ``grid``) or
    several (``name`` a tuple of names, ``grid`` a tuple of value tuples in the same order: every
    combination is tried) by the smallest mean absolute step-time error, once per organisation
    with that organisation's rows left out, and score it on them; ``fixed`` assumptions hold
    in every trial. The fit never sees the rows it is scored on: the split is by organisation
    (:data:`ORGS`), not by row; and it is the grid's best point for the rows it may see, found
    by trying every point (:func:`grid_fit`), so no start fitted to the held-out rows steers it."""
    return grid_fit(name, grid, runs, **fixed).folds


#: The grid the engine profiles' kernel scales and micro-batch cost are fitted on
#: (:func:`grid_fit`; ``benchmarks/heldout_runs.py --joint``, chapter 18): every combination is
#: tried. The defaults of :class:`~parmem.planner.Assumptions` are its best point on all the
#: measured runs.
FIT_GRID: dict[str, tuple[float, ...]] = {
    "mfu_ampere_scale": tuple(round(1.2 + 0.05 * i, 2) for i in range(11)),  # 1.2 .. 1.7
    "mfu_hopper_scale": tuple(round(0.8 + 0.05 * i, 2) for i in range(13)),  # 0.8 .. 1.4
    "mfu_half_tokens": (0, 512, 768, 1024, 1280, 1536, 2048),
}


@dataclass(frozen=True)
class GridFit:
    """:func:`grid_fit`'s answer: the grid's best value on every organisation's rows
    (``value``: one value, or a dict of them by name), its mean and worst absolute error there,
    the rows, and the :class:`Fold` of each organisation left out."""

    value: Any
    mean: float
    worst: float
    rows: int
    folds: list[Fold]

    @property
    def held_out(self) -> tuple[float, float, int]:
        """The folds' held-out rows together (:func:`pooled_folds`): mean, worst, rows."""
        return pooled_folds(self.folds)


def grid_fit(
    name: str | tuple[str, ...],
    grid: tuple[Any, ...],
    runs: list[MeasuredRun] | None = None,
    **fixed: Any,
) -> GridFit:
    """Every point of ``grid`` (as :func:`leave_one_out`) scored on every run, once: the best
    point on all organisations' rows (how a default is chosen) and on each organisation's
    complement (its fold). Each run's layout and communication are built once and only the
    rates and overlaps are retimed per point (:func:`~parmem.planner.search.step_times`)."""
    runs = measured_runs() if runs is None else runs
    names = (name,) if isinstance(name, str) else tuple(name)
    points: list[Any] = list(grid) if isinstance(name, str) else list(product(*grid))
    timed = _step_times(runs)
    errors = {}
    for v in points:
        kw: dict[str, Any] = dict(fixed, **dict(zip(names, (v,) if isinstance(name, str) else v,
                                                    strict=True)))  # fmt: skip
        a = Assumptions.from_kwargs(kw)  # type: ignore[arg-type]
        errors[v] = [(r.org, abs(at(a) / r.step_time - 1)) for r, at in timed]
    orgs = sorted({o for o, _ in errors[points[0]]})

    def named(v: Any) -> Any:
        return v if isinstance(name, str) else dict(zip(names, v, strict=True))

    def mean(v: Any, keep: Callable[[str], bool]) -> tuple[float, float, int]:
        e = [x for o, x in errors[v] if keep(o)]
        return sum(e) / len(e), max(e), len(e)

    def everyone(o: str) -> bool:
        return True

    folds = []
    for org in orgs:

        def others(o: str, org: str = org) -> bool:
            return o != org

        def own(o: str, org: str = org) -> bool:
            return o == org

        best = min(points, key=lambda v: mean(v, others)[0])  # noqa: B023 (used at once)
        folds.append(Fold(org, named(best), mean(best, others)[0], *mean(best, own)))
    every = min(points, key=lambda v: mean(v, everyone)[0])
    return GridFit(named(every), *mean(every, everyone), folds)


# ---------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class MeasuredMemory:
    """A measured run's printed peak memory on one GPU beside parmem's for the same layout and
    engine profile. ``measures`` is what the source printed (``memory_measures`` of its group):
    ``"reserved"``, PyTorch's ``max_memory_reserved`` (held against
    ``reserved`` of :class:`parmem.bounds.StageBounds`), or ``"nvidia-smi"``, the device's used memory
    (held against ``high``: reserved plus the CUDA context,
    NCCL's buffers and cuBLAS's workspace). ``allocated``: :func:`parmem.estimate`'s peak;
    ``modelled``: the bound held against the measurement, both of the stage with the largest
    high bound; ``loss``: the loss's transient the estimate counts on that stage
    (:attr:`parmem.estimate.MemoryBreakdown.loss`). ``compiled``: the run compiled its model
    (``torch.compile`` among its printed techniques), which the engine profiles (eager) do not
    describe."""

    run: MeasuredRun
    measured: int
    measures: str
    allocated: int
    modelled: int
    loss: int
    compiled: bool

    @property
    def error(self) -> float:
        """Modelled over measured bytes, minus 1 (negative: parmem counts less than ran)."""
        return self.modelled / self.measured - 1

    @property
    def without_loss(self) -> int:
        """The estimate's peak without the loss's transient: what parmem allocated for the run
        before the engine profiles counted it (the papers' accounting of the loss)."""
        return self.allocated - self.loss


def _printed_gib(row: dict[str, Any]) -> float | None:
    """The row's printed peak memory in GiB: ``memory_gib``, or the used part of
    ``memory_as_printed`` ("76/80": used / capacity)."""
    if "memory_gib" in row:
        return float(row["memory_gib"])
    if "memory_as_printed" in row:
        return float(str(row["memory_as_printed"]).split("/")[0])
    return None


def measured_memory() -> list[MeasuredMemory]:
    """Every scorable row of ``data/measured_runs.toml`` whose source printed its peak memory
    per GPU (the group's ``memory_measures`` says what was measured), with parmem's estimate
    (:func:`parmem.estimate`, the row's engine profile) and bounds (:func:`parmem.bounds.bounds`)
    for the same model, layout and setup. The memory model is fitted to none of them."""
    from ..bounds import bounds
    from ..estimate import estimate
    from ..units import GIB

    out = []
    for name, g, row in _rows():
        gib = _printed_gib(row)
        if gib is None or _why_not(g, row) is not None:
            continue
        measures = str(g["memory_measures"])
        if measures not in ("reserved", "nvidia-smi"):
            raise ValueError(f"{name}: memory_measures = {measures!r}: reserved or nvidia-smi")
        r = _run(name, g, row)
        if r.timed_as:  # the layout stands in for the run's time, not for its memory
            continue
        est = estimate(r.spec, r.parallel, r.setup,
                       layers_per_stage=even_split(r.spec.layers, r.parallel.pp),
                       gpus_per_node=r.cluster.gpus_per_node)  # fmt: skip
        peak = bounds(est, r.cluster.hardware).peak
        modelled = peak.reserved if measures == "reserved" else peak.high
        out.append(MeasuredMemory(r, round(gib * GIB), measures, peak.allocated, modelled,
                                  est.stages[peak.stage].loss,
                                  "torch.compile" in str(row.get("techniques", ""))))  # fmt: skip
    return out


# ---------------------------------------------------------------------------- accuracy
def measure_accuracy(date: str) -> StepTimeAccuracy:
    """What ``data/step_time_accuracy.toml`` keeps (:mod:`parmem.planner.accuracy`), computed:
    :func:`grid_fit` of the kernel scales and ``mfu_half_tokens`` on :data:`FIT_GRID`, every
    organisation's runs predicted by the grid's best point on the others (the pooled mean and the
    worst of the folds), and the best point on all runs (in sample); ``date``: the fit's."""
    fit = grid_fit(tuple(FIT_GRID), tuple(FIT_GRID.values()))
    mean, worst, rows = fit.held_out
    timed = _step_times(measured_runs())
    scored = [r for r, _ in timed]
    # each run's held-out error (its organisation's fold), gathered by engine profile
    fold = {f.held_out: Assumptions.from_kwargs(f.value) for f in fit.folds}
    errors: dict[str, list[float]] = {}
    for r, at in timed:
        errors.setdefault(r.setup.engine, []).append(abs(at(fold[r.org]) / r.step_time - 1))
    by_engine = {e: {"runs": len(v), "held_out_mean": round(sum(v) / len(v), 4),
                     "held_out_worst": round(max(v), 4)} for e, v in sorted(errors.items())}  # fmt: skip
    return StepTimeAccuracy(
        date=date,
        runs=rows,
        organisations=len(fit.folds),
        held_out_mean=round(mean, 4),
        held_out_worst=round(worst, 4),
        in_sample_mean=round(fit.mean, 4),
        in_sample_worst=round(fit.worst, 4),
        fitted=dict(fit.value),
        by_engine=by_engine,
        gpus=tuple(sorted({r.cluster.hardware.name for r in scored})),
        precisions=tuple(sorted({r.setup.precision for r in scored})),
    )


def accuracy_toml(acc: StepTimeAccuracy) -> str:
    """``acc`` as the text of ``data/step_time_accuracy.toml``."""
    return (
        "# The planner's step time on measured runs it was not fitted to, as a plan prints it\n"
        "# (parmem.planner.accuracy). Written by `benchmarks/heldout_runs.py --write` from\n"
        "# parmem.planner.heldout.measure_accuracy: the kernel scales and mfu_half_tokens fitted on\n"
        "# every point of FIT_GRID with each organisation of data/measured_runs.toml left out in\n"
        "# turn and scored on it (held_out_*: the pooled mean and the worst |error| of the step\n"
        "# time, fractions), and fitted on every run (in_sample_*). tests/test_heldout_runs.py\n"
        "# computes it again: change the runs or the model and write it again.\n"
        f'date = "{acc.date}"\n'
        f"runs = {acc.runs}\n"
        f"organisations = {acc.organisations}\n"
        f"held_out_mean = {acc.held_out_mean}\n"
        f"held_out_worst = {acc.held_out_worst}\n"
        f"in_sample_mean = {acc.in_sample_mean}\n"
        f"in_sample_worst = {acc.in_sample_worst}\n"
        "# the grid's best point on every run (the defaults of Assumptions), and what the runs\n"
        "# cover: their GPU presets and precisions\n"
        f"fitted = {{{', '.join(f'{k} = {v}' for k, v in acc.fitted.items())}}}\n"
        f"gpus = {json.dumps(list(acc.gpus))}\n"
        f"precisions = {json.dumps(list(acc.precisions))}\n"
        "# the held-out errors of each engine profile's runs (each run in its organisation's fold)\n"
        + "".join(
            f"by_engine.{e} = {{{', '.join(f'{k} = {v}' for k, v in d.items())}}}\n"
            for e, d in acc.by_engine.items()
        )  # fmt: skip
    )
