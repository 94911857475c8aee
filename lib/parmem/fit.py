"""What fits: the inverse questions, answered by bisection over the estimator.

Readers rarely ask "how much memory does this layout take"; they ask "what is the longest
sequence, the largest micro-batch, the most concurrent requests that fit?" and "what is the
fewest GPUs for this model?". Each function here answers one of them exactly at its boundary:
the answer fits, and the next value up (or, for GPUs, every smaller count) does not, both
checked with the same function a forward question uses.

"Fits" is the book's one rule, the planner's and the calculator's too: the estimate within the
usable memory, the GPU less a margin (:data:`MARGIN`, Chapter 10), **and** one of
:func:`parmem.bounds.bounds`' numbers within the whole GPU (``bound``): ``"high"`` (the default:
allocated + the caching allocator's overhead + CUDA context, NCCL buffers and the cuBLAS
workspace), ``"reserved"`` or ``"allocated"``. ``margin=0`` leaves the bound alone to decide. Memory
grows with the sequence and the micro-batch, so bisection finds the boundary in O(log n)
estimates. The allocator's overhead is not monotone in every case; the answer is still exact at
its boundary (the answer fits, one step more does not), but a much larger value could fit
again in principle. ``FitAnswer.probes`` says how many estimates the search ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ._check import MAX_BATCH, MAX_GPUS, MAX_SEQ_LEN, choice, instance, integer
from .bounds import bounds
from .config import ParallelConfig, TrainingSetup
from .engines import engine as engine_profile
from .estimate import Estimate, estimate
from .hardware import Hardware, hardware_preset, usable_bytes
from .inference import kv_cache_bytes, max_concurrency, serving_weight_bytes
from .model import ModelSpec
from .units import GIB

__all__ = [
    "FitAnswer",
    "BOUNDS",
    "judged_bytes",
    "max_seq_len",
    "max_micro_batch",
    "max_requests",
    "fewest_gpus",
    "fits",
    "MARGIN",
]

#: the numbers "fits" may be judged on
BOUNDS = ("high", "reserved", "allocated")

#: The fraction of a GPU's memory the book keeps free under its estimate (Chapter 10): a layout
#: fits when its estimated peak is at most ``(1 − MARGIN)`` of the GPU (and its high bound at most
#: the GPU). The planner's ``Assumptions.headroom`` defaults to it.
MARGIN = 0.10


@dataclass(frozen=True)
class FitAnswer:
    """An inverse query's answer. ``value``: the largest value that fits (the fewest GPUs for
    :func:`fewest_gpus`); 0 when none does. ``bytes``: the judged bytes at ``value``.
    ``next_value``/``next_bytes``: the step beyond the boundary, which does not fit (``None``
    when ``value`` is the largest allowed, or, for :func:`fewest_gpus`, always: every smaller
    count was tried). ``capacity``: the GPU's bytes. ``parallel``, ``setup``: the layout found
    (:func:`fewest_gpus`), else the one asked about. ``allocated``: the estimate at ``value``;
    ``usable``: the memory it must fit in, the GPU less the margin."""

    quantity: str
    value: int
    bytes: int
    next_value: int | None
    next_bytes: int | None
    capacity: int
    bound: str
    probes: int
    parallel: ParallelConfig | None = None
    setup: TrainingSetup | None = None
    allocated: int = 0
    usable: int = 0
    next_allocated: int | None = None

    @property
    def fits(self) -> bool:
        """Whether any value fits at all."""
        return self.value > 0

    @property
    def headroom(self) -> int:
        """Capacity minus the judged bytes at the answer."""
        return self.capacity - self.bytes

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("parallel", "setup")}
        d["parallel"] = None if self.parallel is None else self.parallel.__dict__.copy()
        d["setup"] = None if self.setup is None else self.setup.__dict__.copy()
        d["headroom"] = self.headroom
        return d

    def __str__(self) -> str:
        g = GIB
        rule = (
            f"estimate {self.allocated / g:.2f} of {self.usable / g:.2f} GiB usable, "
            if self.usable
            else ""
        ) + f"{self.bound} {self.bytes / g:.2f} of {self.capacity / g:.2f} GiB"
        if not self.value:
            return f"{self.quantity}: nothing fits (at the smallest value: {rule})"
        out = f"{self.quantity} = {self.value:,}: {rule} ({self.headroom / g:+.2f} GiB headroom)"
        if self.next_value is not None and self.next_bytes is not None:
            nxt = f"{self.bound} {self.next_bytes / g:.2f} GiB"
            if self.next_allocated is not None:
                nxt = f"estimate {self.next_allocated / g:.2f} GiB, " + nxt
            out += f"; {self.next_value:,}: {nxt}"
        if self.parallel is not None and self.quantity == "gpus":
            out += f"; layout {self.parallel}"
        return out


def _hw(hardware: Hardware | str) -> Hardware:
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str):
        return hardware_preset(hardware)
    raise ValueError(f"hardware={hardware!r:.60} must be a Hardware or a preset name")


def judged_bytes(est: Estimate, hardware: Hardware | str, bound: str = "high", **kw: Any) -> int:
    """The bytes "fits" is judged on: the fullest stage's ``bound`` (one of :data:`BOUNDS`);
    ``kw`` goes to :func:`parmem.bounds.bounds` (a measured ``cuda_context`` or ``reserve``)."""
    bound = choice("bound", bound, BOUNDS)
    if bound == "allocated":
        return est.peak_bytes
    b = bounds(est, hardware, **kw)
    return b.high if bound == "high" else b.reserved


def _usable(hw: Hardware, margin: float | None) -> int:
    return usable_bytes(hw, MARGIN if margin is None else margin)


def fits(
    est: Estimate,
    hardware: Hardware | str = "h100-sxm",
    *,
    bound: str = "high",
    margin: float | None = None,
    **bound_options: Any,
) -> bool:
    """The book's rule: ``est``'s peak within ``(1 − margin)`` of the GPU (default
    :data:`MARGIN`) and its ``bound`` (:func:`judged_bytes`) within the whole GPU."""
    hw = _hw(hardware)
    return _excess(est, hw, bound, _usable(hw, margin), **bound_options)[0] <= 0


def _excess(
    est: Estimate, hw: Hardware, bound: str, usable: int, **bound_options: Any
) -> tuple[int, int]:
    """(how far ``est`` is from fitting: > 0 when it does not, the bound's bytes)."""
    shown = judged_bytes(est, hw, bound, **bound_options)
    return max(shown - hw.memory_bytes, est.peak_bytes - usable), shown


def _inputs(
    spec: Any, parallel: Any, setup: Any, need_setup: bool
) -> tuple[ModelSpec, ParallelConfig, TrainingSetup | None]:
    """The model, layout and setup of a query, each checked for its type."""
    instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")
    par = ParallelConfig() if parallel is None else parallel
    instance("parallel", par, ParallelConfig, "ParallelConfig(...)")
    if setup is None and need_setup:
        raise ValueError(
            "setup must be a TrainingSetup(seq_len=...): the sequence length is needed"
        )
    if setup is not None:
        instance("setup", setup, TrainingSetup, "TrainingSetup(seq_len=...)")
    return spec, par, setup


#: a probe's answer: (excess, bytes): the layout fits when excess <= 0; bytes are the bound's
_Probe = tuple[int, int]


def _bisect(
    lo: int, lo_got: _Probe, hi: int, hi_got: _Probe, judge: Callable[[int], _Probe]
) -> tuple[int, _Probe, int, _Probe, int]:
    """Narrow lo (fits) < hi (does not) to adjacent values: (lo, its probe, hi, its probe,
    probes)."""
    probes = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probes += 1
        got = judge(mid)
        if got[0] <= 0:
            lo, lo_got = mid, got
        else:
            hi, hi_got = mid, got
    return lo, lo_got, hi, hi_got, probes


_Found = tuple[int, _Probe, int | None, _Probe | None, int]


def _upward(limit: int, judge: Callable[[int], _Probe]) -> _Found:
    """The largest k in 1..limit that fits, by doubling then bisection: (k, its probe, k + 1 or
    None, its probe or None, probes). k = 0 when 1 does not fit (its probe is returned)."""
    first = judge(1)
    if first[0] > 0:
        return 0, first, None, None, 1
    lo, lo_got, probes, k = 1, first, 1, 2
    while k <= limit:
        probes += 1
        got = judge(k)
        if got[0] > 0:
            out = _bisect(lo, lo_got, k, got, judge)
            return out[0], out[1], out[2], out[3], probes + out[4]
        lo, lo_got, k = k, got, k * 2
    if lo == limit:
        return lo, lo_got, None, None, probes
    got = judge(limit)
    if got[0] <= 0:
        return limit, got, None, None, probes + 1
    out = _bisect(lo, lo_got, limit, got, judge)
    return out[0], out[1], out[2], out[3], probes + 1 + out[4]


def _largest(
    limit: int, judge: Callable[[int], _Probe], cheap: Callable[[int], _Probe] | None
) -> _Found:
    """The largest k in 1..limit that fits (see :func:`_upward`). ``cheap`` never says a value
    fits that ``judge`` refuses and costs no allocator replay: the search first finds where it
    stops fitting, k_lb (the answer is at most k_lb), then walks down from there by doubling
    steps with ``judge`` and bisects: a few replays instead of one per step of the search."""
    if cheap is None:
        return _upward(limit, judge)
    k_lb, _, _, _, probes = _upward(limit, cheap)
    if not k_lb:
        return 0, judge(1), None, None, probes + 1
    hi: int | None = None
    hi_got: _Probe | None = None
    if k_lb < limit:
        hi, hi_got, probes = k_lb + 1, judge(k_lb + 1), probes + 1
    step, k = 1, k_lb
    while True:
        probes += 1
        got = judge(k)
        if got[0] <= 0:
            break
        hi, hi_got = k, got
        if k == 1:
            return 0, got, None, None, probes
        k, step = max(1, k - step), step * 2
    if hi is None or hi_got is None:
        return k, got, None, None, probes
    out = _bisect(k, got, hi, hi_got, judge)
    return out[0], out[1], out[2], out[3], probes + out[4]


def _judges(
    at: Callable[[int], Estimate], hw: Hardware, bound: str, usable: int, **bound_options: Any
) -> tuple[Callable[[int], _Probe], Callable[[int], _Probe] | None]:
    """The probe of value k, and a cheaper one that never says fits where it does not (no
    allocator replay: each stage's allocated bytes, plus for ``high`` the context, NCCL and
    cuBLAS bytes, which :func:`parmem.bounds.bounds` adds exactly; ``None`` when the bound needs
    no replay anyway: ``allocated``, or a measured ``reserve``)."""

    def judge(k: int) -> _Probe:
        return _excess(at(k), hw, bound, usable, **bound_options)

    if bound == "allocated" or bound_options.get("reserve") is not None:
        return judge, None
    rest = {k: v for k, v in bound_options.items() if k != "reserve"}

    def cheap(k: int) -> _Probe:
        est = at(k)
        lower = est.peak_bytes if bound == "reserved" else bounds(est, hw, reserve=0, **rest).high
        return max(lower - hw.memory_bytes, est.peak_bytes - usable), lower

    return judge, cheap


def _answer(
    quantity: str,
    found: _Found,
    scale: int,
    hw: Hardware,
    bound: str,
    usable: int,
    at: Callable[[int], Estimate],
    par: ParallelConfig,
    setup: Callable[[int], TrainingSetup],
) -> FitAnswer:
    """A :class:`FitAnswer` from a search's result (values are k · ``scale``)."""
    k, got, nk, n_got, probes = found
    return FitAnswer(
        quantity,
        k * scale,
        got[1],
        None if nk is None else nk * scale,
        None if n_got is None else n_got[1],
        hw.memory_bytes,
        bound,
        probes,
        par,
        setup(max(k, 1)),
        at(max(k, 1)).peak_bytes,
        usable,
        None if nk is None else at(nk).peak_bytes,
    )


def _search(
    quantity: str,
    spec: ModelSpec,
    par: ParallelConfig,
    setup_at: Callable[[int], TrainingSetup],
    limit: int,
    scale: int,
    hardware: Hardware | str,
    bound: str,
    margin: float | None,
    bound_options: dict[str, Any],
) -> FitAnswer:
    """The largest k in 1..limit whose setup ``setup_at(k)`` fits (:func:`fits`), as a
    :class:`FitAnswer` of value k · ``scale``: the search shared by the inverse queries."""
    hw = _hw(hardware)
    bound = choice("bound", bound, BOUNDS)
    usable = _usable(hw, margin)

    def at(k: int) -> Estimate:
        return estimate(spec, par, setup_at(k))

    judge, cheap = _judges(at, hw, bound, usable, **bound_options)
    found = _largest(limit, judge, cheap)
    return _answer(quantity, found, scale, hw, bound, usable, at, par, setup_at)


def max_seq_len(
    spec: ModelSpec,
    parallel: ParallelConfig | None = None,
    setup: TrainingSetup | None = None,
    hardware: Hardware | str = "h100-sxm",
    *,
    bound: str = "high",
    margin: float | None = None,
    **bound_options: Any,
) -> FitAnswer:
    """The longest sequence a training step of ``spec`` under ``parallel``/``setup`` fits on
    ``hardware`` (:func:`fits`). Sequences are tried in steps of cp × (t under sequence
    parallelism), the lengths the layout accepts; with cp > 1 this is the longest context for
    that CP degree. A model with learned positions stops at ``max_positions``. ``setup``'s own
    ``seq_len`` is ignored."""
    spec, par, given = _inputs(spec, parallel, setup, False)
    base = given or TrainingSetup(seq_len=1)
    step = par.cp * (par.tp if par.sp else 1)
    chunks = engine_profile(base.engine).loss_chunks_for(spec.name, base.loss_chunks)
    if chunks:  # torchtitan's chunked loss cuts the rank's s/cp into equal chunks
        step = math.lcm(step, par.cp * chunks)
    top = spec.max_positions if spec.position == "learned" else MAX_SEQ_LEN
    limit = top // step
    if not limit:
        raise ValueError(
            f"no sequence length is a multiple of cp·t = {step} within {top} (max_positions)"
        )

    def at_seq(k: int) -> TrainingSetup:
        return replace(base, seq_len=k * step)

    return _search(
        "seq_len", spec, par, at_seq, limit, step, hardware, bound, margin, bound_options
    )


def max_micro_batch(
    spec: ModelSpec,
    parallel: ParallelConfig | None = None,
    setup: TrainingSetup | None = None,
    hardware: Hardware | str = "h100-sxm",
    *,
    bound: str = "high",
    margin: float | None = None,
    **bound_options: Any,
) -> FitAnswer:
    """The largest micro-batch b a training step of ``spec`` fits on ``hardware`` (:func:`fits`),
    at the setup's sequence length and number of micro-batches (``setup``'s own
    ``micro_batch`` is ignored)."""
    spec, par, checked = _inputs(spec, parallel, setup, True)
    assert checked is not None
    base = checked

    def at_b(b: int) -> TrainingSetup:
        return replace(base, micro_batch=b)

    return _search("micro_batch", spec, par, at_b, MAX_BATCH, 1, hardware, bound, margin,
                   bound_options)  # fmt: skip


def max_requests(
    spec: ModelSpec,
    seq_len: int,
    hardware: Hardware | str = "h100-sxm",
    *,
    tp: int = 1,
    weight_dtype: str = "fp16",
    kv_dtype: str = "fp16",
    utilization: float = 0.9,
    reserved: int = 0,
) -> FitAnswer:
    """The most concurrent requests of ``seq_len`` tokens one GPU of a t-way serving group holds
    (:func:`parmem.inference.max_concurrency`: the weights and every request's whole KV cache
    within ``utilization`` of memory less ``reserved``), with the bytes at the answer and one
    request more. The budget is the serving engine's (``utilization``), not the training bounds."""
    hw = _hw(hardware)
    n = max_concurrency(spec, seq_len, hw, tp, weight_dtype, kv_dtype, utilization, reserved)
    weights = serving_weight_bytes(spec, weight_dtype, tp)
    per = kv_cache_bytes(spec, seq_len, 1, kv_dtype, tp)
    budget = int(hw.memory_bytes * utilization) - reserved
    return FitAnswer(
        "requests",
        n,
        weights + reserved + n * per,
        n + 1,
        weights + reserved + (n + 1) * per,
        budget + reserved,
        f"serving budget ({utilization:g} of memory)",
        1,
    )


def _divisors(n: int, most: int) -> list[int]:
    return [k for k in range(1, min(n, most) + 1) if n % k == 0]


def _layouts(
    spec: ModelSpec, n: int, gpus_per_node: int, prof: Any, zeros: tuple[int, ...], uneven: bool
) -> Iterator[ParallelConfig]:
    """Every (t, p, d, e, ZeRO) layout of n GPUs the engine may run: t within a node, dividing
    the kv heads' multiple rules checked by the layout itself; p up to the layers; e dividing
    the experts and d."""
    for t in _divisors(n, gpus_per_node):
        if t > 1 and prof.refusal("tp"):
            continue
        for p in _divisors(n // t, spec.layers):
            if spec.layers % p and not uneven:
                continue
            d = n // (t * p)
            eps = [1]
            if spec.is_moe and not prof.refusal("ep"):
                eps = [e for e in _divisors(d, spec.num_experts) if spec.num_experts % e == 0]
            for e in eps:
                for z in zeros if d > 1 else (0,):
                    yield ParallelConfig(
                        dp=d, tp=t, pp=p, ep=e, sp=t > 1 and not prof.refusal("sp"), zero=z
                    )


def fewest_gpus(
    spec: ModelSpec,
    setup: TrainingSetup,
    hardware: Hardware | str = "h100-sxm",
    *,
    bound: str = "high",
    margin: float | None = None,
    max_gpus: int = 1024,
    gpus_per_node: int = 8,
    recompute: tuple[str, ...] = ("none", "selective", "full"),
    uneven_pp: bool = False,
    **bound_options: Any,
) -> FitAnswer:
    """The fewest GPUs on which a training step of ``spec`` at ``setup``'s sequence length and
    micro-batch fits (:func:`fits`), and the layout that does it. Every GPU count from 1 up is
    tried; for each, every layout the planner would consider (t within a node, p dividing the
    layers unless ``uneven_pp``, e dividing the experts, the ZeRO stages the engine runs) under
    each ``recompute`` policy, with m = p micro-batches (1F1B's memory does not grow past p),
    until one fits. Among the layouts that fit at that count, the one with the lowest bound is
    returned. ``setup``'s ``engine`` decides the rules and the accounting. Unlike the planner,
    no global batch is asked for, so no divisibility of it constrains d."""
    spec, _, checked = _inputs(spec, None, setup, True)
    assert checked is not None
    setup = checked
    hw = _hw(hardware)
    bound = choice("bound", bound, BOUNDS)
    usable = _usable(hw, margin)
    max_gpus = integer("max_gpus", max_gpus, 1, MAX_GPUS)
    gpus_per_node = integer("gpus_per_node", gpus_per_node, 1, 1024)
    if isinstance(recompute, str) or not isinstance(recompute, tuple | list) or not recompute:
        raise ValueError(f"recompute={recompute!r:.60} must be a tuple of policies")
    for r in recompute:
        choice("recompute", r, ("none", "selective", "full"))
    prof = engine_profile(setup.engine)
    probes = 0
    smallest: int | None = None
    for n in range(1, max_gpus + 1):
        best: tuple[int, int, ParallelConfig, TrainingSetup] | None = None
        for par in _layouts(spec, n, gpus_per_node, prof, tuple(prof.zero_stages), uneven_pp):
            for r in recompute:
                st = replace(setup, recompute=r, num_microbatches=max(par.pp, 1))
                try:
                    est = estimate(spec, par, st)
                except ValueError:
                    continue  # a layout the model or the engine cannot run
                probes += 1
                if est.peak_bytes > usable:
                    smallest = est.peak_bytes if smallest is None else min(smallest, est.peak_bytes)
                    continue
                excess, got = _excess(est, hw, bound, usable, **bound_options)
                probes += 1
                if excess <= 0 and (best is None or got < best[0]):
                    best = (got, est.peak_bytes, par, st)
        if best is not None:
            got, alloc, par, st = best
            return FitAnswer(
                "gpus", n, got, None, None, hw.memory_bytes, bound, probes, par, st, alloc, usable
            )
    return FitAnswer(
        "gpus", 0, smallest or 0, None, None, hw.memory_bytes, bound, probes, usable=usable
    )
