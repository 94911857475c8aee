"""The search of :func:`plan`: every valid layout, the ones that fit, ranked by modelled time.

A *family* is ``(t, cp, p, d, e)``. Structural rules reject families up front (``t`` must divide
the heads, ``kv_heads`` and the FFN width and stay within a node; ``p`` must divide the layers
unless ``uneven_pp``; ``d`` must divide the global batch; ``e`` divides the experts and ``d``).
One :func:`~parmem.estimate.estimate` of the family's most frugal setting (highest ZeRO, SP, full
recompute, smallest micro-batch, no interleaving) bounds its memory from below: if that does not
fit, the family is rejected with the reason. Inside a family, memory only grows as ZeRO drops, SP
goes off, recomputation is relaxed or the micro-batch grows, so settings are visited from frugal
to generous: one that has a neighbour which did not fit cannot fit; one that has a neighbour with
no more memory that is at least as fast is *dominated* and skipped. Every other setting gets a
real :func:`~parmem.estimate.estimate`. Step times in the search use communication times linear
in ``b`` and ``m`` (two :func:`~parmem.comm.collectives` calls per distinct stage:
:meth:`~parmem.planner.cost.CostModel.linear_timer`); the listed candidates are re-timed with the
exact communication of their own ``b`` and ``m``
(:meth:`~parmem.planner.cost.CostModel.exact_time`).

:func:`plan` runs it in steps: validate the request (``check_inputs``, ``check_setup``,
``search_space``), enumerate the families (``Families``), search each (``_search_family``), rank
(``_rank``: fastest first, ties within 1% to the simpler layout), take the Pareto front (``_pareto``,
:func:`pareto_front`). :func:`evaluate` models one given layout the
same way.

Sources: Narayanan et al. 2021 §3 (the layouts), Rajbhandari et al. 2020 (ZeRO) §7; DeepSpeed's
rule that pipeline parallelism does not combine with ZeRO-2/3 (``deepspeed.runtime.pipe.engine``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import product
from typing import NamedTuple, Unpack

from .._check import MAX_BATCH, boolean, integer
from ..config import RECOMPUTE, ParallelConfig, TrainingSetup, vpp_schedule
from ..engines import engine as engine_profile
from ..estimate import Estimate, estimate
from ..flops import step_flops
from ..hardware import hardware_preset, hardware_presets
from ..layout import check_layout
from ..model import ModelSpec
from ..units import GIB
from .cost import CostModel, StepTimer
from .families import Families, Family, check_inputs, check_setup, search_space
from .inputs import AssumptionOptions, Assumptions, Cluster, SetupOptions
from .result import Candidate, Plan, PlanStats

__all__ = ["TIE", "evaluate", "pareto_front", "plan", "rank_candidates", "simplicity", "step_times"]


class _Point(NamedTuple):
    """A feasible, non-dominated setting found by the search."""

    time: float
    peak: int
    par: ParallelConfig
    setup: TrainingSetup
    est: Estimate
    lps: tuple[int, ...]


#: Layouts whose modelled step times differ by less than this fraction are a tie: the simpler
#: one ranks first (:func:`simplicity`). The cost model cannot resolve a 1% difference.
TIE = 0.01

# a setting of one family: indices into its zeros, sps, rcs and the micro-batches searched
_Cell = tuple[int, ...]

#: the most work one :func:`plan` does, in stage-estimates (an estimate of a p-stage layout
#: counts p; a plan of GPT-3 175B on 3,072 GPUs does about 6,000); beyond it the request is
#: refused with a message, so a huge search space answers in seconds instead of minutes
MAX_SEARCH_WORK = 1_000_000


def _fmt_setting(zero: int, sp: bool, rc: str, b: int, v: int = 1) -> str:
    parts = [f"ZeRO-{zero}"] + (["SP"] if sp else []) + [f"{rc} recompute", f"micro-batch {b}"]
    if v > 1:
        parts.append(f"v={v}")
    return ", ".join(parts)


def _lower_bound(model: CostModel, fam: Family, lower_bounds: list[tuple[int, str]]) -> str | None:
    """Estimate the family's most frugal setting (interleaving only adds in-flight memory);
    record it in ``lower_bounds``; the rejection reason if even that does not fit."""
    z0, sp0, rc0, b0 = fam.zeros[0], fam.sps[0], fam.rcs[0], fam.bs[0]
    est0 = model.estimate(
        ParallelConfig(dp=fam.d, tp=fam.t, pp=fam.p, ep=fam.e, cp=fam.c, sp=sp0, zero=z0),
        model.setup(b0, fam.per_replica // b0, rc0, 1),
        fam.lps,
    )
    desc = (
        f"t={fam.t}, p={fam.p}"
        + (f", cp={fam.c}" if fam.c > 1 else "")
        + (f", e={fam.e}" if fam.e > 1 else "")
    )
    lower_bounds.append((est0.peak_bytes, f"{desc}, {_fmt_setting(z0, sp0, rc0, b0)}"))
    if est0.peak_bytes <= model.usable:
        return None
    pk = est0.peak
    return (
        f"does not fit: {pk.total / GIB:.1f} GiB > {model.usable / GIB:.1f} GiB usable on "
        f"stage {pk.stage}, even with {_fmt_setting(z0, sp0, rc0, b0)}"
    )


def _search_family(
    model: CostModel, fam: Family, out: list[_Point], lower_bounds: list[tuple[int, str]]
) -> str | None:
    """Visit one family's settings from frugal to generous (see the module docstring); append a
    :class:`_Point` for every feasible non-dominated setting to ``out``. Returns the rejection
    reason when nothing in the family fits, else ``None``."""
    if 1 in fam.vs:
        reason = _lower_bound(model, fam, lower_bounds)
        if reason:
            return reason
    found = False
    for v in fam.vs:
        found = _search_interleave(model, fam, v, out) or found
    if fam.zbv and "none" in fam.rcs:  # ZB-V: two chunks per rank in a V, where the engine
        # runs it; without recomputation only (parmem.layout: what the split backward keeps of
        # what recomputation rebuilds is not counted)
        zbv = dataclasses.replace(fam, rcs=("none",))
        found = _search_interleave(model, zbv, 2, out, "zbv") or found
    return None if found else "does not fit with any allowed setting"


def _lower(cell: _Cell) -> list[tuple[int, _Cell]]:
    """The more frugal neighbours of ``cell`` (one step back on one axis), with the axis."""
    return [(k, cell[:k] + (cell[k] - 1,) + cell[k + 1 :]) for k in range(4) if cell[k] > 0]


def _search_interleave(
    model: CostModel, fam: Family, v: int, out: list[_Point], schedule: str | None = None
) -> bool:
    """The settings of ``fam`` with ``v`` virtual stages (under ``schedule``: by default 1F1B,
    or interleaved 1F1B for v > 1), on the grid (ZeRO, SP, recompute, micro-batch) ordered from
    frugal to generous; whether any fits."""
    sched = schedule or vpp_schedule(v)
    bv = [b for b in fam.bs if sched != "interleaved" or (fam.per_replica // b) % fam.p == 0]
    if not bv:
        return False
    pars: dict[tuple[int, int], ParallelConfig] = {}
    timers: dict[tuple[int, int, int], StepTimer] = {}
    for (zi, z), (si, s_) in product(enumerate(fam.zeros), enumerate(fam.sps)):
        par = ParallelConfig(dp=fam.d, tp=fam.t, pp=fam.p, ep=fam.e, cp=fam.c, sp=s_, zero=z, vpp=v)
        pars[zi, si] = par
        for ri, rc in enumerate(fam.rcs):
            timers[zi, si, ri] = model.linear_timer(par, rc, fam.lps, sched)
    times: dict[_Cell, float] = {}
    status: dict[_Cell, int] = {}  # 0 infeasible, 1 dominated, 2 feasible
    found = False
    rcs, lps, per_replica, usable = fam.rcs, fam.lps, fam.per_replica, model.usable
    grid = product(range(len(fam.zeros)), range(len(fam.sps)), range(len(rcs)), range(len(bv)))
    for cell in sorted(grid, key=sum):
        zi, si, ri, bi = cell
        b = bv[bi]
        m = per_replica // b
        tt = times[cell] = timers[zi, si, ri].total(b, m)
        lower = [n for _, n in _lower(cell)]
        if any(status[n] == 0 for n in lower):
            status[cell] = 0
            continue
        # a neighbour with less memory that is as fast dominates; along the ZeRO axis the
        # neighbour has the higher stage, so it must win by more than a tie (TIE: the simpler
        # layout takes ties)
        if any(times[n] * (1 + TIE * (k == 0)) <= tt for k, n in _lower(cell)):
            status[cell] = 1
            continue
        par = pars[zi, si]
        setup = model.setup(b, m, rcs[ri], v, sched)
        est = model.estimate(par, setup, lps)
        if est.peak_bytes > usable:
            status[cell] = 0
            continue
        status[cell] = 2
        found = True
        out.append(_Point(tt, est.peak_bytes, par, setup, est, lps))
    return found


# ---------------------------------------------------------------------------- 4. rank, Pareto
def _candidate(
    model: CostModel, par: ParallelConfig, setup: TrainingSetup, lps: tuple[int, ...], est: Estimate
) -> Candidate:
    """One layout, timed with its exact communication, as a :class:`Candidate`."""
    st, crit = model.exact_time(par, setup, lps)
    total = st.total
    n = par.world_size
    adapter = model.f_adapter if model.frozen else None
    useful = step_flops(model.spec, model.G, model.s, "none", adapter)
    # the engine's own selective set (torchtitan's SAC), as the step time counts it
    executed = step_flops(model.spec, model.G, model.s, setup.recompute, adapter,
                          model.selective_rule)  # fmt: skip
    return Candidate(
        parallel=par,
        setup=setup,
        estimate=est,
        layers_per_stage=tuple(lps),
        time=st,
        critical_stage=crit,
        tokens_per_s=model.G * model.s / total,
        model_flops_per_gpu=useful / (n * total),
        hardware_flops_per_gpu=executed / (n * total),
        peak_flops=model.hw.peak_flops_bf16,
        global_batch=model.G,
        exact=True,
    )


def simplicity(c: Candidate) -> tuple[int, int, int, int]:
    """How complex a layout is, for breaking ties: the parallel axes in use (d, t, p, cp, e
    above 1), interleaving, the number of virtual stages, the ZeRO stage; smaller is simpler."""
    par = c.parallel
    axes = sum(x > 1 for x in (par.dp, par.tp, par.pp, par.cp, par.ep))
    return (axes, int(par.vpp > 1), par.vpp, par.zero)


def rank_candidates(cands: list[Candidate]) -> list[Candidate]:
    """``cands`` fastest first, except that among layouts within :data:`TIE` of the fastest
    one left the simplest goes first (:func:`simplicity`, then time, then memory)."""
    rest = sorted(cands, key=lambda c: (c.step_time, c.peak_bytes))
    out: list[Candidate] = []
    while rest:
        limit = rest[0].step_time * (1 + TIE)
        k = 1
        while k < len(rest) and rest[k].step_time <= limit:
            k += 1
        i = min(range(k), key=lambda j: (simplicity(rest[j]), rest[j].step_time))
        out.append(rest.pop(i))
    return out


def _rank(model: CostModel, feasible: list[_Point], top: int) -> list[Candidate]:
    """Sort ``feasible`` by (linear time, peak); re-time the first ``top + 8`` (and any within
    :data:`TIE` of the last of them) with the exact communication of their own ``b`` and ``m``
    and rank them (:func:`rank_candidates`)."""
    feasible.sort(key=lambda x: (x[0], x[1]))
    n = min(len(feasible), top + 8)
    # within TIE of the last of the first top + 8 (not a chain of ties, each within TIE of the
    # one before it, which can reach far down a dense list)
    edge = feasible[n - 1].time * (1 + TIE) if n else 0.0
    while n < len(feasible) and feasible[n].time <= edge:
        n += 1
    head = [_candidate(model, x.par, x.setup, x.lps, x.est) for x in feasible[:n]]
    return rank_candidates(head)


def pareto_front(points: Sequence[tuple[float, int]]) -> list[int]:
    """The indices, in order, of the ``points`` (step time, peak bytes) on the Pareto front of
    time against memory: those that no other point dominates (another at most as slow and at
    most as heavy, and faster or lighter); of identical points only the first counts.

    Sorted by (time, memory), a point is on the front exactly when it is lighter than every
    point before it: the two-dimensional case of Kung, Luccio and Preparata 1975 ("On finding
    the maxima of a set of vectors", J. ACM 22(4)), with both objectives minimised."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front: list[int] = []
    lightest: int | None = None
    for i in order:
        if lightest is None or points[i][1] < lightest:
            front.append(i)
            lightest = points[i][1]
    return sorted(front)


def _pareto(model: CostModel, feasible: list[_Point], head: list[Candidate]) -> list[Candidate]:
    """The layouts of ``feasible`` (sorted by time) that no faster one beats on memory
    (:func:`pareto_front`), exactly timed (reusing those of ``head``)."""
    front = [feasible[i] for i in pareto_front([(x.time, x.peak) for x in feasible])]
    exact_by_key = {(c.parallel, c.setup): c for c in head}
    out = []
    for x in front:
        c = exact_by_key.get((x.par, x.setup))
        out.append(c if c is not None else _candidate(model, x.par, x.setup, x.lps, x.est))
    return out


def _no_fit(fits: list[tuple[int, str]], usable: int, headroom: float, gpu: str) -> str:
    peak, desc = min(fits, key=lambda x: x[0])
    need = peak / (1 - headroom)
    bigger = [(hardware_preset(n).memory_bytes, n) for n in hardware_presets()]
    bigger = sorted(x for x in bigger if x[0] >= need)
    hint = f"needs GPUs of ≥ {need / GIB:.1f} GiB"
    if bigger:
        hint += f" (e.g. {bigger[0][1]}, {bigger[0][0] / GIB:.1f} GiB)"
    return (
        f"no layout fits: smallest peak is {peak / GIB:.1f} GiB with {desc}; {hint} or "
        f"more nodes ({usable / GIB:.1f} GiB usable per {gpu} with {headroom:.0%} headroom)"
    )


def _message(
    model: CostModel, lower_bounds: list[tuple[int, str]], rejected: dict[str, str]
) -> str:
    """Why nothing fits: the layout that came closest, else the structural reasons."""
    if lower_bounds:
        return _no_fit(lower_bounds, model.usable, model.a.headroom, model.hw.name)
    return "no valid layout: " + "; ".join(sorted(set(rejected.values()))[:6])


def _check_batch(families: Families) -> None:
    """A global batch that no reachable data-parallel size divides is an invalid argument."""
    if families.reached_batch and not families.batch_ok:
        rejected = families.rejected
        ds = sorted({int(k.split("d=")[1].split(",")[0]) for k in rejected if "d=" in k})
        raise ValueError(
            f"global_batch={families.G} is not divisible by any data-parallel "
            f"size d that the layouts of {families.N} GPUs allow (d in {ds})"
        )


def _search(
    model: CostModel, families: Families
) -> tuple[list[_Point], list[tuple[int, str]], int]:
    """Search every family (recording the rejected ones in ``families.rejected``); the feasible
    points, the lower bounds of the families and the number searched. Refuses (``ValueError``)
    a search that grows past :data:`MAX_SEARCH_WORK`."""
    feasible: list[_Point] = []
    lower_bounds: list[tuple[int, str]] = []
    searched = work = 0
    for fam in families:
        searched += 1
        before = model.estimates
        reason = _search_family(model, fam, feasible, lower_bounds)
        if reason:
            families.rejected[fam.key] = reason
        work += (model.estimates - before) * fam.p
        if work > MAX_SEARCH_WORK:
            raise ValueError(
                f"the search is too large: {model.estimates} estimates of up to {fam.p} stages "
                f"after {searched} families of the {families.N} GPUs; narrow it (tp=, pp=, "
                "micro_batch=, uneven_pp=False) or plan for fewer GPUs"
            )
    return feasible, lower_bounds, searched


# ---------------------------------------------------------------------------- entry points
def plan(
    spec: ModelSpec,
    cluster: Cluster,
    global_batch: int,
    seq_len: int,
    *,
    top: int = 10,
    tp: int | Iterable[int] | None = None,
    pp: int | Iterable[int] | None = None,
    cp: int | Iterable[int] = 1,
    ep: int | Iterable[int] | None = None,
    zero: int | Iterable[int] = (0, 1, 2, 3),
    sp: bool | Iterable[bool] = (False, True),
    recompute: str | Iterable[str] = RECOMPUTE,
    micro_batch: int | Iterable[int] | None = None,
    vpp: int | Iterable[int] | None = None,
    uneven_pp: bool = False,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    flash_attention: bool | None = None,
    dropout: bool | None = None,
    capacity_factor: float = 1.0,
    cuda_context: int = 0,
    engine: str = "paper",
    adapter: str = "none",
    lora_rank: int = 16,
    lora_targets: str = "all-linear",
    base_quant: str = "nf4",
    tp_comm_overlap: bool = False,
    loss_chunks: int | None = None,
    **assumptions: Unpack[AssumptionOptions],
) -> Plan:
    """Search the layouts of ``cluster`` for ``spec`` at ``global_batch`` sequences of
    ``seq_len`` tokens per step; rank the feasible ones by modelled step time.

    Search space (each may be narrowed to a value or a sequence of values; ``None``, the default of
    ``tp``, ``pp``, ``ep``, ``micro_batch`` and ``vpp``, = every valid one): ``tp`` (within a node,
    dividing heads, kv_heads and the FFN width), ``pp`` (dividing the layers, or any with
    ``uneven_pp=True``: then extra layers go to the first stages, as
    :func:`~parmem.estimate.estimate` splits), ``cp`` (context parallel; 1 unless listed: it pays
    only at long sequences), ``ep`` (MoE: dividing the experts and d), ``zero`` (0–3; 2 and 3 only
    with ``pp=1``, DeepSpeed's rule), ``sp`` (with ``tp > 1``), ``recompute``, ``micro_batch``
    (dividing ``global_batch / d``), ``vpp`` (virtual stages; v ≥ 2 needs ``m % p == 0`` and v
    dividing each stage's layers). ``precision``, ``optimizer``, ``flash_attention``, ``dropout``,
    ``capacity_factor`` and ``cuda_context`` go to every :class:`~parmem.config.TrainingSetup`
    (``dropout=None``: the model's own), and so do the fine-tuning fields ``adapter``,
    ``lora_rank``, ``lora_targets`` and ``base_quant`` (``engine="hf"``): the memory is then the
    frozen weights' and the adapters', and the step's FLOPs those of frozen matmuls
    (:func:`parmem.flops.step_flops` with ``adapter``). ``tp_comm_overlap=True`` times every
    tensor-parallel collective as hidden by ``tp_overlap`` (the engine's opt-in overlap, which
    its recipe then turns on); by default only those the engine's code runs beside a GEMM
    (``[engines.*.defaults] tp_overlap``). ``loss_chunks``: the sequence chunks of the loss
    (:class:`~parmem.config.TrainingSetup`; ``None``, the engine's own for the model).

    ``**assumptions``: the cost model's parameters, see :class:`Assumptions` (``mfu``,
    ``headroom``, ``tp_overlap``, ``dp_overlap``, ``dp_bucket_params``, ``pp_overlap``,
    ``cp_overlap``, ``ep_overlap``).

    Returns a :class:`Plan`. When nothing fits, the plan has no candidates and ``message`` says
    which layout came closest and what it would need (an answer, not an error: the widget and
    the CLI show it). Invalid arguments raise ``ValueError`` naming the argument.
    """
    t0 = time.perf_counter()
    # 1. validate the request
    check_inputs(spec, cluster, global_batch, seq_len, top, cuda_context)
    global_batch = integer("global_batch", global_batch, 1, MAX_BATCH)
    seq_len, top = integer("seq_len", seq_len), integer("top", top)
    boolean("uneven_pp", uneven_pp)
    setup_kw = SetupOptions(
        precision=precision,
        optimizer=optimizer,
        flash_attention=flash_attention,
        dropout=dropout,
        capacity_factor=capacity_factor,
        cuda_context=cuda_context,
        engine=engine,
        adapter=adapter,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        base_quant=base_quant,
        grad_dtype=None,
        tp_comm_overlap=tp_comm_overlap,
        loss_chunks=loss_chunks,
    )
    TrainingSetup(seq_len=seq_len, **setup_kw)  # validates every setup field, each by name
    check_setup(precision, optimizer)
    prof = engine_profile(engine)
    if tp_comm_overlap and prof.defaults.timing != "papers" and not prof.defaults.tp_comm_overlap:
        raise ValueError(f"tp_comm_overlap=True: {prof.who} has no switch that overlaps its "
                         "tensor-parallel collectives with GEMMs")  # fmt: skip
    if tp_comm_overlap and prof.defaults.tp_comm_overlap_needs_sp:
        # the switch needs SP: search the TP layouts with it only
        if True not in ((sp,) if isinstance(sp, bool) else tuple(sp)):
            raise ValueError(f"tp_comm_overlap=True needs sp=True under {prof.who}: "
                             f"{prof.defaults.tp_comm_overlap} needs sequence parallelism")  # fmt: skip
        sp = (True,)
    a = Assumptions.from_kwargs(assumptions)
    space = search_space(
        spec,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        zero=zero,
        sp=sp,
        recompute=recompute,
        micro_batch=micro_batch,
        vpp=vpp,
        uneven_pp=uneven_pp,
    )
    rcs = tuple(r for r in space.rc_order if r in prof.recompute)
    if not rcs:
        raise ValueError(
            f"recompute={recompute!r}: {prof.who} offers recompute {', '.join(prof.recompute)}"
        )
    space = space._replace(rc_order=rcs)
    model = CostModel(spec, cluster, global_batch, seq_len, a, setup_kw)
    # 2. enumerate the families, 3. search each
    compiled = tp_comm_overlap and prof.defaults.tp_comm_overlap_compiles
    families = Families(spec, cluster, global_batch, seq_len, space, prof, compiled)
    feasible, lower_bounds, searched = _search(model, families)
    _check_batch(families)
    # 4. rank, 5. the Pareto front
    head = _rank(model, feasible, top)
    candidates = head[:top]
    pareto = _pareto(model, feasible, head)
    message = None if candidates else _message(model, lower_bounds, families.rejected)
    stats = PlanStats(
        families=searched,
        feasible=len(feasible),
        estimates=model.estimates,
        seconds=time.perf_counter() - t0,
    )
    return Plan(
        spec=spec,
        cluster=cluster,
        global_batch=global_batch,
        seq_len=seq_len,
        assumptions=a,
        candidates=candidates,
        rejected=families.rejected,
        pareto=pareto,
        points=[(x.peak, x.time) for x in feasible],
        message=message,
        stats=stats,
        engine=engine,
    )


def _refuse_untimed(setup: TrainingSetup) -> None:
    """A setting whose time the step-time model does not have is refused by name, not timed as
    the setting without it (:func:`parmem.estimate` models the memory of each): FP8 GEMMs (the
    model has BF16 kernel rates only), and host offload of the optimizer or of the activations
    (no PCIe transfer or CPU optimizer step is timed)."""
    if setup.fp8 != "none":
        raise ValueError(f"fp8={setup.fp8!r}: the step-time model has BF16 kernel rates only "
                         "(FP8 GEMMs are not timed); parmem.estimate models its memory")  # fmt: skip
    if setup.offload != "none":
        raise ValueError(f"offload={setup.offload!r}: the step-time model times no host "
                         "offload (PCIe transfers, a CPU optimizer step)")  # fmt: skip
    if setup.offload_activations:
        raise ValueError("offload_activations=True: the step-time model times no host offload "
                         "(the activations' PCIe transfers)")  # fmt: skip


def evaluate(
    spec: ModelSpec,
    cluster: Cluster,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    *,
    layers_per_stage: Iterable[int] | None = None,
    **assumptions: Unpack[AssumptionOptions],
) -> Candidate:
    """Model one given layout the way :func:`plan` ranks layouts (exact communication, a real
    :func:`~parmem.estimate.estimate`); ``global_batch`` is ``d · b · m``. It need not fit:
    compare ``candidate.peak_bytes`` with ``(1 − headroom)`` of the GPU. ``**assumptions`` as
    for :func:`plan`. A setting the step-time model has no time for (``fp8``, ``offload``,
    ``offload_activations``) is a ``ValueError`` naming it."""
    a = Assumptions.from_kwargs(assumptions)
    model, lps = _layout_model(spec, cluster, parallel, setup, layers_per_stage, a)
    est = estimate(spec, parallel, setup, layers_per_stage=list(lps))
    return _candidate(model, parallel, setup, lps, est)


def step_times(
    spec: ModelSpec,
    cluster: Cluster,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    *,
    layers_per_stage: Iterable[int] | None = None,
) -> Callable[[Assumptions], float]:
    """:func:`evaluate`'s step time of one given layout (the same checks, the same refusals) as
    a function of the :class:`Assumptions`: the layout and its communication are built once,
    so scoring a grid of assumptions on a run costs the rates and overlaps alone
    (:meth:`~parmem.planner.cost.CostModel.exact_times`)."""
    model, lps = _layout_model(spec, cluster, parallel, setup, layers_per_stage, Assumptions())
    return model.exact_times(parallel, setup, lps)


def _layout_model(
    spec: ModelSpec,
    cluster: Cluster,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    layers_per_stage: Iterable[int] | None,
    a: Assumptions,
) -> tuple[CostModel, tuple[int, ...]]:
    """The checks :func:`evaluate` makes of one given layout, and its :class:`CostModel`."""
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    lps = tuple(check_layout(spec, parallel, setup, layers_per_stage))  # the engine's rules too
    parallel.check_world_size(cluster.world_size)
    _refuse_untimed(setup)
    if parallel.tp > cluster.gpus_per_node:
        raise ValueError(f"tp={parallel.tp} crosses nodes ({cluster.gpus_per_node} GPUs per node)")
    G = parallel.dp * setup.micro_batch * setup.num_microbatches
    setup_kw = SetupOptions(
        precision=setup.precision,
        optimizer=setup.optimizer,
        flash_attention=setup.flash_attention,
        dropout=setup.dropout,
        capacity_factor=setup.capacity_factor,
        cuda_context=setup.cuda_context,
        engine=setup.engine,
        adapter=setup.adapter,
        lora_rank=setup.lora_rank,
        lora_targets=setup.lora_targets,
        base_quant=setup.base_quant,
        grad_dtype=setup.grad_dtype,
        tp_comm_overlap=setup.tp_comm_overlap,
        loss_chunks=setup.loss_chunks,
    )
    return CostModel(spec, cluster, G, setup.seq_len, a, setup_kw), lps
