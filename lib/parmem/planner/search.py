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

:func:`plan` runs it in steps: validate the request (``_check_inputs``, ``_check_setup``,
``_space``), enumerate the families (``_Families``), search each (``_search_family``), rank
(``_rank``), take the Pareto front (``_pareto``). :func:`evaluate` models one given layout the
same way.

Sources: Narayanan et al. 2021 §3 (the layouts), Rajbhandari et al. 2020 (ZeRO) §7; DeepSpeed's
rule that pipeline parallelism does not combine with ZeRO-2/3 (``deepspeed.runtime.pipe.engine``).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from itertools import product
from typing import NamedTuple, TypeVar, Unpack

from .._check import integer
from ..config import OPTIMIZERS, PRECISIONS, RECOMPUTE, ParallelConfig, TrainingSetup, even_split
from ..estimate import Estimate, estimate
from ..flops import step_flops
from ..hardware import hardware_preset, hardware_presets
from ..model import ModelSpec
from ..units import GIB
from .cost import AssumptionOptions, Assumptions, Cluster, CostModel, SetupOptions, StepTimer
from .result import Candidate, Plan, PlanStats

__all__ = ["evaluate", "plan"]

_RC_ORDER = ("full", "selective", "none")  # least memory first

_T = TypeVar("_T", int, bool, str)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


# ---------------------------------------------------------------------------- 1. the request
class _Space(NamedTuple):
    """The allowed values of each search axis (``None``: every valid one)."""

    tp: tuple[int, ...] | None
    pp: tuple[int, ...] | None
    cp: tuple[int, ...]
    ep: tuple[int, ...] | None
    zero: tuple[int, ...]
    sp: tuple[bool, ...]
    rc_order: tuple[str, ...]
    micro_batch: tuple[int, ...] | None
    vpp: tuple[int, ...] | None
    uneven_pp: bool


def _values(name: str, value: object, kind: type[_T],
            allowed: Collection[_T] | None = None) -> tuple[_T, ...]:
    """``value`` (one ``kind`` or an iterable of them) validated, sorted, without repeats."""
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        value = (value,)
    if not isinstance(value, Iterable):
        raise ValueError(f"{name}={value!r} must be a {kind.__name__} or a sequence of them")
    vals = tuple(value)
    if not vals:
        raise ValueError(f"{name}=() must list at least one value")
    out: list[_T] = []
    for x in vals:
        if kind is int:
            integer(name, x, 0 if name == "zero" else 1)
        if not isinstance(x, kind):
            raise ValueError(f"{name}: {x!r} must be a {kind.__name__}")
        if allowed is not None and x not in allowed:
            raise ValueError(f"{name}: {x!r} must be one of {allowed}")
        out.append(x)
    return tuple(sorted(set(out)))


def _options(name: str, value: object, kind: type[_T],
             allowed: Collection[_T] | None = None) -> tuple[_T, ...] | None:
    """:func:`_values`, or ``None`` (every valid value) when ``value`` is ``None``."""
    return None if value is None else _values(name, value, kind, allowed)


def _check_inputs(spec: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, top: int,
                  cuda_context: int) -> None:
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    integer("global_batch", global_batch)
    integer("seq_len", seq_len)
    integer("top", top)
    integer("cuda_context", cuda_context, 0)
    if spec.position == "learned" and seq_len > spec.max_positions:
        raise ValueError(f"seq_len={seq_len} > max_positions={spec.max_positions} "
                         f"(learned positions of {spec.name})")


def _check_setup(precision: str, optimizer: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {tuple(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} must be one of {tuple(OPTIMIZERS)}")


def _space(spec: ModelSpec, *, tp: object, pp: object, cp: object, ep: object, zero: object,
           sp: object, recompute: object, micro_batch: object, vpp: object,
           uneven_pp: bool) -> _Space:
    """The search space of the axes as given to :func:`plan` (validated)."""
    space = _Space(tp=_options("tp", tp, int), pp=_options("pp", pp, int),
                   cp=_values("cp", cp, int), ep=_options("ep", ep, int),
                   zero=_values("zero", zero, int, (0, 1, 2, 3)),
                   sp=_values("sp", sp, bool, (False, True)),
                   rc_order=_values("recompute", recompute, str, RECOMPUTE),
                   micro_batch=_options("micro_batch", micro_batch, int),
                   vpp=_options("vpp", vpp, int), uneven_pp=uneven_pp)
    if space.ep is not None and not spec.is_moe and space.ep != (1,):
        raise ValueError(f"ep={ep!r}: expert parallelism needs a mixture-of-experts "
                         f"model ({spec.name} is dense)")
    return space._replace(rc_order=tuple(r for r in _RC_ORDER if r in space.rc_order))


# ---------------------------------------------------------------------------- 2. the families
@dataclass(frozen=True)
class _Family:
    """One ``(t, cp, p, d, e)`` group and the settings allowed inside it."""

    t: int
    c: int
    p: int
    d: int
    e: int
    lps: tuple[int, ...]
    zeros: list[int]
    sps: list[bool]
    rcs: tuple[str, ...]
    bs: list[int]
    vs: list[int]
    per_replica: int

    @property
    def key(self) -> str:
        return _family_key(self.t, self.p, self.d, self.c, self.e)


def _family_key(t: int, p: int, d: int, cp: int, e: int) -> str:
    key = f"t={t}, p={p}, d={d}"
    if cp > 1:
        key += f", cp={cp}"
    if e > 1:
        key += f", e={e}"
    return key


def _tp_problem(spec: ModelSpec, t: int, world: int, gpn: int) -> str | None:
    if world % t:
        return f"tp={t} does not divide the {world} GPUs"
    if t > gpn or gpn % t:
        return f"tp={t} crosses nodes ({gpn} GPUs per node)"
    if spec.heads % t:
        return f"tp={t} must divide heads={spec.heads}"
    if spec.kv_heads % t and t % spec.kv_heads:
        return f"tp={t} and kv_heads={spec.kv_heads}: one must divide the other"
    if spec.ffn_hidden % t:
        return f"tp={t} must divide ffn_hidden={spec.ffn_hidden}"
    if spec.is_moe and spec.expert_ffn_hidden % t:
        return f"tp={t} must divide expert_ffn_hidden={spec.expert_ffn_hidden}"
    return None


class _Families:
    """Iterates over the valid families of a request; the ones it rejects go to ``rejected``
    (family -> reason, in the order met) with the reason."""

    def __init__(self, spec: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int,
                 space: _Space):
        self.spec, self.space, self.G, self.s = spec, space, global_batch, seq_len
        self.N, self.gpn = cluster.world_size, cluster.gpus_per_node
        self.rejected: dict[str, str] = {}
        self.reached_batch = self.batch_ok = False

    def __iter__(self) -> Iterator[_Family]:
        tps = self.space.tp
        for t in tps or _divisors(self.N):
            if t > self.spec.heads and tps is None:
                continue
            problem = _tp_problem(self.spec, t, self.N, self.gpn)
            if problem:
                self.rejected[f"t={t}"] = problem
                continue
            for c in self.space.cp:
                if (self.N // t) % c:
                    self.rejected[f"t={t}, cp={c}"] = (f"cp={c} does not divide the "
                                                       f"{self.N // t} GPUs left by tp")
                elif self.s % c:
                    self.rejected[f"t={t}, cp={c}"] = f"cp={c} must divide seq_len={self.s}"
                else:
                    yield from self._over_pp(t, c)

    def _over_pp(self, t: int, c: int) -> Iterator[_Family]:
        rest, L, zero = self.N // (t * c), self.spec.layers, self.space.zero
        for p in self.space.pp or _divisors(rest):
            fam_tp = f"t={t}, p={p}" + (f", cp={c}" if c > 1 else "")
            if rest % p:
                self.rejected[fam_tp] = f"pp={p} does not divide the {rest} GPUs left"
                continue
            if p > L:  # one entry for all of them
                self.rejected.setdefault(f"t={t}, p>{L}" + (f", cp={c}" if c > 1 else ""),
                                         f"pp={p} > layers={L}: every stage needs a layer")
                continue
            if L % p and not self.space.uneven_pp:
                self.rejected[fam_tp] = f"pp={p} must divide layers={L} (or pass uneven_pp=True)"
                continue
            zeros = [z for z in sorted(zero, reverse=True) if p == 1 or z <= 1]
            if not zeros:
                self.rejected[fam_tp] = (f"ZeRO-{'/'.join(map(str, zero))} cannot be combined "
                                         f"with pp={p} (DeepSpeed rule)")
                continue
            yield from self._settings(t, c, p, zeros, fam_tp)

    def _settings(self, t: int, c: int, p: int, zeros: list[int],
                  fam_tp: str) -> Iterator[_Family]:
        d = self.N // (t * c * p)
        if d * c == 1:  # no data-parallel group: every ZeRO stage is the same layout
            zeros = [zeros[-1]]
        self.reached_batch = True
        if self.G % d:
            self.rejected[_family_key(t, p, d, c, 1)] = (
                f"global_batch={self.G} is not divisible by d={d}")
            return
        self.batch_ok = True
        per_replica = self.G // d
        mb = self.space.micro_batch
        bs = [b for b in _divisors(per_replica) if mb is None or b in mb]
        if not bs:
            self.rejected[_family_key(t, p, d, c, 1)] = (
                f"no allowed micro-batch divides global_batch/d = {per_replica}")
            return
        sps = self._sps(t, c)
        if not sps:
            self.rejected[fam_tp] = (f"sp=True needs seq_len/cp={self.s // c} divisible by "
                                     f"tp={t}" if t > 1 else "sp=True needs tp >= 2")
            return
        lps = even_split(self.spec.layers, p)
        vs = self._vs(p, lps)
        if not vs:
            self.rejected[fam_tp] = f"no allowed vpp divides the {min(lps)} layers per stage"
            return
        es = self._eps(d)
        if not es:
            self.rejected[_family_key(t, p, d, c, 1)] = (
                f"no allowed ep divides both num_experts={self.spec.num_experts} and d={d}")
            return
        for e in es:
            yield _Family(t, c, p, d, e, lps, zeros, sps, self.space.rc_order, bs, vs,
                          per_replica)

    def _sps(self, t: int, c: int) -> list[bool]:
        sps = [True, False] if t > 1 else [False]
        sps = [x for x in sps if x in self.space.sp or t == 1]
        if (self.s // c) % t:
            sps = [x for x in sps if not x]
        return sps

    def _vs(self, p: int, lps: tuple[int, ...]) -> list[int]:
        vs = [1] + [v for v in range(2, min(lps) + 1)
                    if p > 1 and all(n % v == 0 for n in lps)]
        if self.space.vpp is not None:
            vs = [v for v in vs if v in self.space.vpp]
        return vs

    def _eps(self, d: int) -> list[int]:
        if not self.spec.is_moe:
            return [1]
        es = [e for e in _divisors(self.spec.num_experts) if d % e == 0]
        if self.space.ep is not None:
            es = [e for e in es if e in self.space.ep]
        return es


# ---------------------------------------------------------------------------- 3. one family
class _Point(NamedTuple):
    """A feasible, non-dominated setting found by the search."""

    time: float
    peak: int
    par: ParallelConfig
    setup: TrainingSetup
    est: Estimate
    lps: tuple[int, ...]


# a setting of one family: indices into its zeros, sps, rcs and the micro-batches searched
_Cell = tuple[int, ...]


def _fmt_setting(zero: int, sp: bool, rc: str, b: int, v: int = 1) -> str:
    parts = [f"ZeRO-{zero}"] + (["SP"] if sp else []) + [f"{rc} recompute", f"micro-batch {b}"]
    if v > 1:
        parts.append(f"v={v}")
    return ", ".join(parts)


def _lower_bound(model: CostModel, fam: _Family,
                 lower_bounds: list[tuple[int, str]]) -> str | None:
    """Estimate the family's most frugal setting (interleaving only adds in-flight memory);
    record it in ``lower_bounds``; the rejection reason if even that does not fit."""
    z0, sp0, rc0, b0 = fam.zeros[0], fam.sps[0], fam.rcs[0], fam.bs[0]
    est0 = model.estimate(ParallelConfig(dp=fam.d, tp=fam.t, pp=fam.p, ep=fam.e, cp=fam.c,
                                         sp=sp0, zero=z0),
                          model.setup(b0, fam.per_replica // b0, rc0, 1), fam.lps)
    desc = (f"t={fam.t}, p={fam.p}" + (f", cp={fam.c}" if fam.c > 1 else "")
            + (f", e={fam.e}" if fam.e > 1 else ""))
    lower_bounds.append((est0.peak_bytes, f"{desc}, {_fmt_setting(z0, sp0, rc0, b0)}"))
    if est0.peak_bytes <= model.usable:
        return None
    pk = est0.peak
    return (f"does not fit: {pk.total / GIB:.1f} GiB > {model.usable / GIB:.1f} GiB usable on "
            f"stage {pk.stage}, even with {_fmt_setting(z0, sp0, rc0, b0)}")


def _search_family(model: CostModel, fam: _Family, out: list[_Point],
                   lower_bounds: list[tuple[int, str]]) -> str | None:
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
    return None if found else "does not fit with any allowed setting"


def _search_interleave(model: CostModel, fam: _Family, v: int, out: list[_Point]) -> bool:
    """The settings of ``fam`` with ``v`` virtual stages, on the grid (ZeRO, SP, recompute,
    micro-batch) ordered from frugal to generous; whether any fits."""
    bv = [b for b in fam.bs if v == 1 or (fam.per_replica // b) % fam.p == 0]
    if not bv:
        return False
    pars: dict[tuple[int, int], ParallelConfig] = {}
    timers: dict[tuple[int, int, int], StepTimer] = {}
    for (zi, z), (si, s_) in product(enumerate(fam.zeros), enumerate(fam.sps)):
        par = ParallelConfig(dp=fam.d, tp=fam.t, pp=fam.p, ep=fam.e, cp=fam.c, sp=s_, zero=z,
                             vpp=v)
        pars[zi, si] = par
        for ri, rc in enumerate(fam.rcs):
            timers[zi, si, ri] = model.linear_timer(par, rc, fam.lps)
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
        lower = [cell[:k] + (cell[k] - 1,) + cell[k + 1:] for k in range(4) if cell[k] > 0]
        if any(status[n] == 0 for n in lower):
            status[cell] = 0
            continue
        if any(times[n] <= tt for n in lower):
            status[cell] = 1
            continue
        par = pars[zi, si]
        setup = model.setup(b, m, rcs[ri], v)
        est = model.estimate(par, setup, lps)
        if est.peak_bytes > usable:
            status[cell] = 0
            continue
        status[cell] = 2
        found = True
        out.append(_Point(tt, est.peak_bytes, par, setup, est, lps))
    return found


# ---------------------------------------------------------------------------- 4. rank, Pareto
def _candidate(model: CostModel, par: ParallelConfig, setup: TrainingSetup,
               lps: tuple[int, ...], est: Estimate) -> Candidate:
    """One layout, timed with its exact communication, as a :class:`Candidate`."""
    st, crit = model.exact_time(par, setup, lps)
    total = st.total
    n = par.world_size
    useful = step_flops(model.spec, model.G, model.s, "none")
    executed = step_flops(model.spec, model.G, model.s, setup.recompute)
    return Candidate(parallel=par, setup=setup, estimate=est, layers_per_stage=tuple(lps),
                     time=st, critical_stage=crit, tokens_per_s=model.G * model.s / total,
                     model_flops_per_gpu=useful / (n * total),
                     hardware_flops_per_gpu=executed / (n * total),
                     peak_flops=model.hw.peak_flops_bf16, global_batch=model.G, exact=True)


def _rank(model: CostModel, feasible: list[_Point], top: int) -> list[Candidate]:
    """Sort ``feasible`` by (linear time, peak); re-time the first ``top + 8`` with the exact
    communication of their own ``b`` and ``m`` and rank them again."""
    feasible.sort(key=lambda x: (x[0], x[1]))
    head = [_candidate(model, x.par, x.setup, x.lps, x.est) for x in feasible[:top + 8]]
    head.sort(key=lambda c: (c.step_time, c.peak_bytes))
    return head


def _pareto(model: CostModel, feasible: list[_Point], head: list[Candidate]) -> list[Candidate]:
    """The layouts of ``feasible`` (sorted by time) that no faster one beats on memory, exactly
    timed (reusing those of ``head``)."""
    front: list[_Point] = []
    best_mem: int | None = None
    for x in feasible:
        if best_mem is None or x.peak < best_mem:
            front.append(x)
            best_mem = x.peak
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
    return (f"no layout fits: smallest peak is {peak / GIB:.1f} GiB with {desc}; {hint} or "
            f"more nodes ({usable / GIB:.1f} GiB usable per {gpu} with {headroom:.0%} headroom)")


def _message(model: CostModel, lower_bounds: list[tuple[int, str]],
             rejected: dict[str, str]) -> str:
    """Why nothing fits: the layout that came closest, else the structural reasons."""
    if lower_bounds:
        return _no_fit(lower_bounds, model.usable, model.a.headroom, model.hw.name)
    return "no valid layout: " + "; ".join(sorted(set(rejected.values()))[:6])


def _check_batch(families: _Families) -> None:
    """A global batch that no reachable data-parallel size divides is an invalid argument."""
    if families.reached_batch and not families.batch_ok:
        rejected = families.rejected
        ds = sorted({int(k.split("d=")[1].split(",")[0]) for k in rejected if "d=" in k})
        raise ValueError(f"global_batch={families.G} is not divisible by any data-parallel "
                         f"size d that the layouts of {families.N} GPUs allow (d in {ds})")


# ---------------------------------------------------------------------------- entry points
def plan(spec: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, *, top: int = 10,
         tp: int | Iterable[int] | None = None, pp: int | Iterable[int] | None = None,
         cp: int | Iterable[int] = 1, ep: int | Iterable[int] | None = None,
         zero: int | Iterable[int] = (0, 1, 2, 3), sp: bool | Iterable[bool] = (False, True),
         recompute: str | Iterable[str] = RECOMPUTE, micro_batch: int | Iterable[int] | None = None,
         vpp: int | Iterable[int] | None = None, uneven_pp: bool = False,
         precision: str = "bf16-mixed", optimizer: str = "adamw", flash_attention: bool = False,
         dropout: bool = True, capacity_factor: float = 1.0, cuda_context: int = 0,
         **assumptions: Unpack[AssumptionOptions]) -> Plan:
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
    ``capacity_factor`` and ``cuda_context`` go to every :class:`~parmem.config.TrainingSetup`.

    ``**assumptions``: the cost model's parameters, see :class:`Assumptions` (``mfu``,
    ``headroom``, ``tp_overlap``, ``dp_overlap``, ``dp_bucket_params``, ``pp_overlap``,
    ``cp_overlap``, ``ep_overlap``).

    Returns a :class:`Plan`. When nothing fits, the plan has no candidates and ``message`` says
    which layout came closest and what it would need (an answer, not an error: the widget and
    the CLI show it). Invalid arguments raise ``ValueError`` naming the argument.
    """
    t0 = time.perf_counter()
    # 1. validate the request
    _check_inputs(spec, cluster, global_batch, seq_len, top, cuda_context)
    _check_setup(precision, optimizer)
    a = Assumptions.from_kwargs(assumptions)
    space = _space(spec, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, sp=sp, recompute=recompute,
                   micro_batch=micro_batch, vpp=vpp, uneven_pp=uneven_pp)
    setup_kw = SetupOptions(precision=precision, optimizer=optimizer,
                            flash_attention=bool(flash_attention), dropout=bool(dropout),
                            capacity_factor=capacity_factor, cuda_context=cuda_context)
    TrainingSetup(seq_len=seq_len, **setup_kw)  # validates capacity_factor and the rest
    model = CostModel(spec, cluster, global_batch, seq_len, a, setup_kw)
    # 2. enumerate the families, 3. search each
    families = _Families(spec, cluster, global_batch, seq_len, space)
    feasible: list[_Point] = []
    lower_bounds: list[tuple[int, str]] = []
    searched = 0
    for fam in families:
        searched += 1
        reason = _search_family(model, fam, feasible, lower_bounds)
        if reason:
            families.rejected[fam.key] = reason
    _check_batch(families)
    # 4. rank, 5. the Pareto front
    head = _rank(model, feasible, top)
    candidates = head[:top]
    pareto = _pareto(model, feasible, head)
    message = None if candidates else _message(model, lower_bounds, families.rejected)
    stats = PlanStats(families=searched, feasible=len(feasible), estimates=model.estimates,
                      seconds=time.perf_counter() - t0)
    return Plan(spec=spec, cluster=cluster, global_batch=global_batch, seq_len=seq_len,
                assumptions=a, candidates=candidates, rejected=families.rejected, pareto=pareto,
                points=[(x.peak, x.time) for x in feasible], message=message, stats=stats)


def evaluate(spec: ModelSpec, cluster: Cluster, parallel: ParallelConfig, setup: TrainingSetup,
             *, layers_per_stage: Iterable[int] | None = None,
             **assumptions: Unpack[AssumptionOptions]) -> Candidate:
    """Model one given layout the way :func:`plan` ranks layouts (exact communication, a real
    :func:`~parmem.estimate.estimate`); ``global_batch`` is ``d · b · m``. It need not fit:
    compare ``candidate.peak_bytes`` with ``(1 − headroom)`` of the GPU. ``**assumptions`` as
    for :func:`plan`."""
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    parallel.check_world_size(cluster.world_size)
    a = Assumptions.from_kwargs(assumptions)
    if parallel.tp > cluster.gpus_per_node:
        raise ValueError(f"tp={parallel.tp} crosses nodes ({cluster.gpus_per_node} GPUs per node)")
    G = parallel.dp * setup.micro_batch * setup.num_microbatches
    setup_kw = SetupOptions(precision=setup.precision, optimizer=setup.optimizer,
                            flash_attention=setup.flash_attention, dropout=setup.dropout,
                            capacity_factor=setup.capacity_factor,
                            cuda_context=setup.cuda_context)
    model = CostModel(spec, cluster, G, setup.seq_len, a, setup_kw)
    lps = tuple(layers_per_stage) if layers_per_stage is not None else even_split(spec.layers,
                                                                              parallel.pp)
    est = estimate(spec, parallel, setup, layers_per_stage=list(lps))
    return _candidate(model, parallel, setup, lps, est)
