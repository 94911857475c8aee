"""Sweeps and studies the chapters use: each one a loop over :func:`parmem.estimate` (and
:func:`parmem.comm.step_comm`) that answers one question of the book.

* :func:`balance_layers`: the pipeline split that minimises the peak stage (chapter 12);
* :func:`microbatch_sweep`: memory and bubble against the micro-batch size (chapter 14);
* :func:`gpipe_remat_activations`: a stage's activations under GPipe with re-materialisation
  (chapter 11);
* :func:`axis_by_axis`: which term each parallel axis removes (chapters 17 and 20);
* :func:`layout_sweep`: every d·t·p layout of a cluster, memory against communication (chapter 16);
* :func:`collective_curves`: alpha-beta time of one collective against message size (chapter 16);
* :func:`zero_stages`: model states and DP traffic of ZeRO stages 0–3 (chapter 3);
* :func:`zero3_vs_tp`: ZeRO-3 model states and activations against d, with and without TP+SP
  (chapter 4);
* :func:`tp_shard_layout`: which rank holds which slice of every weight matrix (chapter 5);
* :func:`tp_component_bytes`: one tensor-parallel rank's bytes by model component (chapter 6);
* :func:`tp_tradeoff`: one GPU's memory and TP traffic for each t (chapter 7);
* :func:`dualpipe_ranks`: the model states of each rank when DualPipe pairs two pipeline
  chunks on it (chapter 15).

The engine comparisons of chapter 22 are in :mod:`parmem.engine_analyses`.

Each returns plain data (rows of dicts, estimates) that a figure of :mod:`parmem.book.plots`
draws; the figures themselves compute nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ._check import integer, number
from .comm import (
    StageShape,
    collective_bytes,
    collective_steps,
    collective_time,
    collectives,
    placement,
    step_comm,
)
from .config import ParallelConfig, TrainingSetup
from .estimate import Estimate, estimate
from .hardware import Hardware, hardware_preset, link_preset, usable_bytes
from .layout import layout
from .model import ModelSpec
from .pipeline import bubble_fraction, in_flight
from .sharding import tp_param_counts
from .states import model_state_bytes

__all__ = [
    "balance_layers",
    "microbatch_sweep",
    "gpipe_remat_activations",
    "axis_by_axis",
    "layout_sweep",
    "collective_curves",
    "zero_stages",
    "zero3_vs_tp",
    "tp_shard_layout",
    "tp_component_bytes",
    "tp_tradeoff",
    "dualpipe_ranks",
]


def balance_layers(
    spec: ModelSpec,
    parallel: ParallelConfig | None = None,
    setup: TrainingSetup | None = None,
    *,
    world_size: int | None = None,
) -> tuple[int, ...]:
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

    t_star, _ = _split_dp(p, L, v, counts, lambda i, n: total[i][n], max)
    mean = L / p

    def deviation(i: int, n: int) -> float:
        return (n - mean) ** 2 if total[i][n] <= t_star else float("inf")

    _, split = _split_dp(p, L, v, counts, deviation, lambda a, b: a + b)
    return tuple(split)


def _split_dp(
    p: int,
    L: int,
    v: int,
    counts: list[int],
    cost: Callable[[int, int], float],
    fold: Callable[[float, float], float],
) -> tuple[float, list[int]]:
    """min over splits of L layers into p stages (each a multiple of v, from ``counts``) of
    ``fold`` over the stages of ``cost(stage, layers)``: fold is max for the peak, + for a sum.
    Dynamic programme over the stages, last to first."""
    inf = float("inf")
    # best[i][r]: best value for stages i..p-1 holding r layers; choice[i][r]: n of stage i
    best = [[inf] * (L + 1) for _ in range(p + 1)]
    choice = [[0] * (L + 1) for _ in range(p)]
    best[p][0] = 0.0
    for i in range(p - 1, -1, -1):
        for r in range(v * (p - i), L - v * i + 1, v):
            for n in counts:
                if n > r - v * (p - i - 1):
                    break
                val = fold(cost(i, n), best[i + 1][r - n])
                if val < best[i][r]:
                    best[i][r], choice[i][r] = val, n
    split, r = [], L
    for i in range(p):
        split.append(choice[i][r])
        r -= choice[i][r]
    return best[0][L], split


def microbatch_sweep(
    spec: ModelSpec,
    parallel: ParallelConfig | None = None,
    setup: TrainingSetup | None = None,
    *,
    global_batch: int,
    micro_batches=None,
) -> list[dict]:
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
    global_batch = integer("global_batch", global_batch)
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
        rows.append(
            {
                "b": b,
                "m": m,
                "in_flight": in_flight(setup.schedule, par.pp, m, par.vpp),
                "activations": est.stages[0].activations,
                "logits": est.stages[-1].logits,
                "peak_stage": est.peak.stage,
                "peak_total": est.peak_bytes,
                "bubble_fraction": bubble_fraction(par.pp, m, par.vpp),
            }
        )
    return rows


def gpipe_remat_activations(
    spec: ModelSpec, parallel: ParallelConfig, setup: TrainingSetup, stage: int = 0
) -> int:
    """Activation bytes of one pipeline stage under GPipe *as published*, with re-materialisation.

    Huang et al. 2019 §2.3: "each accelerator only stores output activations at the partition
    boundaries"; in backward it recomputes its stage's forward for one micro-batch at a time, so
    peak activation memory is O(N + L/K · N/M). Here: the stage's input (activation precision) of
    every one of the m micro-batches (s·b·h values, s·b·h/t with sequence parallelism), plus the
    activations of the stage's layers for the one micro-batch being recomputed, which is what
    :func:`estimate` gives the stage for m = 1 (the first stage's input is token ids; it is
    counted as s·b·h like the others, an upper bound). Without recomputation GPipe holds all m
    micro-batches of its layers (``setup.schedule="gpipe"``).
    """
    stage = integer("stage", stage, 0, parallel.pp - 1)
    one = estimate(spec, parallel, replace(setup, num_microbatches=1, schedule="gpipe"))
    boundary = layout(spec, parallel, one.setup).boundary_bytes
    return setup.num_microbatches * boundary + one.stages[stage].activations


def axis_by_axis(
    spec: ModelSpec, parallel: ParallelConfig, setup: TrainingSetup
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


def layout_sweep(
    spec,
    world_size: int,
    setup,
    *,
    global_batch: int,
    zero: int = 1,
    sp: bool = True,
    ep: int = 1,
    cp: int = 1,
    hardware: Hardware | str = "h100-sxm",
    gpus_per_node: int = 8,
    tps=None,
    pps=None,
    headroom: float = 0.0,
) -> list[dict]:
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
    most ``(1 − headroom)`` of the GPU's memory; pass the planner's
    ``parmem.planner.Assumptions().headroom`` to keep room for the CUDA context and the allocator).
    """
    world_size = integer("world_size", world_size, 1)
    headroom = number("headroom", headroom, 0.0, 1.0, hi_open=True)
    global_batch = integer("global_batch", global_batch, 1)
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
            rows.append(
                {
                    "d": d,
                    "t": t,
                    "p": p,
                    "m": m,
                    "peak_bytes": est.peak_bytes,
                    "peak_stage": est.peak.stage,
                    **com.as_dict(),
                    "comm_bytes": com.total,
                    "comm_time_s": com.time(hw, **where),
                    "tp_in_node": where["tp_intra"],
                    "fits": est.peak_bytes <= usable_bytes(hw, headroom),
                }
            )
    return rows


# ---------------------------------------------------------------------------- collectives, ZeRO
def collective_curves(
    op: str = "all_reduce",
    n: int = 8,
    links=("nvlink4", "ib-ndr"),
    sizes=None,
    mark: int | None = None,
) -> list[dict]:
    """Alpha-beta time of one collective against the message size, one row per link.

    ``op`` and ``n`` as in :func:`parmem.comm.collective_time`; ``links``: link preset names;
    ``sizes`` in bytes (default 1 KiB … 64 GiB, the powers of two). Each row: ``op``, ``n``,
    ``link`` (the name), its ``bandwidth`` (bytes/s) and ``latency`` (s), ``sizes`` and
    ``times`` (seconds, :func:`parmem.comm.collective_time`), ``crossover`` and ``mark``.

    ``crossover`` is the size S* at which the latency term equals the bandwidth term,
    steps·α = bytes_sent(S*)/β, i.e. S* = steps·α·β / (bytes sent per byte of S) (Hockney's
    alpha-beta model as used by Thakur et al. 2005 §2, §4; for a ring all-reduce on n ranks
    S* = n·α·β): smaller messages are latency-bound. ``None`` when the collective sends nothing
    (n = 1). ``mark``: ``(mark, time of a mark-byte message)``, or ``None``. Used by the figure
    of chapter 16 (and the explorer of chapter 1).
    """
    sizes = list(sizes) if sizes is not None else [2**k for k in range(10, 37)]
    rows = []
    for name in links:
        link = link_preset(name)
        steps, per_byte = collective_steps(op, n), collective_bytes(op, 2**30, n) / 2**30
        cross = steps * link.latency * link.bandwidth / per_byte if steps and per_byte else None
        rows.append(
            {
                "op": op,
                "n": n,
                "link": name,
                "bandwidth": link.bandwidth,
                "latency": link.latency,
                "sizes": sizes,
                "times": [collective_time(op, s, n, link) for s in sizes],
                "crossover": cross,
                "mark": None if mark is None else (mark, collective_time(op, mark, n, link)),
            }
        )
    return rows


def zero_stages(
    num_params: int,
    dp: int,
    num_microbatches: int = 1,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
) -> list[dict]:
    """ZeRO stages 0–3 for Ψ = ``num_params`` parameters over ``dp`` data-parallel GPUs: one
    row per stage with the per-GPU model states and the bytes each GPU sends per optimizer step.

    Each row: ``zero``; ``params``, ``grads``, ``optimizer`` and ``model_states`` (bytes, from
    :func:`parmem.model_state_bytes`: (2 + 2 + K)Ψ, 2Ψ + 2Ψ + KΨ/d, 2Ψ + (2 + K)Ψ/d,
    (2 + 2 + K)Ψ/d for mixed-precision Adam, Rajbhandari et al. 2020 §5.1 and Figure 1);
    ``dp_bytes``, the data-parallel bytes sent (:func:`parmem.comm.collectives` with
    ``m = num_microbatches``: ZeRO-2 reduce-scatters and ZeRO-3 gathers every micro-batch), and
    ``dp_values``, the same in units of Ψ 16-bit values (2Ψ bytes), the unit in which §7 counts
    DP's 2Ψ and ZeRO-3's 3Ψ (exactly 2(d−1)/d and 3(d−1)/d here). The traffic counts 16-bit
    gradients and parameters whatever ``precision`` is. The inputs ``num_params``, ``dp`` and
    ``num_microbatches`` are repeated in every row. Used in chapter 3 (ZeRO as a balance point).
    """
    num_params = integer("num_params", num_params, 1)
    rows = []
    for z in range(4):
        st = model_state_bytes(num_params, dp, z, precision, optimizer)
        sent = collectives(
            StageShape(
                params=num_params,
                seq_len=1,
                micro_batch=1,
                hidden=1,
                layers=0,
                num_microbatches=num_microbatches,
                dp=dp,
                zero=z,
            )
        ).dp
        rows.append(
            {
                "zero": z,
                "num_params": num_params,
                "dp": dp,
                "num_microbatches": num_microbatches,
                "params": st.params,
                "grads": st.grads,
                "optimizer": st.optimizer,
                "model_states": st.total,
                "dp_bytes": sent,
                "dp_values": sent / (2 * num_params),
            }
        )
    return rows


def zero3_vs_tp(
    spec: ModelSpec,
    seq_len: int,
    tp: int = 8,
    dps=(1, 2, 4, 8, 16, 32, 64, 128),
    flash: bool = True,
    recompute: str = "none",
) -> list[dict]:
    """Per-GPU model states and activations of ``spec`` under ZeRO-3 against d, for t = 1 and
    for t = ``tp`` with sequence parallelism (b = 1, one sequence of ``seq_len`` tokens per GPU,
    no dropout), from :func:`parmem.estimate` (the first stage; no pipeline).

    One row per (t, d), t = 1 first: ``model``, ``seq_len``, ``t``, ``sp`` (t > 1), ``d``, and
    the bytes ``model_states``, ``activations`` and ``logits``. Model states fall as 16Ψ/d
    (Rajbhandari et al. 2020 §5.3: ZeRO-3 shards all three); activations and logits do not
    depend on d and are divided by t only by TP+SP (Korthikanti et al. 2022 §4.2.2). Used in
    chapter 4 (is TP still needed with ZeRO-3?).
    """
    setup = TrainingSetup(
        seq_len=seq_len, flash_attention=flash, dropout=False, recompute=recompute
    )
    rows = []
    for t in dict.fromkeys((1, tp)):
        for d in dps:
            st = estimate(spec, ParallelConfig(dp=d, tp=t, sp=t > 1, zero=3), setup).stages[0]
            rows.append(
                {
                    "model": spec.name,
                    "seq_len": seq_len,
                    "t": t,
                    "sp": t > 1,
                    "d": d,
                    "model_states": st.model_states,
                    "activations": st.activations,
                    "logits": st.logits,
                }
            )
    return rows


# ---------------------------------------------------------------------------- tensor parallelism
def tp_shard_layout(spec: ModelSpec, tp: int) -> dict:
    """Which rank holds which slice of each weight matrix under Megatron tensor parallelism: the
    data of the schematic figure of chapter 5 (how TP shards the weights).

    Matrices are written as Y = X·A (A is [in, out]): the embedding [V, h] and the LM head
    [h, V] split the vocabulary, the QKV projection [h, (a + 2·kv)·d] and the MLP input split
    columns (heads, inner width), the attention output and the MLP output split rows, the norms
    are replicated (Shoeybi et al. 2019 §3; the splits of :mod:`parmem.sharding`). When
    t > kv_heads each K and V head is kept by t/kv_heads ranks (grouped-query attention,
    Megatron-Core). A tied LM head has no panel of its own.

    Returns ``{"model", "tp", "kv_heads", "panels"}``; each panel is a dict with ``title``,
    ``rows`` and ``cols`` (the full shape), ``axis`` (``"rows"`` or ``"cols"``, the split one)
    and ``parts``: ``(fraction of the split axis, owning ranks)`` in order along it, the
    fractions summing to one. Raises ``ValueError`` when t does not divide the shapes
    (:func:`parmem.sharding.tp_param_counts`).
    """
    tp_param_counts(spec, tp)  # validates t against the shapes
    t, h, d = tp, spec.hidden, spec.head_dim
    a, kv, V = spec.heads, spec.kv_heads, spec.vocab_size
    f = spec.expert_ffn_hidden if spec.is_moe else spec.ffn_hidden
    up = 2 * f if spec.ffn_kind == "swiglu" else f
    ranks = list(range(t))
    kv_groups = (
        [list(range(j * t // kv, (j + 1) * t // kv)) for j in range(kv)]
        if t > kv
        else [[r] for r in ranks]
    )
    mlp = "expert" if spec.is_moe else "MLP"
    each = [(1 / t, [r]) for r in ranks]
    panels = [
        (f"embedding\n[V={V:,}, h]", V, h, "rows", each),
        (
            f"Q | K | V\n[h, (a+2kv)·d], kv={kv}",
            h,
            (a + 2 * kv) * d,
            "cols",
            [(a / t / (a + 2 * kv), [r]) for r in ranks]
            + 2 * [(kv / len(kv_groups) / (a + 2 * kv), g) for g in kv_groups],
        ),
        ("attention out\n[a·d, h]", a * d, h, "rows", each),
        (
            f"{mlp} in{' (gate | up)' if spec.ffn_kind == 'swiglu' else ''}\n[h, {up:,}]",
            h,
            up,
            "cols",
            (up // f) * [(f / up / t, [r]) for r in ranks],
        ),
        (f"{mlp} out\n[{f:,}, h]", f, h, "rows", each),
        ("norms\n[h]", 1, h, "cols", [(1.0, ranks)]),
    ]
    if not spec.tied_embeddings:
        panels.append((f"LM head\n[h, V={V:,}]", h, V, "cols", each))
    keys = ("title", "rows", "cols", "axis", "parts")
    return {
        "model": spec.name,
        "tp": t,
        "kv_heads": kv,
        "panels": [dict(zip(keys, p, strict=True)) for p in panels],
    }


def tp_component_bytes(spec: ModelSpec, tps=(1, 2, 4, 8), bytes_per_param: int = 2) -> list[dict]:
    """Bytes one tensor-parallel rank holds, by model component, for each t in ``tps``.

    One row per t: ``model``, ``t``, ``bytes_per_param`` and ``components``, a dict component →
    bytes (``per_rank`` parameters of :func:`parmem.sharding.tp_param_counts` times
    ``bytes_per_param``, Megatron-LM's layout, Shoeybi et al. 2019 §3). ``bytes_per_param`` is
    2 for 16-bit weights (or gradients), 12 for mixed-precision Adam's fp32 master copy and
    moments, 16 for all model states (Rajbhandari et al. 2020 §3.1). Used in chapter 6 (a 7B
    model at TP = 4).
    """
    bytes_per_param = integer("bytes_per_param", bytes_per_param, 1)
    rows = []
    for t in tps:
        comps: dict[str, int] = {}
        for r in tp_param_counts(spec, t):
            comps[r.component] = comps.get(r.component, 0) + r.per_rank * bytes_per_param
        rows.append(
            {"model": spec.name, "t": t, "bytes_per_param": bytes_per_param, "components": comps}
        )
    return rows


def tp_tradeoff(spec: ModelSpec, setup: TrainingSetup, tps=(1, 2, 4, 8)) -> list[dict]:
    """What tensor parallelism buys and what it costs, per GPU, for each t in ``tps`` (one
    pipeline stage, no data parallelism).

    One row per t: ``t``; ``estimate``, the :class:`~parmem.estimate.Estimate` of
    :func:`parmem.estimate` with ``ParallelConfig(tp=t)``; ``tp_bytes``, the bytes that GPU sends
    for tensor-parallel all-reduces in one step (:func:`parmem.comm.step_comm`: each all-reduce
    of one s·b·h activation X sends 2(t−1)/t·X, two per layer and micro-batch in the forward and
    two in the backward, Shoeybi et al. 2019 §3); ``comm_buffer``, the all-reduce buffer the
    estimate holds (one s·b·h tensor). Used in chapter 7 (TP communicates a lot; why is its
    memory saving immediate?).
    """
    rows = []
    for t in tps:
        par = ParallelConfig(tp=t)
        est = estimate(spec, par, setup)
        rows.append(
            {
                "t": t,
                "estimate": est,
                "tp_bytes": step_comm(spec, par, setup).tp,
                "comm_buffer": est.stages[0].comm_buffers,
            }
        )
    return rows


def dualpipe_ranks(est: Estimate) -> list[dict]:
    """Model states per GPU when a ``p``-stage pipeline of ``est`` runs under DualPipe.

    DualPipe (DeepSeek-AI 2024, DeepSeek-V3 technical report §3.2.1, and the reference code of
    ``deepseek-ai/DualPipe``, ``examples/example_dualpipe.py``) feeds micro-batches from both
    ends of the pipeline. Rank ``r`` holds chunk ``r`` for the forward direction and chunk
    ``p − 1 − r`` for the reverse one, each with its own weights and gradients (the two copies'
    gradients are summed across ranks ``r`` and ``p − 1 − r`` before the step): "two copies of
    the model parameters" in all, and the first rank holds both the embedding and the output
    head. ``p`` must be even. Chunk ``i`` here is stage ``i`` of ``est``: its layers, its
    embedding or head, its bytes per parameter.

    The optimizer states are not fixed by DualPipe: the two copies of a chunk are replicas, so
    a ZeRO-1 over both copies' ranks holds half of the two chunks' states (``optimizer``), and
    one that keeps each copy's states apart holds both (``optimizer_per_copy``).
    Activations are left out: DualPipe keeps ``p + 1`` micro-batches of one chunk in flight on
    a rank, against ``p`` for 1F1B's first stage (the reference README's table), and which
    chunk's activations they are depends on the direction, which :func:`parmem.estimate` does
    not follow.

    Returns one row per rank: ``rank``, ``chunks`` (the two stage indices), ``num_params``,
    ``params``, ``grads`` (bytes of both chunks), ``optimizer``, ``optimizer_per_copy`` (bytes,
    with the profile's fp32 master copy) and ``model_states`` (params + grads + optimizer).
    """
    p = len(est.stages)
    if p < 2 or p % 2:
        raise ValueError(f"est: DualPipe needs an even number of pipeline stages, got p={p}")
    rows: list[dict] = []
    for r in range(p):
        a, b = est.stages[r], est.stages[p - 1 - r]
        opt_both = a.optimizer + b.optimizer
        params, grads = a.params + b.params, a.grads + b.grads
        rows.append(
            {
                "rank": r,
                "chunks": (r, p - 1 - r),
                "num_params": a.num_params + b.num_params,
                "params": params,
                "grads": grads,
                "optimizer": opt_both // 2,
                "optimizer_per_copy": opt_both,
                "model_states": params + grads + opt_both // 2,
            }
        )
    return rows
