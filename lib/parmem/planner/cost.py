"""The planner's step-time model: the cluster, the assumptions, and the seconds of one step.

Every assumption is a field of :class:`Assumptions`. One step is ``m = global_batch / (d·b)``
micro-batches on every data-parallel replica. For a pipeline stage ``i`` one micro-batch costs,
on one GPU::

    t_i = compute_i + recompute_i + exposed TP/SP + exposed CP + exposed EP + exposed PP

* **compute**: forward FLOPs times 3 (forward + backward, Narayanan et al. 2021 §5.1: the
  backward pass costs two forwards; the attention core's backward under FlashAttention 2.5,
  :data:`FLASH_CORE_BACKWARD`, since it recomputes the scores) divided by ``peak_flops_bf16 · mfu`` (times the engine's
  and GPU generation's :func:`kernel_scale`; the attention core's FLOPs weigh
  ``1/attention_efficiency``). Forward FLOPs of one
  sequence through one layer are ``2·s·W + 4·s²·(a·d_head)``: every weight matrix ``W`` (Q, K, V,
  output, MLP; the routed ``top_k`` experts for MoE) does a multiply-add per token, and attention
  scores and the weighted sum of values each cost ``2·s²`` per query width. The last stage adds
  the LM head, ``2·s·h·V``. Work is divided by ``t·cp``. An engine profile's micro-batch of
  ``b·s`` tokens costs the compute of ``b·s + mfu_half_tokens`` (small micro-batches run
  their kernels less busy: Narayanan et al. 2021 §3.4, Figure 7). The elementwise work
  between the GEMMs (``mfu_half_hidden`` of :func:`busy_fraction`) weighs by the GPU's
  FLOP-to-byte ratio under an engine profile (:func:`flop_byte_ratio`: it streams through HBM).
* **fine-tuning** (``adapter``): a frozen weight's matmul computes only its input's gradient in
  the backward (one forward's work, not two); the attention core and the LoRA adapters
  (``2·s`` FLOPs per adapter value, :func:`parmem.flops.lora_flops_per_sequence`) still cost
  two forwards; DDP reduces the adapters' fp32 gradients only. QLoRA's dequantisation of each
  4-bit weight (memory-bound kernels) is not timed.
* **recompute**: full recomputation runs each layer's forward again; selective recomputation
  what the engine's selective mode recomputes (``selective_flops`` of ``[engines.*]``): the
  attention core (``4·s²·a·d_head``, Korthikanti et al. 2022 §5: the papers, Megatron-Core) or
  torchtitan's every second matmul (:func:`parmem.flops.selective_flops_per_sequence`).
* For a GPT layer these sums are exactly Narayanan et al. 2021, eq. (3):
  ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))`` FLOPs per iteration with full recomputation and
  ``72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))`` without (:func:`parmem.flops.narayanan_flops`).
* **communication**: :func:`parmem.comm.step_comm` lists the collectives; their alpha-beta time is
  taken on NVLink when the group fits in a node and on the per-GPU InfiniBand link otherwise
  (Megatron-LM rank order: t, cp, e, d, p from the fastest-varying); a ring across nodes with
  ``k`` ranks of its group on each node runs on ``k`` ports (:func:`parmem.comm.op_time`; one
  for the ``paper`` profile: :func:`shares_ports`). TP/SP, EP and PP transfers
  sit on the critical path (less ``tp_overlap`` of the TP collectives the engine runs beside a
  GEMM, ``[engines.*.defaults] tp_overlap``; less ``ep_overlap``, ``pp_overlap``); CP's K/V ring
  hides behind the attention it feeds (``cp_overlap``, Liu et al. 2023).
* **pipeline**: ``T = m·t_max + (Σ_i t_i − t_max)/v``; the second term is the bubble. For equal
  stages it is :func:`parmem.pipeline.bubble_ratio` ``(p−1)/(v·m)`` times the ideal ``m·t``
  (Narayanan et al. 2021 §2.2). Under ZB-V (``schedule="zbv"``, Qi et al. 2024 §6) the bubble
  is :func:`parmem.pipeline.zbv_bubble` of the slowest stage's forward, weight gradient (one
  forward of its weight matrices) and the rest of its backward.
* **data parallel**: the gradient reduction (and ZeRO's parameter gathers) overlap with the
  backward (and forward) passes that run while they are issued, ``dp_overlap`` of that window
  (``dp_overlap_on`` for an engine whose run overlaps them: FSDP2's prefetch, DDP's buckets, the
  overlap flags of parmem's Megatron-LM and DeepSpeed recipes), but never the last bucket
  (``dp_bucket_params``).

The step time is ``T`` plus the exposed data-parallel time. Tokens/s is ``global_batch·s / step``;
``Candidate.model_flops_per_gpu`` counts the useful FLOPs (the 72 form: MFU)
and ``Candidate.hardware_flops_per_gpu`` the executed ones (recomputation
included: eq. (3), what Narayanan et al. 2021 Table 1 reports).

Not modelled: kernel efficiency that grows with the micro-batch under the ``paper`` profile
(so it favours ``b = 1`` unless latency or memory say otherwise), the optimizer step, load
imbalance of MoE routing,
embedding/LM-head collectives, stragglers and failures.

:class:`CostModel` holds what is fixed for one request; :meth:`CostModel.linear_timer` gives a
:class:`StepTimer` whose communication is linear in ``b`` and ``m`` (two
:func:`~parmem.comm.collectives` calls per distinct stage, for the search), and
:meth:`CostModel.exact_time` times one layout with the exact collectives of its own ``b`` and
``m``.

Sources: Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21) §2.2, §5.1, eq. (3), Table 1; Korthikanti et al. 2022 §5;
Liu et al. 2023 (ring attention).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from functools import cache

from ..comm import (
    CATEGORIES,
    CommOp,
    StageShape,
    collectives,
    op_time,
    placement,
    stage_shape,
)
from ..config import PRECISIONS, ParallelConfig, TrainingSetup, vpp_schedule
from ..engines import TP_OPS
from ..engines import engine as engine_profile
from ..estimate import Estimate, estimate
from ..flops import flops_per_sequence, lora_flops_per_sequence, selective_flops_per_sequence
from ..hardware import Hardware, hardware_preset
from ..layout import Layout, Stage, layout
from ..model import ModelSpec
from ..pipeline import bubble_ratio, zbv_bubble
from ..states import reduced_grad_itemsize
from .inputs import Assumptions, Cluster, SetupOptions

__all__ = [
    "busy_fraction",
    "kernel_scale",
    "flop_byte_ratio",
    "FLOP_BYTE_REFERENCE",
    "FLASH_CORE_BACKWARD",
    "CostModel",
    "StageComm",
    "StepTime",
    "StepTimer",
]

# per micro-batch: TP collectives the engine runs beside a GEMM (hidden by tp_overlap), those it
# waits for ("tpx"), CP, EP and PP
_ACT = ("tp", "tpx", "cp", "ep", "pp")


# ---------------------------------------------------------------------------- inputs
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
        """Seconds per step: the sum of the parts."""
        parts: list[float] = [getattr(self, f) for f in self.FIELDS]
        return sum(parts)

    @property
    def comm(self) -> float:
        """Exposed communication: TP (with SP), CP, EP, PP and DP."""
        return self.tp + self.cp + self.ep + self.pp + self.dp

    def as_dict(self) -> dict[str, float]:
        """The parts and ``total`` by name."""
        return {**{f: getattr(self, f) for f in self.FIELDS}, "total": self.total}


# ---------------------------------------------------------------------------- the model
def busy_fraction(
    a: Assumptions, hidden: int, tp: int = 1, scale: float = 1.0, flop_byte: float = 1.0
) -> float:
    """Fraction of the dense BF16 peak the training kernels sustain for a model of hidden size
    ``h`` split ``t`` ways: ``scale · mfu · w/(w + mfu_half_width) · h/(h + flop_byte ·
    mfu_half_hidden)`` with ``w = h/t`` the width of each GPU's matrix multiplications,
    ``scale`` the engine's and GPU generation's (:func:`kernel_scale`) and ``flop_byte`` the
    GPU's FLOP-to-byte ratio relative to the A100 80GB's (:func:`flop_byte_ratio`). Narrow GEMMs
    run further from peak, and a smaller model does more elementwise work (norms, activations,
    softmax) per FLOP: that work is memory-bound, ``∝ h`` bytes a token against ``∝ h²`` FLOPs
    (Williams et al. 2009, the roofline), so its share of the time is ``∝ (peak/bandwidth)/h``.
    The form and its parameters are fitted to published runs (:mod:`parmem.planner.calibration`),
    the scales to measured ones (:mod:`parmem.planner.heldout`)."""
    w = hidden / tp
    half = flop_byte * a.mfu_half_hidden
    return scale * a.mfu * w / (w + a.mfu_half_width) * hidden / (hidden + half)


#: forwards of the attention core that its backward costs under FlashAttention: the backward
#: recomputes the scores ``S = QKᵀ`` and then forms ``dV = PᵀdO``, ``dP = dO·Vᵀ``, ``dQ = dS·K``
#: and ``dK = dSᵀ·Q``, five matmuls of ``2·s²·d_head`` FLOPs a head against the forward's two
#: (Dao et al. 2022, "FlashAttention", Algorithm 4; FlashAttention-2 keeps the recomputation,
#: Dao 2023 §3.1.2). The FLOP counts the sources report (Narayanan et al. 2021 eq. (3), the
#: MFU and HFU of MosaicML's and torchtitan's tables) leave it out, and so does
#: :func:`parmem.flops.step_flops`: it is time the kernel spends, not model FLOPs.
FLASH_CORE_BACKWARD = 2.5

#: the GPU whose FLOP-to-byte ratio ``mfu_half_hidden`` is stated for (:func:`flop_byte_ratio`)
FLOP_BYTE_REFERENCE = "a100-80gb"


def flop_byte_ratio(hw: Hardware, engine: str) -> float:
    """The GPU's dense BF16 peak over its HBM bandwidth (``peak_flops_bf16 /
    memory_bandwidth``, FLOPs per byte), over the same ratio of the A100 80GB
    (:data:`FLOP_BYTE_REFERENCE`; 312 TFLOP/s over 2,039 GB/s, the datasheet): the factor on
    ``mfu_half_hidden`` for a run of profile ``engine``. The elementwise kernels between the
    matrix multiplications stream their tensors through HBM, so their time per FLOP of the
    layer grows with it: an H100 SXM (989 TFLOP/s, 3.35 TB/s) has 1.93 times the A100 80GB's
    ratio, and its elementwise work weighs 1.93 times as much against its GEMMs. 1 for the
    ``paper`` profile (``mfu_half_hidden`` is fitted to its published runs as they are:
    :mod:`parmem.planner.calibration`) and for a GPU of no stated bandwidth."""
    return _flop_byte_ratio(hw, engine_profile(engine).defaults.timing == "papers")


def _flop_byte_ratio(hw: Hardware, papers: bool) -> float:
    if papers or not hw.memory_bandwidth:
        return 1.0
    return hw.peak_flops_bf16 / hw.memory_bandwidth / _reference_flop_byte()


@cache
def _reference_flop_byte() -> float:
    ref = hardware_preset(FLOP_BYTE_REFERENCE)
    return ref.peak_flops_bf16 / ref.memory_bandwidth


def kernel_scale(a: Assumptions, generation: str, engine: str) -> float:
    """The factor on ``mfu`` of a run of profile ``engine`` on a GPU of ``generation``
    (:attr:`parmem.hardware.Hardware.generation`): 1 for the ``paper`` profile (the published
    runs ``mfu`` is fitted to) and a GPU of no stated generation, else ``mfu_ampere_scale`` or
    ``mfu_hopper_scale``."""
    return _kernel_scale(a, generation, engine_profile(engine).defaults.timing == "papers")


def _kernel_scale(a: Assumptions, generation: str, papers: bool) -> float:
    if papers:
        return 1.0
    if generation == "ampere":
        return a.mfu_ampere_scale
    if generation == "hopper":
        return a.mfu_hopper_scale
    return 1.0


def shares_ports(engine: str) -> bool:
    """Whether the ring collectives of profile ``engine`` share the network ports of a node
    among the ranks of a group that sit on it (:func:`parmem.comm.op_time`: ``k`` ranks a node,
    ``k`` ports; NCCL binds each channel to a GPU's own port, and NVIDIA's NCCL team measures
    192 GB/s of all-reduce bus bandwidth across DGX A100 nodes with 8 x 200 Gb/s ports:
    NVIDIA/nccl issue 812). True for every engine profile; the measured runs of current
    engines need it (FSDP over 16 to 128 H100s holds its 8-GPU throughput: MosaicML's
    llm-foundry benchmark tables, ``data/measured_runs.toml``).

    False for the ``paper`` profile: one port per GPU, as the published runs it is fitted to
    ran. Narayanan et al. 2021 (Table 2) measured DeepSpeed ZeRO-3 at 88 and 44 teraFLOP/s per
    GPU on 768 and 1,536 A100s for the 175B model (PTD-P: 149 and 141); one 25 GB/s port a GPU,
    unoverlapped, accounts for the drop, and ``k`` ports do not (the modelled PTD-P to ZeRO-3
    ratio falls from above 1.5 to under 1: ``tests/test_calibration.py``). A 2021 ZeRO-3 gathered
    parameter by parameter, small messages that do not fill eight rings; this model has no
    message-size term, so the profile keeps the paper's measured behaviour instead."""
    return engine_profile(engine).defaults.timing != "papers"


class StageComm:
    """Communication seconds of one stage: per micro-batch ``α_c + b·β_c`` for c in tp, cp, ep,
    pp; data parallel ``F + m·P`` per step; ``grad_once``: one full gradient reduction."""

    __slots__ = ("alpha", "beta", "dp_fixed", "dp_per_mb", "grad_once")

    def __init__(
        self,
        alpha: dict[str, float],
        beta: dict[str, float],
        dp_fixed: float,
        dp_per_mb: float,
        grad_once: float,
    ) -> None:
        self.alpha, self.beta = alpha, beta
        self.dp_fixed, self.dp_per_mb, self.grad_once = dp_fixed, dp_per_mb, grad_once

    def act(self, cat: str, b: int) -> float:
        """Seconds of category ``cat`` for one micro-batch of ``b`` sequences."""
        return self.alpha[cat] + b * self.beta[cat]

    def dp(self, m: int) -> float:
        """Data-parallel seconds of a step of ``m`` micro-batches."""
        return self.dp_fixed + m * self.dp_per_mb


# cache keys of CostModel: what each cached value depends on
_EstKey = tuple[ParallelConfig, TrainingSetup, tuple[int, ...]]
# tp, cp, pp, ep, sp, recompute, vpp, n_layers, moe layers, stage, cp/ep/pp_intra,
# tp/cp/ep/pp ranks per node
_ActKey = tuple[
    int, int, int, int, bool, str, int, int, int, int, bool | int, bool | int, bool | int,
    bool | int, bool | int, bool | int, bool | int,
]  # fmt: skip
# cp, dp, ep, zero, dense, expert, reduced gradient element, dp_intra, dp/edp ranks per node
_DpKey = tuple[int, int, int, int, int, int, int, bool | int, bool | int, bool | int]


class CostModel:
    """Everything fixed for one (spec, cluster, batch, seq, assumptions, setup options), with
    caches of estimates and communication coefficients."""

    def __init__(
        self,
        spec: ModelSpec,
        cluster: Cluster,
        global_batch: int,
        seq_len: int,
        a: Assumptions,
        setup_kw: SetupOptions,
    ) -> None:
        self.spec, self.cluster, self.G, self.s, self.a = spec, cluster, global_batch, seq_len, a
        self.setup_kw = setup_kw
        hw = cluster.hardware
        self.hw = hw
        self.peak = hw.peak_flops_bf16
        self.usable = a.usable_bytes(hw)
        self.f_layer, self.f_core, self.f_head = flops_per_sequence(spec, seq_len)
        # what the engine's selective recomputation runs again (the attention core, or
        # torchtitan's every second matmul: parmem.flops.selective_flops_per_sequence)
        self.selective_rule = engine_profile(setup_kw["engine"]).selective_flops
        self.f_selective = selective_flops_per_sequence(spec, seq_len, self.selective_rule)
        # frozen weights with adapters (fine-tuning): the adapters' forward FLOPs per sequence
        self.frozen = setup_kw.get("adapter", "none") != "none"
        self.f_adapter = (
            lora_flops_per_sequence(spec, seq_len, setup_kw["lora_rank"], setup_kw["lora_targets"])
            if self.frozen
            else 0
        )
        prec = PRECISIONS[setup_kw["precision"]]
        self.act_bytes, self.param_bytes = prec["act"], prec["param"]
        self._est: dict[_EstKey, Estimate] = {}
        self._act: dict[_ActKey, tuple[dict[str, float], dict[str, float]]] = {}
        self._dp: dict[_DpKey, tuple[float, float, float]] = {}
        self._setups: dict[tuple[int, int, str, str], TrainingSetup] = {}
        self._intra: dict[ParallelConfig, dict[str, bool | int]] = {}
        self.estimates = 0
        eng = engine_profile(setup_kw["engine"])
        # the TP collectives the engine runs beside a GEMM, and its SP re-gather (Defaults)
        self.tp_hidden = frozenset(
            TP_OPS if setup_kw.get("tp_comm_overlap") else eng.defaults.tp_overlap
        )
        self.sp_regather = eng.defaults.sp_regather

    def grad_bytes(self, zero: int) -> int:
        """Bytes of one gradient element as the engine reduces it at ZeRO stage ``zero``
        (:func:`~parmem.states.reduced_grad_itemsize`: Megatron-Core reduces its fp32 main
        gradients, DeepSpeed and the papers 16-bit ones)."""
        kw = self.setup_kw
        return reduced_grad_itemsize(kw["engine"], kw["precision"], zero, kw.get("grad_dtype"))

    # ------------------------------------------------------------------ pieces
    def setup(
        self, b: int, m: int, recompute: str, v: int, schedule: str | None = None
    ) -> TrainingSetup:
        """The :class:`~parmem.config.TrainingSetup` of micro-batch ``b``, ``m`` micro-batches,
        ``recompute`` and ``v`` virtual stages under ``schedule`` (by default interleaved 1F1B
        when ``v > 1``, else 1F1B; ``"zbv"``: ZB-V, v = 2), built once."""
        sched = schedule or vpp_schedule(v)
        key = (b, m, recompute, sched)
        st = self._setups.get(key)
        if st is None:
            st = self._setups[key] = TrainingSetup(
                seq_len=self.s,
                micro_batch=b,
                num_microbatches=m,
                recompute=recompute,
                schedule=sched,
                **self.setup_kw,
            )
        return st

    def estimate(self, par: ParallelConfig, setup: TrainingSetup, lps: tuple[int, ...]) -> Estimate:
        """:func:`~parmem.estimate.estimate` of one layout, cached; counts the calls made."""
        key = (par, setup, lps)
        est = self._est.get(key)
        if est is None:
            est = estimate(self.spec, par, setup, layers_per_stage=list(lps))
            self._est[key] = est
            self.estimates += 1
        return est

    def layout(
        self,
        par: ParallelConfig,
        recompute: str,
        lps: tuple[int, ...],
        b: int = 1,
        m: int = 1,
        schedule: str | None = None,
    ) -> Layout:
        """The :class:`~parmem.layout.Layout` of ``par`` with split ``lps`` at micro-batch ``b``,
        ``m`` micro-batches, ``recompute`` and ``schedule`` (:meth:`setup`; cached by
        :func:`parmem.layout.layout`)."""
        return layout(self.spec, par, self.setup(b, m, recompute, par.vpp, schedule), lps)

    def intra(self, par: ParallelConfig) -> dict[str, bool | int]:
        """Which groups of ``par`` fit in a node, and how many ranks of the others share a node:
        :func:`parmem.comm.placement`; for a profile whose rings cross one port per GPU
        (:func:`shares_ports`), one rank a node."""
        where = self._intra.get(par)
        if where is None:
            where = placement(par, self.cluster.gpus_per_node)
            if not shares_ports(self.setup_kw["engine"]):
                where = {k: (1 if k.endswith("_per_node") else v) for k, v in where.items()}
            self._intra[par] = where
        return where

    def _times(self, ops: Iterable[CommOp], intra: dict[str, bool | int]) -> dict[str, float]:
        """Seconds per category; TP and SP split into what the engine runs beside a GEMM
        ("tp": ``tp_overlap`` of it hides) and what waits for its GEMM ("tpx")."""
        out = dict.fromkeys(CATEGORIES, 0.0)
        out["tpx"] = 0.0
        hw, hidden = self.hw, self.tp_hidden
        for o in ops:
            cat = o.category
            if cat in ("tp", "sp"):
                cat = "tp" if o.what in hidden else "tpx"
            out[cat] += op_time(o, hw, intra)
        del out["sp"]
        return out

    @staticmethod
    def _grad_once(ops: Iterable[CommOp], intra: dict[str, bool | int], hw: Hardware) -> float:
        """Seconds of one gradient reduction (each data-parallel gradient op once)."""
        total = 0.0
        for o in ops:
            if o.category == "dp" and "gradient" in o.what:
                total += op_time(o, hw, intra) / o.count
        return total

    def stage_comm_linear(self, lay: Layout, st: Stage) -> StageComm:
        """Coefficients of stage ``st`` of ``lay`` (built at b = m = 1) from the collectives at
        (b, m) = (1, 1), (2, 1) for the per-micro-batch part and m = 1, 2 for the data-parallel
        part, each cached on what it depends on."""
        par = lay.parallel
        intra = self.intra(par)
        rc = "full" if lay.setup.recompute == "full" else "none"  # selective adds no collective
        akey = (
            par.tp,
            par.cp,
            par.pp,
            par.ep,
            par.sp,
            rc,
            par.vpp,
            st.layers,
            st.moe_layers,
            st.index if par.pp > 1 and (st.first or st.last) else -1,
            intra["cp_intra"],
            intra["ep_intra"],
            intra["pp_intra"],
            intra["tp_per_node"],
            intra["cp_per_node"],
            intra["ep_per_node"],
            intra["pp_per_node"],
        )
        act = self._act.get(akey)
        if act is None:
            x = replace(
                stage_shape(lay, st.index, sp_regather=self.sp_regather),
                dp=par.ep,
                zero=0,
                params=0,
                expert_params=0,
                recompute=rc,
                micro_batch=1,
                num_microbatches=1,
            )
            t1 = self._times(collectives(x).ops, intra)
            t2 = self._times(collectives(replace(x, micro_batch=2)).ops, intra)
            beta = {c: t2[c] - t1[c] for c in _ACT}
            act = self._act[akey] = ({c: t1[c] - beta[c] for c in _ACT}, beta)
        gb = self.grad_bytes(par.zero)
        dkey = (par.cp, par.dp, par.ep, par.zero, st.dense_params, st.expert_params, gb,
                intra["dp_intra"], intra["dp_per_node"], intra["edp_per_node"])  # fmt: skip
        dpc = self._dp.get(dkey)
        if dpc is None:
            x = StageShape(
                params=st.dense_params,
                seq_len=self.s,
                micro_batch=1,
                hidden=self.spec.hidden,
                layers=0,
                dp=par.dp,
                zero=par.zero,
                cp=par.cp,
                ep=par.ep,
                expert_params=st.expert_params,
                grad_bytes=gb,
                param_bytes=self.param_bytes,
            )
            ops1 = collectives(x).ops
            d1 = self._times(ops1, intra)["dp"]
            if par.zero >= 2:
                d2 = self._times(collectives(replace(x, num_microbatches=2)).ops, intra)["dp"]
            else:
                d2 = d1
            dpc = self._dp[dkey] = (
                2 * d1 - d2,
                d2 - d1,
                self._grad_once(ops1, intra, self.hw),
            )
        return StageComm(act[0], act[1], *dpc)

    def stage_comm_exact(self, lay: Layout, st: Stage) -> StageComm:
        """Stage ``st``'s communication from the exact collectives of ``lay``'s own ``b`` and
        ``m`` (per-micro-batch parts averaged over the ``m`` micro-batches)."""
        intra = self.intra(lay.parallel)
        m = lay.setup.num_microbatches
        ops = collectives(stage_shape(lay, st.index, sp_regather=self.sp_regather)).ops
        tot = self._times(ops, intra)
        return StageComm(
            {c: tot[c] / m for c in _ACT},
            dict.fromkeys(_ACT, 0.0),
            tot["dp"],
            0.0,
            self._grad_once(ops, intra, self.hw),
        )

    # ------------------------------------------------------------------ the step
    def linear_timer(
        self, par: ParallelConfig, recompute: str, lps: tuple[int, ...], schedule: str | None = None
    ) -> StepTimer:
        """A :class:`StepTimer` of ``par``, ``recompute`` and ``schedule`` (:meth:`setup`) whose
        communication is linear in ``b`` and ``m`` (:meth:`stage_comm_linear`): the search's
        timer."""
        # one micro-batch (p of them when interleaved: m must be a multiple of p); the linear
        # coefficients are taken per micro-batch
        sched = schedule or vpp_schedule(par.vpp)
        lay = self.layout(par, recompute, lps, 1, par.pp if sched == "interleaved" else 1, sched)
        return StepTimer(self, lay, self.stage_comm_linear)

    def exact_times(
        self, par: ParallelConfig, setup: TrainingSetup, lps: tuple[int, ...]
    ) -> Callable[[Assumptions], float]:
        """:meth:`exact_time`'s step time (seconds) of one layout as a function of the
        assumptions. The layout and its exact communication do not depend on them (they are
        set by the model, the layout, the hardware and the engine), so they are built once and
        each call builds only the :class:`StepTimer` of the rates and overlaps: what scoring
        many assumptions on one run (a fit's grid) needs."""
        b, m = setup.micro_batch, setup.num_microbatches
        lay = self.layout(par, setup.recompute, lps, b, m, setup.schedule)
        comm = {st.index: self.stage_comm_exact(lay, st) for st, _ in lay.distinct_stages()}

        # one GPU generation's kernel scale is all a run reads (kernel_scale): the other's is
        # set aside, so a grid over both times each run once per value of its own
        other = {"ampere": "mfu_hopper_scale", "hopper": "mfu_ampere_scale"}.get(self.hw.generation)
        names = [f.name for f in fields(Assumptions) if f.name != other]
        seen: dict[tuple[object, ...], float] = {}

        def at(a: Assumptions) -> float:
            key = tuple(getattr(a, n) for n in names)
            t = seen.get(key)
            if t is None:
                timer = StepTimer(self, lay, lambda _lay, st: comm[st.index], a)
                t = seen[key] = timer.breakdown(b, m)[0].total
            return t

        return at

    def exact_time(
        self, par: ParallelConfig, setup: TrainingSetup, lps: tuple[int, ...]
    ) -> tuple[StepTime, int]:
        """The step time of one layout with the exact communication of its own ``b`` and ``m``
        (:meth:`stage_comm_exact`), and its critical stage."""
        b, m = setup.micro_batch, setup.num_microbatches
        lay = self.layout(par, setup.recompute, lps, b, m, setup.schedule)
        return StepTimer(self, lay, self.stage_comm_exact).breakdown(b, m)


# compute, recompute, exposed tp, cp, ep, pp seconds of one micro-batch on one stage
_Parts = tuple[float, float, float, float, float, float]


@dataclass(slots=True)
class _StageGroup:
    """The pipeline stages that :meth:`parmem.layout.Layout.distinct_stages` groups as one (they
    cost the same), for b = 1."""

    first: int  # index of the first of them (the critical stage reported)
    count: int  # how many stages
    fwd: float  # forward seconds of one micro-batch
    bwd: float  # backward seconds of one micro-batch (two forwards; frozen weights: less)
    rec: float  # recompute seconds of one micro-batch
    attn: float  # attention-core seconds, forward and backward, of one micro-batch
    wgt: float  # the weights' gradient seconds of one micro-batch (ZB-V's W)
    comm: StageComm
    frac: float  # share of the stage's parameters in the last gradient bucket


class StepTimer:
    """Modelled step time of one layout and recompute mode as a function of (b, m).

    Per distinct stage of the :class:`~parmem.layout.Layout` it keeps, for b = 1, the forward,
    recompute and attention seconds and the communication coefficients (``comm`` of the layout
    and a stage), so that trying a micro-batch size is a few multiplications."""

    __slots__ = ("a", "p", "v", "zero", "groups", "dp_overlap", "b0", "zbv")

    def __init__(
        self,
        model: CostModel,
        lay: Layout,
        comm: Callable[[Layout, Stage], StageComm],
        a: Assumptions | None = None,
    ) -> None:
        """``a``: the assumptions to time with, if not ``model``'s."""
        par, recompute = lay.parallel, lay.setup.recompute
        self.a = a = model.a if a is None else a
        self.p, self.v = par.pp, par.vpp
        self.zero = par.zero
        self.zbv = par.pp > 1 and lay.setup.schedule == "zbv"
        # engine-aware: the engine (as parmem's recipe launches it) overlaps DP collectives or not
        self.dp_overlap = a.dp_overlap_on if lay.engine.defaults.dp_overlap else a.dp_overlap
        papers = lay.engine.defaults.timing == "papers"
        scale = _kernel_scale(a, model.hw.generation, papers)
        # an engine profile's micro-batch also costs mfu_half_tokens tokens' compute (b0 sequences)
        self.b0 = 0.0 if papers else a.mfu_half_tokens / model.s
        busy = busy_fraction(a, model.spec.hidden, par.tp, scale,
                             _flop_byte_ratio(model.hw, papers))  # fmt: skip
        split_rate = par.tp * par.cp * model.peak * busy
        ad = model.f_adapter / model.spec.layers  # the adapters' forward per layer
        # the attention core at attention_efficiency of the GEMM rate: its FLOPs weigh 1/eff
        core = model.f_core / a.attention_efficiency
        f_layer = model.f_layer - model.f_core + core
        # the core's backward: FlashAttention's recomputes the scores QKᵀ (it keeps no s × s
        # matrix), five matmuls against the forward's two (Dao et al. 2022, Algorithm 4), 2.5
        # forwards of the core; with the scores kept, four, 2 forwards as the weights' matmuls
        core_bwd = (FLASH_CORE_BACKWARD if lay.setup.flash else 2.0) * core
        # selective: the attention core (weighed as above) or the engine's own set of matmuls
        sel = core if model.selective_rule == "core" else model.f_selective
        rc_flops = {"none": 0, "selective": sel, "full": f_layer + ad}[recompute]
        self.groups = []
        for st, count in lay.distinct_stages():
            n = st.layers
            head = model.f_head if st.last else 0
            fwd = (n * (f_layer + ad) + head) / split_rate
            bwd = 2 * fwd + n * (core_bwd - 2 * core) / split_rate
            # the weights' gradient: one forward of every weight matrix (not the attention core)
            wgt = (n * (model.f_layer - model.f_core + ad) + head) / split_rate
            if model.frozen:  # input gradients only, but the attention core and adapters twice
                bwd = (n * (f_layer - core + core_bwd + 2 * ad) + head) / split_rate
                wgt = n * ad / split_rate
            frac = min(1.0, a.dp_bucket_params / max(st.params, 1))
            self.groups.append(
                _StageGroup(
                    st.index,
                    count,
                    fwd,
                    bwd,
                    n * rc_flops / split_rate,
                    n * (core + core_bwd) / split_rate,
                    wgt,
                    comm(lay, st),
                    frac,
                )
            )

    def _stage(self, g: _StageGroup, b: int, m: int) -> tuple[float, _Parts, float]:
        a, sc = self.a, g.comm
        bb = b + self.b0  # the micro-batch's compute, in sequences (Assumptions.mfu_half_tokens)
        fwd, bwd, rec = bb * g.fwd, bb * g.bwd, bb * g.rec
        tp = sc.act("tp", b) * (1 - a.tp_overlap) + sc.act("tpx", b)
        cpx = max(0.0, sc.act("cp", b) - a.cp_overlap * b * g.attn)
        ep = sc.act("ep", b) * (1 - a.ep_overlap)
        pp = sc.act("pp", b) * (1 - a.pp_overlap)
        # data parallel: issued during backward (and forward) passes, never hides the last bucket
        # window: ZeRO-0 the last backward; ZeRO-1 + the next first forward; ZeRO-2 every
        # backward + one forward; ZeRO-3 every backward and forward
        n_bwd, n_fwd = {0: (1, 0), 1: (1, 1), 2: (m, 1), 3: (m, m)}[self.zero]
        window = self.dp_overlap * (n_bwd * (bwd + rec) + n_fwd * fwd)
        dp_total = sc.dp(m)
        dp = max(dp_total - window, min(dp_total, g.frac * sc.grad_once))
        return (fwd + bwd + rec + tp + cpx + ep + pp, (fwd + bwd, rec, tp, cpx, ep, pp), dp)

    def total(self, b: int, m: int) -> float:
        """Seconds per step (see :meth:`breakdown`)."""
        t_max, t_sum, dp = 0.0, 0.0, 0.0
        crit = self.groups[0]
        for g in self.groups:
            t_i, _, dp_i = self._stage(g, b, m)
            if t_i > t_max:
                t_max, crit = t_i, g
            t_sum += g.count * t_i
            dp = max(dp, dp_i)
        if self.p == 1:
            return m * t_max + dp
        return m * t_max + self._bubble(crit, t_max, t_sum, b, m) + dp

    def _bubble(self, crit: _StageGroup, t_max: float, t_sum: float, b: int, m: int) -> float:
        """The pipeline's idle seconds: ``(Σ t_i − t_max)/v`` times ``m/(p−1)·bubble_ratio``
        (1F1B, interleaved), or ZB-V's (:func:`parmem.pipeline.zbv_bubble`) for stages like the
        slowest one, whose micro-batch splits into the forward, the weights' gradient (W) and
        the rest of the backward with its communication and recomputation (B)."""
        if self.zbv:
            bb = b + self.b0
            f, w = bb * crit.fwd, bb * crit.wgt
            rest = max(t_max - f - w, 1e-9 * t_max)
            return zbv_bubble(self.p, m, f, rest, max(w, 1e-9 * t_max))
        return bubble_ratio(self.p, m, self.v) * m * (t_sum - t_max) / (self.p - 1)

    def breakdown(self, b: int, m: int) -> tuple[StepTime, int]:
        """The step time split by cause, and the critical (slowest) stage."""
        best: tuple[float, _Parts, int] | None = None
        t_sum, dp = 0.0, 0.0
        for g in self.groups:
            t_i, parts, dp_i = self._stage(g, b, m)
            if best is None or t_i > best[0]:
                best = (t_i, parts, g.first)
            t_sum += g.count * t_i
            dp = max(dp, dp_i)
        if best is None:
            raise ValueError("layers_per_stage=() must list at least one stage")
        t_max, parts, crit = best
        bubble = 0.0
        if self.p > 1:  # (Σ t_i − t_max)/v: (p−1)/(v·m) of the ideal m·t for equal stages
            g_crit = next(g for g in self.groups if g.first == crit)
            bubble = self._bubble(g_crit, t_max, t_sum, b, m)
        st = StepTime(
            compute=m * parts[0],
            recompute=m * parts[1],
            tp=m * parts[2],
            cp=m * parts[3],
            ep=m * parts[4],
            pp=m * parts[5],
            dp=dp,
            bubble=bubble,
        )
        return st, crit
