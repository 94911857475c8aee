"""Pipeline parallelism: GPipe, 1F1B, interleaved 1F1B and ZB-V with ``torch.distributed.pipelining``.

The model is a stack of L tanh-MLP blocks cut into p stages of L/p blocks (one stage per rank), or
into p·v chunks of L/(pv) blocks for the interleaved schedule (chunk c of rank i is stage c·p + i,
Narayanan et al. 2021 §2.2.2), or into 2p chunks in a V for ZB-V (rank i holds stages i and
2p − 1 − i; Qi et al. 2024a §6, PyTorch's ``ScheduleZBVZeroBubble``). Every stage is built with explicit ``input_args``/``output_args``,
so no shape-inference forward runs and no extra micro-batch is kept.

What a stage holds between a micro-batch's forward and its backward is measured, not assumed:
each stage module runs its forward under ``torch.autograd.graph.saved_tensors_hooks`` whose pack
hook wraps every saved tensor in a small holder; a holder is released when autograd frees the
graph after that micro-batch's backward. A micro-batch (of one chunk) is *stashed* while any of
its holders is alive. The peak number stashed per stage is compared with
:func:`parmem.pipeline.simulate`: GPipe holds all m micro-batches on every stage (Huang et al.
2019); 1F1B holds p − i on stage i (Narayanan et al. 2021 §2.2.1).

Times come from the schedule's own events: every forward and backward of every stage is stamped
with ``time.perf_counter`` (CLOCK_MONOTONIC on Linux, one clock for all processes of a machine),
so :func:`bubble_rows` can put the ranks on one timeline. The pipeline's step runs from the first
operation on any stage to the last; a stage's idle time is that step less its own operations,
which is how :func:`parmem.pipeline.simulate` counts it. The simulator assumes free
communication; on CPU a tiny stage's compute takes microseconds and each gloo send/recv far
longer, so without emulated compute (``delay_ms``, :class:`Delay`) measured idle time is mostly
communication. The operation *order* per stage is exact and is compared with the simulator's;
what a run's times guarantee on any machine, however loaded, is a lower bound: :func:`replay`
re-runs the schedule with the measured operation times and free communication, and no real step
or idle time is shorter than the replay's.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from parmem.distributed.launcher import device, rank, world_size

__all__ = ["make_model", "StashMeter", "demo"]


def make_model(layers: int, hidden: int) -> nn.Sequential:
    """L blocks of Linear(h, h) → tanh (fp32)."""
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) for _ in range(layers)]
    )


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
            m.events.append(("B", *self.key, m.bwd_start.pop(self.key, None), time.perf_counter()))


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
        self.shared["key"] = key  # what a Delay inside logs its sleeps under
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: _Holder(t, self, key), lambda h: h.t
        ):
            out = self.inner(x)
        self.shared["peak"] = max(self.shared["peak"], len(self.live))
        self.events.append(("F", *key, t0, time.perf_counter()))
        out.register_hook(lambda g: self._bwd_begins(key))
        return out

    def _bwd_begins(self, key) -> None:
        self.bwd_start.setdefault(key, time.perf_counter())


class Events(tuple):
    """The (kind, micro-batch, chunk, start, end) events of one stage: a tuple whose repr is
    short, so that tables of demo results (``python -m parmem.distributed pp``) stay readable."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{len(self)} events>"


def demo(
    schedule: str = "1f1b",
    microbatches: int | None = None,
    v: int = 2,
    layers: int | None = None,
    hidden: int = 32,
    microbatch_size: int = 4,
    delay_ms: tuple[float, float] | None = None,
) -> dict:
    """Train one step of the pipelined model; compare with the unpipelined model and simulate().

    ``schedule``: ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` (``v`` chunks per rank) or ``"zbv"``
    (two chunks per rank in a V; each backward split into the input's gradient and the weights',
    and a chunk's saved tensors live until the latter has run). Defaults: m = 2p micro-batches,
    L = p·v blocks (v = 1 unless interleaved, 2 for ZB-V).

    Returns per rank (= stage): ``grad_err`` (vs. the unpipelined model; ``loss_err`` on the last
    stage), ``peak_stashed`` (micro-batches, in whole-stage units; ``peak_stashed_chunks`` counts
    chunk-micro-batches) and ``sim_peak_stashed``, the operation ``order`` and whether it equals
    the simulator's, ``events`` (kind, micro-batch, chunk, start, end; seconds on the machine's
    monotonic clock; with ``delay_ms`` the emulated compute's own sleeps, otherwise each
    forward, and each backward from its output's gradient to the release of its saved tensors),
    this stage's ``busy_s`` and mean ``t_fwd_s``, ``t_bwd_s`` (whole stage), ``emulated``
    (whether ``delay_ms`` was given),
    and ``sim_idle_fraction`` (the simulator with t_b = 2 t_f). :func:`bubble_rows` puts the
    events of all ranks on one timeline and returns the idle times.

    ``delay_ms=(t_fwd, t_bwd)`` adds that much time (milliseconds, split over the v chunks) to
    every micro-batch's forward and backward on every stage by sleeping (:class:`Delay`): the
    emulated compute of a GPU, which makes the timing independent of how many CPU cores the
    ranks share. Default ``None``: no delay.
    """
    import torch.distributed as dist
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleZBVZeroBubble,
    )

    from parmem.pipeline import simulate

    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
               "zbv": ScheduleZBVZeroBubble}  # fmt: skip
    if schedule not in classes:
        raise ValueError(f"schedule={schedule!r} must be one of {tuple(classes)}")
    p, r, dev = world_size(), rank(), device()
    multi = schedule in ("interleaved", "zbv")  # several chunks (stages) per rank
    v = 2 if schedule == "zbv" else v if schedule == "interleaved" else 1
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
        idx = (r if c == 0 else 2 * p - 1 - r) if schedule == "zbv" else c * p + r
        part = make_model(per, hidden).to(dev)
        part.load_state_dict(nn.Sequential(*full[idx * per : (idx + 1) * per]).state_dict())
        if delay_ms is not None:
            part = nn.Sequential(
                part,
                Delay(
                    delay_ms[0] / v,
                    delay_ms[1] / v,
                    log=shared.setdefault("sleeps", []),
                    tag=lambda: shared["key"],
                ),
            )
        mod = StashMeter(part, c, shared)
        metered.append((idx, mod))
        shape = (microbatch_size, hidden)  # outputs (and non-first inputs) carry gradients
        inp = torch.empty(shape, device=dev, requires_grad=idx > 0)
        outp = torch.empty(shape, device=dev, requires_grad=True)
        stages.append(PipelineStage(mod, idx, p * v, dev, input_args=inp, output_args=outp))
    sched = classes[schedule](stages if multi else stages[0], m, loss_fn=nn.functional.mse_loss)
    losses: list = []
    last = 0 if schedule == "zbv" else p - 1  # the rank of the model's last chunk
    dist.barrier()
    _step(sched, r == 0, r == last, x, y, losses)
    dist.barrier()

    grad_err = 0.0
    for idx, mod in metered:
        ref = nn.Sequential(*full[idx * per : (idx + 1) * per])
        for a, b in zip(mod.inner.parameters(), ref.parameters(), strict=True):
            grad_err = max(grad_err, float((a.grad - b.grad).abs().max()))
    ev = sorted(shared["events"], key=lambda e: e[3] if e[3] is not None else e[4])
    sim = simulate(schedule, p, m, v, t_fwd=1.0, t_bwd=2.0)
    # a "B" event here starts with the output's gradient and ends when the chunk's saved tensors
    # are released (under ZB-V at the end of its W); events are ordered by their start
    sim_order = [(e.kind, e.microbatch, e.chunk) for e in sim.stage_events(r) if e.kind != "W"]
    order = [(e[0], e[1], e[2]) for e in ev]
    if "sleeps" in shared:  # emulated compute: the sleeps themselves are the operations
        ev = sorted((k, *tag, t0, t1) for k, tag, t0, t1 in shared["sleeps"])
        ev.sort(key=lambda e: e[3])
    busy = sum(e[4] - e[3] for e in ev if e[3] is not None)
    t_f = sum(e[4] - e[3] for e in ev if e[0] == "F") / (m * v)
    t_b = sum(e[4] - e[3] for e in ev if e[0] == "B" and e[3] is not None) / (m * v)
    out = {
        "stage": r,
        "microbatches": m,
        "grad_err": grad_err,
        "peak_stashed": shared["peak"] / v,
        "peak_stashed_chunks": shared["peak"],
        "sim_peak_stashed": sim.peak_in_flight[r],
        "order_matches_sim": order == sim_order,
        "order": " ".join(f"{k}{mb}" + (f".{c}" if v > 1 else "") for k, mb, c in order),
        "events": Events(tuple(e) for e in ev),
        "busy_s": busy,
        "t_fwd_s": t_f * v,
        "t_bwd_s": t_b * v,
        "schedule": schedule,
        "v": v,
        "sim_idle_fraction": sim.idle[r] / sim.step_time,
        "emulated": delay_ms is not None,
    }
    if r == last:
        out["loss_err"] = abs(torch.stack(losses).mean().item() - ref_loss.item())
    return out


def _step(sched, first: bool, last: bool, x, y, losses: list) -> None:
    """One step of ``sched`` on a rank that holds the model's first chunk (it feeds ``x``), its
    last (it computes the loss against ``y``), both (ZB-V's rank 0) or neither."""
    kw = {"target": y, "losses": losses} if last else {}
    if first:
        sched.step(x, **kw)
    else:
        sched.step(**kw)


# ---------------------------------------------------------------------------- emulated compute
class _Sleep(torch.autograd.Function):
    """Identity that sleeps ``t_fwd`` seconds in forward and ``t_bwd`` in backward, and appends
    (kind, tag, start, end) of each sleep to ``log`` when one is given."""

    @staticmethod
    def forward(ctx, x, t_fwd: float, t_bwd: float, log, tag):
        ctx.t_bwd, ctx.log, ctx.tag = t_bwd, log, tag
        t0 = time.perf_counter()
        time.sleep(t_fwd)
        if log is not None:
            log.append(("F", tag, t0, time.perf_counter()))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        t0 = time.perf_counter()
        time.sleep(ctx.t_bwd)
        if ctx.log is not None:
            ctx.log.append(("B", ctx.tag, t0, time.perf_counter()))
        return grad, None, None, None, None


class Delay(nn.Module):
    """Emulated compute: an identity that takes ``fwd_ms`` in forward and ``bwd_ms`` in backward
    (sleeping, so ranks that share CPU cores do not slow each other down).

    With ``log`` (a list), every sleep appends ``(kind, tag, start, end)``, kind ``"F"`` or
    ``"B"``, times from ``time.perf_counter``; ``tag()`` names the forward that is running (the
    backward carries its forward's tag)."""

    def __init__(self, fwd_ms: float, bwd_ms: float, log: list | None = None, tag=None):
        super().__init__()
        if not (fwd_ms >= 0 and bwd_ms >= 0):
            raise ValueError(f"delay_ms=({fwd_ms}, {bwd_ms}) must be >= 0")
        self.t_fwd, self.t_bwd = fwd_ms / 1e3, bwd_ms / 1e3
        self.log, self.tag = log, tag

    def forward(self, x):
        tag = self.tag() if self.tag is not None else None
        return _Sleep.apply(x, self.t_fwd, self.t_bwd, self.log, tag)


# ---------------------------------------------------------------------------- a pipelined GPT
class _LiveSaved:
    """Live bytes of the tensors autograd saves on this rank (each storage once) and their peak,
    and the micro-batches they belong to.

    Every saved tensor is wrapped in a :class:`_SavedRef` while its graph lives; a storage counts
    from its first save until its last reference is released (after its micro-batch's backward).
    Parameters are excluded: they are model state. Each reference is tagged with the micro-batch
    whose forward saved it (:meth:`next_microbatch`, called before every forward of the stage); a
    micro-batch is *in flight* while any of its references is alive. ``in_flight_at_peak`` is
    how many were in flight when the live bytes reached ``peak``; ``peak_in_flight`` the most at
    any time.
    """

    def __init__(self, exclude=()):
        from parmem.measure import storage_key_and_bytes

        self._key = storage_key_and_bytes
        self.exclude = {storage_key_and_bytes(p)[0] for p in exclude}
        self.refs: dict = {}
        self.sizes: dict = {}
        self.live = self.peak = 0
        self.mb = -1
        self.mb_refs: dict = {}
        self.in_flight_at_peak = self.peak_in_flight = 0

    def next_microbatch(self, *_args) -> None:
        """A forward of the stage begins: what it saves belongs to the next micro-batch."""
        self.mb += 1

    def _pack(self, t):
        key, n = self._key(t)
        return t if key in self.exclude else _SavedRef(t, self, key, n)

    @staticmethod
    def _unpack(h):
        return h.t if isinstance(h, _SavedRef) else h

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)


class _SavedRef:
    __slots__ = ("t", "meter", "key", "mb")

    def __init__(self, t, meter: _LiveSaved, key, n: int):
        self.t, self.meter, self.key, self.mb = t, meter, key, meter.mb
        meter.mb_refs[self.mb] = meter.mb_refs.get(self.mb, 0) + 1
        meter.peak_in_flight = max(meter.peak_in_flight, len(meter.mb_refs))
        if key not in meter.refs:
            meter.refs[key] = 0
            meter.sizes[key] = n
            meter.live += n
            if meter.live > meter.peak:
                meter.peak = meter.live
                meter.in_flight_at_peak = len(meter.mb_refs)
        meter.refs[key] += 1

    def __del__(self):
        m = self.meter
        m.refs[self.key] -= 1
        if not m.refs[self.key]:
            del m.refs[self.key]
            m.live -= m.sizes.pop(self.key)
        m.mb_refs[self.mb] -= 1
        if not m.mb_refs[self.mb]:
            del m.mb_refs[self.mb]


class GPTStage(nn.Module):
    """Layers ``lo:hi`` of a :class:`parmem.reference.TinyGPT` as one pipeline stage; the first
    stage also holds the token and position embeddings (input: token ids ``[b, s]``), the last the
    final LayerNorm and the LM head (output: fp32 logits ``[s, b, V]``), as in Megatron-LM.
    ``sent_bytes`` is the size of the activation a non-last stage sends per micro-batch."""

    def __init__(self, full, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok, self.pos = full.tok, full.pos
        self.layers = nn.ModuleList(full.layers[lo:hi])
        if last:
            self.ln_f, self.head = full.ln_f, full.head
        self.sent_bytes = 0

    def forward(self, x):
        if self.first:
            # the schedule splits [b, s] on dim 0; layers use [s, b, h]. A copy in its own storage:
            # at b = 1 the transpose is already contiguous and would share the whole batch's
            ids = x.t().clone(memory_format=torch.contiguous_format)
            pos = torch.arange(ids.shape[0], device=ids.device)
            x = self.tok(ids) + self.pos(pos)[:, None, :]
        for layer in self.layers:
            x = layer(x)
        if self.last:
            return self.head(self.ln_f(x)).float()
        self.sent_bytes = x.numel() * x.element_size()
        return x


def _gpt_loss(logits, labels):
    target = labels.t().clone(memory_format=torch.contiguous_format).view(-1)  # own storage
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target)


def demo_gpt(
    schedule: str = "1f1b",
    microbatches: int | None = None,
    layers_per_stage=None,
    vocab: int = 512,
    hidden: int = 64,
    layers: int | None = None,
    heads: int = 4,
    seq: int = 32,
    microbatch_size: int = 2,
) -> dict:
    """One training step of a GPT cut into p = world-size pipeline stages; measured bytes per stage.

    The model is :class:`parmem.reference.TinyGPT` (bf16, no dropout) of
    :func:`parmem.reference.tiny_spec`, split by ``layers_per_stage`` (default: even; L defaults
    to 2p) into :class:`GPTStage` modules and run by ``torch.distributed.pipelining``
    (``"gpipe"`` or ``"1f1b"``, m = ``microbatches``, default 2p, of ``microbatch_size``
    sequences). Each rank then takes a mixed-precision AdamW step on its stage.

    Measured on each rank: parameters, gradients, optimizer states and buffers
    (:func:`parmem.measure.state_bytes`), the peak of the live bytes autograd saves
    (activations and logits of every micro-batch in flight), the bytes sent per micro-batch. Beside
    them: :func:`parmem.estimate` for the same spec, ``pp = p`` and split, and
    the stage's :func:`parmem.distributed.anatomy.named_extras` for the micro-batches measured in flight.
    Returned: ``measured``, ``estimate``, ``extras`` (dicts of bytes), ``in_flight`` (measured:
    the micro-batches whose saved tensors were alive when the stage's saved bytes peaked),
    ``peak_in_flight`` (measured: the most alive at any time), ``in_flight_model``
    (:func:`parmem.pipeline.in_flight_units`, the count the estimate uses), ``layers``,
    ``sent_bytes``, ``grad_err`` (max abs
    difference from one process running the same micro-batches with gradient accumulation: 0,
    bit for bit), ``loss_err`` on the last stage, and from that single process
    ``layer_saved_bytes`` (one layer, one micro-batch) and ``all_layers_saved_bytes`` (all L
    layers, one micro-batch).
    """
    import copy

    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from parmem import ParallelConfig, TrainingSetup, estimate
    from parmem.distributed.anatomy import named_extras
    from parmem.measure import SavedTensorsMeter, state_bytes
    from parmem.pipeline import in_flight_units
    from parmem.reference import MixedPrecisionAdamW, TinyGPT, tiny_spec

    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if schedule not in classes:
        raise ValueError(f"schedule={schedule!r} must be one of {tuple(classes)}")
    p, r, dev = world_size(), rank(), device()
    m = microbatches or 2 * p
    b = microbatch_size
    spec = tiny_spec(vocab=vocab, hidden=hidden, layers=layers or 2 * p, heads=heads, seq=seq)
    setup = TrainingSetup(
        seq_len=seq, micro_batch=b, num_microbatches=m, schedule=schedule, dropout=False
    )
    est = estimate(spec, ParallelConfig(pp=p), setup, layers_per_stage=layers_per_stage)
    lps = [s.layers for s in est.stages]
    first, last = r == 0, r == p - 1
    torch.manual_seed(0)
    full = TinyGPT(spec, dropout_p=0.0).to(dev).train()
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (m * b, seq), generator=g).to(dev)
    labels = torch.randint(0, vocab, (m * b, seq), generator=g).to(dev)

    # the single-process reference: the same micro-batches, gradients accumulated, then / m
    ref = copy.deepcopy(full)
    ref_losses = []
    for k in range(m):
        lk = ref(
            ids[k * b : (k + 1) * b].t().contiguous(), labels[k * b : (k + 1) * b].t().contiguous()
        )
        lk.backward()
        ref_losses.append(lk.detach().float())
    for prm in ref.parameters():
        prm.grad.div_(m)
    x = torch.randn(seq, b, hidden, dtype=torch.bfloat16, device=dev, requires_grad=True)
    with SavedTensorsMeter(exclude=ref.parameters()) as one:
        ref.layers[0](x)
    with SavedTensorsMeter(exclude=ref.parameters()) as all_layers:
        y = x
        for layer in ref.layers:
            y = layer(y)

    lo = sum(lps[:r])
    names = {id(prm): n for n, prm in full.named_parameters()}
    mod = GPTStage(full, lo, lo + lps[r], first, last).to(dev)
    ref_params = dict(ref.named_parameters())
    act = torch.bfloat16
    inp = (
        torch.empty(b, seq, dtype=torch.long, device=dev)
        if first
        else torch.empty(seq, b, hidden, dtype=act, device=dev, requires_grad=True)
    )
    out = (
        torch.empty(seq, b, vocab, dtype=torch.float32, device=dev, requires_grad=True)
        if last
        else torch.empty(seq, b, hidden, dtype=act, device=dev, requires_grad=True)
    )
    stage = PipelineStage(mod, r, p, dev, input_args=inp, output_args=out)
    sched = classes[schedule](stage, m, loss_fn=_gpt_loss)
    meter = _LiveSaved(exclude=mod.parameters())
    mod.register_forward_pre_hook(meter.next_microbatch)
    losses: list = []
    dist.barrier()
    with meter.hooks():
        if first:
            sched.step(ids)
        elif last:
            sched.step(target=labels, losses=losses)
        else:
            sched.step()
    dist.barrier()
    grad_err = max(
        float((prm.grad.float() - ref_params[names[id(prm)]].grad.float()).abs().max())
        for prm in mod.parameters()
    )
    opt = MixedPrecisionAdamW(mod.parameters())
    opt.step()
    st = state_bytes(mod, opt)
    e = est.stages[r]
    units = meter.in_flight_at_peak  # measured: the micro-batches alive at this stage's peak
    res = {
        "stage": r,
        "layers": lps[r],
        "microbatches": m,
        "in_flight": units,
        "peak_in_flight": meter.peak_in_flight,
        "in_flight_model": in_flight_units(schedule, p, m, r),
        "measured": {
            "params": st.params,
            "grads": st.grads,
            "optimizer": st.optimizer,
            "activations_and_logits": meter.peak,
            "buffers": st.buffers,
        },
        "estimate": {
            "params": e.params,
            "grads": e.grads,
            "optimizer": e.optimizer,
            "activations": e.activations,
            "logits": e.logits,
            "total": e.total,
        },
        "extras": named_extras(
            spec,
            seq,
            b,
            st.detail["num_param_tensors"],
            dev,
            layers=lps[r],
            first=first,
            last=last,
            units=units,
        ),
        "sent_bytes": mod.sent_bytes,
        "grad_err": grad_err,
        "saved_after_step": meter.live,
        "layer_saved_bytes": one.bytes,
        "all_layers_saved_bytes": all_layers.bytes,
        "num_params": e.num_params,
    }
    if last:
        res["loss_err"] = abs(
            torch.stack(losses).float().mean().item() - torch.stack(ref_losses).mean().item()
        )
    return res


def compare_gpt(result: dict) -> list[dict]:
    """Rows of measured vs estimated bytes for one stage of :func:`demo_gpt`, with the named extras
    that explain each difference (the accounting of :func:`parmem.distributed.anatomy.compare`; here the
    activations are the stage's peak over the schedule); ``unexplained`` is what is left."""
    from parmem.distributed.anatomy import compare

    return compare(result, activations_label="activations + logits (peak)")


def replay(results: list[dict]) -> dict:
    """The step of one :func:`demo` run replayed with its own operation times and free communication.

    Every stage runs its operations in the order it ran them, each lasting as long as it was
    measured; an operation starts when the previous one on its stage has ended and the operation
    whose output it consumes (:func:`parmem.pipeline.simulate`'s dependencies: the forward of the
    same micro-batch on the stage before, the backward on the stage after) has ended. This is the
    simulator fed with the measured durations instead of t_f and t_b, so no hand-off costs time.

    The real run obeys the same two rules (a stage does one operation at a time; it cannot start
    an operation before its input has arrived), so its measured times can only be later: every
    operation starts no earlier than in the replay, the measured step is at least ``step_s``, and
    each stage idles at least ``idle_s[stage]``, however slow or loaded the machine. The events
    must be the emulated compute's (``delay_ms``), which end before the stage sends its output.

    Returns ``step_s``, ``busy_s`` and ``idle_s`` (lists per stage), and ``late``: the
    operations, as (kind, stage, chunk, micro-batch), that started before the operation they
    consume had ended on the shared clock (none in a real run).
    """
    from parmem.pipeline import dependency, list_schedule

    r0 = results[0]
    p, v = len(results), r0["v"]
    ops = []  # per stage: (kind, chunk, micro-batch, start, end), in the order they ran
    for i, r in enumerate(results):
        if r["stage"] != i:
            raise ValueError(f"results[{i}]['stage']={r['stage']} must be {i} (one row per rank)")
        evs = sorted(r["events"], key=lambda e: e[3])
        if any(e[3] is None for e in evs):
            raise ValueError(
                "results[*]['events'] need a start for every operation (run demo with delay_ms)"
            )
        ops.append([(k, c, mb, t0, t1) for k, mb, c, t0, t1 in evs])
    ended = {(k, i, c, mb): t1 for i, evs in enumerate(ops) for k, c, mb, _, t1 in evs}
    late = []
    for i, evs in enumerate(ops):
        for k, c, mb, t0, _ in evs:
            dep = dependency(k, i, c, mb, p, v, r0.get("schedule", ""))
            if dep is not None and t0 < ended.get(dep, float("-inf")):
                late.append((k, i, c, mb))
    try:
        timed = list_schedule(
            [[(k, mb, c) for k, c, mb, _, _ in evs] for evs in ops],
            [[t1 - t0 for *_, t0, t1 in evs] for evs in ops],
            v,
            r0.get("schedule", ""),
        )
    except ValueError as e:
        raise ValueError(f"the events of results cannot be replayed: {e}") from None
    step = max((evs[-1][4] for evs in timed if evs), default=0.0)
    busy = [sum(t1 - t0 for *_, t0, t1 in evs) for evs in ops]
    return {"step_s": step, "busy_s": busy, "idle_s": [step - b for b in busy], "late": late}


def bubble_rows(results: list[dict]) -> list[dict]:
    """Per-stage idle time of one :func:`demo` run, from the schedule's own events on one clock.

    The pipeline's step runs from the first operation on any stage to the end of the last one
    (the events of all ranks share the machine's monotonic clock); a stage's idle time is that step
    minus the time spent in its own forwards and backwards, which is how
    :func:`parmem.pipeline.simulate` counts it. Each row also carries ``sim_idle_fraction`` (the
    simulator with t_b = 2 t_f, the ratio ``delay_ms`` should keep) and, from :func:`replay`
    (``delay_ms`` runs only), ``replay_step_s`` and ``replay_idle_fraction`` (the same step with
    the measured operation times and free communication: the measured step and idle time are never
    below them, on any machine), ``excess_s``, the measured step less the replayed one (the time
    communication and the schedule's own bookkeeping add on the critical path, which the simulator
    takes as free), and ``late``, the stage's operations that started before their input was
    computed (none in a real run); these four are ``None`` for a run without ``delay_ms``."""
    starts = [e[3] if e[3] is not None else e[4] for r in results for e in r["events"]]
    step = max(e[4] for r in results for e in r["events"]) - min(starts)
    # without delay_ms a backward's stamps bracket autograd's release, not the computation
    rep = replay(results) if all(r.get("emulated") for r in results) else None
    rows = []
    for i, r in enumerate(results):
        row = {
            "stage": r["stage"],
            "step_s": step,
            "busy_s": r["busy_s"],
            "idle_s": step - r["busy_s"],
            "idle_fraction": (step - r["busy_s"]) / step,
            "sim_idle_fraction": r["sim_idle_fraction"],
            "replay_step_s": None,
            "replay_idle_fraction": None,
            "excess_s": None,
            "late": None,
            "peak_stashed": r["peak_stashed"],
            "sim_peak_stashed": r["sim_peak_stashed"],
        }
        if rep is not None:
            row.update(
                replay_step_s=rep["step_s"],
                replay_idle_fraction=rep["idle_s"][i] / rep["step_s"],
                excess_s=step - rep["step_s"],
                late=[op for op in rep["late"] if op[1] == i],
            )
        rows.append(row)
    return rows


__all__ += ["Delay", "Events", "GPTStage", "bubble_rows", "compare_gpt", "demo_gpt", "replay"]
