"""The planner's search space: the request checked, then every family of layouts (t, cp, p, d, e)
a cluster allows, each valid one or rejected with its reason.

A *family* is ``(t, cp, p, d, e)``. Structural rules reject families up front: ``t`` must divide
the heads, ``kv_heads`` and the FFN width and stay within a node; ``p`` must divide the layers
unless ``uneven_pp``; ``d`` must divide the global batch; ``e`` divides the experts and ``d``.
:mod:`parmem.planner.search` then searches the settings inside each family.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, TypeVar

from .._check import integer, plain
from ..config import OPTIMIZERS, PRECISIONS, RECOMPUTE, even_split
from ..engines import EngineProfile
from ..model import ModelSpec
from .inputs import Cluster

__all__ = ["SearchSpace", "Family", "Families", "check_inputs", "check_setup", "search_space"]

_RC_ORDER = ("full", "selective", "none")  # least memory first

_T = TypeVar("_T", int, bool, str)


@lru_cache(maxsize=256)
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in increasing order, in O(√n)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return (*small, *(n // k for k in reversed(small) if k * k != n))


# ---------------------------------------------------------------------------- 1. the request
class SearchSpace(NamedTuple):
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


def _values(
    name: str, value: object, kind: type[_T], allowed: Collection[_T] | None = None
) -> tuple[_T, ...]:
    """``value`` (one ``kind`` or an iterable of them) validated, sorted, without repeats; NumPy
    numbers become Python ones (:func:`parmem._check.plain`)."""
    value = plain(value)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        value = (value,)
    if not isinstance(value, Iterable):
        raise ValueError(f"{name}={value!r} must be a {kind.__name__} or a sequence of them")
    vals = tuple(value)
    if not vals:
        raise ValueError(f"{name}=() must list at least one value")
    out: list[_T] = []
    for x in map(plain, vals):
        if kind is int:
            integer(name, x, 0 if name == "zero" else 1)
        if not isinstance(x, kind):
            raise ValueError(f"{name}: {x!r} must be a {kind.__name__}")
        if allowed is not None and x not in allowed:
            raise ValueError(f"{name}: {x!r} must be one of {allowed}")
        out.append(x)
    return tuple(sorted(set(out)))


def _options(
    name: str, value: object, kind: type[_T], allowed: Collection[_T] | None = None
) -> tuple[_T, ...] | None:
    """:func:`_values`, or ``None`` (every valid value) when ``value`` is ``None``."""
    return None if value is None else _values(name, value, kind, allowed)


def check_inputs(
    spec: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, top: int, cuda_context: int
) -> None:
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    global_batch = integer("global_batch", global_batch)
    seq_len = integer("seq_len", seq_len)
    top = integer("top", top)
    cuda_context = integer("cuda_context", cuda_context, 0)
    if spec.position == "learned" and seq_len > spec.max_positions:
        raise ValueError(
            f"seq_len={seq_len} > max_positions={spec.max_positions} "
            f"(learned positions of {spec.name})"
        )


def check_setup(precision: str, optimizer: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {tuple(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} must be one of {tuple(OPTIMIZERS)}")


def search_space(
    spec: ModelSpec,
    *,
    tp: object,
    pp: object,
    cp: object,
    ep: object,
    zero: object,
    sp: object,
    recompute: object,
    micro_batch: object,
    vpp: object,
    uneven_pp: bool,
) -> SearchSpace:
    """The search space of the axes as given to :func:`parmem.planner.search.plan` (validated)."""
    space = SearchSpace(
        tp=_options("tp", tp, int),
        pp=_options("pp", pp, int),
        cp=_values("cp", cp, int),
        ep=_options("ep", ep, int),
        zero=_values("zero", zero, int, (0, 1, 2, 3)),
        sp=_values("sp", sp, bool, (False, True)),
        rc_order=_values("recompute", recompute, str, RECOMPUTE),
        micro_batch=_options("micro_batch", micro_batch, int),
        vpp=_options("vpp", vpp, int),
        uneven_pp=uneven_pp,
    )
    if space.ep is not None and not spec.is_moe and space.ep != (1,):
        raise ValueError(
            f"ep={ep!r}: expert parallelism needs a mixture-of-experts model ({spec.name} is dense)"
        )
    return space._replace(rc_order=tuple(r for r in _RC_ORDER if r in space.rc_order))


# ---------------------------------------------------------------------------- 2. the families
@dataclass(frozen=True)
class Family:
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
    #: whether ZB-V (two chunks per rank in a V) is tried too: p > 1, every stage's layers
    #: even, vpp 2 allowed, and an engine that runs it (with async TP, not compiled)
    zbv: bool = False

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


class Families:
    """Iterates over the valid families of a request; the ones it rejects go to ``rejected``
    (family -> reason, in the order met) with the reason."""

    def __init__(
        self,
        spec: ModelSpec,
        cluster: Cluster,
        global_batch: int,
        seq_len: int,
        space: SearchSpace,
        prof: EngineProfile,
        compiled: bool = False,
    ):
        self.spec, self.space, self.G, self.s = spec, space, global_batch, seq_len
        self.N, self.gpn = cluster.world_size, cluster.gpus_per_node
        self.prof = prof
        # the run is compiled (tp_comm_overlap=True under an engine whose switch compiles):
        # PyTorch's ZB-V schedule refuses compiled stages
        self.compiled = compiled
        self.rejected: dict[str, str] = {}
        self.reached_batch = self.batch_ok = False

    def _refused(self, key: str, feature: str, what: str) -> bool:
        """Whether the engine refuses ``feature``; if so, file the family ``key`` as rejected
        with the engine's reason."""
        why = self.prof.refusal(feature)
        if why:
            self.rejected.setdefault(key, f"{self.prof.who} cannot run {what}: {why}")
        return bool(why)

    def __iter__(self) -> Iterator[Family]:
        tps = self.space.tp
        for t in tps or _divisors(self.N):
            if t > self.spec.heads and tps is None:
                continue
            if t > 1 and self._refused("t>1" if tps is None else f"t={t}", "tp", f"tp={t}"):
                continue
            problem = _tp_problem(self.spec, t, self.N, self.gpn)
            if problem:
                self.rejected[f"t={t}"] = problem
                continue
            for c in self.space.cp:
                if c > 1 and self._refused(f"t={t}, cp={c}", "cp", f"cp={c}"):
                    continue
                if (self.N // t) % c:
                    self.rejected[f"t={t}, cp={c}"] = (
                        f"cp={c} does not divide the {self.N // t} GPUs left by tp"
                    )
                elif self.s % c:
                    self.rejected[f"t={t}, cp={c}"] = f"cp={c} must divide seq_len={self.s}"
                else:
                    yield from self._over_pp(t, c)

    def _over_pp(self, t: int, c: int) -> Iterator[Family]:
        rest, L, prof = self.N // (t * c), self.spec.layers, self.prof
        zero = [z for z in self.space.zero if z in prof.zero_stages]
        for p in self.space.pp or _divisors(rest):
            fam_tp = f"t={t}, p={p}" + (f", cp={c}" if c > 1 else "")
            if p > 1 and not prof.pipeline:
                self.rejected.setdefault(
                    "p>1" + (f", cp={c}" if c > 1 else ""),
                    f"{prof.who} has no pipeline parallelism",
                )
                continue
            if rest % p:
                self.rejected[fam_tp] = f"pp={p} does not divide the {rest} GPUs left"
                continue
            if p > L:  # one entry for all of them
                self.rejected.setdefault(
                    f"t={t}, p>{L}" + (f", cp={c}" if c > 1 else ""),
                    f"pp={p} > layers={L}: every stage needs a layer",
                )
                continue
            if L % p and not self.space.uneven_pp:
                self.rejected[fam_tp] = f"pp={p} must divide layers={L} (or pass uneven_pp=True)"
                continue
            zmax = prof.plan_pipeline_zero_max
            zeros = [z for z in sorted(zero, reverse=True) if p == 1 or z <= zmax]
            if not zeros:
                asked = "/".join(map(str, self.space.zero))
                runs = "/".join(map(str, prof.zero_stages))
                self.rejected[fam_tp] = (
                    f"{prof.who} cannot run ZeRO-{asked}: it runs ZeRO stage {runs}"
                    if not zero
                    else f"{prof.who} cannot combine ZeRO-{asked} with pp={p}: its pipeline "
                    f"runs ZeRO stage <= {zmax}"
                )
                continue
            yield from self._settings(t, c, p, zeros, fam_tp)

    def _settings(self, t: int, c: int, p: int, zeros: list[int], fam_tp: str) -> Iterator[Family]:
        d = self.N // (t * c * p)
        if d * c == 1:  # no data-parallel group: every ZeRO stage is the same layout
            zeros = [zeros[-1]]
        self.reached_batch = True
        if self.G % d:
            self.rejected[_family_key(t, p, d, c, 1)] = (
                f"global_batch={self.G} is not divisible by d={d}"
            )
            return
        self.batch_ok = True
        per_replica = self.G // d
        mb = self.space.micro_batch
        bs = [b for b in _divisors(per_replica) if mb is None or b in mb]
        if not bs:
            self.rejected[_family_key(t, p, d, c, 1)] = (
                f"no allowed micro-batch divides global_batch/d = {per_replica}"
            )
            return
        sps = self._sps(t, c)
        if not sps:
            self.rejected[fam_tp] = (
                f"sp=True needs seq_len/cp={self.s // c} divisible by tp={t}"
                if t > 1
                else "sp=True needs tp >= 2"
            )
            return
        lps = even_split(self.spec.layers, p)
        vs = self._vs(p, lps)
        if not vs:
            why = self.prof.refusal("interleaved")
            self.rejected[fam_tp] = (
                f"{self.prof.who} cannot run vpp > 1 (interleaved 1F1B): {why}"
                if why and p > 1
                else f"no allowed vpp divides the {min(lps)} layers per stage"
            )
            return
        es = self._eps(d)
        if not es:
            why = self.prof.refusal("ep")
            self.rejected[_family_key(t, p, d, c, 1)] = (
                f"{self.prof.who} cannot run ep > 1: {why}"
                if why
                else f"no allowed ep divides both num_experts={self.spec.num_experts} and d={d}"
            )
            return
        zbv = (
            p > 1
            and all(n % 2 == 0 for n in lps)
            and (self.space.vpp is None or 2 in self.space.vpp)
            and not self.prof.refusal("zbv")
            and not self.compiled
        )
        for e in es:
            yield Family(t, c, p, d, e, lps, zeros, sps, self.space.rc_order, bs, vs, per_replica,
                         zbv)  # fmt: skip

    def _sps(self, t: int, c: int) -> list[bool]:
        sps = [True, False] if t > 1 and not self.prof.refusal("sp") else [False]
        sps = [x for x in sps if x in self.space.sp or t == 1]
        if (self.s // c) % t:
            sps = [x for x in sps if not x]
        return sps

    def _vs(self, p: int, lps: tuple[int, ...]) -> list[int]:
        vs = [1] + [v for v in range(2, min(lps) + 1) if p > 1 and all(n % v == 0 for n in lps)]
        if self.space.vpp is not None:
            vs = [v for v in vs if v in self.space.vpp]
        if self.prof.refusal("interleaved") and any(v > 1 for v in vs):
            vs = [v for v in vs if v == 1]
        return vs

    def _eps(self, d: int) -> list[int]:
        if not self.spec.is_moe:
            return [1]
        es = list(_divisors(math.gcd(self.spec.num_experts, d)))  # e | experts and e | d
        if self.space.ep is not None:
            es = [e for e in es if e in self.space.ep]
        if self.prof.refusal("ep") and any(e > 1 for e in es):
            es = [e for e in es if e == 1]
        return es


# ---------------------------------------------------------------------------- 3. one family
