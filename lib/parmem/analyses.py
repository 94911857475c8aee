"""Sweeps and studies the chapters use: each one a loop over :func:`parmem.estimate` (and
:func:`parmem.comm.step_comm`) that answers one question of the book.

* :func:`balance_layers`: the pipeline split that minimises the peak stage (chapter 12);
* :func:`microbatch_sweep`: memory and bubble against the micro-batch size (chapter 14);
* :func:`axis_by_axis`: which term each parallel axis removes (chapters 17 and 20);
* :func:`layout_sweep`: every d·t·p layout of a cluster, memory against communication (chapter 16).
"""

from __future__ import annotations

from dataclasses import replace

from ._check import integer
from .comm import placement, step_comm
from .config import ParallelConfig, TrainingSetup
from .estimate import Estimate, estimate
from .hardware import Hardware, hardware_preset
from .model import ModelSpec
from .pipeline import bubble_fraction, in_flight

__all__ = ["balance_layers", "microbatch_sweep", "axis_by_axis", "layout_sweep"]


def balance_layers(spec: ModelSpec, parallel: ParallelConfig | None = None,
                   setup: TrainingSetup | None = None, *,
                   world_size: int | None = None) -> tuple[int, ...]:
    """The ``layers_per_stage`` split that minimises the peak stage of :func:`estimate`.

    Pipeline stages are not equal: the first holds the embedding and (under 1F1B) the most
    micro-batches in flight, the last the final norm, the LM head and the fp32 logits. Moving
    layers away from a heavy stage lowers the peak; this function finds the best split exactly.

    Method: a stage's bytes depend only on its position ``i`` and its own layer count ``n``
    (model states of its layers and of the embedding/head it holds, ``in_flight_units`` times its
    layers' activations), so one :func:`estimate` call per (i, n) tabulates every stage's total.
    A dynamic program over the stages then finds the least possible peak ``T*`` over all splits
    (every stage keeps at least one layer, a multiple of ``vpp`` when interleaved), and a second
    one picks, among the splits whose stages all fit in ``T*``, the one closest to the even split
    (least sum of squared differences in layer counts), because the slowest stage sets the
    pipeline's pace. Cost: about ``p · L / vpp`` estimates and ``p · (L / vpp)²`` steps.

    Returns the split as a tuple of ``pp`` layer counts summing to ``spec.layers``; pass it to
    ``estimate(..., layers_per_stage=...)``. ``pp = 1`` returns ``(spec.layers,)``.
    Raises ``ValueError`` for a layout :func:`estimate` rejects.
    """
    par = parallel if parallel is not None else ParallelConfig()
    base = estimate(spec, par, setup, world_size=world_size)  # validates the layout
    setup = base.setup
    p, L, v = par.pp, spec.layers, par.vpp
    if p == 1:
        return (L,)
    counts = list(range(v, L - v * (p - 1) + 1, v))  # possible layer counts of one stage
    total: list[dict[int, int]] = [{} for _ in range(p)]
    for i in range(p):
        j = (i + 1) % p  # a stage that absorbs the layers the others do not take
        for n in counts:
            lps = [v] * p
            lps[i] = n
            lps[j] = L - n - v * (p - 2)
            total[i][n] = estimate(spec, par, setup, layers_per_stage=lps).stages[i].total

    def solve(cost) -> tuple[float, list[int]]:
        """min over splits of fold(cost(i, n)); fold is max for the peak, + for the deviation."""
        inf = float("inf")
        # best[i][r]: best value for stages i..p-1 holding r layers; choice[i][r]: n of stage i
        best = [[inf] * (L + 1) for _ in range(p + 1)]
        choice = [[0] * (L + 1) for _ in range(p)]
        best[p][0] = 0
        for i in range(p - 1, -1, -1):
            for r in range(v * (p - i), L - v * i + 1, v):
                for n in counts:
                    if n > r - v * (p - i - 1):
                        break
                    c, rest = cost(i, n), best[i + 1][r - n]
                    val = cost.fold(c, rest)
                    if val < best[i][r]:
                        best[i][r], choice[i][r] = val, n
        split, r = [], L
        for i in range(p):
            split.append(choice[i][r])
            r -= choice[i][r]
        return best[0][L], split

    def peak_cost(i, n):
        return total[i][n]

    peak_cost.fold = max
    t_star, _ = solve(peak_cost)
    mean = L / p

    def deviation_cost(i, n):
        return (n - mean) ** 2 if total[i][n] <= t_star else float("inf")

    deviation_cost.fold = lambda a, b: a + b
    _, split = solve(deviation_cost)
    return tuple(split)



def microbatch_sweep(spec: ModelSpec, parallel: ParallelConfig | None = None,
                     setup: TrainingSetup | None = None, *, global_batch: int,
                     micro_batches=None) -> list[dict]:
    """Memory and pipeline bubble for every micro-batch size b at a fixed batch per step.

    ``global_batch`` is the number of sequences one pipeline (one data-parallel replica) processes
    per optimizer step, B/d; each b in ``micro_batches`` (default: every divisor of
    ``global_batch``) gives m = global_batch / b micro-batches (gradient accumulation keeps the
    batch). Sizes that the layout rejects (the interleaved schedule needs m to be a multiple of
    p) are skipped. One row per b, from :func:`estimate` and
    :func:`parmem.pipeline.bubble_fraction`:

    * ``b``, ``m``; ``in_flight``: micro-batches stage 0 holds at its peak (fractional when
      interleaved: chunks / v);
    * ``activations``: stage 0's activation bytes; ``logits``: the last stage's logits bytes;
    * ``peak_stage``, ``peak_total``: the heaviest stage and its bytes;
    * ``bubble_fraction``: idle share of the step, (p - 1)/(v m + p - 1) (Narayanan et al. 2021
      §2.2; the step-time model of their §3.4 is (m + (p - 1)/v)(t_f(b) + t_b(b)) for b-sized
      micro-batches, so a larger b buys matmul efficiency with a larger bubble).
    """
    par = parallel if parallel is not None else ParallelConfig()
    if setup is None:
        setup = TrainingSetup(seq_len=min(2048, spec.max_positions))
    integer("global_batch", global_batch)
    if micro_batches is None:
        micro_batches = [b for b in range(1, global_batch + 1) if global_batch % b == 0]
    rows = []
    for b in micro_batches:
        integer("micro_batches[...]", b)
        if global_batch % b:
            raise ValueError(f"micro-batch size {b} must divide global_batch={global_batch}")
        m = global_batch // b
        if setup.schedule == "interleaved" and m % par.pp:
            continue
        est = estimate(spec, par, replace(setup, micro_batch=b, num_microbatches=m))
        rows.append({"b": b, "m": m, "in_flight": in_flight(setup.schedule, par.pp, m, par.vpp),
                     "activations": est.stages[0].activations,
                     "logits": est.stages[-1].logits, "peak_stage": est.peak.stage,
                     "peak_total": est.peak_bytes,
                     "bubble_fraction": bubble_fraction(par.pp, m, par.vpp)})
    return rows



def axis_by_axis(spec: ModelSpec, parallel: ParallelConfig, setup: TrainingSetup
                 ) -> dict[str, Estimate]:
    """Estimates that add the axes of ``parallel`` one at a time, to show which term each removes.

    Starting from one GPU (the same ``setup``), the steps are: data parallelism d (no ZeRO),
    the ZeRO stage, tensor parallelism t, sequence parallelism, pipeline parallelism p (with v),
    expert parallelism e, context parallelism cp, then ``setup.recompute``. Steps that change
    nothing for this layout are skipped; the last estimate is ``estimate(spec, parallel, setup)``.
    Returns an ordered dict label → :class:`Estimate`.
    """
    base = replace(setup, recompute="none", schedule="1f1b")
    steps = [("1 GPU", ParallelConfig(), base)]

    def add(label: str, **changes) -> None:
        par, st = steps[-1][1], steps[-1][2]
        st_changes = {k: changes.pop(k) for k in ("recompute", "schedule") if k in changes}
        steps.append((label, replace(par, **changes), replace(st, **st_changes)))

    p = parallel
    if p.dp > 1:
        add(f"d={p.dp}", dp=p.dp)
    if p.zero:
        add(f"+ZeRO-{p.zero}", zero=p.zero)
    if p.tp > 1:
        add(f"+t={p.tp}", tp=p.tp)
    if p.sp:
        add("+SP", sp=True)
    if p.pp > 1:
        label = f"+p={p.pp}" + (f", v={p.vpp}" if p.vpp > 1 else "")
        add(label, pp=p.pp, vpp=p.vpp, schedule=setup.schedule)
    if p.ep > 1:
        add(f"+e={p.ep}", ep=p.ep)
    if p.cp > 1:
        add(f"+cp={p.cp}", cp=p.cp)
    if setup.recompute != "none":
        add(f"+{setup.recompute} recompute", recompute=setup.recompute)
    return {label: estimate(spec, par, st) for label, par, st in steps}


def layout_sweep(spec, world_size: int, setup, *, global_batch: int, zero: int = 1,
                 sp: bool = True, ep: int = 1, cp: int = 1, hardware: Hardware | str = "h100-sxm",
                 gpus_per_node: int = 8, tps=None, pps=None) -> list[dict]:
    """Every d·t·p layout of ``world_size`` GPUs: peak memory and communication per GPU.

    For each t in ``tps`` and p in ``pps`` (default: all divisors of the world size) with
    d = world / (t·p·cp) an integer, the setup gets ``num_microbatches = global_batch / (d·b)``
    (``global_batch`` sequences per step, b = ``setup.micro_batch``) and ZeRO stage ``zero`` over
    d; SP is on whenever t > 1 and ``sp``. Layouts that are invalid for the model (t not dividing
    the heads, p above the layers, the batch not splitting evenly) are left out.

    Each row: ``d``, ``t``, ``p``, ``m``, ``peak_bytes`` and ``peak_stage`` (from
    :func:`parmem.estimate`), bytes sent per category (``dp``, ``tp``, ``sp``, ``pp``, ``ep``,
    ``cp``) and ``comm_bytes`` (:func:`parmem.comm.step_comm`), ``comm_time_s`` (serial alpha-beta time on
    ``hardware`` with groups placed by :func:`parmem.comm.placement`), ``tp_in_node``, and ``fits`` (peak at
    most the GPU's memory).
    """
    integer("world_size", world_size, 1)
    integer("global_batch", global_batch, 1)
    hw = hardware_preset(hardware) if isinstance(hardware, str) else hardware
    divisors = [k for k in range(1, world_size + 1) if world_size % k == 0]
    rows = []
    for t in tps or divisors:
        for p in pps or divisors:
            if world_size % (t * p * cp):
                continue
            d = world_size // (t * p * cp)
            if global_batch % (d * setup.micro_batch):
                continue
            m = global_batch // (d * setup.micro_batch)
            try:
                par = ParallelConfig(dp=d, tp=t, pp=p, ep=ep, cp=cp, sp=sp and t > 1, zero=zero)
                st = replace(setup, num_microbatches=m)
                est = estimate(spec, par, st)
                com = step_comm(spec, par, st)
            except ValueError:
                continue
            where = placement(par, gpus_per_node)
            rows.append({"d": d, "t": t, "p": p, "m": m, "peak_bytes": est.peak_bytes,
                         "peak_stage": est.peak.stage, **com.as_dict(), "comm_bytes": com.total,
                         "comm_time_s": com.time(hw, **where), "tp_in_node": where["tp_intra"],
                         "fits": est.peak_bytes <= hw.memory_bytes})
    return rows
