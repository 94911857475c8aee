"""The planner against published training runs: for each run of ``data/published_runs.toml``
(:func:`parmem.papers.published_runs`), the rank of its layout among the plans of its search and
its modelled against its published throughput.

A run's *search* is :func:`~parmem.planner.plan` on the run's cluster, global batch and sequence
length, offered what the software of the time could do (Megatron-LM of 2021: ZeRO-0, no
sequence parallelism, full recomputation). Its *layout* is matched among the candidates on
``t``, ``p``, ``cp``, ``e``, the ZeRO stage and, where published, the micro-batch size and the
number of virtual stages; the planner picks the rest (the best setting of that layout). The
published TFLOP/s per GPU is compared with the candidate's executed FLOP/s (``metric:
hardware``, Narayanan et al. 2021 eq. (3)) or useful FLOP/s (``metric: model``, MFU).

:func:`published_runs` builds the runs, :func:`compare` places one, :func:`comparison` all of
them, :func:`comparison_rows` gives the table the benchmark and chapter 18 print.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Unpack

from ..config import ParallelConfig, TrainingSetup, even_split, vpp_schedule
from ..model import ModelSpec
from ..papers import narayanan_gpt
from ..papers import published_runs as _groups
from .inputs import AssumptionOptions, Cluster
from .result import Candidate, Plan
from .search import evaluate, plan, rank_candidates

__all__ = ["PublishedRun", "RunComparison", "published_runs", "compare", "comparison",
           "comparison_rows", "run_plan", "loss", "GAP", "TOLERANCE", "TOP"]  # fmt: skip

#: A layout its authors chose should rank in the top ``TOP`` plans of its search (issue 15).
TOP = 3
#: ... and be within this fraction of the best modelled step time.
GAP = 0.05
#: Modelled TFLOP/s per GPU should be within this fraction of the published ones.
TOLERANCE = 0.10

_AXES = ("t", "p", "cp", "e", "zero", "v", "micro_batch")


@dataclass(frozen=True)
class PublishedRun:
    """One published run: the model, cluster, batch and sequence length, the published layout
    (``layout``: t, p, cp, e, zero and, when printed, v and micro_batch), the ``search`` options
    that describe its software, the published TFLOP/s per GPU and what they count (``metric``:
    ``"hardware"`` or ``"model"``), and its ``role`` (``"chosen"`` by its authors as their best,
    or a ``"baseline"``)."""

    key: str
    group: str
    source: str
    spec: ModelSpec
    cluster: Cluster
    global_batch: int
    seq_len: int
    layout: dict[str, int]
    search: dict[str, Any] = field(repr=False)
    metric: str
    tflops: float
    role: str

    def label(self) -> str:
        """The published layout in one line (``t=8, p=12, d=8, ZeRO-0, b=1``)."""
        lay = self.layout
        d = self.cluster.world_size // (lay["t"] * lay["p"] * lay.get("cp", 1))
        parts = [f"t={lay['t']}", f"p={lay['p']}", f"d={d}"]
        parts += [f"{k}={lay[k]}" for k in ("cp", "e", "v") if lay.get(k, 1) > 1]
        parts.append(f"ZeRO-{lay.get('zero', 0)}")
        if "micro_batch" in lay:
            parts.append(f"b={lay['micro_batch']}")
        return ", ".join(parts)


@dataclass(frozen=True)
class RunComparison:
    """Where one :class:`PublishedRun` lands: ``rank`` (1-based) of ``count`` plans, the
    published layout as modelled (``candidate``; ``fits``: whether it fits parmem's memory
    estimate), the ``best`` plan, and the modelled TFLOP/s per GPU in the run's metric."""

    run: PublishedRun
    rank: int
    count: int
    candidate: Candidate
    best: Candidate
    fits: bool = True

    @property
    def modelled_tflops(self) -> float:
        """Modelled TFLOP/s per GPU of the published layout, counted as the run counts them."""
        c = self.candidate
        flops = c.hardware_flops_per_gpu if self.run.metric == "hardware" else c.model_flops_per_gpu
        return flops / 1e12

    @property
    def error(self) -> float:
        """Modelled over published TFLOP/s, minus 1."""
        return self.modelled_tflops / self.run.tflops - 1

    @property
    def gap(self) -> float:
        """The layout's modelled step time over the best plan's, minus 1."""
        return self.candidate.step_time / self.best.step_time - 1


def _spec(group: dict[str, Any], row: dict[str, Any]) -> ModelSpec:
    if "model" in row and "models" in group:
        shape = group["models"][row["model"]]
        billions = float(row["model"].split("-")[-1].rstrip("b"))
        spec: ModelSpec = narayanan_gpt({"params_billion": billions, **shape})
        return spec
    if "params_billion" in row:
        spec = narayanan_gpt(row)
        return spec
    model = group["model"]
    if isinstance(model, str):
        return ModelSpec.preset(model)
    return ModelSpec(**model)


def _layout(row: dict[str, Any], search: dict[str, Any]) -> dict[str, int]:
    zero = row.get("zero", min(search.get("zero", (0,))))
    out = {"t": row["t"], "p": row["p"], "cp": row.get("cp", 1), "e": row.get("e", 1),
           "zero": zero}  # fmt: skip
    for k in ("v", "micro_batch"):
        if k in row:
            out[k] = row[k]
    return out


def _run(name: str, group: dict[str, Any], row: dict[str, Any]) -> PublishedRun:
    settings = group.get("settings", {})
    gpu = group.get("gpu", settings.get("hardware", "a100-80gb"))
    per_node = group.get("gpus_per_node", settings.get("gpus_per_node", 8))
    spec = _spec(group, row)
    seq = row.get("seq_len", settings.get("seq_len", 2048))
    batch = row.get("batch") or row["d"] * row["batch_per_dp"]
    search = dict(group.get("search", {}))
    layout = _layout(row, search)
    if layout["cp"] > 1:
        search["cp"] = (1, layout["cp"])
    tag = row.get("scheme", "")
    key = f"{name} {tag} {spec.name} on {row['gpus']}".replace("  ", " ")
    return PublishedRun(
        key=key,
        group=name,
        source=group["source"],
        spec=spec,
        cluster=Cluster(gpu, per_node, row["gpus"] // per_node),
        global_batch=batch,
        seq_len=seq,
        layout=layout,
        search=search,
        metric=group["metric"],
        tflops=float(row["tflops_per_gpu"]),
        role=row.get("role", group.get("role", "chosen")),
    )


def published_runs() -> list[PublishedRun]:
    """Every run of ``data/published_runs.toml``, in the file's order."""
    return [_run(name, g, row) for name, g in _groups().items() for row in g["rows"]]


def _matches(c: Candidate, layout: dict[str, int]) -> bool:
    par, st = c.parallel, c.setup
    have = {"t": par.tp, "p": par.pp, "cp": par.cp, "e": par.ep, "zero": par.zero,
            "v": par.vpp, "micro_batch": st.micro_batch}  # fmt: skip
    return all(have[k] == v for k, v in layout.items())


def run_plan(run: PublishedRun, **assumptions: Unpack[AssumptionOptions]) -> Plan:
    """The run's search: every plan of its cluster, batch and sequence length that its
    software could run."""
    kw = dict(run.search)
    return plan(run.spec, run.cluster, run.global_batch, run.seq_len, top=10**6, **kw,
                **assumptions)  # fmt: skip


def _restricted(run: PublishedRun) -> dict[str, Any]:
    """The run's search narrowed to its published layout."""
    lay = run.layout
    kw = dict(run.search, tp=lay["t"], pp=lay["p"], cp=lay["cp"], zero=lay["zero"])
    if run.spec.is_moe:
        kw["ep"] = lay["e"]
    if "v" in lay:
        kw["vpp"] = lay["v"]
    if "micro_batch" in lay:
        kw["micro_batch"] = lay["micro_batch"]
    return kw


def _unfitted(run: PublishedRun, **assumptions: Unpack[AssumptionOptions]) -> Candidate:
    """The published layout modelled by :func:`evaluate` although it does not fit parmem's
    memory estimate (micro-batch as published or 1, recomputation as its search allows)."""
    lay, kw = run.layout, run.search
    d = run.cluster.world_size // (lay["t"] * lay["p"] * lay["cp"])
    b, v = lay.get("micro_batch", 1), lay.get("v", 1)
    sps = kw.get("sp", (lay["t"] > 1,))
    par = ParallelConfig(dp=d, tp=lay["t"], pp=lay["p"], cp=lay["cp"], ep=lay["e"],
                         sp=bool(sps[-1]) and lay["t"] > 1, zero=lay["zero"], vpp=v)  # fmt: skip
    setup = TrainingSetup(
        seq_len=run.seq_len,
        micro_batch=b,
        num_microbatches=run.global_batch // (d * b),
        recompute=tuple(kw.get("recompute", ("full",)))[0],
        schedule=vpp_schedule(v),
        flash_attention=bool(kw.get("flash_attention", False)),
        dropout=bool(kw.get("dropout", True)),
    )
    lps = even_split(run.spec.layers, lay["p"])
    return evaluate(run.spec, run.cluster, par, setup, layers_per_stage=lps, **assumptions)


def compare(run: PublishedRun, **assumptions: Unpack[AssumptionOptions]) -> RunComparison:
    """Rank and model ``run``'s layout in its search (:func:`run_plan`). A layout the search
    does not list (a setting another dominates, or one that does not fit) is planned on its
    own and ranked among the search's plans by the same rule (:func:`rank_candidates`);
    ``fits`` says whether it fits parmem's memory estimate."""
    pl = run_plan(run, **assumptions)
    ranked = pl.candidates
    cand = next((c for c in ranked if _matches(c, run.layout)), None)
    fits = True
    if cand is None:
        own = plan(run.spec, run.cluster, run.global_batch, run.seq_len, top=1,
                   **_restricted(run), **assumptions)  # fmt: skip
        cand = own.best
        if cand is None:
            fits, cand = False, _unfitted(run, **assumptions)
        ranked = rank_candidates([*ranked, cand])
    rank = next(i for i, c in enumerate(ranked) if c is cand) + 1
    best = ranked[0]
    return RunComparison(run, rank, len(ranked), cand, best, fits)


def comparison(**assumptions: Unpack[AssumptionOptions]) -> list[RunComparison]:
    """:func:`compare` for every published run."""
    return [compare(r, **assumptions) for r in published_runs()]


def comparison_rows(results: list[RunComparison]) -> list[dict[str, Any]]:
    """The table of :func:`comparison`: run, published layout, rank of the plans, gap to the
    best plan, modelled and published TFLOP/s per GPU, their difference."""
    rows = []
    for r in results:
        m = r.modelled_tflops
        rows.append(
            {
                "run": r.run.key,
                "role": r.run.role,
                "published layout": r.run.label(),
                "rank": f"{r.rank} of {r.count}" + ("" if r.fits else " (does not fit)"),
                "vs best": f"{r.gap:+.1%}",
                "planner's best": r.best.label(),
                "TFLOP/s modelled": round(m),
                "TFLOP/s published": round(r.run.tflops),
                "error": f"{r.error:+.1%}",
            }
        )
    return rows


def loss(results: list[RunComparison], fitted: tuple[str, ...] = ("llama3_table4",)) -> float:
    """What the defaults of :class:`~parmem.planner.Assumptions` were fitted to minimise: the
    squared log error of the modelled TFLOP/s of every run, plus, for chosen layouts, 20 times
    the squared gap to the best plan and 0.01 for a rank below :data:`TOP`. The groups in
    ``fitted`` count for their ranking only (Llama 3's schedule and sharding are not the
    planner's: their throughput is compared, not fitted)."""
    total = 0.0
    for r in results:
        if r.run.group not in fitted:
            total += math.log(r.modelled_tflops / r.run.tflops) ** 2
        if r.run.role == "chosen":
            total += 20 * max(0.0, r.gap) ** 2 + (0.01 if r.rank > TOP else 0.0)
    return total
