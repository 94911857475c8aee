"""Allocation traces to replay through :func:`parmem.allocator.replay`.

* :class:`record_allocations` records the events of a real PyTorch run on the CPU: every new
  tensor storage an operator creates, and when it dies (``torch`` is imported only here);
* :func:`training_step_events` builds the events of a training step of a real model from the
  estimator's own terms (the sharding table for the weights, :func:`parmem.activations.layer_terms`
  for what each layer keeps, :func:`parmem.pipeline.simulate` for the order of micro-batches).

Events are ``("alloc", key, nbytes)`` (a recorded one carries the operator name as a fourth
element) and ``("free", key)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import replace

from ._check import cdiv, integer
from .activations import layer_terms
from .config import PRECISIONS, ParallelConfig, TrainingSetup
from .engines import optimizer_preset
from .layout import layout
from .model import ModelSpec
from .pipeline import stage_order
from .sharding import stage_tensor_numels
from .states import optimizer_state_bytes, state_rule

__all__ = ["record_allocations", "training_step_events", "stage_weight_tensors", "EventTrace"]


class record_allocations:  # noqa: N801 - used like a function: ``with record_allocations() as r``
    """Record every tensor storage PyTorch operators create inside a ``with`` block, and when it
    is freed, as :func:`parmem.allocator.replay` events ``("alloc", key, nbytes, op)`` / ``("free", key)``.

    It is a ``TorchDispatchMode``: after each operator it checks the storages it has seen (a
    weak reference each) and records the ones that died, then records the operator's outputs
    whose storage is new (a view or an in-place result shares a storage already seen and is not
    an allocation). ``track`` registers tensors that existed before the block (parameters,
    inputs) as allocations at its start. What it cannot see: memory a kernel uses internally and
    frees before returning (workspaces), and allocations made outside operators.

    Example::

        with record_allocations(track=model.parameters()) as rec:
            model(x).sum().backward()
        replay(rec.events).peak_reserved
    """

    def __init__(self, track=()):
        self._track = list(track)
        self.events: list[tuple] = []
        self._live: dict = {}
        self._mode = None
        self._keys = itertools.count()

    def _sweep(self) -> None:
        dead = [k for k, (w, _) in self._live.items() if w.expired()]
        for k in dead:
            key = self._live.pop(k)[1]
            self.events.append(("free", key))

    def _add(self, t, op: str, known: set) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        st = t.untyped_storage()
        w = StorageWeakRef(st)
        if w.cdata in self._live or w.cdata in known:
            return
        key = next(self._keys)
        self._live[w.cdata] = (w, key)
        self.events.append(("alloc", key, st.nbytes(), op))

    def __enter__(self) -> record_allocations:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        rec = self

        def dispatch(mode, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ins = {
                a.untyped_storage()._cdata
                for a in tree_flatten((args, kwargs))[0]
                if isinstance(a, torch.Tensor)
            }
            rec._sweep()
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    rec._add(t, func.__name__, ins)
            return out

        class _Mode(TorchDispatchMode):
            pass

        # Set after the class exists: TorchDispatchMode.__init_subclass__ would wrap the method
        # to disable TorchDynamo, and that wrapper imports TorchDynamo (seconds) at first use.
        # Nothing is compiled while recording, so the wrapper has nothing to do here.
        _Mode.__torch_dispatch__ = dispatch

        for t in self._track:
            self._add(t, "tracked", set())
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
        self._sweep()

    def finish(self) -> list[tuple]:
        """Record the frees of storages that died since the last operator; returns the events."""
        self._sweep()
        return self.events

    @property
    def live(self) -> int:
        """Number of recorded storages still alive."""
        return len(self._live)

    def _walk(self) -> tuple[int, dict[int, int]]:
        """The events replayed: the largest sum of live storages, and the sizes still live."""
        live = total = 0
        size: dict[int, int] = {}
        for event in self.finish():
            if event[0] == "alloc":
                size[event[1]] = event[2]
                live += event[2]
                total = max(total, live)
            else:
                live -= size.pop(event[1])
        return total, size

    def peak_bytes(self) -> int:
        """The largest sum of live recorded storages at any moment (after :meth:`finish`)."""
        return self._walk()[0]

    def live_bytes(self) -> int:
        """The sum of the recorded storages alive now (tracked ones included)."""
        return sum(self._walk()[1].values())


def training_step_events(
    spec: ModelSpec,
    parallel: ParallelConfig | None = None,
    setup: TrainingSetup | None = None,
    stage: int = 0,
    seq_lens: Sequence[int] | None = None,
) -> list[tuple]:
    """Allocation events of training steps on one GPU of pipeline stage ``stage``, built from
    :func:`parmem.estimate`'s own terms (a synthetic trace, not a recording).

    * Model states first, one tensor each: every weight matrix, bias, norm and embedding of the
      stage's local shard (16-bit; :func:`stage_weight_tensors`, as :func:`parmem.estimate`
      shards them), then at the first backward its gradient, then the fp32 master copy and Adam's
      two moments (each ⌈n/d⌉ values under ZeRO-1, d = data × context parallel size; gradients
      too under ZeRO-2; ZeRO-3 is not modelled here, and expert tensors are sharded over d like
      the others rather than over d/e, so MoE optimizer states come out smaller than the
      estimate's).
    * Every micro-batch, in the order of the stage's 1F1B (or GPipe) schedule from
      :func:`parmem.pipeline.simulate`: each layer's forward allocates the tensors of
      :func:`parmem.activations.layer_terms`, kept until that layer's backward frees them; the
      backward allocates the gradient of the layer's input (16-bit, s·b·h) and of its largest
      inner tensor, and frees them when the next layer down is done.
    * ``seq_lens``: one sequence length per step (default: one step at ``setup.seq_len``);
      different lengths model variable-length batches, the case expandable segments address.

    Only the shapes matter to the allocator; :func:`parmem.allocator.replay` turns the events
    into reserved and allocated bytes.
    """
    par = parallel or ParallelConfig()
    setup = setup or TrainingSetup(seq_len=2048)
    lay = layout(spec, par, setup)
    if setup.engine != "paper":
        raise ValueError(
            f"engine={setup.engine!r}: training_step_events builds the paper profile's tensors "
            "(16-bit weights and gradients, fp32 master copy); other engines are not modelled"
        )
    if optimizer_preset(setup.optimizer).factored and par.zero == 0:
        raise ValueError(
            f"optimizer={setup.optimizer!r} with zero=0: the factored second moment needs each "
            "matrix's shape, which training_step_events does not model (use zero >= 1)"
        )
    if par.zero == 3:
        raise ValueError("zero=3 is not modelled by training_step_events (use zero <= 2)")
    if par.vpp > 1 or setup.schedule in ("interleaved", "zbv"):
        raise ValueError(
            f"schedule={setup.schedule!r} (vpp={par.vpp}) is not modelled by "
            "training_step_events (one chunk per stage: gpipe or 1f1b)"
        )
    stage = integer("stage", stage, 0, par.pp - 1)
    prec = PRECISIONS[setup.precision]
    trace = EventTrace()
    weights = stage_weight_tensors(spec, par, stage)
    for n in weights:
        trace.alloc(prec["param"] * n)
    order = stage_order(setup.schedule, par.pp, setup.num_microbatches, stage)
    first_backward = next(o for o in order if o.kind == "B")
    n_layers = lay.stages[stage].layers
    shard = lay.dp_group
    for step, s in enumerate(list(seq_lens) if seq_lens is not None else [setup.seq_len]):
        terms = [
            x.bytes
            for x in layer_terms(
                spec,
                s,
                setup.micro_batch,
                tp=par.tp,
                sp=par.sp,
                cp=par.cp,
                flash=lay.flash,
                dropout=lay.dropout,
                act_bytes=prec["act"],
            )
        ]
        grad_in = layout(spec, par, replace(setup, seq_len=s)).boundary_bytes
        kept: dict[int, list[list[int]]] = {}
        for op in order:
            if op.kind == "F":
                kept[op.microbatch] = [
                    [trace.alloc(n) for n in terms if n] for _ in range(n_layers)
                ]
                continue
            trace.backward(kept.pop(op.microbatch), grad_in, max(terms))
            if step == 0 and op is first_backward:  # gradients appear and stay
                for n in weights:
                    trace.alloc(prec["grad"] * (cdiv(n, shard) if par.zero >= 2 else n))
        if step == 0:  # the optimizer creates its states at the first step
            _optimizer_states(trace, weights, shard if par.zero >= 1 else 1, setup, par.zero)
    return trace.events


class EventTrace:
    """Allocation events under construction, with a fresh key per allocation: what
    :func:`training_step_events` and :func:`parmem.bounds.step_events` build and
    :func:`parmem.allocator.replay` runs."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self._keys = itertools.count()

    def alloc(self, nbytes: int) -> int:
        key = next(self._keys)
        self.events.append(("alloc", key, nbytes))
        return key

    def free(self, keys: Iterable[int]) -> None:
        self.events.extend(("free", k) for k in keys)

    def split(self, total: int, weights: list[int]) -> list[int]:
        """Allocate ``total`` bytes as one tensor per weight, in proportion to ``weights`` (the
        remainder on the last), and return their keys."""
        whole = sum(weights)
        if not total or not whole:
            return []
        sizes = [total * w // whole for w in weights]
        sizes[-1] += total - sum(sizes)
        return [self.alloc(n) for n in sizes if n]

    def backward(self, layers: list[list[int]], grad_in: int, largest: int) -> None:
        """Backward through ``layers`` (last first): each allocates its input gradient and its
        largest inner gradient, frees its saved tensors and the gradients of the layer above."""
        below: list[int] = []
        for layer in reversed(layers):
            grads = [self.alloc(grad_in), self.alloc(largest)]
            self.free(layer + below)
            below = grads
        self.free(below)


def _optimizer_states(
    trace: EventTrace, weights: list[int], shard: int, setup: TrainingSetup, zero: int
) -> None:
    """The fp32 master copy and the optimizer's states: of each weight at ZeRO-0, of one flat
    ⌈Ψ/shard⌉ partition from ZeRO-1 on, in the bytes :func:`parmem.states.apply_rule` gives the
    estimator (8-bit Adam's block scales included)."""
    rule = state_rule("paper", setup.precision, setup.optimizer, zero)
    prec = PRECISIONS[setup.precision]
    # ZeRO >= 1 steps on one flat shard of all the stage's weights (DeepSpeed, Megatron's
    # distributed optimizer), as the estimator counts it; ZeRO-0 on each weight
    sizes = [cdiv(sum(weights), shard)] if zero >= 1 else weights
    for n_local in sizes:
        if prec["master"]:
            trace.alloc(prec["master"] * n_local)
        opt = optimizer_state_bytes(n_local, rule.preset, rule.opt_itemsize)
        states = max(rule.preset.states, 1)
        for i in range(states):  # one tensor per state; the remainder on the last
            trace.alloc(opt // states + (opt % states if i == states - 1 else 0))


def stage_weight_tensors(
    spec: ModelSpec, parallel: ParallelConfig | None = None, stage: int = 0
) -> list[int]:
    """Element counts of the weight tensors one GPU of pipeline stage ``stage`` holds, one entry
    per tensor, in layer order (:func:`parmem.sharding.stage_tensor_numels` for the stage's layers
    of the even split): 2 bytes times the sum is the estimate's ``params`` for 16-bit weights."""
    par = parallel or ParallelConfig()
    stage = integer("stage", stage, 0, par.pp - 1)
    st = layout(spec, par, TrainingSetup(seq_len=min(2048, spec.max_positions))).stages[stage]
    return stage_tensor_numels(spec, par.tp, par.ep, st.layers, st.first, st.last, start=st.start)
