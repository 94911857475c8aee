"""The planner: which d·t·p·cp·e, ZeRO stage, micro-batch, recompute, SP and v for my model and
my cluster?

:func:`plan` enumerates every valid layout of a :class:`Cluster`, keeps those whose
:func:`~parmem.estimate.estimate` peak fits the GPU less a headroom, ranks them by a modelled step
time, and returns a :class:`Plan`: the ranked :class:`Candidate` list, the reason every rejected
family failed, the Pareto front of memory against time, and the winner as flags for Megatron-LM,
DeepSpeed and torchtitan (:meth:`Plan.emit`).

The cost model (every assumption is a field of :class:`Assumptions`)
--------------------------------------------------------------------
One step is ``m = global_batch / (d·b)`` micro-batches on every data-parallel replica. For a
pipeline stage ``i`` one micro-batch costs, on one GPU::

    t_i = compute_i + recompute_i + exposed TP/SP + exposed CP + exposed EP + exposed PP

* **compute**: forward FLOPs times 3 (forward + backward, Narayanan et al. 2021 §5.1: the
  backward pass costs two forwards) divided by ``peak_flops_bf16 · mfu``. Forward FLOPs of one
  sequence through one layer are ``2·s·W + 4·s²·(a·d_head)``: every weight matrix ``W`` (Q, K, V,
  output, MLP; the routed ``top_k`` experts for MoE) does a multiply-add per token, and attention
  scores and the weighted sum of values each cost ``2·s²`` per query width. The last stage adds
  the LM head, ``2·s·h·V``. Work is divided by ``t·cp``.
* **recompute**: full recomputation runs each layer's forward again; selective recomputation
  (Korthikanti et al. 2022 §5) only the attention core (``4·s²·a·d_head``).
* For a GPT layer these sums are exactly Narayanan et al. 2021, eq. (3):
  ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))`` FLOPs per iteration with full recomputation and
  ``72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))`` without (:func:`parmem.flops.narayanan_flops`).
* **communication**: :func:`parmem.comm.step_comm` lists the collectives; their alpha-beta time is
  taken on NVLink when the group fits in a node and on the per-GPU InfiniBand link otherwise
  (Megatron-LM rank order: t, cp, e, d, p from the fastest-varying). TP/SP, EP and PP transfers
  sit on the critical path (less ``tp_overlap``, ``ep_overlap``, ``pp_overlap``); CP's K/V ring
  hides behind the attention it feeds (``cp_overlap``, Liu et al. 2023).
* **pipeline**: ``T = m·t_max + (Σ_i t_i − t_max)/v``; the second term is the bubble. For equal
  stages it is :func:`parmem.pipeline.bubble_ratio` ``(p−1)/(v·m)`` times the ideal ``m·t``
  (Narayanan et al. 2021 §2.2).
* **data parallel**: the gradient reduction (and ZeRO's parameter gathers) overlap with the
  backward (and forward) passes that run while they are issued, ``dp_overlap`` of that window,
  but never the last bucket (``dp_bucket_params``).

The step time is ``T`` plus the exposed data-parallel time. Tokens/s is ``global_batch·s / step``;
:attr:`Candidate.model_flops_per_gpu` counts the useful FLOPs (the 72 form: MFU) and
:attr:`Candidate.hardware_flops_per_gpu` the executed ones (recomputation included: eq. (3),
what Narayanan et al. 2021 Table 1 reports).

Not modelled: kernel efficiency that grows with the micro-batch (so the model favours ``b = 1``
unless latency or memory say otherwise), the optimizer step, load imbalance of MoE routing,
embedding/LM-head collectives, stragglers and failures.

The search
----------
A *family* is ``(t, cp, p, d, e)``. Structural rules reject families up front (``t`` must divide
the heads, ``kv_heads`` and the FFN width and stay within a node; ``p`` must divide the layers
unless ``uneven_pp``; ``d`` must divide the global batch; ``e`` divides the experts and ``d``).
One :func:`estimate` of the family's most frugal setting (highest ZeRO, SP, full recompute,
smallest micro-batch, no interleaving) bounds its memory from below: if that does not fit, the
family is rejected with the reason. Inside a family, memory only grows as ZeRO drops, SP goes off,
recomputation is relaxed or the micro-batch grows, so settings are visited from frugal to
generous: one that has a neighbour which did not fit cannot fit; one that has a neighbour with no
more memory that is at least as fast is *dominated* and skipped. Every other setting gets a real
:func:`estimate`. Step times in the search use communication times linear in ``b`` and ``m`` (two
:func:`~parmem.comm.step_comm` calls per distinct stage); the listed candidates are re-timed with
the exact ``step_comm`` of their own ``b`` and ``m``.

Answers and errors
------------------
A request no layout can satisfy is an answer, not an error: :func:`plan` returns a
:class:`Plan` without candidates whose ``message`` names the layout that came closest ("no layout
fits: smallest peak is 133.2 GiB with t=8, p=1, ZeRO-0, SP, full recompute, micro-batch 1; needs
GPUs of ≥ 148.0 GiB or more nodes ..." for Llama-3-70B on eight 40 GB A100s), so the CLI and the widget can show it. Invalid
arguments (a non-integer batch, an unknown GPU, a global batch no data-parallel size divides, an
unknown assumption) raise ``ValueError`` naming the argument.

Sources: Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21) §2.2, §3, §5.1, eq. (3), Table 1; Korthikanti et al. 2022 §4–6;
Rajbhandari et al. 2020 (ZeRO) §7; DeepSpeed's rule that pipeline parallelism does not combine
with ZeRO-2/3 (``deepspeed.runtime.pipe.engine``).
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import asdict, dataclass, field, fields, replace

from .comm import StageShape, category_times, collectives, placement
from .config import OPTIMIZERS, PRECISIONS, RECOMPUTE, ParallelConfig, TrainingSetup, even_split
from .estimate import Estimate, estimate
from .flops import flops_per_sequence, step_flops
from .hardware import Hardware, hardware_preset, hardware_presets
from .model import ModelSpec
from .pipeline import bubble_ratio
from .sharding import stage_params
from .units import GIB

__all__ = ["Assumptions", "Candidate", "Cluster", "Plan", "StepTime", "evaluate", "plan",
           "ENGINES"]

#: Engines :meth:`Plan.emit` writes flags for.
ENGINES = ("megatron", "deepspeed", "torchtitan")
_RC_ORDER = ("full", "selective", "none")  # least memory first


def _int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return value


def _fraction(name: str, value, lo: float, hi: float, lo_open: bool = False,
              hi_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r} must be a number")
    bad = value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi)
    if bad:
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"{name}={value!r} must be in {left}{lo}, {hi}{right}")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


# ---------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of one kind.

    ``gpu`` is a :func:`~parmem.hardware.hardware_preset` name (``"a100-40gb"``, ``"a100-80gb"``,
    ``"h100-sxm"``, ``"h200"``) or a :class:`~parmem.hardware.Hardware`; its ``intra_node`` link
    (NVLink) joins GPUs of a node and its ``inter_node`` link (one InfiniBand port per GPU) joins
    nodes.
    """

    gpu: str | Hardware = "h100-sxm"
    gpus_per_node: int = 8
    nodes: int = 1
    hardware: Hardware = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.gpu, Hardware):
            hw = self.gpu
        elif isinstance(self.gpu, str):
            try:
                hw = hardware_preset(self.gpu)
            except ValueError:
                raise ValueError(f"gpu={self.gpu!r} is not a hardware preset; known: "
                                 f"{', '.join(hardware_presets())}") from None
        else:
            raise ValueError(f"gpu={self.gpu!r} must be a preset name or a Hardware")
        _int("gpus_per_node", self.gpus_per_node)
        _int("nodes", self.nodes)
        object.__setattr__(self, "hardware", hw)

    @property
    def world_size(self) -> int:
        """All GPUs, ``gpus_per_node · nodes``."""
        return self.gpus_per_node * self.nodes

    def __str__(self) -> str:
        return f"{self.nodes} x {self.gpus_per_node} {self.hardware.name}"


@dataclass(frozen=True)
class Assumptions:
    """Every assumption of the planner's memory and time model, with its default.

    Pass any of them to :func:`plan` or :func:`evaluate` by name (``plan(..., mfu=0.5)``).
    """

    mfu: float = 0.55
    """Fraction of the GPU's dense BF16 peak (``Hardware.peak_flops_bf16``) that the training
    kernels sustain while a GPU is busy (executed FLOPs, recomputation included, over busy time).
    An assumption, not a measurement. End-to-end utilisation comes out lower, once bubbles and
    exposed communication are added: Narayanan et al. 2021, Table 1, report 44–52% of peak end
    to end for GPT models of 1.7B–1T parameters on A100s, so the busy fraction must be above
    that."""

    headroom: float = 0.10
    """Fraction of GPU memory kept free for what :func:`~parmem.estimate.estimate` does not count:
    allocator fragmentation (PyTorch's caching allocator), the CUDA context and kernels, NCCL's
    own buffers, temporaries of fused kernels. A layout fits when its peak stage is at most
    ``(1 − headroom) · memory``."""

    tp_overlap: float = 0.0
    """Fraction of TP/SP collective time hidden behind computation. 0: Megatron-LM's default,
    where the all-reduces (all-gathers, reduce-scatters) wait for the GEMMs around them;
    Transformer Engine's user-buffer overlap can hide part of them."""

    dp_overlap: float = 1.0
    """Fraction of the window during which data-parallel collectives are issued that hides them:
    the gradient reduce-scatter (all-reduce) runs during the backward pass of the last
    micro-batch (every micro-batch with ZeRO-2/3), ZeRO's parameter all-gather during the first
    forward of the next step (every forward and backward with ZeRO-3). 1: Megatron-LM's
    ``--overlap-grad-reduce --overlap-param-gather``; 0: nothing overlaps."""

    dp_bucket_params: int = 40_000_000
    """Parameters per gradient bucket. The last bucket's reduction starts after the last
    gradient is computed, so it is never hidden. 40M is Megatron-LM's default bucket size."""

    pp_overlap: float = 0.0
    """Fraction of pipeline point-to-point transfer time hidden behind computation (0: the
    sends and receives of each micro-batch sit between its forward and backward passes)."""

    cp_overlap: float = 1.0
    """Fraction of the attention computation that the context-parallel K/V ring can hide behind
    (ring attention overlaps each block's transfer with the previous block's attention; Liu et
    al. 2023). Exposed CP time is ``max(0, cp_time − cp_overlap · attention_time)``."""

    ep_overlap: float = 0.0
    """Fraction of expert-parallel all-to-all time hidden behind computation (0: dispatch and
    combine wait for the router and the experts)."""

    def __post_init__(self) -> None:
        _fraction("mfu", self.mfu, 0.0, 1.0, lo_open=True)
        _fraction("headroom", self.headroom, 0.0, 1.0, hi_open=True)
        for f in ("tp_overlap", "dp_overlap", "pp_overlap", "cp_overlap", "ep_overlap"):
            _fraction(f, getattr(self, f), 0.0, 1.0)
        _int("dp_bucket_params", self.dp_bucket_params)

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> Assumptions:
        known = {f.name for f in fields(cls)}
        for k in kwargs:
            if k not in known:
                raise ValueError(f"unknown option {k!r}; planner assumptions are: "
                                 f"{', '.join(sorted(known))}")
        return cls(**kwargs)


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class StepTime:
    """Seconds of one step on the slowest stage: compute, recompute, exposed communication by
    kind, the pipeline bubble. ``total`` is their sum."""

    compute: float
    recompute: float
    tp: float
    cp: float
    ep: float
    pp: float
    dp: float
    bubble: float

    FIELDS = ("compute", "recompute", "tp", "cp", "ep", "pp", "dp", "bubble")

    @property
    def total(self) -> float:
        return sum(getattr(self, f) for f in self.FIELDS)

    @property
    def comm(self) -> float:
        """Exposed communication: TP (with SP), CP, EP, PP and DP."""
        return self.tp + self.cp + self.ep + self.pp + self.dp

    def as_dict(self) -> dict[str, float]:
        return {**{f: getattr(self, f) for f in self.FIELDS}, "total": self.total}


@dataclass(frozen=True, repr=False)
class Candidate:
    """One feasible layout with its memory (a real :func:`estimate`) and modelled speed."""

    parallel: ParallelConfig
    setup: TrainingSetup
    estimate: Estimate
    layers_per_stage: tuple[int, ...]
    time: StepTime
    critical_stage: int
    tokens_per_s: float
    model_flops_per_gpu: float
    hardware_flops_per_gpu: float
    peak_flops: float
    global_batch: int
    exact: bool = True

    @property
    def step_time(self) -> float:
        """Modelled seconds per optimizer step."""
        return self.time.total

    @property
    def peak_bytes(self) -> int:
        return self.estimate.peak_bytes

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: useful FLOP/s per GPU over the GPU's peak."""
        return self.model_flops_per_gpu / self.peak_flops

    @property
    def bubble_fraction(self) -> float:
        return self.time.bubble / self.step_time

    def __repr__(self) -> str:
        return (f"<Candidate {self.label()}: {self.step_time:.3f} s/step, "
                f"peak {self.peak_bytes / GIB:.1f} GiB>")

    def label(self) -> str:
        par, st = self.parallel, self.setup
        parts = [f"t={par.tp}", f"p={par.pp}", f"d={par.dp}"]
        if par.cp > 1:
            parts.append(f"cp={par.cp}")
        if par.ep > 1:
            parts.append(f"e={par.ep}")
        if par.vpp > 1:
            parts.append(f"v={par.vpp}")
        parts.append(f"ZeRO-{par.zero}")
        if par.sp:
            parts.append("SP")
        parts += [f"{st.recompute} recompute", f"b={st.micro_batch}"]
        return ", ".join(parts)

    def to_dict(self) -> dict:
        st = self.setup
        return {"label": self.label(), "parallel": asdict(self.parallel),
                "micro_batch": st.micro_batch, "num_microbatches": st.num_microbatches,
                "recompute": st.recompute, "schedule": st.schedule,
                "layers_per_stage": list(self.layers_per_stage),
                "step_time_s": self.step_time, "time_s": self.time.as_dict(),
                "critical_stage": self.critical_stage, "tokens_per_s": self.tokens_per_s,
                "model_flops_per_gpu": self.model_flops_per_gpu,
                "hardware_flops_per_gpu": self.hardware_flops_per_gpu, "mfu": self.mfu,
                "peak_bytes": self.peak_bytes, "peak_stage": self.estimate.peak.stage,
                "peak_breakdown": self.estimate.peak.to_dict()}


# ---------------------------------------------------------------------------- the model
class _StageComm:
    """Communication seconds of one stage: per micro-batch ``α_c + b·β_c`` for c in tp, cp, ep,
    pp; data parallel ``F + m·P`` per step; ``grad_once``: one full gradient reduction."""

    __slots__ = ("alpha", "beta", "dp_fixed", "dp_per_mb", "grad_once")

    def __init__(self, alpha, beta, dp_fixed, dp_per_mb, grad_once):
        self.alpha, self.beta = alpha, beta
        self.dp_fixed, self.dp_per_mb, self.grad_once = dp_fixed, dp_per_mb, grad_once

    def act(self, cat: str, b: int) -> float:
        return self.alpha[cat] + b * self.beta[cat]

    def dp(self, m: int) -> float:
        return self.dp_fixed + m * self.dp_per_mb


_ACT = ("tp", "cp", "ep", "pp")


class _Model:
    """Everything fixed for one (spec, cluster, batch, seq, assumptions, setup options)."""

    def __init__(self, spec: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int,
                 a: Assumptions, setup_kw: dict):
        self.spec, self.cluster, self.G, self.s, self.a = spec, cluster, global_batch, seq_len, a
        self.setup_kw = setup_kw
        hw = cluster.hardware
        self.hw = hw
        self.rate = hw.peak_flops_bf16 * a.mfu
        self.usable = int(hw.memory_bytes * (1 - a.headroom))
        self.f_layer, self.f_core, self.f_head = flops_per_sequence(spec, seq_len)
        prec = PRECISIONS[setup_kw["precision"]]
        self.act_bytes, self.grad_bytes, self.param_bytes = prec["act"], prec["grad"], prec["param"]
        self._est: dict = {}
        self._act: dict = {}
        self._dp: dict = {}
        self._params: dict = {}
        self.estimates = 0

    # ------------------------------------------------------------------ pieces
    def setup(self, b: int, m: int, recompute: str, v: int) -> TrainingSetup:
        return TrainingSetup(seq_len=self.s, micro_batch=b, num_microbatches=m, recompute=recompute,
                             schedule="interleaved" if v > 1 else "1f1b", **self.setup_kw)

    def estimate(self, par: ParallelConfig, setup: TrainingSetup, lps: tuple) -> Estimate:
        key = (par, setup, lps)
        est = self._est.get(key)
        if est is None:
            est = estimate(self.spec, par, setup, layers_per_stage=list(lps))
            self._est[key] = est
            self.estimates += 1
        return est

    def params(self, t: int, e: int, n_layers: int, first: bool, last: bool) -> tuple[int, int]:
        key = (t, e, n_layers, first, last)
        out = self._params.get(key)
        if out is None:
            out = self._params[key] = stage_params(self.spec, t, e, n_layers, first, last)
        return out

    def intra(self, par: ParallelConfig) -> dict[str, bool]:
        return placement(par, self.cluster.gpus_per_node)

    def _times(self, ops, intra: dict[str, bool]) -> dict[str, float]:
        out = category_times(ops, self.hw, intra)
        out["tp"] += out.pop("sp")
        return out

    @staticmethod
    def _grad_once(ops, intra_dp: bool, hw: Hardware) -> float:
        link = hw.intra_node if intra_dp else hw.inter_node  # placement()["dp_intra"]
        total = 0.0
        for o in ops:
            if o.category == "dp" and "gradient" in o.what:
                total += o.time(link) / o.count
        return total

    def _shape(self, par: ParallelConfig, recompute: str, n_layers: int, stage: int,
               first: bool, last: bool, b: int = 1, m: int = 1) -> StageShape:
        spec = self.spec
        dense, expert = self.params(par.tp, par.ep, n_layers, first, last)
        return StageShape(params=dense, seq_len=self.s, micro_batch=b, hidden=spec.hidden,
                          layers=n_layers, num_microbatches=m, dp=par.dp, zero=par.zero,
                          grad_bytes=self.grad_bytes, param_bytes=self.param_bytes, tp=par.tp,
                          sp=par.sp, pp=par.pp, v=par.vpp, stage=stage, cp=par.cp,
                          kv_hidden=spec.kv_dim, ep=par.ep,
                          moe_layers=n_layers if spec.is_moe else 0, expert_params=expert,
                          top_k=max(spec.top_k, 1),
                          capacity_factor=(self.setup_kw["capacity_factor"] if spec.is_moe
                                           and self.setup_kw["capacity_factor"] != 1.0 else None),
                          act_bytes=self.act_bytes, recompute=recompute)

    def stage_comm_linear(self, par: ParallelConfig, recompute: str, n_layers: int, stage: int,
                          first: bool, last: bool) -> _StageComm:
        """Coefficients from step_comm at (b, m) = (1, 1), (2, 1) for the per-micro-batch part
        and m = 1, 2 for the data-parallel part, each cached on what it depends on."""
        intra = self.intra(par)
        rc = "full" if recompute == "full" else "none"  # selective adds no collective
        akey = (par.tp, par.cp, par.pp, par.ep, par.sp, rc, par.vpp, n_layers, stage, first,
                last, intra["cp_intra"], intra["ep_intra"], intra["pp_intra"])
        act = self._act.get(akey)
        if act is None:
            x = replace(self._shape(par, rc, n_layers, stage, first, last), dp=par.ep, zero=0,
                        params=0, expert_params=0)
            t1 = self._times(collectives(x).ops, intra)
            t2 = self._times(collectives(replace(x, micro_batch=2)).ops, intra)
            beta = {c: t2[c] - t1[c] for c in _ACT}
            act = self._act[akey] = ({c: t1[c] - beta[c] for c in _ACT}, beta)
        dense, expert = self.params(par.tp, par.ep, n_layers, first, last)
        dkey = (par.cp, par.dp, par.ep, par.zero, dense, expert, intra["dp_intra"])
        dpc = self._dp.get(dkey)
        if dpc is None:
            x = StageShape(params=dense, seq_len=self.s, micro_batch=1, hidden=self.spec.hidden,
                           layers=0, dp=par.dp, zero=par.zero, cp=par.cp, ep=par.ep,
                           expert_params=expert, grad_bytes=self.grad_bytes,
                           param_bytes=self.param_bytes)
            ops1 = collectives(x).ops
            d1 = self._times(ops1, intra)["dp"]
            if par.zero >= 2:
                d2 = self._times(collectives(replace(x, num_microbatches=2)).ops, intra)["dp"]
            else:
                d2 = d1
            dpc = self._dp[dkey] = (2 * d1 - d2, d2 - d1,
                                    self._grad_once(ops1, intra["dp_intra"], self.hw))
        return _StageComm(act[0], act[1], *dpc)

    def stage_comm_exact(self, par: ParallelConfig, recompute: str, b: int, m: int,
                         n_layers: int, stage: int, first: bool, last: bool) -> _StageComm:
        intra = self.intra(par)
        ops = collectives(self._shape(par, recompute, n_layers, stage, first, last, b, m)).ops
        tot = self._times(ops, intra)
        return _StageComm({c: tot[c] / m for c in _ACT}, dict.fromkeys(_ACT, 0.0), tot["dp"], 0.0,
                          self._grad_once(ops, intra["dp_intra"], self.hw))

    # ------------------------------------------------------------------ the step
    def timer(self, par: ParallelConfig, recompute: str, lps: tuple, comm: dict) -> _Timer:
        """``comm`` maps each distinct stage key (n_layers, first, last) to its _StageComm."""
        return _Timer(self, par, recompute, lps, comm)

    def candidate(self, par, setup, est, lps, st, crit, exact) -> Candidate:
        total = st.total
        n = par.world_size
        useful = step_flops(self.spec, self.G, self.s, "none")
        executed = step_flops(self.spec, self.G, self.s, setup.recompute)
        return Candidate(parallel=par, setup=setup, estimate=est, layers_per_stage=tuple(lps),
                         time=st, critical_stage=crit, tokens_per_s=self.G * self.s / total,
                         model_flops_per_gpu=useful / (n * total),
                         hardware_flops_per_gpu=executed / (n * total),
                         peak_flops=self.hw.peak_flops_bf16, global_batch=self.G, exact=exact)

    def exact(self, par: ParallelConfig, setup: TrainingSetup, lps: tuple,
              est: Estimate | None = None) -> Candidate:
        p = par.pp
        b, m, rc = setup.micro_batch, setup.num_microbatches, setup.recompute
        comm = {}
        for i, n in enumerate(lps):
            key = (n, i == 0, i == p - 1)
            if key not in comm:
                comm[key] = self.stage_comm_exact(par, rc, b, m, n, i, *key[1:])
        st, crit = self.timer(par, rc, lps, comm).breakdown(b, m)
        est = est if est is not None else self.estimate(par, setup, lps)
        return self.candidate(par, setup, est, lps, st, crit, True)


class _Timer:
    """Modelled step time of one layout and recompute mode as a function of (b, m).

    Per distinct stage it keeps, for b = 1, the forward, recompute and attention seconds and the
    communication coefficients, so that trying a micro-batch size is a few multiplications."""

    __slots__ = ("a", "p", "v", "zero", "groups")

    def __init__(self, model: _Model, par: ParallelConfig, recompute: str, lps: tuple,
                 comm: dict):
        self.a = a = model.a
        self.p, self.v = par.pp, par.vpp
        self.zero = par.zero
        split_rate = par.tp * par.cp * model.rate
        rc_flops = {"none": 0, "selective": model.f_core, "full": model.f_layer}[recompute]
        seen: dict = {}
        for i, n in enumerate(lps):
            key = (n, i == 0, i == par.pp - 1)
            if key in seen:
                seen[key][1] += 1
                continue
            sc = comm[key]
            fwd = (n * model.f_layer + (model.f_head if key[2] else 0)) / split_rate
            dense, expert = model.params(par.tp, par.ep, n, key[1], key[2])
            frac = min(1.0, a.dp_bucket_params / max(dense + expert, 1))
            seen[key] = [i, 1, fwd, n * rc_flops / split_rate, 3 * n * model.f_core / split_rate,
                         sc, frac]
        self.groups = list(seen.values())

    def _stage(self, g, b: int, m: int):
        a = self.a
        _, _, fwd1, rec1, attn1, sc, frac = g
        fwd, rec = b * fwd1, b * rec1
        tp = sc.act("tp", b) * (1 - a.tp_overlap)
        cpx = max(0.0, sc.act("cp", b) - a.cp_overlap * b * attn1)
        ep = sc.act("ep", b) * (1 - a.ep_overlap)
        pp = sc.act("pp", b) * (1 - a.pp_overlap)
        # data parallel: issued during backward (and forward) passes, never hides the last bucket
        # window: ZeRO-0 the last backward; ZeRO-1 + the next first forward; ZeRO-2 every
        # backward + one forward; ZeRO-3 every backward and forward
        n_bwd, n_fwd = {0: (1, 0), 1: (1, 1), 2: (m, 1), 3: (m, m)}[self.zero]
        window = a.dp_overlap * (n_bwd * (2 * fwd + rec) + n_fwd * fwd)
        dp_total = sc.dp(m)
        dp = max(dp_total - window, min(dp_total, frac * sc.grad_once))
        return (3 * fwd + rec + tp + cpx + ep + pp, (3 * fwd, rec, tp, cpx, ep, pp), dp)

    def total(self, b: int, m: int) -> float:
        """Seconds per step (see :meth:`breakdown`)."""
        t_max, t_sum, dp = 0.0, 0.0, 0.0
        for g in self.groups:
            t_i, _, dp_i = self._stage(g, b, m)
            t_max = max(t_max, t_i)
            t_sum += g[1] * t_i
            dp = max(dp, dp_i)
        if self.p == 1:
            return m * t_max + dp
        return m * t_max + bubble_ratio(self.p, m, self.v) * m * (t_sum - t_max) / (self.p - 1) + dp

    def breakdown(self, b: int, m: int) -> tuple[StepTime, int]:
        """The step time split by cause, and the critical (slowest) stage."""
        best, t_sum, dp = None, 0.0, 0.0
        for g in self.groups:
            t_i, parts, dp_i = self._stage(g, b, m)
            if best is None or t_i > best[0]:
                best = (t_i, parts, g[0])
            t_sum += g[1] * t_i
            dp = max(dp, dp_i)
        t_max, parts, crit = best
        bubble = 0.0
        if self.p > 1:  # (Σ t_i − t_max)/v: (p−1)/(v·m) of the ideal m·t for equal stages
            bubble = bubble_ratio(self.p, m, self.v) * m * (t_sum - t_max) / (self.p - 1)
        st = StepTime(compute=m * parts[0], recompute=m * parts[1], tp=m * parts[2],
                      cp=m * parts[3], ep=m * parts[4], pp=m * parts[5], dp=dp, bubble=bubble)
        return st, crit


def _stage_keys(lps: tuple, p: int) -> list[tuple]:
    seen: dict = {}
    for i, n in enumerate(lps):
        seen.setdefault((n, i == 0, i == p - 1), i)
    return [(k, i) for k, i in seen.items()]


# ---------------------------------------------------------------------------- the plan
@dataclass(repr=False)
class Plan:
    """The answer of :func:`plan`.

    ``candidates``: the ``top`` fastest feasible layouts, fastest first, each with a real
    :func:`estimate` and exact communication; ``best``: the first (``None`` when nothing fits);
    ``rejected``: family → why it was rejected; ``pareto``: the layouts no other is both faster
    and smaller than; ``points``: (peak bytes, step seconds) of every feasible layout estimated;
    ``message``: why nothing fits (``None`` otherwise); ``stats``: search counts and seconds.
    """

    spec: ModelSpec
    cluster: Cluster
    global_batch: int
    seq_len: int
    assumptions: Assumptions
    candidates: list[Candidate]
    rejected: dict[str, str]
    pareto: list[Candidate]
    points: list[tuple[int, float]]
    message: str | None
    stats: dict

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def __repr__(self) -> str:
        head = f"<Plan {self.spec.name} on {self.cluster}: "
        if not self.candidates:
            return head + f"{self.message}>"
        return head + f"{len(self.candidates)} candidates, best {self.best.label()}>"

    @property
    def usable_bytes(self) -> int:
        """GPU memory a layout may use: ``(1 − headroom)`` of the GPU."""
        return int(self.cluster.hardware.memory_bytes * (1 - self.assumptions.headroom))

    # ------------------------------------------------------------------ display
    _HEAD = ("#", "t", "p", "d", "cp", "e", "v", "ZeRO", "SP", "recompute", "b", "m",
             "peak GiB", "step s", "tokens/s", "TFLOP/s", "MFU", "bubble", "comm")

    def _rows(self) -> list[list[str]]:
        rows = []
        for i, c in enumerate(self.candidates, 1):
            par, st = c.parallel, c.setup
            rows.append([str(i), str(par.tp), str(par.pp), str(par.dp), str(par.cp), str(par.ep),
                         str(par.vpp), str(par.zero), "yes" if par.sp else "no", st.recompute,
                         str(st.micro_batch), str(st.num_microbatches),
                         f"{c.peak_bytes / GIB:.1f}", f"{c.step_time:.3f}",
                         f"{c.tokens_per_s:,.0f}", f"{c.model_flops_per_gpu / 1e12:.0f}",
                         f"{c.mfu:.1%}", f"{c.time.bubble / c.step_time:.1%}",
                         f"{c.time.comm / c.step_time:.1%}"])
        return rows

    def _title(self) -> str:
        hw = self.cluster.hardware
        return (f"{self.spec.name} on {self.cluster} ({self.cluster.world_size} GPUs, "
                f"{hw.memory_gib:.0f} GiB, {self.usable_bytes / GIB:.1f} GiB usable), "
                f"global batch {self.global_batch} x {self.seq_len} tokens")

    def table(self) -> str:
        """The ranked candidates as a fixed-width text table."""
        if not self.candidates:
            return self.message or "no candidates"
        rows = self._rows()
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(self._HEAD)]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        return "\n".join([fmt.format(*self._HEAD), *(fmt.format(*r) for r in rows)])

    def _rejected_lines(self, limit: int = 12) -> list[str]:
        items = list(self.rejected.items())
        lines = [f"  {k}: {v}" for k, v in items[:limit]]
        if len(items) > limit:
            lines.append(f"  ... and {len(items) - limit} more (Plan.rejected)")
        return lines

    def __str__(self) -> str:
        lines = [self._title()]
        if not self.candidates:
            lines.append(self.message or "no candidates")
        else:
            b = self.best
            lines += ["TFLOP/s = model FLOP/s per GPU (no recompute counted); MFU of "
                      f"{b.peak_flops / 1e12:.0f} TFLOP/s peak; bubble and comm: share of "
                      "the step", self.table(), "", f"best: {b.label()}",
                      "step time (s): " + ", ".join(f"{k} {v:.3f}"
                                                    for k, v in b.time.as_dict().items() if v),
                      str(b.estimate)]
        if self.rejected:
            lines += ["", f"rejected families ({len(self.rejected)}):", *self._rejected_lines()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        title = f"<p><b>{html.escape(self._title())}</b></p>"
        if not self.candidates:
            return f"<div>{title}<p>{html.escape(self.message or 'no candidates')}</p></div>"
        head = "".join(f"<th>{h}</th>" for h in self._HEAD)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                       for r in self._rows())
        rej = "".join(f"<li><code>{html.escape(k)}</code>: {html.escape(v)}</li>"
                      for k, v in list(self.rejected.items())[:12])
        more = len(self.rejected) - 12
        rej += f"<li>… and {more} more</li>" if more > 0 else ""
        return (f"<div>{title}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
                f"</table><p>TFLOP/s: model FLOP/s per GPU. Best: "
                f"<code>{html.escape(self.best.label())}</code></p>"
                f"{self.best.estimate._repr_html_()}"
                f"<details><summary>rejected families ({len(self.rejected)})</summary>"
                f"<ul>{rej}</ul></details></div>")

    def to_dict(self) -> dict:
        hw = self.cluster.hardware
        return {"model": self.spec.name,
                "cluster": {"gpu": hw.name, "gpus_per_node": self.cluster.gpus_per_node,
                            "nodes": self.cluster.nodes, "world_size": self.cluster.world_size,
                            "memory_bytes": hw.memory_bytes, "usable_bytes": self.usable_bytes},
                "global_batch": self.global_batch, "seq_len": self.seq_len,
                "assumptions": asdict(self.assumptions),
                "candidates": [c.to_dict() for c in self.candidates],
                "pareto": [c.to_dict() for c in self.pareto],
                "rejected": dict(self.rejected), "message": self.message, "stats": self.stats}

    # ------------------------------------------------------------------ engines
    def emit(self, engine: str, candidate: Candidate | int | None = None) -> str:
        """The layout (default: the best; an ``int`` picks a rank, 0-based) as settings for a
        real engine: ``"megatron"`` (Megatron-LM command-line arguments), ``"deepspeed"`` (a
        DeepSpeed config JSON; the tensor and pipeline sizes are launcher arguments, given to
        Megatron-DeepSpeed as ``--tensor-model-parallel-size`` / ``--pipeline-model-parallel-size``)
        or ``"torchtitan"`` (a TOML job-config fragment)."""
        if engine not in ENGINES:
            raise ValueError(f"engine={engine!r} must be one of {ENGINES}")
        if candidate is None or isinstance(candidate, int):
            if not self.candidates:
                raise ValueError(f"nothing to emit: {self.message}")
            candidate = self.candidates[candidate or 0]
        return {"megatron": _megatron, "deepspeed": _deepspeed,
                "torchtitan": _torchtitan}[engine](self, candidate)


def _megatron(plan: Plan, c: Candidate) -> str:
    par, st, spec = c.parallel, c.setup, plan.spec
    notes = [f"# parmem plan: {spec.name} on {plan.cluster}: {c.label()}"]
    args = [f"--tensor-model-parallel-size {par.tp}", f"--pipeline-model-parallel-size {par.pp}"]
    if par.cp > 1:
        args.append(f"--context-parallel-size {par.cp}")
    if par.ep > 1:
        args.append(f"--expert-model-parallel-size {par.ep}")
    if par.sp:
        args.append("--sequence-parallel")
    if par.zero == 1:
        args.append("--use-distributed-optimizer")
    elif par.zero >= 2:  # Megatron-FSDP: optim_grads = ZeRO-2, optim_grads_params = ZeRO-3
        notes.append("# ZeRO-2/3 in Megatron-LM is Megatron-FSDP (recent versions; it also "
                     "wants --ckpt-format fsdp_dtensor)")
        strategy = "optim_grads" if par.zero == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
                 "--use-distributed-optimizer"]
    if par.dp * par.cp > 1:
        args.append("--overlap-grad-reduce")
        if par.zero >= 1:
            args.append("--overlap-param-gather")
    if st.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    elif st.recompute == "selective":
        args.append("--recompute-granularity selective")
    if par.vpp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage "
                    f"{c.layers_per_stage[0] // par.vpp}")
    if len(set(c.layers_per_stage)) > 1:
        notes.append(f"# uneven pipeline split {list(c.layers_per_stage)}: Megatron-LM sets only "
                     "the first and last stage sizes (--decoder-first-pipeline-num-layers, "
                     "--decoder-last-pipeline-num-layers)")
    args += [f"--micro-batch-size {st.micro_batch}", f"--global-batch-size {plan.global_batch}",
             f"--seq-length {plan.seq_len}"]
    if st.precision == "bf16-mixed":
        args.append("--bf16")
    elif st.precision == "fp16-mixed":
        args.append("--fp16")
    return "\n".join(notes) + "\n" + " \\\n".join(args)


def _deepspeed(plan: Plan, c: Candidate) -> str:
    st, par = c.setup, c.parallel
    cfg: dict = {"train_batch_size": plan.global_batch,
                 "train_micro_batch_size_per_gpu": st.micro_batch,
                 "gradient_accumulation_steps": st.num_microbatches}
    if st.precision == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
    elif st.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True}
    cfg["zero_optimization"] = {"stage": par.zero, "overlap_comm": True}
    if st.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": par.sp,
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return json.dumps(cfg, indent=2)


def _torchtitan(plan: Plan, c: Candidate) -> str:
    par, st = c.parallel, c.setup
    lines = [f"# parmem plan: {plan.spec.name} on {plan.cluster}: {c.label()}",
             "# key names follow torchtitan's JobConfig; check them against your version",
             "[parallelism]"]
    if par.zero == 0:
        lines += [f"data_parallel_replicate_degree = {par.dp}", "data_parallel_shard_degree = 1"]
    else:
        lines += ["data_parallel_replicate_degree = 1", f"data_parallel_shard_degree = {par.dp}"]
        if par.zero in (1, 2):
            lines += ["# torchtitan shards with FSDP2; keeping parameters gathered between "
                      "forward and backward", "# is the closest it has to ZeRO-1/2",
                      'fsdp_reshard_after_forward = "never"']
    lines.append(f"tensor_parallel_degree = {par.tp}")
    if par.tp > 1 and not par.sp:
        lines.append("# torchtitan's tensor parallelism always shards norms over the sequence (SP)")
    lines.append(f"pipeline_parallel_degree = {par.pp}")
    if par.pp > 1:
        sched = "Interleaved1F1B" if par.vpp > 1 else "1F1B"
        lines += [f'pipeline_parallel_schedule = "{sched}"',
                  f"pipeline_parallel_microbatch_size = {st.micro_batch}"]
        if par.vpp > 1:
            lines.append(f"pipeline_parallel_layers_per_stage = "
                         f"{c.layers_per_stage[0] // par.vpp}")
    lines.append(f"context_parallel_degree = {par.cp}")
    if par.ep > 1:
        lines.append(f"expert_parallel_degree = {par.ep}")
    lines += ["", "[training]", f"local_batch_size = {plan.global_batch // par.dp}",
              f"global_batch_size = {plan.global_batch}", f"seq_len = {plan.seq_len}",
              "", "[activation_checkpoint]", f'mode = "{st.recompute}"']
    if st.recompute == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- search
def _options(name: str, value, allowed=None, kind=int) -> tuple | None:
    if value is None:
        return None
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        value = (value,)
    try:
        vals = tuple(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} must be a {kind.__name__} or a sequence of them") \
            from None
    if not vals:
        raise ValueError(f"{name}=() must list at least one value")
    for x in vals:
        if kind is int:
            _int(name, x, 0 if name == "zero" else 1)
        elif not isinstance(x, kind):
            raise ValueError(f"{name}: {x!r} must be a {kind.__name__}")
        if allowed is not None and x not in allowed:
            raise ValueError(f"{name}: {x!r} must be one of {allowed}")
    return tuple(sorted(set(vals)))


def _tp_problem(spec: ModelSpec, t: int, gpn: int) -> str | None:
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


def _fmt_setting(zero: int, sp: bool, rc: str, b: int, v: int = 1) -> str:
    parts = [f"ZeRO-{zero}"] + (["SP"] if sp else []) + [f"{rc} recompute", f"micro-batch {b}"]
    if v > 1:
        parts.append(f"v={v}")
    return ", ".join(parts)


def _family_key(t: int, p: int, d: int, cp: int, e: int) -> str:
    key = f"t={t}, p={p}, d={d}"
    if cp > 1:
        key += f", cp={cp}"
    if e > 1:
        key += f", e={e}"
    return key


def _no_fit(fits: list, usable: int, headroom: float, gpu: str) -> str:
    peak, desc = min(fits, key=lambda x: x[0])
    need = peak / (1 - headroom)
    bigger = [(hardware_preset(n).memory_bytes, n) for n in hardware_presets()]
    bigger = sorted(x for x in bigger if x[0] >= need)
    hint = f"needs GPUs of ≥ {need / GIB:.1f} GiB"
    if bigger:
        hint += f" (e.g. {bigger[0][1]}, {bigger[0][0] / GIB:.1f} GiB)"
    return (f"no layout fits: smallest peak is {peak / GIB:.1f} GiB with {desc}; {hint} or "
            f"more nodes ({usable / GIB:.1f} GiB usable per {gpu} with {headroom:.0%} headroom)")


def plan(spec: ModelSpec, cluster: Cluster, global_batch: int, seq_len: int, *, top: int = 10,
         tp=None, pp=None, cp=1, ep=None, zero=(0, 1, 2, 3), sp=(False, True),
         recompute=RECOMPUTE, micro_batch=None, vpp=None, uneven_pp: bool = False,
         precision: str = "bf16-mixed", optimizer: str = "adamw", flash_attention: bool = False,
         dropout: bool = True, capacity_factor: float = 1.0, cuda_context: int = 0,
         **assumptions) -> Plan:
    """Search the layouts of ``cluster`` for ``spec`` at ``global_batch`` sequences of
    ``seq_len`` tokens per step; rank the feasible ones by modelled step time.

    Search space (each may be narrowed to a value or a sequence of values; ``None`` = every
    valid one): ``tp`` (within a node, dividing heads, kv_heads and the FFN width), ``pp``
    (dividing the layers, or any with ``uneven_pp=True``: then extra layers go to the first
    stages, as :func:`estimate` splits), ``cp`` (context parallel; 1 unless listed: it pays only
    at long sequences), ``ep`` (MoE: dividing the experts and d), ``zero`` (0–3; 2 and 3 only
    with ``pp=1``, DeepSpeed's rule), ``sp`` (with ``tp > 1``), ``recompute``, ``micro_batch``
    (dividing ``global_batch / d``), ``vpp`` (virtual stages; v ≥ 2 needs ``m % p == 0`` and v
    dividing each stage's layers). ``precision``, ``optimizer``, ``flash_attention``,
    ``dropout``, ``capacity_factor`` and ``cuda_context`` go to every
    :class:`~parmem.config.TrainingSetup`.

    ``**assumptions``: the cost model's parameters, see :class:`Assumptions` (``mfu``,
    ``headroom``, ``tp_overlap``, ``dp_overlap``, ``dp_bucket_params``, ``pp_overlap``,
    ``cp_overlap``, ``ep_overlap``).

    Returns a :class:`Plan`. When nothing fits, the plan has no candidates and ``message`` says
    which layout came closest and what it would need (an answer, not an error: the widget and
    the CLI show it). Invalid arguments raise ``ValueError`` naming the argument.
    """
    t0 = time.perf_counter()
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    _int("global_batch", global_batch)
    _int("seq_len", seq_len)
    _int("top", top)
    _int("cuda_context", cuda_context, 0)
    if spec.position == "learned" and seq_len > spec.max_positions:
        raise ValueError(f"seq_len={seq_len} > max_positions={spec.max_positions} "
                         f"(learned positions of {spec.name})")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {tuple(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} must be one of {tuple(OPTIMIZERS)}")
    a = Assumptions.from_kwargs(assumptions)
    tp_o = _options("tp", tp)
    pp_o = _options("pp", pp)
    cp_o = _options("cp", cp)
    ep_o = _options("ep", ep)
    zero_o = _options("zero", zero, (0, 1, 2, 3))
    sp_o = _options("sp", sp, (False, True), bool)
    rc_o = _options("recompute", recompute, RECOMPUTE, str)
    mb_o = _options("micro_batch", micro_batch)
    v_o = _options("vpp", vpp)
    if ep_o is not None and not spec.is_moe and ep_o != (1,):
        raise ValueError(f"ep={ep!r}: expert parallelism needs a mixture-of-experts model "
                         f"({spec.name} is dense)")
    setup_kw = dict(precision=precision, optimizer=optimizer, flash_attention=bool(flash_attention),
                    dropout=bool(dropout), capacity_factor=capacity_factor,
                    cuda_context=cuda_context)
    TrainingSetup(seq_len=seq_len, **setup_kw)  # validates capacity_factor and the rest
    model = _Model(spec, cluster, global_batch, seq_len, a, setup_kw)
    N, gpn, L = cluster.world_size, cluster.gpus_per_node, spec.layers
    rc_order = [r for r in _RC_ORDER if r in rc_o]
    rejected: dict[str, str] = {}
    lower_bounds: list[tuple[int, str]] = []
    feasible: list[tuple] = []  # (time, peak, par, setup, est, lps)
    families = 0
    batch_ok = reached_batch = False

    for t in tp_o or _divisors(N):
        if t > spec.heads and tp_o is None:
            continue
        if N % t:
            rejected[f"t={t}"] = f"tp={t} does not divide the {N} GPUs"
            continue
        problem = _tp_problem(spec, t, gpn)
        if problem:
            rejected[f"t={t}"] = problem
            continue
        for c in cp_o:
            if (N // t) % c:
                rejected[f"t={t}, cp={c}"] = f"cp={c} does not divide the {N // t} GPUs left by tp"
                continue
            if seq_len % c:
                rejected[f"t={t}, cp={c}"] = f"cp={c} must divide seq_len={seq_len}"
                continue
            for p in pp_o or _divisors(N // (t * c)):
                fam_tp = f"t={t}, p={p}" + (f", cp={c}" if c > 1 else "")
                if (N // (t * c)) % p:
                    rejected[fam_tp] = f"pp={p} does not divide the {N // (t * c)} GPUs left"
                    continue
                if p > L:  # one entry for all of them
                    rejected.setdefault(f"t={t}, p>{L}" + (f", cp={c}" if c > 1 else ""),
                                        f"pp={p} > layers={L}: every stage needs a layer")
                    continue
                if L % p and not uneven_pp:
                    rejected[fam_tp] = f"pp={p} must divide layers={L} (or pass uneven_pp=True)"
                    continue
                zeros = [z for z in sorted(zero_o, reverse=True) if p == 1 or z <= 1]
                if not zeros:
                    rejected[fam_tp] = (f"ZeRO-{'/'.join(map(str, zero_o))} cannot be combined "
                                        f"with pp={p} (DeepSpeed rule)")
                    continue
                d = N // (t * c * p)
                if d * c == 1:  # no data-parallel group: every ZeRO stage is the same layout
                    zeros = [zeros[-1]]
                reached_batch = True
                if global_batch % d:
                    rejected[_family_key(t, p, d, c, 1)] = (
                        f"global_batch={global_batch} is not divisible by d={d}")
                    continue
                batch_ok = True
                per_replica = global_batch // d
                bs = [b for b in _divisors(per_replica) if mb_o is None or b in mb_o]
                if not bs:
                    rejected[_family_key(t, p, d, c, 1)] = (
                        f"no allowed micro-batch divides global_batch/d = {per_replica}")
                    continue
                sps = [True, False] if t > 1 else [False]
                sps = [x for x in sps if x in sp_o or t == 1]
                if (seq_len // c) % t:
                    sps = [x for x in sps if not x]
                if not sps:
                    rejected[fam_tp] = (f"sp=True needs seq_len/cp={seq_len // c} divisible by "
                                        f"tp={t}" if t > 1 else "sp=True needs tp >= 2")
                    continue
                lps = even_split(L, p)
                vs = [1] + [v for v in range(2, min(lps) + 1)
                            if p > 1 and all(n % v == 0 for n in lps)]
                if v_o is not None:
                    vs = [v for v in vs if v in v_o]
                if not vs:
                    rejected[fam_tp] = f"no allowed vpp divides the {min(lps)} layers per stage"
                    continue
                es = [1]
                if spec.is_moe:
                    es = [e for e in _divisors(spec.num_experts) if d % e == 0]
                    if ep_o is not None:
                        es = [e for e in es if e in ep_o]
                    if not es:
                        rejected[_family_key(t, p, d, c, 1)] = (
                            f"no allowed ep divides both num_experts={spec.num_experts} and d={d}")
                        continue
                for e in es:
                    families += 1
                    fam = _family_key(t, p, d, c, e)
                    reason = _search_family(model, fam, t, c, p, d, e, lps, zeros, sps,
                                            rc_order, bs, vs, per_replica, feasible,
                                            lower_bounds)
                    if reason:
                        rejected[fam] = reason

    if reached_batch and not batch_ok:
        ds = sorted({int(k.split("d=")[1].split(",")[0]) for k in rejected if "d=" in k})
        raise ValueError(f"global_batch={global_batch} is not divisible by any data-parallel "
                         f"size d that the layouts of {N} GPUs allow (d in {ds})")
    feasible.sort(key=lambda x: (x[0], x[1]))
    # re-time the leaders with the exact step_comm of their own b and m, then rank again
    head = [model.exact(par, st, lps, est) for _, _, par, st, est, lps in feasible[:top + 8]]
    head.sort(key=lambda c: (c.step_time, c.peak_bytes))
    candidates = head[:top]
    pareto_raw, best_mem = [], None
    for x in feasible:
        if best_mem is None or x[1] < best_mem:
            pareto_raw.append(x)
            best_mem = x[1]
    exact_by_key = {(c.parallel, c.setup): c for c in head}
    pareto = []
    for _, _, par, st, est, lps in pareto_raw:
        c = exact_by_key.get((par, st))
        pareto.append(c if c is not None else model.exact(par, st, lps, est))
    message = None
    if not candidates:
        if lower_bounds:
            message = _no_fit(lower_bounds, model.usable, a.headroom, cluster.hardware.name)
        else:
            message = "no valid layout: " + "; ".join(sorted(set(rejected.values()))[:6])
    stats = {"families": families, "feasible": len(feasible), "estimates": model.estimates,
             "seconds": time.perf_counter() - t0}
    return Plan(spec=spec, cluster=cluster, global_batch=global_batch, seq_len=seq_len,
                assumptions=a, candidates=candidates, rejected=rejected, pareto=pareto,
                points=[(x[1], x[0]) for x in feasible], message=message, stats=stats)


def _search_family(model: _Model, fam: str, t: int, c: int, p: int, d: int, e: int,
                   lps: tuple, zeros: list, sps: list, rcs: list, bs: list, vs: list,
                   per_replica: int, out: list, lower_bounds: list) -> str | None:
    """Visit one family's settings from frugal to generous (see the module docstring); append
    (time, peak, par, setup, est, lps) of every feasible non-dominated setting to ``out``.
    Returns the rejection reason when nothing in the family fits, else ``None``."""
    usable = model.usable
    # lower bound: the family's most frugal setting (interleaving only adds in-flight memory)
    z0, sp0, rc0, b0 = zeros[0], sps[0], rcs[0], bs[0]
    est0 = None
    if 1 in vs:
        est0 = model.estimate(ParallelConfig(dp=d, tp=t, pp=p, ep=e, cp=c, sp=sp0, zero=z0),
                              model.setup(b0, per_replica // b0, rc0, 1), lps)
        desc = f"t={t}, p={p}" + (f", cp={c}" if c > 1 else "") + (f", e={e}" if e > 1 else "")
        lower_bounds.append((est0.peak_bytes, f"{desc}, {_fmt_setting(z0, sp0, rc0, b0)}"))
        if est0.peak_bytes > usable:
            pk = est0.peak
            return (f"does not fit: {pk.total / GIB:.1f} GiB > {usable / GIB:.1f} GiB usable on "
                    f"stage {pk.stage}, even with {_fmt_setting(z0, sp0, rc0, b0)}")
    found = False
    keys = _stage_keys(lps, p)
    for v in vs:
        bv = [b for b in bs if v == 1 or (per_replica // b) % p == 0]
        if not bv:
            continue
        axes = (len(zeros), len(sps), len(rcs), len(bv))
        times: dict = {}
        status: dict = {}  # 0 infeasible, 1 dominated, 2 feasible
        pars = {}
        timers = {}
        for zi, z in enumerate(zeros):
            for si, s_ in enumerate(sps):
                par = ParallelConfig(dp=d, tp=t, pp=p, ep=e, cp=c, sp=s_, zero=z, vpp=v)
                pars[zi, si] = par
                for ri, rc in enumerate(rcs):
                    comm = {k: model.stage_comm_linear(par, rc, k[0], i, k[1], k[2])
                            for k, i in keys}
                    timers[zi, si, ri] = model.timer(par, rc, lps, comm)
        order = sorted(((zi, si, ri, bi) for zi in range(axes[0]) for si in range(axes[1])
                        for ri in range(axes[2]) for bi in range(axes[3])), key=sum)
        for cell in order:
            zi, si, ri, bi = cell
            b = bv[bi]
            m = per_replica // b
            par = pars[zi, si]
            rc = rcs[ri]
            tt = timers[zi, si, ri].total(b, m)
            times[cell] = tt
            lower = [cell[:k] + (cell[k] - 1,) + cell[k + 1:] for k in range(4) if cell[k] > 0]
            if any(status[n] == 0 for n in lower):
                status[cell] = 0
                continue
            if any(times[n] <= tt for n in lower):
                status[cell] = 1
                continue
            setup = model.setup(b, m, rc, v)
            est = model.estimate(par, setup, lps)
            if est.peak_bytes > usable:
                status[cell] = 0
                continue
            status[cell] = 2
            found = True
            out.append((tt, est.peak_bytes, par, setup, est, lps))
    return None if found else "does not fit with any allowed setting"


def evaluate(spec: ModelSpec, cluster: Cluster, parallel: ParallelConfig, setup: TrainingSetup,
             *, layers_per_stage=None, **assumptions) -> Candidate:
    """Model one given layout the way :func:`plan` ranks layouts (exact communication, a real
    :func:`estimate`); ``global_batch`` is ``d · b · m``. It need not fit: compare
    ``candidate.peak_bytes`` with ``(1 − headroom)`` of the GPU. ``**assumptions`` as for
    :func:`plan`."""
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    parallel.check_world_size(cluster.world_size)
    a = Assumptions.from_kwargs(assumptions)
    if parallel.tp > cluster.gpus_per_node:
        raise ValueError(f"tp={parallel.tp} crosses nodes ({cluster.gpus_per_node} GPUs per node)")
    G = parallel.dp * setup.micro_batch * setup.num_microbatches
    setup_kw = {k: getattr(setup, k) for k in ("precision", "optimizer", "flash_attention",
                                                "dropout", "capacity_factor", "cuda_context")}
    model = _Model(spec, cluster, G, setup.seq_len, a, setup_kw)
    lps = tuple(layers_per_stage) if layers_per_stage is not None else even_split(spec.layers,
                                                                              parallel.pp)
    est = estimate(spec, parallel, setup, layers_per_stage=list(lps))
    return model.exact(parallel, setup, lps, est)
