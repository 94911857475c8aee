"""Three numbers instead of one: allocated, expected reserved, and a high bound with the driver.

:func:`parmem.estimate` counts the bytes of live tensors at the step's peak: what
``torch.cuda.max_memory_allocated()`` reports. A GPU runs out of memory on more than that.
:func:`bounds` adds, for each pipeline stage:

* **reserved**: the caching allocator's overhead (rounding, 20 MiB segments shared by requests
  under 10 MiB, blocks cached in the wrong place) on the step's own allocation trace: the saved
  tensors of every layer and micro-batch allocated and freed in the order of the stage's
  schedule (:func:`step_events`), replayed through :class:`~parmem.allocator.CachingAllocator`
  (PyTorch's ``CUDACachingAllocator.cpp`` rules). ``reserved = allocated + (peak reserved − peak
  requested of the replay)``: what ``torch.cuda.max_memory_reserved()`` would report;
* **high**: reserved plus what the process holds outside the allocator or before it runs: the
  CUDA context with its kernels, NCCL's buffers for every communicator the layout opens, and
  PyTorch's cuBLAS workspace (``data/overheads.toml``, each value with its source). This is the
  number ``nvidia-smi`` would show at the peak; "fits" is judged on it.

A reader who measured their own context (``torch.cuda.mem_get_info()`` before and after
``torch.cuda.init()``) or their own allocator overhead (``max_memory_reserved() −
max_memory_allocated()``) passes them as ``cuda_context`` and ``reserve``.

Not modelled: several streams (the allocator keeps blocks per stream), CUDA graphs' private
pools, NVLS/CollNet buffers and NCCL's tree connections (only rings and point-to-point peers are
counted), a second cuBLAS handle per side stream, and memory other processes hold.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ._check import integer
from ._data import load_toml
from .allocator import replay
from .estimate import Estimate, activation_terms, first_layer_kept, kept_logits, loss_pieces
from .hardware import Hardware, hardware_preset
from .layout import layout
from .pipeline import stage_order
from .sharding import stage_tensor_numels
from .traces import EventTrace
from .units import GIB

__all__ = [
    "Bounds",
    "StageBounds",
    "bounds",
    "step_events",
    "allocator_overhead",
    "nccl_bytes",
    "communicators",
    "overheads",
]

#: the micro-batches a traced step runs at most: the 1F1B steady state repeats after p of them,
#: so the allocator's pattern is the same for more (the peak is the estimate's, not the trace's)
_TRACE_MICROBATCHES = 8


@lru_cache(maxsize=1)
def overheads() -> dict[str, Any]:
    """``data/overheads.toml``: the CUDA context, cuBLAS workspace and NCCL buffer constants,
    each with its source."""
    data: dict[str, Any] = load_toml("overheads.toml")
    return data


# ---------------------------------------------------------------------------- NCCL
def communicators(est: Estimate) -> list[tuple[str, int, str]]:
    """The NCCL communicators one rank of the layout opens: (name, ranks, kind), kind
    ``"collective"`` (a ring: one receiving connection per channel) or ``"p2p"`` (one receiving
    connection per peer it receives from). The default group over the world (barriers), the TP
    group, the gradient-reduction group (d·cp), the CP group, the expert-parallel all-to-all
    (e − 1 peers), the expert-data-parallel group when it differs from d·cp, and the pipeline's
    point-to-point links (the previous and the next stage)."""
    par = est.parallel
    out: list[tuple[str, int, str]] = []
    if par.world_size > 1:
        out.append(("world", par.world_size, "collective"))
    if par.tp > 1:
        out.append(("tp", par.tp, "collective"))
    if par.dp_group > 1:
        out.append(("dp", par.dp_group, "collective"))
    if par.cp > 1:
        out.append(("cp", par.cp, "collective"))
    if est.spec.is_moe and par.ep > 1:
        out.append(("ep", par.ep, "p2p"))
    if est.spec.is_moe and 1 < par.expert_dp_group != par.dp_group:
        out.append(("expert-dp", par.expert_dp_group, "collective"))
    if par.pp > 1:
        out.append(("pp", par.pp, "p2p"))
    return out


def nccl_bytes(
    est: Estimate,
    stage: int = 0,
    channels: int | None = None,
    p2p_channels_per_peer: int | None = None,
) -> int:
    """NCCL's buffers on one GPU of ``stage``: for every communicator of :func:`communicators`,
    a collective's ``channels`` receiving connections each holding the Simple, LL and LL128
    buffers (NCCL ``src/init.cc``: 4 MiB, 512 KiB and 4,800 KiB by default), a point-to-point
    peer's ``p2p_channels_per_peer`` connections holding the Simple buffer (point-to-point runs
    the Simple protocol). The pipeline's first and last stages receive from one neighbour, the
    others from two; the all-to-all from e − 1 peers. ``channels`` and ``p2p_channels_per_peer``
    default to ``data/overheads.toml``'s (an assumption; NCCL chooses them from the topology,
    and NCCL >= 2.22 connects only what a run uses)."""
    n = overheads()["nccl"]
    channels = integer("channels", n["channels"] if channels is None else channels, 1, 1024)
    per_peer = integer(
        "p2p_channels_per_peer",
        n["p2p_channels_per_peer"] if p2p_channels_per_peer is None else p2p_channels_per_peer,
        1,
        1024,
    )
    ring = channels * (n["simple"] + n["ll"] + n["ll128"])
    total = 0
    for name, ranks, kind in communicators(est):
        if kind == "collective":
            total += ring
            continue
        if name == "pp":
            peers = 1 if stage in (0, est.parallel.pp - 1) else 2
        else:
            peers = ranks - 1
        total += peers * per_peer * n["simple"]
    return total


def cublas_workspace_bytes(hardware: Hardware) -> int:
    """PyTorch's cuBLAS workspace for one stream running GEMMs (``CublasHandlePool.cpp``:
    32 MiB on Hopper, 8,519,680 bytes before), shared with cuBLASLt by default."""
    c = overheads()["cublas"]
    return int(c["sm90"] if hardware.name in c["sm90_gpus"] else c["older"])


# ---------------------------------------------------------------------------- the trace
def _rebuilt(full: list[int], kept: list[int]) -> list[int]:
    """The tensors a layer's backward recomputes: ``full`` less ``kept`` as multisets, adjusted
    so that they sum to ``sum(full) - sum(kept)``, the working set the estimate counts (under full
    recomputation the kept input need not be one of the layer's own tensors)."""
    out = sorted((Counter(full) - Counter(kept)).elements())
    delta = sum(full) - sum(kept) - sum(out)
    if delta > 0:
        out.append(delta)
    while delta < 0 and out:
        cut = min(out[-1], -delta)
        out[-1] -= cut
        delta += cut
        if not out[-1]:
            out.pop()
    return out


def step_events(est: Estimate, stage: int = 0, steps: int = 2) -> list[tuple[Any, ...]]:
    """The allocation events of ``steps`` training steps on one GPU of ``stage``, built from the
    estimate's own terms (a synthetic trace, not a recording):

    * the stage's weights, one tensor per weight matrix, bias, norm and embedding of its local
      shard (:func:`~parmem.sharding.stage_tensor_numels`), with the estimate's ``params`` bytes
      (one flat shard under ZeRO-3); the communication buffers, one tensor;
    * at the first backward, the gradients (per weight, one flat shard under ZeRO-2/3); after
      the first step's backward, the optimizer states (three flat tensors: the fp32 master and
      the two moments' bytes of the estimate);
    * every micro-batch, in the order of the stage's schedule
      (:func:`~parmem.pipeline.stage_order`): each layer's forward allocates the tensors it
      keeps (:func:`~parmem.estimate.activation_terms`), the stage's shared and own tensors and
      the last stage's logits (:func:`~parmem.estimate.kept_logits`); its backward allocates, on
      the last stage, the loss's transient tensor by tensor
      (:func:`~parmem.estimate.loss_pieces`: the unfused loss's gradients, the size of the fp32
      logits; or a chunked loss's buffers and one chunk's tensors) and frees it, then what
      recomputation rebuilds, then frees the layer's tensors;
    * the optimizer step's own buffers (DeepSpeed's fp32 gradient partition), made and freed.

    Interleaved schedules are traced in their 1F1B order with a stage's layers per micro-batch,
    and at most 8 micro-batches are traced (the steady state repeats): the trace gives the
    allocator's overhead; the peak is the estimate's. ZB-V (whose chunks are freed after their
    weight backward, not in 1F1B's order) is refused by name."""
    par, setup, spec = est.parallel, est.setup, est.spec
    if setup.schedule == "zbv" and par.pp > 1:
        raise ValueError(
            "schedule='zbv' is not traced by step_events (its two chunks per rank "
            "are freed after their weight backward; use schedule='1f1b')"
        )
    stage = integer("stage", stage, 0, par.pp - 1)
    steps = integer("steps", steps, 1, 8)
    b = est.stages[stage]
    lay = layout(spec, par, setup)
    st = lay.stages[stage]
    numels = stage_tensor_numels(spec, par.tp, par.ep, st.layers, st.first, st.last, start=st.start)
    full, kept, shared, first, last = activation_terms(lay)
    kept0 = first_layer_kept(lay) if st.first else None

    def layer_kept(i: int) -> list[int]:
        return kept0 if i == 0 and kept0 is not None else kept

    recompute = _rebuilt(full, kept)
    own = shared + (first if st.first else []) + (last if st.last else [])
    m = min(setup.num_microbatches, _TRACE_MICROBATCHES)
    order = stage_order("gpipe" if setup.schedule == "gpipe" else "1f1b", par.pp, m, stage)
    t = EventTrace()
    t.split(b.params, numels if par.zero < 3 else [1])
    if b.comm_buffers:
        t.alloc(b.comm_buffers)
    # the fp32 logits of one micro-batch, as the estimate counts them
    logits_unit = kept_logits(lay) if st.last else 0
    # what the loss makes for a moment above them, tensor by tensor (estimate.loss_pieces)
    loss_parts = loss_pieces(lay) if st.last else ()
    for step in range(steps):
        live: dict[int, list[int]] = {}
        for op in order:
            if op.kind == "F":
                keys = [t.alloc(n) for i in range(st.layers) for n in layer_kept(i) if n]
                keys += [t.alloc(n) for n in own if n]
                if logits_unit:
                    keys.append(t.alloc(logits_unit))
                live[op.microbatch] = keys
                continue
            if loss_parts:  # the loss's backward, then the last layer's recomputation
                t.free([t.alloc(n) for n in loss_parts if n])
            rebuilt = [t.alloc(n) for n in recompute if n]
            t.free(rebuilt)
            t.free(live.pop(op.microbatch))
            if step == 0 and op.microbatch == 0:
                t.split(b.grads, numels if par.zero < 2 else [1])
        if step == 0:
            t.split(b.optimizer, [1, 1, 1])
        if b.optimizer_step:
            t.free([t.alloc(b.optimizer_step)])
    return t.events


# ---------------------------------------------------------------------------- the bounds
@dataclass(frozen=True)
class StageBounds:
    """One pipeline stage's three numbers (bytes) and what the high bound adds."""

    stage: int
    allocated: int
    reserved: int
    high: int
    allocator: int
    cuda_context: int
    nccl: int
    workspace: int

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Bounds:
    """:func:`bounds`' answer: every stage's numbers, the GPU's capacity, and whether the fullest
    stage's high bound fits (``headroom``: capacity − high, negative when it does not)."""

    stages: tuple[StageBounds, ...]
    capacity: int
    hardware: str
    sources: tuple[str, ...]

    @property
    def peak(self) -> StageBounds:
        """The stage with the largest high bound."""
        return max(self.stages, key=lambda s: s.high)

    @property
    def allocated(self) -> int:
        return max(s.allocated for s in self.stages)

    @property
    def reserved(self) -> int:
        return max(s.reserved for s in self.stages)

    @property
    def high(self) -> int:
        return self.peak.high

    @property
    def headroom(self) -> int:
        return self.capacity - self.high

    @property
    def fits(self) -> bool:
        """Whether the high bound of every stage fits the GPU."""
        return self.headroom >= 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "capacity": self.capacity,
            "allocated": self.allocated,
            "reserved": self.reserved,
            "high": self.high,
            "headroom": self.headroom,
            "fits": self.fits,
            "stages": [s.to_dict() for s in self.stages],
            "sources": list(self.sources),
        }

    def __str__(self) -> str:
        p = self.peak
        g = GIB
        verdict = "fits" if self.fits else "does not fit"
        return (
            f"stage {p.stage}: allocated {p.allocated / g:.2f} GiB, reserved {p.reserved / g:.2f} "
            f"GiB (+{p.allocator / g:.2f} allocator), high {p.high / g:.2f} GiB (+{p.cuda_context / g:.2f} "
            f"context, +{p.nccl / g:.2f} NCCL, +{p.workspace / g:.2f} cuBLAS); {self.hardware} holds "
            f"{self.capacity / g:.2f} GiB: {verdict} ({self.headroom / g:+.2f} GiB headroom)"
        )


def _hardware(hardware: Hardware | str) -> Hardware:
    if isinstance(hardware, str):
        return hardware_preset(hardware)
    if not isinstance(hardware, Hardware):
        raise ValueError(
            f"hardware={hardware!r:.60} must be a Hardware or a preset name "
            "(parmem.hardware.hardware_presets())"
        )
    return hardware


def allocator_overhead(est: Estimate, stage: int = 0, expandable_segments: bool = False) -> int:
    """What the caching allocator reserves beyond the tensors on a GPU of ``stage``: the peak
    reserved minus the peak requested bytes of :func:`step_events` replayed through
    :func:`parmem.allocator.replay` (remembered per estimate: the inverse queries and the pages
    ask for the same one more than once)."""
    if not isinstance(est, Estimate):
        raise ValueError(
            f"est must be an Estimate (parmem.estimate(...)), got {type(est).__name__}"
        )
    stage = integer("stage", stage, 0, est.parallel.pp - 1)
    return _overhead(est, stage, bool(expandable_segments))


@lru_cache(maxsize=256)
def _overhead(est: Estimate, stage: int, expandable_segments: bool) -> int:
    r = replay(step_events(est, stage), expandable_segments=expandable_segments)
    return max(0, r.peak_reserved - r.peak_requested)


def bounds(
    est: Estimate,
    hardware: Hardware | str = "h100-sxm",
    *,
    cuda_context: int | None = None,
    reserve: int | None = None,
    expandable_segments: bool = False,
    channels: int | None = None,
    p2p_channels_per_peer: int | None = None,
) -> Bounds:
    """Allocated, expected reserved and high bound of every stage of ``est`` on ``hardware``.

    ``cuda_context``: the context you measured (default: the setup's ``cuda_context`` when it is
    set, which the estimate already counts, else the eager figure of ``data/overheads.toml``).
    ``reserve``: the allocator overhead you measured (reserved − allocated at the peak), instead
    of the replay. ``expandable_segments``: PyTorch's
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. ``channels``,
    ``p2p_channels_per_peer``: NCCL's (:func:`nccl_bytes`)."""
    if not isinstance(est, Estimate):
        raise ValueError(
            f"est must be an Estimate (parmem.estimate(...)), got {type(est).__name__}"
        )
    hw = _hardware(hardware)
    o = overheads()
    if cuda_context is None:
        context = 0 if est.setup.cuda_context else int(o["cuda_context"]["eager"])
    else:
        context = integer("cuda_context", cuda_context, 0, hw.memory_bytes)
    if reserve is not None:
        reserve = integer("reserve", reserve, 0, hw.memory_bytes)
    workspace = cublas_workspace_bytes(hw)
    out = []
    for b in est.stages:
        if reserve is None:
            extra = allocator_overhead(est, b.stage, bool(expandable_segments))
        else:
            extra = reserve
        nccl = nccl_bytes(est, b.stage, channels, p2p_channels_per_peer)
        reserved = b.total + extra
        out.append(
            StageBounds(
                stage=b.stage,
                allocated=b.total,
                reserved=reserved,
                high=reserved + context + nccl + workspace,
                allocator=extra,
                cuda_context=context,
                nccl=nccl,
                workspace=workspace,
            )
        )
    sources = (
        "allocator: parmem.allocator (PyTorch CUDACachingAllocator.cpp rules) over "
        "parmem.bounds.step_events",
        str(o["cuda_context"]["source"]),
        str(o["nccl"]["source"]),
        str(o["cublas"]["source"]),
    )
    return Bounds(tuple(out), hw.memory_bytes, hw.name, sources)
