"""Pipeline parallelism: GPipe, 1F1B and interleaved 1F1B with ``torch.distributed.pipelining``.

The model is a stack of L tanh-MLP blocks cut into p stages of L/p blocks (one stage per rank), or
into p·v chunks of L/(pv) blocks for the interleaved schedule (chunk c of rank i is stage c·p + i,
Narayanan et al. 2021 §2.2.2). Every stage is built with explicit ``input_args``/``output_args``,
so no shape-inference forward runs and no extra micro-batch is kept.

What a stage holds between a micro-batch's forward and its backward is measured, not assumed:
each stage module runs its forward under ``torch.autograd.graph.saved_tensors_hooks`` whose pack
hook wraps every saved tensor in a small holder; a holder is released when autograd frees the
graph after that micro-batch's backward. A micro-batch (of one chunk) is *stashed* while any of
its holders is alive. The peak number stashed per stage is compared with
:func:`parmem.pipeline.simulate`: GPipe holds all m micro-batches on every stage (Huang et al.
2019); 1F1B holds p − i on stage i (Narayanan et al. 2021 §2.2.1).

Times are wall-clock on this machine: idle time per stage is the step time minus the time spent
in this stage's forward and backward; ``sim_idle_s`` is the simulator's idle time with this
stage's measured forward and backward times. The simulator assumes free communication; on CPU a
tiny stage's compute takes microseconds and each gloo send/recv far longer, so measured idle time
is mostly communication, and on an oversubscribed CPU (4 ranks on 2 cores) it is noisy. The
operation *order* per stage is exact and is compared with the simulator's.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from parmem.dist.launcher import device, rank, world_size

__all__ = ["make_model", "StashMeter", "demo"]


def make_model(layers: int, hidden: int) -> nn.Sequential:
    """L blocks of Linear(h, h) → tanh (fp32)."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
                           for _ in range(layers)])


class _Holder:
    __slots__ = ("t", "meter", "key")

    def __init__(self, t, meter, key):
        self.t, self.meter, self.key = t, meter, key
        meter.live[key] = meter.live.get(key, 0) + 1

    def __del__(self):
        m = self.meter
        m.live[self.key] -= 1
        if not m.live[self.key]:
            del m.live[self.key]
            m.events.append(("B", *self.key, m.bwd_start.pop(self.key, None),
                             time.perf_counter()))


class StashMeter(nn.Module):
    """Wrap a stage module; record F/B events and the peak number of stashed micro-batches.

    ``live`` maps (micro-batch, chunk) to its count of live saved tensors; ``peak`` is the largest
    number of keys alive at once; ``events`` are (kind, micro-batch, chunk, start, end).
    """

    def __init__(self, inner: nn.Module, chunk: int, shared: dict):
        super().__init__()
        self.inner, self.chunk = inner, chunk
        self.n_fwd = 0
        self.live = shared.setdefault("live", {})
        self.events = shared.setdefault("events", [])
        self.bwd_start = shared.setdefault("bwd_start", {})
        self.shared = shared
        shared.setdefault("peak", 0)

    def forward(self, x):
        key = (self.n_fwd, self.chunk)
        self.n_fwd += 1
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: _Holder(t, self, key),
                                                      lambda h: h.t):
            out = self.inner(x)
        self.shared["peak"] = max(self.shared["peak"], len(self.live))
        self.events.append(("F", *key, t0, time.perf_counter()))
        out.register_hook(lambda g: self._bwd_begins(key))
        return out

    def _bwd_begins(self, key) -> None:
        self.bwd_start.setdefault(key, time.perf_counter())


def demo(schedule: str = "1f1b", microbatches: int | None = None, v: int = 2,
         layers: int | None = None, hidden: int = 32, microbatch_size: int = 4) -> dict:
    """Train one step of the pipelined model; compare with the unpipelined model and simulate().

    ``schedule``: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"`` (``v`` chunks per rank). Defaults:
    m = 2p micro-batches, L = p·v blocks (v = 1 unless interleaved).

    Returns per rank (= stage): ``grad_err`` (vs. the unpipelined model; ``loss_err`` on the last
    stage), ``peak_stashed`` (micro-batches, in whole-stage units; ``peak_stashed_chunks`` counts
    chunk-micro-batches) and ``sim_peak_stashed``, the operation ``order`` and whether it equals
    the simulator's, and times (``step_s``, ``busy_s``, ``idle_s``, ``t_fwd_s``, ``t_bwd_s``,
    ``sim_idle_s``, ``sim_idle_fraction``). With ``hidden=1024, microbatch_size=128, layers=8``
    (about 1 s per schedule at p = 2) compute outweighs gloo's latency and the measured idle
    fraction comes within a few points of the simulator's.
    """
    import torch.distributed as dist
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    from parmem.pipeline import simulate

    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
               "interleaved": ScheduleInterleaved1F1B}
    if schedule not in classes:
        raise ValueError(f"schedule={schedule!r} must be one of {tuple(classes)}")
    p, r, dev = world_size(), rank(), device()
    v = v if schedule == "interleaved" else 1
    m = microbatches or 2 * p
    layers = layers or p * v
    if layers % (p * v):
        raise ValueError(f"layers={layers} must be a multiple of p*v={p * v}")
    if schedule == "interleaved" and m % p:
        raise ValueError(f"microbatches={m} must be a multiple of p={p} when interleaved")
    torch.manual_seed(0)
    full = make_model(layers, hidden).to(dev)
    x = torch.randn(m * microbatch_size, hidden, device=dev)
    y = torch.randn(m * microbatch_size, hidden, device=dev)
    ref_loss = nn.functional.mse_loss(full(x), y)
    ref_loss.backward()

    per = layers // (p * v)
    shared: dict = {}
    stages, metered = [], []
    for c in range(v):
        idx = c * p + r
        part = make_model(per, hidden).to(dev)
        part.load_state_dict(nn.Sequential(*full[idx * per:(idx + 1) * per]).state_dict())
        mod = StashMeter(part, c, shared)
        metered.append((idx, mod))
        shape = (microbatch_size, hidden)  # outputs (and non-first inputs) carry gradients
        inp = torch.empty(shape, device=dev, requires_grad=idx > 0)
        outp = torch.empty(shape, device=dev, requires_grad=True)
        stages.append(PipelineStage(mod, idx, p * v, dev, input_args=inp, output_args=outp))
    sched = classes[schedule](stages if schedule == "interleaved" else stages[0], m,
                              loss_fn=nn.functional.mse_loss)
    losses: list = []
    dist.barrier()
    t0 = time.perf_counter()
    if r == 0:
        sched.step(x)
    elif r == p - 1:
        sched.step(target=y, losses=losses)
    else:
        sched.step()
    step_time = time.perf_counter() - t0
    dist.barrier()

    grad_err = 0.0
    for idx, mod in metered:
        ref = nn.Sequential(*full[idx * per:(idx + 1) * per])
        for a, b in zip(mod.inner.parameters(), ref.parameters(), strict=True):
            grad_err = max(grad_err, float((a.grad - b.grad).abs().max()))
    ev = sorted(shared["events"], key=lambda e: e[3] if e[3] is not None else e[4])
    busy = sum(e[4] - e[3] for e in ev if e[3] is not None)
    t_f = sum(e[4] - e[3] for e in ev if e[0] == "F") / (m * v)
    t_b = sum(e[4] - e[3] for e in ev if e[0] == "B" and e[3] is not None) / (m * v)
    sim = simulate(schedule, p, m, v, t_fwd=1.0, t_bwd=2.0)
    timed = simulate(schedule, p, m, v, t_fwd=max(t_f * v, 1e-9), t_bwd=max(t_b * v, 1e-9))
    sim_order = [(e.kind, e.microbatch, e.chunk) for e in sim.stage_events(r)]
    order = [(e[0], e[1], e[2]) for e in ev]
    out = {
        "stage": r, "microbatches": m, "grad_err": grad_err,
        "peak_stashed": shared["peak"] / v, "peak_stashed_chunks": shared["peak"],
        "sim_peak_stashed": sim.peak_in_flight[r],
        "order_matches_sim": order == sim_order,
        "order": " ".join(f"{k}{mb}" + (f".{c}" if v > 1 else "") for k, mb, c in order),
        "step_s": step_time, "busy_s": busy, "idle_s": step_time - busy,
        "t_fwd_s": t_f * v, "t_bwd_s": t_b * v,
        "sim_idle_fraction": sim.idle[r] / sim.step_time,
        "sim_idle_s": timed.idle[r],  # the simulator with this stage's measured t_fwd, t_bwd
    }
    if r == p - 1:
        out["loss_err"] = abs(torch.stack(losses).mean().item() - ref_loss.item())
    return out
