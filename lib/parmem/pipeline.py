"""Pipeline-parallel schedule simulator: GPipe, 1F1B, interleaved 1F1B and ZB-V.

Model (the one the papers' bubble formulas assume): ``p`` stages, ``m``
micro-batches; every stage runs a fixed list of operations in a fixed order;
an operation starts as soon as the previous operation on its stage has ended
and the operation it depends on (on a neighbouring stage) has ended;
communication takes no time. A forward takes ``t_fwd`` and a backward
``t_bwd``; with ``v`` model chunks per stage (interleaved) each operation is one
chunk and takes ``t_fwd / v`` or ``t_bwd / v``.

Schedules:

* ``"gpipe"``: all forwards, then all backwards (Huang et al. 2019, §2.3).
* ``"1f1b"``: PipeDream-Flush (Narayanan et al. 2021, §2.2.1; Narayanan et al.
  2021b "Memory-efficient pipeline-parallel DNN training"): stage ``i``
  (0-based) runs ``min(p - i - 1, m)`` warm-up forwards, then alternates one
  forward and one backward, then drains the remaining backwards.
* ``"interleaved"``: interleaved 1F1B (Narayanan et al. 2021, §2.2.2), with the
  operation order of Megatron-LM's
  ``forward_backward_pipelining_with_interleaving`` (``schedules.py``):
  ``m`` must be a multiple of ``p``; ``v >= 2``; warm-up is
  ``min(2(p - i - 1) + (v - 1)p, m v)`` chunk-forwards, except that when
  ``m == p`` every stage runs all forwards first (Megatron-LM's
  ``all_warmup_microbatches`` case).
* ``"zbv"``: ZB-V (Qi et al. 2024a §6, "zero bubble" in a V; Qi et al. 2024b), the order of
  PyTorch's ``ScheduleZBVZeroBubble`` (torchtitan's ``ZBVZeroBubble``). ``v = 2``: rank ``i`` holds
  the model chunks of stages ``i`` and ``2p - 1 - i`` of ``2p``, so the first and the last
  chunk (the embedding and the LM head) sit on rank 0 and the two forwards that meet at
  rank ``p - 1`` need no transfer. Each backward is split into ``B``, the gradient of the
  chunk's input (what the previous stage waits for), and ``W``, the weights' gradient, which
  waits for nothing and fills the gaps where 1F1B idles. ``w_share`` of ``t_bwd`` is ``W``
  (one half when the matmuls' two gradients cost the same and nothing else is timed). An
  activation is held from its forward until its ``W`` has run (PyTorch's input backward keeps
  the graph for the weight backward). With equal forward, input and weight backward (``t_f``
  each per stage) a step idles only while the first micro-batch's forward crosses ``p - 1``
  chunks, ``(p - 1) t_f/2``, the least any schedule can (1F1B: ``3 (p - 1) t_f``); every rank
  holds ``2p`` chunks (``p`` stage micro-batches, 1F1B's first stage) at its peak once
  ``m >= 2p - 1``.

Qi et al. 2024a: "Zero Bubble (Almost) Pipeline Parallelism", ICLR 2024 (arXiv:2401.10241);
Qi et al. 2024b: "Pipeline Parallelism with Controllable Memory", NeurIPS 2024.

Example:
    >>> from parmem.pipeline import simulate, bubble_fraction
    >>> r = simulate("1f1b", p=4, m=8)
    >>> r.step_time, r.peak_in_flight
    (33.0, [4, 3, 2, 1])
    >>> round(r.bubble_fraction, 4) == round(bubble_fraction(4, 8), 4)
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from ._check import MAX_BATCH, MAX_GPUS, MAX_LAYERS, choice, integer, normalised_cache, number
from .config import SCHEDULES

__all__ = [
    "SCHEDULES",
    "Op",
    "stage_order",
    "Event",
    "PipelineResult",
    "simulate",
    "dependency",
    "list_schedule",
    "bubble_fraction",
    "bubble_ratio",
    "zbv_bubble",
    "in_flight",
    "in_flight_units",
    "in_flight_profile",
    "in_flight_ends",
    "in_flight_timeline",
    "MAX_SIM_OPS",
    "MAX_CHART_CELLS",
    "MAX_TIME",
]

#: the most micro-batch chunks, p·m·v, that :func:`simulate` runs (each is one forward and one
#: backward on every stage it passes): 2**16, about a second of work
MAX_SIM_OPS = 2**16
#: the most characters of a :meth:`PipelineResult.ascii` chart (stages × cells): 2**20
MAX_CHART_CELLS = 2**20
#: the longest ``t_fwd`` or ``t_bwd`` (any unit) that :func:`simulate` takes, and 1/MAX_TIME the
#: shortest: sums of 2**18 of them stay finite and their shares of a stage stay above zero
MAX_TIME = 1e100


def _sizes(p: int, m: int, v: int) -> tuple[int, int, int]:
    """p, m and v as ``int``, within their bounds (:data:`~parmem._check.MAX_GPUS` stages,
    :data:`~parmem._check.MAX_BATCH` micro-batches, :data:`~parmem._check.MAX_LAYERS` chunks)."""
    return (
        integer("p", p, 1, MAX_GPUS),
        integer("m", m, 1, MAX_BATCH),
        integer("v", v, 1, MAX_LAYERS),
    )


def _validate(schedule: str, p: int, m: int, v: int) -> tuple[int, int, int]:
    """The checked schedule's p, m and v as ``int`` (the keys of the caches below)."""
    choice("schedule", schedule, SCHEDULES)
    p, m, v = _sizes(p, m, v)
    if schedule == "zbv":
        if v != 2:
            raise ValueError(
                f"v={v} must be 2 for schedule='zbv' (ZB-V runs two model chunks per rank, in a V)"
            )
    elif schedule == "interleaved":
        if v < 2:
            raise ValueError(
                f"v={v} must be >= 2 for the interleaved schedule (use schedule='1f1b' for v=1)"
            )
        if m % p:
            raise ValueError(
                f"m={m} must be a multiple of p={p} for the interleaved schedule "
                "(Megatron-LM requirement)"
            )
    elif v != 1:
        raise ValueError(
            f"v={v} must be 1 for schedule={schedule!r}; virtual stages need schedule='interleaved'"
        )
    return p, m, v


@dataclass(frozen=True)
class Event:
    """One operation on one stage: a forward (``'F'``) or backward (``'B'``; under ZB-V the
    input-gradient half, with ``'W'`` the weight-gradient half) of one micro-batch through one
    model chunk (chunk is 0 unless interleaved or ZB-V)."""

    stage: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float

    @property
    def label(self) -> str:
        """Short label, ``F3`` or ``B3`` (the chunk is not included)."""
        return f"{self.kind}{self.microbatch}"


@dataclass
class PipelineResult:
    """Timeline and summary statistics of one simulated training step.

    Attributes:
        schedule, p, m, v, t_fwd, t_bwd: the inputs.
        events: every operation, sorted by stage then start time.
        step_time: makespan (the end of the last operation).
        busy: per stage, total time spent computing (``m (t_fwd + t_bwd)``).
        idle: per stage, ``step_time - busy``.
        bubble_fraction: ``sum(idle) / (p * step_time)``.
        peak_in_flight_chunks: per stage, the largest number of (micro-batch,
            chunk) pairs whose forward has ended and whose backward has not
            started: the activations the stage must hold at once.
        peak_in_flight: the same in units of a whole stage's micro-batch
            (``peak_in_flight_chunks / v``), which is what scales activation memory.
    """

    schedule: str
    p: int
    m: int
    v: int
    t_fwd: float
    t_bwd: float
    events: list[Event]
    step_time: float
    busy: list[float]
    idle: list[float]
    bubble_fraction: float
    peak_in_flight: list[float]
    peak_in_flight_chunks: list[int]

    def stage_events(self, stage: int) -> list[Event]:
        """The events of ``stage`` in execution order."""
        stage = integer("stage", stage, 0, self.p - 1)
        return [e for e in self.events if e.stage == stage]

    def to_rows(self) -> list[dict[str, object]]:
        """One dict per stage (for a table): busy, idle, idle fraction, peak in flight."""
        return [
            {
                "stage": i,
                "busy": self.busy[i],
                "idle": self.idle[i],
                "idle_fraction": self.idle[i] / self.step_time,
                "peak_in_flight": self.peak_in_flight[i],
                "peak_in_flight_chunks": self.peak_in_flight_chunks[i],
            }
            for i in range(self.p)
        ]

    def ascii(self) -> str:
        """A text Gantt chart, one line per stage; ``.`` marks idle time.

        One cell is the shortest operation (``min(t_fwd, t_bwd) / v``); an
        operation fills ``round(duration / cell)`` cells, so the drawing is exact
        when ``t_fwd`` and ``t_bwd`` are multiples of the shorter one. Labels are
        ``F<micro-batch>`` / ``B<micro-batch>``, with ``.<chunk>`` when interleaved.
        """
        unit = min(self.t_fwd, self.t_bwd) / self.v

        def label(e: Event) -> str:
            return e.label + (f".{e.chunk}" if self.v > 1 else "")

        width = max(len(label(e)) for e in self.events) + 1
        span = self.step_time / unit
        if not span * width * self.p <= MAX_CHART_CELLS:
            raise ValueError(
                f"ascii: the chart would be {self.p} stages x {span:.3g} cells of {width} "
                f"characters > MAX_CHART_CELLS={MAX_CHART_CELLS} (t_fwd/t_bwd={self.t_fwd}/"
                f"{self.t_bwd} is too uneven, or the pipeline too long, to draw)"
            )
        ncells = round(span)
        rows = [[".".ljust(width)] * ncells for _ in range(self.p)]
        for e in self.events:  # one pass (stage_events per stage would be p passes)
            first, last = round(e.start / unit), round(e.end / unit)
            for c in range(first, min(last, ncells)):
                rows[e.stage][c] = (label(e) if c == first else "").ljust(width)
        lines = [f"S{i} |" + "".join(row).rstrip() for i, row in enumerate(rows)]
        return "\n".join(lines)


class Op(NamedTuple):
    """One operation of a stage: ``kind`` ``"F"``, ``"B"`` or (ZB-V) ``"W"``, its micro-batch
    and its chunk."""

    kind: str
    microbatch: int
    chunk: int


def stage_order(schedule: str, p: int, m: int, stage: int, v: int = 1) -> list[Op]:
    """The operations of pipeline stage ``stage`` in the order the schedule runs them
    (Huang et al. 2019; Narayanan et al. 2021 §2.2), without simulating the other stages: O(m·v)
    work, whatever p."""
    p, m, v = _validate(schedule, p, m, v)
    stage = integer("stage", stage, 0, p - 1)
    return [Op(*o) for o in _stage_order(schedule, p, m, v, stage)]


def _stage_order(schedule: str, p: int, m: int, v: int, i: int) -> list[tuple[str, int, int]]:
    """Operations ``(kind, microbatch, chunk)`` of stage ``i`` in execution order."""
    if schedule == "gpipe":
        return [("F", k, 0) for k in range(m)] + [("B", k, 0) for k in range(m)]
    if schedule == "zbv":
        return _zbv_order(p, m, i)
    total = m * v
    if schedule == "1f1b":
        warmup = min(p - i - 1, m)

        def fwd(k: int) -> tuple[str, int, int]:
            return ("F", k, 0)

        def bwd(k: int) -> tuple[str, int, int]:
            return ("B", k, 0)

    else:  # interleaved, Megatron-LM schedules.py
        warmup = total if m == p else min(2 * (p - i - 1) + (v - 1) * p, total)

        def fwd(k: int) -> tuple[str, int, int]:
            return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

        def bwd(k: int) -> tuple[str, int, int]:
            return ("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    ops = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [fwd(warmup + k), bwd(k)]
    ops += [bwd(k) for k in range(total - warmup, total)]
    return ops


def _zbv_order(p: int, m: int, i: int) -> list[tuple[str, int, int]]:
    """Rank ``i``'s operations under ZB-V (Qi et al. 2024a §6): chunk 0 is stage ``i`` of the V,
    chunk 1 stage ``2p - 1 - i``. Written for ``n = max(m, 2p - 1)`` micro-batches, the fewest
    that fill the V, and the operations of micro-batches ``>= m`` then dropped, as PyTorch's
    ``ScheduleZBVZeroBubble`` does (``tests/test_pipeline.py`` compares the two orders).

    Phases: chunk 0 runs ``2(p - i) - 1`` forwards alone; then ``i`` forwards of chunk 1, each
    followed by the next of chunk 0; then ``p - i`` times chunk 1's forward, input backward and
    weight backward; the steady phase alternates chunk 0 (forward while any is left, input and
    weight backward) and chunk 1 (the same); the cool-down runs ``i`` pairs of input backwards
    (chunk 0, chunk 1), then ``p - i`` times chunk 0's input backward and the oldest pending
    chunk-0 weight backward, and last the weight backwards still pending (chunk 1's, then
    chunk 0's)."""
    n = max(m, 2 * p - 1)
    ops: list[tuple[str, int, int]] = []
    nxt = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0, ("W", 0): 0, ("W", 1): 0}
    f0, f1, b0, b1, w0, w1 = ("F", 0), ("F", 1), ("B", 0), ("B", 1), ("W", 0), ("W", 1)

    def run(*what: tuple[str, int]) -> None:  # each (kind, chunk): its next micro-batch
        for kind, c in what:
            ops.append((kind, nxt[kind, c], c))
            nxt[kind, c] += 1

    for _ in range(2 * (p - i) - 1):
        run(f0)
    for _ in range(i):
        run(f1, f0)
    for _ in range(p - i):
        run(f1, b1, w1)
    while nxt[f1] < nxt[f0] or nxt[f0] < n:
        if nxt[f0] < n:
            run(f0)
        run(b0, w0, f1, b1, w1)
    for _ in range(i):
        run(b0, b1)
    for _ in range(p - i):
        run(b0, w0)
    for w, b in ((w1, b1), (w0, b0)):  # the weight backwards still pending
        while nxt[w] < nxt[b]:
            run(w)
    return [op for op in ops if op[1] < m]


def _zbv_stage(i: int, c: int, p: int) -> int:
    """The position in the V (0 .. 2p-1) of rank ``i``'s chunk ``c``."""
    return i if c == 0 else 2 * p - 1 - i


def _zbv_rank(s: int, p: int) -> tuple[int, int]:
    """The rank and the chunk that hold position ``s`` of the V."""
    return (s, 0) if s < p else (2 * p - 1 - s, 1)


def _zbv_dependency(kind: str, i: int, c: int, mb: int, p: int) -> tuple[str, int, int, int] | None:
    s = _zbv_stage(i, c, p)
    if kind == "W":  # the weight gradient needs the output's gradient, from its own B
        return ("B", i, c, mb)
    if kind == "F":
        return None if s == 0 else ("F", *_zbv_rank(s - 1, p), mb)
    if s == 2 * p - 1:  # the last chunk's backward starts from the loss of its own forward
        return ("F", i, c, mb)
    return ("B", *_zbv_rank(s + 1, p), mb)


def dependency(
    kind: str, i: int, c: int, mb: int, p: int, v: int, schedule: str = ""
) -> tuple[str, int, int, int] | None:
    """The operation whose output ``(kind, stage i, chunk c, micro-batch mb)`` consumes.

    Chunk ``c`` of stage ``i`` holds layer block ``c p + i`` (Narayanan et al.
    2021, Fig. 4), so the forward of chunk ``c`` on stage 0 follows chunk
    ``c - 1`` on stage ``p - 1``, and backwards run in the reverse order. Under
    ``schedule="zbv"`` chunk ``c`` of rank ``i`` is position ``i`` (c = 0) or ``2p - 1 - i``
    (c = 1) of the V, and a weight backward ``W`` waits for its own input backward.
    """
    if schedule == "zbv":
        return _zbv_dependency(kind, i, c, mb, p)
    if kind == "F":
        if i > 0:
            return ("F", i - 1, c, mb)
        return ("F", p - 1, c - 1, mb) if c > 0 else None
    if i < p - 1:
        return ("B", i + 1, c, mb)
    if c < v - 1:
        return ("B", 0, c + 1, mb)
    return ("F", i, c, mb)


def list_schedule(
    orders: list[list[tuple[str, int, int]]],
    durations: list[list[float]],
    v: int = 1,
    schedule: str = "",
) -> list[list[tuple[str, int, int, float, float]]]:
    """Run each stage's operations in the given order, with free communication.

    ``orders[i]`` lists stage ``i``'s operations as ``(kind, micro-batch, chunk)`` in the order it
    runs them, ``durations[i]`` their lengths. An operation starts when its stage has finished
    the previous one and the operation whose output it consumes (:func:`dependency`) has ended.
    ``schedule="zbv"`` places the chunks in a V (:func:`dependency`).
    Returns, per stage, ``(kind, micro-batch, chunk, start, end)``. :func:`simulate` runs it with
    the schedules' nominal t_f and t_b; ``parmem.distributed.pp.replay`` with a run's measured times.
    Raises ``ValueError`` when the stages wait on each other (orders of no one schedule).
    """
    p = len(orders)
    if len(durations) != p or any(len(d) != len(o) for o, d in zip(orders, durations, strict=True)):
        raise ValueError("durations must hold one time per operation of orders, stage by stage")
    pos = [0] * p
    free = [0.0] * p
    done: dict[tuple[str, int, int, int], float] = {}
    waiting: dict[tuple[str, int, int, int], list[int]] = {}  # an operation -> stages blocked on it
    out: list[list[tuple[str, int, int, float, float]]] = [[] for _ in range(p)]
    ready = list(range(p - 1, -1, -1))  # stages to run, a stack (stage 0 first)
    while ready:  # each operation runs once and wakes only the stages blocked on it: linear work
        i = ready.pop()
        while pos[i] < len(orders[i]):
            kind, mb, c = orders[i][pos[i]]
            dep = dependency(kind, i, c, mb, p, v, schedule)
            if dep is not None and dep not in done:
                waiting.setdefault(dep, []).append(i)
                break
            start = max(free[i], done[dep] if dep is not None else 0.0)
            end = start + durations[i][pos[i]]
            key = (kind, i, c, mb)
            done[key] = free[i] = end
            out[i].append((kind, mb, c, start, end))
            pos[i] += 1
            ready.extend(waiting.pop(key, ()))
    if any(pos[i] < len(orders[i]) for i in range(p)):
        raise ValueError(
            f"orders cannot run: the stages wait on each other at positions {pos} "
            "(not one run of one schedule)"
        )
    return out


def simulate(
    schedule: str,
    p: int,
    m: int,
    v: int = 1,
    t_fwd: float = 1.0,
    t_bwd: float = 2.0,
    w_share: float = 0.5,
) -> PipelineResult:
    """Simulate one training step of a pipeline schedule (see the module docstring).

    Args:
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` or ``"zbv"``.
        p: pipeline stages (ranks), >= 1.
        m: micro-batches per step, >= 1 (a multiple of ``p`` when interleaved).
        v: model chunks per stage; 1 unless ``schedule == "interleaved"`` (then >= 2) or
            ``"zbv"`` (then 2).
        t_fwd: forward time of one micro-batch through one whole stage (> 0).
        t_bwd: backward time of the same (> 0); 2 * t_fwd is the usual assumption.
        w_share: under ZB-V, the share of ``t_bwd`` that is the weights' gradient (``W``), in
            (0, 1); the rest is the input's gradient (``B``). One half: a matmul's two
            gradients cost one forward each (Qi et al. 2024a §2).

    Returns:
        A :class:`PipelineResult`.

    Raises:
        ValueError: invalid argument; the message names it and the rule. The work is bounded:
            p·m·v above :data:`MAX_SIM_OPS` is refused (the closed forms, :func:`in_flight_units`
            and :func:`bubble_fraction`, answer for any size), and so are times outside
            [1/:data:`MAX_TIME`, :data:`MAX_TIME`].
    """
    p, m, v = _validate(schedule, p, m, v)
    if p * m * v > MAX_SIM_OPS:
        raise ValueError(
            f"simulate: p*m*v = {p}*{m}*{v} = {p * m * v} > MAX_SIM_OPS={MAX_SIM_OPS} "
            "(use the closed forms in_flight_units and bubble_fraction for a pipeline this long)"
        )
    t_fwd, t_bwd = (_time(name, t) for name, t in (("t_fwd", t_fwd), ("t_bwd", t_bwd)))
    w = number("w_share", w_share, 0, 1, lo_open=True, hi_open=True)
    dur = {"F": t_fwd / v, "B": t_bwd / v}
    if schedule == "zbv":
        dur.update(B=(1 - w) * t_bwd / v, W=w * t_bwd / v)
    orders = [_stage_order(schedule, p, m, v, i) for i in range(p)]
    timed = list_schedule(orders, [[dur[k] for k, _, _ in o] for o in orders], v, schedule)
    by_stage = [
        [Event(i, k, mb, c, t0, t1) for k, mb, c, t0, t1 in evs] for i, evs in enumerate(timed)
    ]
    step_time = max((evs[-1].end for evs in by_stage if evs), default=0.0)
    busy = [sum(e.end - e.start for e in evs) for evs in by_stage]
    idle = [step_time - b for b in busy]
    peaks = [_peak(((e.kind for e in evs)), schedule) for evs in by_stage]
    return PipelineResult(
        schedule=schedule,
        p=p,
        m=m,
        v=v,
        t_fwd=t_fwd,
        t_bwd=t_bwd,
        events=[e for evs in by_stage for e in evs],
        step_time=step_time,
        busy=busy,
        idle=idle,
        bubble_fraction=sum(idle) / (p * step_time),
        peak_in_flight=[c if v == 1 else c / v for c in peaks],
        peak_in_flight_chunks=peaks,
    )


def _peak(kinds: Iterable[str], schedule: str) -> int:
    """The most chunks held at once by a stage that runs operations of ``kinds`` in that order:
    a forward adds one, a backward (under ZB-V the weight backward) releases one."""
    release = "W" if schedule == "zbv" else "B"
    count = peak = 0
    for k in kinds:
        if k == "F":
            count += 1
            peak = max(peak, count)
        elif k == release:
            count -= 1
    return peak


def _time(name: str, value: float) -> float:
    """An operation's time as a float in [1/MAX_TIME, MAX_TIME]."""
    t = number(name, value, 0, lo_open=True)
    if not 1 / MAX_TIME <= t <= MAX_TIME:
        raise ValueError(
            f"{name}={t!r} must be in [1/MAX_TIME, MAX_TIME] = [{1 / MAX_TIME}, {MAX_TIME}] "
            "(scale the times)"
        )
    return t


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle fraction of a pipeline step, uniform stages, ``(p-1) / (v m + p - 1)``.

    Derivation: the bubble lasts ``(p - 1)(t_f + t_b) / v`` (Narayanan et al.
    2021, §2.2.1 for v = 1, §2.2.2 for the division by v) and the useful work
    ``m (t_f + t_b)``, so the step is ``(m + (p-1)/v)(t_f + t_b)`` and the idle
    fraction ``((p-1)/v) / (m + (p-1)/v)``. For v = 1 this is GPipe's
    ``(p-1)/(m+p-1)`` (Huang et al. 2019, §2.3); it holds for GPipe and 1F1B alike.
    """
    p, m, v = _sizes(p, m, v)
    return (p - 1) / (v * m + p - 1)


def zbv_bubble(p: int, m: int, t_f: float, t_b: float, t_w: float) -> float:
    """Idle time of a ZB-V step on its busiest rank: the step's length minus ``m (t_f + t_b +
    t_w)``, for ``p`` ranks of equal work whose forward, input backward and weight backward of
    one micro-batch (both chunks together) take ``t_f``, ``t_b`` and ``t_w`` (Qi et al. 2024a
    §6; :func:`simulate` with ``w_share = t_w/(t_b + t_w)``).

    With ``m >= 2p - 1`` the bubble does not grow with ``m`` and grows linearly with ``p``
    (the warm-up and the cool-down are what idles; the steady phase keeps every rank busy), so
    two small simulations, at p = 2 and 3, answer for any p in O(1): ``tests/test_pipeline.py``
    checks that against the full simulation for random times. With fewer micro-batches the
    V is not full and the step is simulated whole. Both are cached on the ratios
    ``t_b/t_f`` and ``t_w/t_f`` to seven significant digits, which keeps the bubble within
    1e-5 of the exact one, relative (it is piecewise linear in them). ``t_f = t_b = t_w = t`` gives ``(p - 1)
    t/2``, where 1F1B idles ``3 (p - 1) t``."""
    p, m, _ = _sizes(p, m, 2)
    t_f, t_b, t_w = (_time(n, t) for n, t in (("t_f", t_f), ("t_b", t_b), ("t_w", t_w)))
    if p == 1:
        return 0.0
    # the bubble scales with the times: one cache entry per ratio, each rounded to 7 significant
    # digits (the bubble is piecewise linear in them and at least (p - 1) t_f/2: within 1e-5)
    r_b, r_w = float(f"{t_b / t_f:.7g}"), float(f"{t_w / t_f:.7g}")
    if m < 2 * p - 1:
        return t_f * _zbv_short(p, m, r_b, r_w)
    b2, slope = _zbv_affine(r_b, r_w)
    return t_f * (b2 + (p - 2) * slope)


@normalised_cache(maxsize=4096)
def _zbv_short(p: int, m: int, t_b: float, t_w: float) -> float:
    """The ZB-V bubble for t_f = 1 when the V is not full (m < 2p - 1): the whole step."""
    return _zbv_idle(p, m, 1.0, t_b, t_w)


def _zbv_idle(p: int, m: int, t_f: float, t_b: float, t_w: float) -> float:
    """The step of :func:`simulate` ("zbv") less the work: the same list schedule, run on the
    operations' dependency graph laid out once per (p, m) (:func:`_zbv_graph`)."""
    dur = (t_f / 2, t_b / 2, t_w / 2)
    end = [0.0] * len(_zbv_graph(p, m))
    for i, (kind, prev, dep) in enumerate(_zbv_graph(p, m)):
        end[i] = max(end[prev] if prev >= 0 else 0.0, end[dep] if dep >= 0 else 0.0) + dur[kind]
    return max(end) - m * (t_f + t_b + t_w)


@normalised_cache(maxsize=256)
def _zbv_graph(p: int, m: int) -> tuple[tuple[int, int, int], ...]:
    """Every operation of a ZB-V step in an order that runs each after the one before it on its
    rank and the one it consumes (:func:`dependency`), as (kind 0/1/2 for F/B/W, the position
    of the one before on its rank, the position of the one it consumes; -1: none)."""
    orders = [_zbv_order(p, m, i) for i in range(p)]
    pos = [0] * p
    where: dict[tuple[str, int, int, int], int] = {}
    out: list[tuple[int, int, int]] = []
    last = [-1] * p
    moved = True
    while moved:  # each sweep runs, rank by rank, every operation whose input has run
        moved = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, mb, c = orders[i][pos[i]]
                dep = _zbv_dependency(kind, i, c, mb, p)
                if dep is not None and dep not in where:
                    break
                where[(kind, i, c, mb)] = len(out)
                out.append(("FBW".index(kind), last[i], -1 if dep is None else where[dep]))
                last[i] = len(out) - 1
                pos[i] += 1
                moved = True
    return tuple(out)


@normalised_cache(maxsize=4096)
def _zbv_affine(t_b: float, t_w: float) -> tuple[float, float]:
    """The ZB-V bubble at p = 2 and its growth per rank, for t_f = 1 (m >= 2p - 1)."""
    b2 = _zbv_idle(2, 4, 1.0, t_b, t_w)
    return b2, _zbv_idle(3, 6, 1.0, t_b, t_w) - b2


def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Bubble time relative to the ideal compute time, ``(p - 1) / (v m)``.

    Source: Narayanan et al. 2021, §2.2.1 ("bubble time fraction" ``(p-1)/m``)
    and §2.2.2 (interleaving divides it by ``v``).
    """
    p, m, v = _sizes(p, m, v)
    return (p - 1) / (v * m)


def in_flight_units(schedule: str, p: int, m: int, stage: int, v: int = 1) -> int:
    """How many (micro-batch, model chunk) activations ``stage`` holds at its peak: the one
    in-flight count of parmem (the estimator, the planner and the allocator trace use it; the
    event simulator, :func:`simulate`, reproduces it in the tests).

    With v = 1 a chunk is the whole stage, so this is the number of micro-batches in flight:

    * GPipe: all ``m`` (every forward precedes every backward; Huang et al. 2019);
    * 1F1B: ``min(p - i, m)`` on stage i (Narayanan et al. 2021 §2.2.1: the warm-up of
      ``p - i - 1`` forwards plus the forward of the first steady step);
    * interleaved: ``min(2(p - i - 1) + (v - 1)p + 1, m·v)`` chunks of L/(pv) layers, which is
      Megatron-LM's warm-up count plus one (``forward_backward_pipelining_with_interleaving``);
      when m == p every forward runs first and all m·v chunks are held. On stage 0 with m > p this
      is p(1 + (p-1)/(pv)) stage-equivalents, Korthikanti et al. 2022 §4.2.3.
    * ZB-V (v = 2): counted on the rank's own order, a chunk held from its forward until its
      weight backward: ``2p`` chunks of L/(2p) layers on every rank once ``m >= 2p - 1``, the
      activations of 1F1B's first stage, now on every rank (Qi et al. 2024a §6 give ZB-V
      1F1B's peak memory); fewer for fewer micro-batches.
    """
    p, m, v = _validate(schedule, p, m, v)
    stage = integer("stage", stage, 0, p - 1)
    return _units(schedule, p, m, v, stage)


def in_flight_profile(schedule: str, p: int, m: int, v: int = 1) -> tuple[int, ...]:
    """:func:`in_flight_units` of every stage 0..p-1 (validated once; what the estimator uses).

    One closed form per stage, so the work is p entries (p <= ``parmem._check.MAX_GPUS``)
    whatever m and v; the cache is keyed on the checked ``int`` values only (a NumPy integer and
    the equal ``int`` share one entry, with the same answer).
    """
    return _profile(schedule, *_validate(schedule, p, m, v))


@normalised_cache(maxsize=512)
def _profile(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    if schedule == "gpipe" or (schedule == "interleaved" and m == p):
        return (m * v,) * p
    if schedule == "zbv":
        return tuple(_zbv_units(p, m, i) for i in range(p))
    if schedule == "1f1b":
        return tuple(min(p - i, m) for i in range(p))
    cap, top = m * v, (v - 1) * p + 1
    return tuple(min(2 * (p - i - 1) + top, cap) for i in range(p))


def in_flight_ends(schedule: str, p: int, m: int, v: int = 1) -> tuple[int, int]:
    """Micro-batches in flight through the model's first chunk (what the embedding's output
    occupies) and through its last chunk (the LM head's logits), at their peaks. 1F1B, GPipe
    and interleaved: the first and the last stage's :func:`in_flight_units`, rounded up to whole
    micro-batches. ZB-V puts both chunks on rank 0, counted on its order: ``min(m, 2p)`` (for
    ``m >= 2p - 1``) through the first, and 1 through the last, whose forward, input backward and weight
    backward run back to back."""
    p, m, v = _validate(schedule, p, m, v)
    return _ends(schedule, p, m, v)


@normalised_cache(maxsize=512)
def _ends(schedule: str, p: int, m: int, v: int) -> tuple[int, int]:
    if schedule != "zbv":
        prof = _profile(schedule, p, m, v)
        return -(-prof[0] // v), -(-prof[-1] // v)
    ops = _zbv_order(p, m, 0)
    return tuple(_peak((k for k, _, c in ops if c == chunk), "zbv") for chunk in (0, 1))  # type: ignore[return-value]


def _zbv_units(p: int, m: int, i: int) -> int:
    """Chunks rank ``i`` holds at its peak under ZB-V: ``2p`` once ``m >= 2p - 1`` (the V is
    full; the order's count, which the tests check), else counted on the order (O(p) work)."""
    if m >= 2 * p - 1:
        return 2 * p
    return _peak((k for k, _, _ in _zbv_order(p, m, i)), "zbv")


def _units(schedule: str, p: int, m: int, v: int, stage: int) -> int:
    if schedule == "zbv":
        return _zbv_units(p, m, stage)
    if schedule == "gpipe":
        return m * v
    if schedule == "1f1b":
        return min(p - stage, m) * v
    if m == p:  # Megatron-LM runs every forward first when m == p (all_warmup_microbatches)
        return m * v
    return min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)


def in_flight(schedule: str, p: int, m: int, v: int = 1, stage: int = 0) -> float:
    """Peak in-flight micro-batches on ``stage`` in units of a whole stage's micro-batch:
    :func:`in_flight_units` divided by v. Activation memory of a stage is this number times one
    micro-batch's activations for the stage's layers.

    Returns an ``int`` for GPipe and 1F1B, a ``float`` for interleaved.
    """
    units = in_flight_units(schedule, p, m, stage, v)
    return units if v == 1 else units / v


def in_flight_timeline(result: PipelineResult, stage: int) -> list[tuple[float, float]]:
    """Micro-batches whose activations ``stage`` holds, over time: ``[(time, count), ...]``.

    A micro-batch (of one chunk) starts to occupy memory when its forward starts and is released
    when its backward ends (under ZB-V its weight backward). The count is in units of a whole stage's micro-batch (chunks count
    ``1/v``). The list starts at ``(0.0, 0)``, has one point per change (releases at an instant
    are applied before arrivals at the same instant) and ends at ``(step_time, 0)``; its largest
    count equals ``result.peak_in_flight[stage]``. Use it to draw memory against time
    (:func:`parmem.book.plots.plot_in_flight`).
    """
    if not isinstance(result, PipelineResult):
        raise ValueError(f"result must be a PipelineResult, got {type(result).__name__}")
    stage = integer("stage", stage, 0, result.p - 1)
    changes: list[tuple[float, int]] = []
    release = "W" if result.schedule == "zbv" else "B"  # ZB-V holds a chunk until its W
    for e in result.stage_events(stage):
        if e.kind == "F":
            changes.append((e.start, +1))
        elif e.kind == release:
            changes.append((e.end, -1))
    changes.sort()  # at equal times -1 sorts before +1: a release before an arrival
    points: list[tuple[float, float]] = [(0.0, 0)]
    count = 0
    for t, delta in changes:
        count += delta
        value = count if result.v == 1 else count / result.v
        if points[-1][0] == t:
            points[-1] = (t, value)
        else:
            points.append((t, value))
    if points[-1][0] != result.step_time:
        points.append((result.step_time, points[-1][1]))
    return points
