"""Serving latency: a roofline of one decode step and of one prefill, and the time to first
token (TTFT), time per output token (TPOT) and tokens/s per GPU they give.

Each GPU of a serving layout (``tp`` tensor-parallel ranks × ``pp`` pipeline stages × ``ep``
expert-parallel ranks) spends on one forward pass of its stage

    max(bytes it reads / (memory_bandwidth · mem_efficiency),
        FLOPs it does / (peak_flops_bf16 · flop_efficiency))  +  communication,

the roofline model (Williams, Waterman & Patterson 2009, "Roofline: an insightful visual
performance model for multicore architectures", CACM 52(4)): a kernel is bound by whichever of
memory traffic and arithmetic takes longer. A decode step reads every weight and every cached
key and value for two FLOPs per weight per sequence, so at small batches it is memory-bound; a
prefill multiplies every weight by thousands of tokens and is compute-bound (the split Pope et
al. 2023, "Efficiently Scaling Transformer Inference", draw between decoding and prefill).
Communication is not overlapped with computation (a serial sum, as in :mod:`parmem.comm`), and
a token visits the ``pp`` stages one after the other, so the stages' times add up.

**Stated assumptions, not fitted.** ``mem_efficiency`` (default :data:`MEM_EFFICIENCY` = 0.8) is
the share of the datasheet's HBM bandwidth (:attr:`parmem.hardware.Hardware.memory_bandwidth`)
that the kernels stream at; ``flop_efficiency`` (default :data:`FLOP_EFFICIENCY` = 0.6) the share
of the dense BF16 peak the matrix multiplications reach. Both are round planning values chosen
here, not measurements: pass what you measured. Activations are 16-bit (2 bytes); the
attention, norm and activation-function traffic besides the weights and the KV cache is not
counted; the layout is not checked to fit in memory (:func:`parmem.inference.serving_layout`
does that).

**What a GPU reads and computes** (one GPU of one stage, ``s`` sequences on its attention):

* weights: its shard of every weight of the stage (:func:`parmem.sharding.stage_params`, the
  MTP modules left out), at ``weight_bytes_per_param`` (or the ``weights`` override). A lookup
  table (the input embedding, learned positions) is gathered, not streamed: only the rows of the
  step's tokens count, at most one per token. An MoE layer reads only the experts its tokens
  are routed to: with B tokens each choosing k of E experts uniformly, an expert is chosen by
  none of them with probability (1 − k/E)^B, so E·(1 − (1 − k/E)^B) distinct experts are
  expected (linearity of expectation over the experts: the classical occupancy problem, Feller
  1968, *An Introduction to Probability Theory and Its Applications*, vol. 1). Uniform routing
  is an assumption; real routers are skewed.
* KV cache: ``s`` × the tokens each layer keeps (sliding-window layers at most their window,
  :func:`parmem.kvcache.kv_layer_tokens`) × the values one GPU keeps per token and layer
  (:func:`parmem.kvcache.layer_kv_values`: kv_heads/t heads, or MLA's replicated latent).
* FLOPs: 2 per multiply-add of every matrix (Kaplan et al. 2020 §2.1; :mod:`parmem.flops`):
  2 · (local matmul weights) · tokens for the dense part, 2 · (local expert weights) · B · k/E
  for the routed experts (the B·k/e token-expert pairs expected on the GPU's E/e experts), the
  LM head on the last position of each sequence only (engines compute the logits of the
  sampled position); attention 4 · s · context · (q_dim/t) per layer for a decode step
  (:func:`parmem.flops.flops_per_sequence`'s ``4·s²·a·d_head`` with one query), and for a causal
  prefill of P tokens 2 · P² · (q_dim/t) per layer and sequence, half the non-causal count, as
  FlashAttention's benchmark counts it (Dao 2023, FlashAttention-2; Dao-AILab/flash-attention
  ``benchmarks/benchmark_flash_attention.py``, ``flops``: ``4 * batch * seqlen**2 * nheads *
  headdim // (2 if causal else 1)``); a sliding window w < P leaves 2 · w · (2P − w) · (q_dim/t).

**Communication** on the GPU's ``intra_node`` link (one NVLink domain; no group is placed across
nodes), 16-bit activations, per stage:

* TP: two all-reduces of the ``tokens × hidden`` hidden states per layer (after attention and
  after the MLP; Shoeybi et al. 2019 §3). ``allreduce="nccl"``: the ring all-reduce's
  alpha-beta time (:func:`parmem.comm.collective_time`). ``allreduce="custom"`` (the default):
  vLLM's custom all-reduce, :func:`all_reduce_time` (the logits gather of a vocab-parallel LM
  head is not counted).
* EP: per MoE layer a dispatch and a combine all-to-all of each rank's ``tokens × top_k ×
  hidden`` buffer over the ``ep`` ranks, each rank sending (e−1)/e of it (Lepikhin et al. 2020
  §3.2; :func:`parmem.comm.all_to_all_bytes`). The attention of the ``ep`` ranks runs
  data-parallel, each on ⌈batch/ep⌉ of the sequences (as :func:`parmem.inference.serving_layout`
  lays them out).
* PP: one send of the ``tokens × hidden`` hidden states to the next stage (Narayanan et al. 2021
  §2.2).

Example (Llama-3-70B, 16-bit weights and KV cache, on H100 SXM, 32 sequences of 4,096 tokens):
tensor parallelism lowers the time per output token of this memory-bound step, while the
tokens/s each GPU delivers fall: the weights and the cache split t ways, but the all-reduces'
time, mostly latency, does not shrink, so t × TPOT grows. vLLM's custom all-reduce (two-shot at
these 512 KiB messages) takes 2 latencies where the ring takes 2(t − 1); a 4,096-token prefill
is compute-bound::

    >>> from parmem.model import ModelSpec
    >>> spec = ModelSpec.preset("llama-3-70b")
    >>> for t in (2, 4, 8):
    ...     s = decode_step(spec, "h100-sxm", batch=32, context=4096, tp=t)
    ...     print(t, f"{s.seconds * 1e3:.2f} ms", f"{32 / s.seconds / t:.0f} tok/s/GPU", s.bound)
    2 34.61 ms 462 tok/s/GPU memory
    4 18.21 ms 439 tok/s/GPU memory
    8 9.77 ms 409 tok/s/GPU memory
    >>> custom = decode_step(spec, batch=32, context=4096, tp=8).comm["tp"]
    >>> ring = decode_step(spec, batch=32, context=4096, tp=8, allreduce="nccl").comm["tp"]
    >>> print(f"{custom * 1e3:.2f} ms custom, {ring * 1e3:.2f} ms ring")
    1.29 ms custom, 7.05 ms ring
    >>> prefill(spec, prompt=4096, tp=8).bound
    'compute'

(At t = 2 the 69.5 GB of weights and 21.5 GB of KV cache each GPU would hold do not fit in an
H100's 81,559 MiB; the roofline does not check.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._check import MAX_BATCH, MAX_GPUS, MAX_SEQ_LEN, choice, instance, integer, number
from .comm import collective_bytes, collective_time
from .config import even_split
from .hardware import MAX_MEMORY_BYTES, Hardware, Link, hardware_preset
from .kvcache import KV_DTYPES, kv_layer_tokens, layer_kv_values
from .model import ModelSpec
from .sharding import check_tp, layer_groups, local_numel, model_tensors, stage_params

__all__ = [
    "MEM_EFFICIENCY",
    "FLOP_EFFICIENCY",
    "ACT_BYTES",
    "ALLREDUCE",
    "CUSTOM_AR_WORLD_SIZES",
    "CUSTOM_AR_MAX_BYTES",
    "StepTime",
    "ServingLatency",
    "custom_all_reduce_algorithm",
    "all_reduce_time",
    "expected_experts",
    "decode_step",
    "prefill",
    "serving_latency",
]

#: share of the datasheet HBM bandwidth the kernels reach: a stated planning assumption
MEM_EFFICIENCY = 0.8
#: share of the dense BF16 Tensor Core peak the matmuls reach: a stated planning assumption
FLOP_EFFICIENCY = 0.6
#: bytes of one activation element (16-bit hidden states on the wire)
ACT_BYTES = 2
#: the ``allreduce`` models: vLLM's custom kernel, or NCCL's ring
ALLREDUCE = ("custom", "nccl")
#: world sizes vLLM's custom all-reduce runs on (``CustomAllreduce._SUPPORTED_WORLD_SIZES``)
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
#: the largest input vLLM's custom all-reduce takes: ``CustomAllreduce.__init__``'s default
#: ``max_size=8192 * 1024`` bytes; ``should_custom_ar`` sends larger ones to NCCL
CUSTOM_AR_MAX_BYTES = 8192 * 1024


def _gpu(gpu: object) -> Hardware:
    if isinstance(gpu, str):
        try:
            return hardware_preset(gpu)
        except ValueError as e:
            raise ValueError(f"gpu={gpu!r:.60}: {e}") from None
    hw = instance("gpu", gpu, Hardware, 'a preset name such as "h100-sxm"')
    if not hw.memory_bandwidth:
        raise ValueError(
            f"gpu={hw.name!r:.60}: memory_bandwidth is unknown (0); the roofline needs the HBM "
            "bandwidth in bytes/s"
        )
    return hw


# ---------------------------------------------------------------------------- all-reduce
def custom_all_reduce_algorithm(size: int, n: int) -> str:
    """Which kernel vLLM's custom all-reduce runs for a ``size``-byte input on ``n`` GPUs of one
    fully NVLink-connected node: ``"one-shot"``, ``"two-shot"``, or ``"nccl"`` when the custom
    kernel declines it (``"none"`` for one GPU).

    From vLLM's source: ``CustomAllreduce.should_custom_ar``
    (``vllm/distributed/device_communicators/custom_all_reduce.py``) takes inputs whose size is
    a multiple of 16 bytes and below ``max_size`` (8 MiB by default) on world sizes 2, 4, 6, 8;
    ``CustomAllreduce::allreduce`` (``csrc/custom_all_reduce.cuh``) then runs
    ``cross_device_reduce_1stage`` when the world size is 2, or it is at most 4 and the input is
    below 512 KiB, or at most 8 and below 256 KiB, and ``cross_device_reduce_2stage`` otherwise.
    (Newer vLLM may hand some sizes to NCCL or torch symmetric-memory all-reduce first
    (``all_reduce_utils.py``); that routing is not modelled.)
    """
    size = integer("size", size, 0)
    n = integer("n", n, 1, MAX_GPUS)
    if n == 1:
        return "none"
    if n not in CUSTOM_AR_WORLD_SIZES or size % 16 or size >= CUSTOM_AR_MAX_BYTES:
        return "nccl"
    if n == 2 or (n <= 4 and size < 512 * 1024) or (n <= 8 and size < 256 * 1024):
        return "one-shot"
    return "two-shot"


def all_reduce_time(size: int, n: int, link: Link, allreduce: str = "custom") -> float:
    """Seconds of one all-reduce of a ``size``-byte tensor over ``n`` GPUs on ``link``.

    ``"nccl"``: the ring, ``2(n−1)`` latencies and ``2(n−1)/n · size`` bytes sent per rank
    (:func:`parmem.comm.collective_time`; Thakur et al. 2005 §4.5). ``"custom"``: vLLM's custom
    kernel as :func:`custom_all_reduce_algorithm` picks it, in the same alpha-beta model:

    * one-shot (``cross_device_reduce_1stage``): one barrier, then each GPU reads the whole input
      of each of the n − 1 others over NVLink and sums: ``latency + (n−1)·size / bandwidth``;
    * two-shot (``cross_device_reduce_2stage``): a reduce-scatter then an all-gather, each GPU
      reading the n − 1 others' 1/n shares in each stage, with a barrier per stage:
      ``2·latency + 2(n−1)·⌈size/n⌉ / bandwidth`` (the ring's bytes in 2 steps instead of 2(n−1));
    * inputs the kernel declines go to the NCCL ring.
    """
    instance("link", link, Link)
    choice("allreduce", allreduce, ALLREDUCE)
    algo = custom_all_reduce_algorithm(size, n) if allreduce == "custom" else "nccl"
    if algo == "one-shot":
        return link.latency + (n - 1) * size / link.bandwidth
    if algo == "two-shot":
        return 2 * link.latency + collective_bytes("all_reduce", size, n) / link.bandwidth
    return collective_time("all_reduce", size, n, link)


def expected_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Experts of one MoE layer expected to receive at least one of ``tokens`` tokens when each
    token picks ``top_k`` distinct experts of ``num_experts`` uniformly: E·(1 − (1 − k/E)^B)
    (an expert escapes one token with probability C(E−1, k)/C(E, k) = 1 − k/E; linearity of
    expectation, the occupancy problem of Feller 1968, vol. 1). One token: exactly k."""
    e = integer("num_experts", num_experts, 1)
    k = integer("top_k", top_k, 1, e)
    b = integer("tokens", tokens, 0)
    return e * (1 - (1 - k / e) ** b)


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class StepTime:
    """One forward pass of a serving layout (a decode step, or a prefill), along the path of a
    token: one GPU of each pipeline stage (with ``pp=1``, one GPU).

    Attributes:
        weights_read: weight bytes those GPUs read (summed over the stages).
        kv_read: KV-cache bytes they move: read by a decode step, written by a prefill.
        flops: FLOPs they do.
        memory_s: (weights_read + kv_read) / (memory_bandwidth · mem_efficiency).
        compute_s: flops / (peak_flops_bf16 · flop_efficiency).
        comm_s: communication seconds, the sum of :attr:`comm`.
        seconds: Σ over the stages of max(memory, compute) + communication.
        comm: seconds per parallel axis, ``{"tp": ..., "ep": ..., "pp": ...}``.
        stages: pipeline stages ``pp``.
    """

    weights_read: int
    kv_read: int
    flops: int
    memory_s: float
    compute_s: float
    comm_s: float
    seconds: float
    comm: dict[str, float]
    stages: int = 1

    @property
    def bound(self) -> str:
        """``"memory"`` when memory time is at least compute time, else ``"compute"``."""
        return "memory" if self.memory_s >= self.compute_s else "compute"


@dataclass(frozen=True)
class ServingLatency:
    """The answer of :func:`serving_latency`.

    Attributes:
        ttft_s: time to first token: the prefill of ``batch`` prompts together.
        tpot_s: time per output token: a decode step at the mean context.
        latency_s: one request end to end, ttft + (output − 1) · tpot.
        tokens_per_s_per_gpu: batch / tpot / gpus.
        gpus: tp · pp · ep.
        prefill: the prefill's :class:`StepTime`.
        decode: the decode step's :class:`StepTime`.
    """

    ttft_s: float
    tpot_s: float
    latency_s: float
    tokens_per_s_per_gpu: float
    gpus: int
    prefill: StepTime
    decode: StepTime


# ---------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class _Setup:
    """Checked arguments shared by :func:`decode_step` and :func:`prefill`."""

    spec: ModelSpec
    hw: Hardware
    tp: int
    pp: int
    ep: int
    bytes_per_param: float
    kv_bytes: int
    mem_rate: float  # bytes/s
    flop_rate: float  # FLOP/s
    allreduce: str
    split: tuple[int, ...]


def _setup(
    spec: object,
    gpu: object,
    tp: int,
    pp: int,
    ep: int,
    weight_bytes_per_param: float,
    weights: int | None,
    kv_dtype: str,
    mem_efficiency: float,
    flop_efficiency: float,
    allreduce: str,
) -> _Setup:
    s = instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")
    hw = _gpu(gpu)
    tp, ep = integer("tp", tp, 1, MAX_GPUS), integer("ep", ep, 1, MAX_GPUS)
    check_tp(s, tp, ep)
    pp = integer("pp", pp, 1, MAX_GPUS)
    if pp > s.layers:
        raise ValueError(f"pp={pp} must be at most layers={s.layers}")
    bpp = number("weight_bytes_per_param", weight_bytes_per_param, 0, 8, lo_open=True)
    choice("kv_dtype", kv_dtype, KV_DTYPES)
    mem = number("mem_efficiency", mem_efficiency, 0, 1, lo_open=True)
    flop = number("flop_efficiency", flop_efficiency, 0, 1, lo_open=True)
    choice("allreduce", allreduce, ALLREDUCE)
    split = even_split(s.layers, pp)
    if weights is not None:
        held = max(sum(_stage_params(s, tp, ep, split, i)) for i in range(pp))
        bpp = integer("weights", weights, 1, MAX_MEMORY_BYTES) / held
    return _Setup(
        s,
        hw,
        tp,
        pp,
        ep,
        bpp,
        KV_DTYPES[kv_dtype],
        hw.memory_bandwidth * mem,
        hw.peak_flops_bf16 * flop,
        allreduce,
        split,
    )


def _stage_params(
    spec: ModelSpec, tp: int, ep: int, split: tuple[int, ...], i: int
) -> tuple[int, int]:
    """(dense, expert) parameters one GPU of stage ``i`` of ``split`` holds, MTP modules left out
    (:func:`parmem.sharding.stage_params`)."""
    first, last, start = i == 0, i == len(split) - 1, sum(split[:i])
    return stage_params(spec, tp, ep, split[i], first, last, start=start, mtp=False)


@dataclass(frozen=True)
class _Pass:
    """One forward pass: ``seqs`` sequences on each attention rank, ``new`` tokens each,
    attending to ``context`` tokens (decode: new = 1; prefill: new = context = the prompt),
    ``routed`` tokens over the whole expert-parallel group."""

    seqs: int
    new: int
    context: int
    routed: int
    decode: bool

    @property
    def tokens(self) -> int:
        return self.seqs * self.new


def _lookup_rows(x: Any, local: int, tokens: int) -> int:
    """Elements of lookup table ``x`` (``local`` elements on this GPU) that ``tokens`` gather:
    at most one row per token."""
    return min(tokens, local // x.cols) * x.cols


def _weights_read(c: _Setup, p: _Pass, i: int) -> float:
    """Parameters one GPU of stage ``i`` reads: the stage's weights, lookup tables counted by
    the rows gathered (a tied embedding on a single stage is also the LM head: read whole) and
    routed experts by the share expected to receive a token."""
    s, first = c.spec, i == 0
    dense, expert = _stage_params(s, c.tp, c.ep, c.split, i)
    head = s.tied_embeddings and c.pp == 1
    for x in model_tensors(s, pipeline=c.pp > 1):
        lookup = x.kind == "positions" or (x.kind == "embedding" and not head)
        if first and x.place == "first" and lookup:
            local = local_numel(s, x, c.tp, c.ep)
            dense += _lookup_rows(x, local, p.tokens) - local
    if not expert:
        return float(dense)
    return dense + expert * expected_experts(s.num_experts, s.top_k, p.routed) / s.num_experts


def _matmul_params(c: _Setup, i: int) -> tuple[int, int]:
    """(dense, routed-expert) weights one GPU of stage ``i`` multiplies tokens by in its layers
    (linear weights and the router; :func:`parmem.sharding.layer_matmul_params`' rule)."""
    s, start = c.spec, sum(c.split[:i])
    dense = expert = 0
    for count, tensors in layer_groups(s, start, c.split[i]):
        for x in tensors:
            if x.kind in ("linear", "router"):
                local = count * local_numel(s, x, c.tp, c.ep)
                expert += local if x.expert else 0
                dense += 0 if x.expert else local
    return dense, expert


def _head_params(c: _Setup, last: bool) -> int:
    """LM-head weights one GPU of the last stage multiplies by (0 on the others)."""
    if not last:
        return 0
    s = c.spec
    for x in model_tensors(s, pipeline=c.pp > 1):
        if x.kind == "lm_head" or (x.kind == "embedding" and s.tied_embeddings and c.pp == 1):
            return local_numel(s, x, c.tp)
    return 0


def _attention_flops(c: _Setup, p: _Pass, i: int) -> int:
    """Attention-core FLOPs of stage ``i`` (sources in the module docstring)."""
    s, q = c.spec, c.spec.q_dim // c.tp
    start = sum(c.split[:i])
    total = 0
    for layer in range(start, start + c.split[i]):
        w = s.sliding_window if s.is_local_layer(layer) else p.context
        if p.decode:
            total += 4 * p.seqs * min(p.context, w) * q
        elif p.context <= w:
            total += 2 * p.seqs * p.context * p.context * q
        else:
            total += 2 * p.seqs * w * (2 * p.context - w) * q
    return total


def _comm(c: _Setup, p: _Pass, i: int) -> dict[str, float]:
    """Communication seconds of stage ``i`` by axis (sources in the module docstring)."""
    s, link, n = c.spec, c.hw.intra_node, c.split[i]
    start = sum(c.split[:i])
    act = p.tokens * s.hidden * ACT_BYTES
    out = {"tp": 0.0, "ep": 0.0, "pp": 0.0}
    if c.tp > 1:
        out["tp"] = 2 * n * all_reduce_time(act, c.tp, link, c.allreduce)
    moe = sum(s.is_moe_layer(j) for j in range(start, start + n))
    if c.ep > 1 and moe:
        buf = p.tokens * s.top_k * s.hidden * ACT_BYTES
        out["ep"] = 2 * moe * collective_time("all_to_all", buf, c.ep, link)
    if i < c.pp - 1:
        out["pp"] = collective_time("send_recv", act, 2, link)
    return out


def _run(c: _Setup, p: _Pass) -> StepTime:
    """Add up the stages of one forward pass."""
    weights = kv = flops = 0
    memory_s = compute_s = seconds = 0.0
    comm = {"tp": 0.0, "ep": 0.0, "pp": 0.0}
    s = c.spec
    for i in range(c.pp):
        start, n = sum(c.split[:i]), c.split[i]
        w = round(_weights_read(c, p, i) * c.bytes_per_param)
        mm_dense, mm_expert = _matmul_params(c, i)
        kv_i = p.seqs * kv_layer_tokens(s, p.context, start, n) * layer_kv_values(s, c.tp)
        kv_i *= c.kv_bytes
        f = 2 * mm_dense * p.tokens + 2 * _head_params(c, i == c.pp - 1) * p.seqs
        if mm_expert:
            f += 2 * mm_expert * p.routed * s.top_k // s.num_experts
        f += _attention_flops(c, p, i)
        mem_i, comp_i = (w + kv_i) / c.mem_rate, f / c.flop_rate
        comm_i = _comm(c, p, i)
        for k, v in comm_i.items():
            comm[k] += v
        weights, kv, flops = weights + w, kv + kv_i, flops + f
        memory_s, compute_s = memory_s + mem_i, compute_s + comp_i
        seconds += max(mem_i, comp_i) + sum(comm_i.values())
    return StepTime(
        weights, kv, flops, memory_s, compute_s, sum(comm.values()), seconds, comm, c.pp
    )


def decode_step(
    spec: ModelSpec,
    gpu: Hardware | str = "h100-sxm",
    *,
    batch: int,
    context: int,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    weight_bytes_per_param: float = 2.0,
    weights: int | None = None,
    kv_dtype: str = "bf16",
    mem_efficiency: float = MEM_EFFICIENCY,
    flop_efficiency: float = FLOP_EFFICIENCY,
    allreduce: str = "custom",
) -> StepTime:
    """One decode step: ``batch`` sequences (over the whole layout of tp·pp·ep GPUs) each add one
    token, attending to ``context`` cached tokens (the new one included). ``seconds`` is the time
    per output token (TPOT).

    ``gpu``: a :class:`~parmem.hardware.Hardware` or a preset name. ``weight_bytes_per_param``:
    bytes of one weight (2 for 16-bit, 1 for FP8, about 0.5 for 4-bit formats before their
    scales); ``weights`` overrides it with the bytes one GPU holds (the largest stage's GPU, e.g.
    what an engine logs for the loaded model), spread evenly over that GPU's parameters.
    ``kv_dtype``: one of ``parmem.kvcache.KV_DTYPES`` (fp32, fp16, bf16, fp8, int8). ``mem_efficiency`` and
    ``flop_efficiency``: stated assumptions (module docstring). ``allreduce``: ``"custom"``
    (vLLM's custom all-reduce, :func:`all_reduce_time`) or ``"nccl"`` (ring). What is counted,
    and the sources: the module docstring.

    Raises:
        ValueError: an argument out of range, named with its rule (``tp=3 must divide
            heads=64``, ``batch=0 must be an integer in 1..1048576``).
    """
    c = _setup(
        spec,
        gpu,
        tp,
        pp,
        ep,
        weight_bytes_per_param,
        weights,
        kv_dtype,
        mem_efficiency,
        flop_efficiency,
        allreduce,
    )
    batch = integer("batch", batch, 1, MAX_BATCH)
    context = integer("context", context, 1, MAX_SEQ_LEN)
    return _run(c, _Pass(-(-batch // c.ep), 1, context, batch, True))


def prefill(
    spec: ModelSpec,
    gpu: Hardware | str = "h100-sxm",
    *,
    prompt: int,
    batch: int = 1,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    weight_bytes_per_param: float = 2.0,
    weights: int | None = None,
    kv_dtype: str = "bf16",
    mem_efficiency: float = MEM_EFFICIENCY,
    flop_efficiency: float = FLOP_EFFICIENCY,
    allreduce: str = "custom",
) -> StepTime:
    """The prefill of ``batch`` prompts of ``prompt`` tokens together, in one forward pass (no
    chunking): every weight is read once, the prompts' keys and values are written
    (``kv_read`` holds the bytes written), and the FLOPs are 2 · weights · tokens plus causal
    attention (module docstring). At these message sizes (tokens × hidden × 2 bytes, megabytes)
    the TP all-reduces exceed the custom kernel's 8 MiB limit and run on NCCL's ring even with
    ``allreduce="custom"``, unless the prompt is short. ``seconds`` is the time to first token.
    Arguments as :func:`decode_step`.
    """
    c = _setup(
        spec,
        gpu,
        tp,
        pp,
        ep,
        weight_bytes_per_param,
        weights,
        kv_dtype,
        mem_efficiency,
        flop_efficiency,
        allreduce,
    )
    batch = integer("batch", batch, 1, MAX_BATCH)
    prompt = integer("prompt", prompt, 1, MAX_SEQ_LEN)
    return _run(c, _Pass(-(-batch // c.ep), prompt, prompt, batch * prompt, False))


def serving_latency(
    spec: ModelSpec,
    gpu: Hardware | str = "h100-sxm",
    *,
    prompt: int,
    output: int,
    batch: int,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    **options: Any,
) -> ServingLatency:
    """TTFT, TPOT and tokens/s per GPU of ``batch`` requests of ``prompt`` input and ``output``
    generated tokens on tp·pp·ep GPUs.

    * ``ttft_s``: :func:`prefill` of the ``batch`` prompts together (the first token comes out of
      the prefill's last position);
    * ``tpot_s``: :func:`decode_step` at the mean context over the generation,
      ``prompt + output // 2`` tokens;
    * ``tokens_per_s_per_gpu``: ``batch / tpot_s / gpus``, with ``gpus = tp·pp·ep`` (every
      sequence adds a token per step; a pipeline keeping several batches in flight would do
      better, which is not modelled);
    * ``latency_s``: ``ttft_s + (output − 1) · tpot_s``.

    ``options``: the keywords of :func:`decode_step` (``weight_bytes_per_param``, ``weights``,
    ``kv_dtype``, ``mem_efficiency``, ``flop_efficiency``, ``allreduce``).
    """
    prompt = integer("prompt", prompt, 1, MAX_SEQ_LEN)
    output = integer("output", output, 1, MAX_SEQ_LEN)
    if prompt + output > MAX_SEQ_LEN:
        raise ValueError(f"prompt + output = {prompt + output} must be at most {MAX_SEQ_LEN}")
    known = {
        "weight_bytes_per_param",
        "weights",
        "kv_dtype",
        "mem_efficiency",
        "flop_efficiency",
        "allreduce",
    }
    for key in options:
        if key not in known:
            raise ValueError(f"unknown option {key!r}; known: {', '.join(sorted(known))}")
    where = {"tp": tp, "pp": pp, "ep": ep, **options}
    first = prefill(spec, gpu, prompt=prompt, batch=batch, **where)
    step = decode_step(spec, gpu, batch=batch, context=prompt + output // 2, **where)
    gpus = tp * pp * ep
    return ServingLatency(
        ttft_s=first.seconds,
        tpot_s=step.seconds,
        latency_s=first.seconds + (output - 1) * step.seconds,
        tokens_per_s_per_gpu=batch / step.seconds / gpus,
        gpus=gpus,
        prefill=first,
        decode=step,
    )
