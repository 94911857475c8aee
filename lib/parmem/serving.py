"""Startup memory of a serving engine: what vLLM, SGLang and TensorRT-LLM set aside before the
first request, and how many tokens of KV cache are left.

Every engine loads the weights, measures (or reserves) a transient activation peak, and gives
the rest of a budget to the KV cache; they differ in the budget and in what they subtract:

* **vLLM** (V1 engine, 0.19: ``v1/worker/gpu_worker.py: Worker.determine_available_memory``,
  ``utils/mem_utils.py: memory_profiling``): requested = ⌈total · ``gpu_memory_utilization``⌉,
  where total is what CUDA reports for the device; KV = requested − weights − torch peak
  increase of the profiling run − non-torch increase. The profiling run is one forward pass of
  ``max_num_batched_tokens`` tokens over ``min(max_num_seqs, tokens)`` requests, then the sampler
  on one row per request (``gpu_model_runner.py: profile_run, _dummy_sampler_run``). CUDA graphs
  are captured *after* the cache is allocated and are not subtracted by default
  (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0``): they, the CUDA context and NCCL live in the
  (1 − utilisation) headroom. Blocks: ⌊⌊KV / page⌋ / layers per group⌋ of 16 tokens
  (``v1/core/kv_cache_utils.py``); the log's token count is blocks // groups × 16.
* **SGLang** (0.5: ``srt/model_executor/model_runner.py: profile_max_num_token``): no
  profiling pass; rest = free after loading − free before loading · (1 − ``mem_fraction_static``),
  tokens = ⌊rest / cell⌋ with cell the KV bytes of one token over all layers.
* **TensorRT-LLM** (``_torch/pyexecutor/_util.py``): KV = (total − peak) ·
  ``free_gpu_memory_fraction`` (0.9): a fraction of the memory free after the profiled peak,
  not of the total, which is why the engines report different token counts on one GPU.

Weights are counted as each quantisation method stores them after loading
(:func:`loaded_weight_bytes`), with the rotary cos/sin cache vLLM keeps beside them.
Two quantities have no formula in the engines' source: the torch peak of the sampler warm-up
and the non-torch memory (cuBLAS workspaces, custom all-reduce and NCCL buffers). parmem
takes them from a *calibration set*, the vLLM 0.19.0 logs of Llama-3.1-8B in
``data/serving_logs.toml``, and scores every other log against them
(``tests/test_serving_logs.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._check import MAX_BATCH, MAX_SEQ_LEN, boolean, choice, instance, integer, number
from .config import even_split
from .hardware import MAX_MEMORY_BYTES, device_memory_bytes
from .inference import prefill_workspace_bytes
from .kvcache import layer_kv_values
from .model import ModelSpec
from .sharding import check_tp, local_numel, stage_tensors

__all__ = [
    "ENGINES",
    "QUANTIZATIONS",
    "SERVE_KV_DTYPES",
    "Startup",
    "loaded_weight_bytes",
    "rope_cache_bytes",
    "profile_peak_bytes",
    "kv_blocks",
    "startup",
    "emit_command",
    "sglang_mem_fraction_static",
    "check_command",
]

GIB = 2**30

#: what each method stores per quantised weight, as vLLM 0.19 creates the parameters
#: (``model_executor/layers/quantization``): value bits; a scale every ``group`` inputs of a row
#: (0: one per output row; -1: one per fused shard) of ``scale`` bytes; packed 4-bit zero points;
#: and which linear layers it touches ("linear": every transformer-layer matrix; "experts": the
#: MoE experts only, every other matrix stays 16-bit). Embeddings and the LM head stay 16-bit in
#: every method (``VocabParallelEmbedding``/``ParallelLMHead`` are not ``LinearBase``).
QUANTIZATIONS: dict[str, dict] = {
    "none": {"bits": 0},
    # fp8.py Fp8LinearMethod / compressed-tensors W8A8-FP8: fp8 weight, one fp32 scale per shard
    "fp8": {"bits": 8, "group": -1, "scale": 4, "zeros": False, "touches": "linear"},
    # fp8 with 128x128 block scales (DeepSeek-V3, Qwen3-*-FP8): fp32 [ceil(out/128), ceil(in/128)]
    "fp8-block": {
        "bits": 8,
        "group": 128,
        "block": 128,
        "scale": 4,
        "zeros": False,
        "touches": "linear",
    },
    # compressed-tensors FP8 dynamic, channel-wise: fp8 weight, fp32 scale [out, 1]
    "fp8-channel": {"bits": 8, "group": 0, "scale": 4, "zeros": False, "touches": "linear"},
    # compressed-tensors W8A8 int8, channel-wise: int8 weight, fp32 scale [out, 1]
    "w8a8": {"bits": 8, "group": 0, "scale": 4, "zeros": False, "touches": "linear"},
    # awq.py: qweight int32 [in, out/8], qzeros int32 [in/g, out/8], scales fp16 [in/g, out]
    "awq": {"bits": 4, "group": 128, "scale": 2, "zeros": True, "touches": "linear"},
    # gptq.py (Marlin path, desc_act=False: g_idx emptied): qweight, qzeros packed, scales fp16
    "gptq": {"bits": 4, "group": 128, "scale": 2, "zeros": True, "touches": "linear"},
    # compressed-tensors pack-quantized W4A16 (symmetric): int32-packed weight, 16-bit scales
    "w4a16": {"bits": 4, "group": 128, "scale": 2, "zeros": False, "touches": "linear"},
    # mxfp4.py Mxfp4MoEMethod: uint8 pairs of fp4 values + one e8m0 byte per 32, experts only
    "mxfp4": {"bits": 4, "group": 32, "scale": 1, "zeros": False, "touches": "experts"},
    # modelopt.py ModelOptNvFp4LinearMethod: fp4 values, fp8 scale per 16, 2 fp32 per shard
    "nvfp4": {
        "bits": 4,
        "group": 16,
        "scale": 1,
        "zeros": False,
        "touches": "linear",
        "per_shard": 8,
    },
}

#: KV-cache dtypes the engines accept, bytes per value ("auto": the model's dtype)
SERVE_KV_DTYPES = {"auto": 0, "bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
#: weight dtypes of an unquantised checkpoint as loaded
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}
#: MXFP4 MoE kernel backends and the multiples they pad (intermediate per rank, hidden) to
#: (``fused_moe/oracle/mxfp4.py: mxfp4_round_up_hidden_size_and_intermediate_size``): Marlin
#: is the weight-only path of GPUs without FP4 units (A100, H100; the gpt-oss-120b log on an
#: H100 names it), the FlashInfer-TRTLLM kernel the one of Blackwell (SM100).
MXFP4_PADDING = {"marlin": (128, 256), "trtllm": (256, 256), "triton": (64, 1)}

_MIB = 2**20

#: Engine defaults and the constants their source does not give (``calibrated``: read off the
#: calibration logs, the vLLM 0.19.0 runs of Llama-3.1-8B at t = 1, t = 2 and p = 2 on an H100;
#: every other log in ``data/serving_logs.toml`` is held out). Sources: vLLM 0.19.1
#: ``config/cache.py`` (0.9, block 16), ``engine/arg_utils.py: get_batch_defaults`` (8,192 tokens and
#: 1,024 sequences for ``vllm serve`` on GPUs of ≥ 70 GiB other than the A100, else 2,048 and
#: 256); SGLang 0.5 ``server_args.py``; TensorRT-LLM ``llmapi/llm_args.py`` (0.9 of free memory,
#: 32-token blocks, 8,192 tokens, 2,048 sequences).
# calibrated: torch peak of vLLM 0.19's sampler warm-up per logit (num_reqs x vocab): 1.89 GiB
# for 1,024 x 128,256 (Llama-3.1-8B, t = 1, 2, 4: the forward pass is smaller there)
_VLLM_SAMPLER = 1.89 * GIB / (1024 * 128256)
# calibrated: vLLM 0.19's non-torch growth during profiling (Llama-3.1-8B: 0.25 GiB at t = 1,
# 2.07 GiB at t = 2 with the custom all-reduce and NCCL buffers, 0.07 GiB at p = 2)
_VLLM_NON_TORCH = {"single": int(0.25 * GIB), "tp": int(2.07 * GIB), "pp": int(0.07 * GIB)}

ENGINES: dict[str, dict] = {
    "vllm": {
        "version": "0.19",
        "utilization": 0.9,
        "block": 16,
        "big_gpu": (8192, 1024),
        "small_gpu": (2048, 256),
        "sampler_bytes_per_logit": _VLLM_SAMPLER,
        "non_torch": _VLLM_NON_TORCH,
        # earlier versions whose profiling peak differs: the sampler's bytes per logit.
        # 0.10: calibrated on the one 0.10.1 log (gpt-oss-120b, H100, 0.9, 8,192 tokens):
        # KV -2.14 GiB = 0.9 x 79.19 - 65.97 (weights) - 0.25 (non-torch) - peak, so the peak
        # is 7.20 GiB for 1,024 x 201,088 logits (its sampler sorted the full vocabulary in
        # PyTorch, fp32 values and int64 indices, before v1/sample moved to Triton)
        "versions": {"0.19": _VLLM_SAMPLER, "0.10": 7.20 * GIB / (1024 * 201088)},
    },
    "sglang": {
        "version": "0.5",
        "block": 1,
        "context": {"single": int(0.51 * GIB), "multi": int(1.53 * GIB)},
    },
    "trtllm": {
        "version": "1.0",
        "free_fraction": 0.9,
        "block": 32,
        "big_gpu": (8192, 2048),
        "small_gpu": (8192, 2048),
        # ASSUMED, not validated (no public TensorRT-LLM log is recorded): the sampler's peak
        # is one fp32 copy of the logits, and the non-torch memory is vLLM's
        "sampler_bytes_per_logit": 4,
        "non_torch": _VLLM_NON_TORCH,
    },
}


def _spec(spec: object) -> None:
    instance("spec", spec, ModelSpec, "ModelSpec.preset(name)")


def _quant_matrix(rows: int, cols: int, q: dict, pad: tuple[int, int] = (1, 1)) -> int:
    """Bytes of one ``rows × cols`` (out × in) matrix stored by method ``q``."""
    values = -(-rows * cols * q["bits"] // 8)
    g = q["group"]
    if q.get("block"):
        scales = -(-rows // q["block"]) * -(-cols // q["block"])
    elif g == -1:
        scales = 1
    elif g == 0:
        scales = rows
    else:
        scales = rows * -(-cols // g)
    zeros = -(-scales * q["bits"] // 8) if q["zeros"] else 0
    return values + scales * q["scale"] + zeros + q.get("per_shard", 0)


def rope_cache_bytes(spec: ModelSpec, act_bytes: int = 2) -> int:
    """The rotary cos/sin cache vLLM keeps on every GPU: ``max_positions × rotary_dim`` values
    in the model's dtype (``layers/rotary_embedding: RotaryEmbedding._compute_cos_sin_cache``,
    cast to the model dtype); rotary_dim is head_dim (qk_rope_head_dim under MLA); 0 for a
    model without rotary positions."""
    _spec(spec)
    if spec.position != "rotary":
        return 0
    dim = spec.qk_rope_head_dim if spec.attention == "mla" else spec.head_dim
    return spec.max_positions * dim * act_bytes


def _refuse(spec: ModelSpec, quantization: str) -> None:
    if quantization == "mxfp4" and not spec.num_experts:
        raise ValueError(
            f"quantization='mxfp4': vLLM quantises only MoE experts in MXFP4; {spec.name} has none"
        )


def _matrix_bytes(spec, x, tp: int, ep: int, q: dict, touched: bool, wbytes: int, pad) -> int:
    """Bytes of tensor ``x`` (all its copies) on one rank as method ``q`` loads it."""
    n = local_numel(spec, x, tp, ep)
    if x.kind != "linear" or not touched:
        return n * wbytes
    copies = x.count // ep if x.expert else x.count
    n_in = x.cols // tp if x.split == "row" else x.cols
    n_out = n // n_in // copies
    if q is QUANTIZATIONS["mxfp4"]:
        # experts padded: intermediate per rank to pad[0], hidden to pad[1]
        if x.split == "row":  # down projection: in = intermediate, out = hidden
            n_in, n_out = -(-n_in // pad[0]) * pad[0], -(-n_out // pad[1]) * pad[1]
        else:
            n_in, n_out = -(-n_in // pad[1]) * pad[1], -(-n_out // pad[0]) * pad[0]
    return copies * _quant_matrix(n_out, n_in, q)


def loaded_weight_bytes(
    spec: ModelSpec,
    quantization: str = "none",
    dtype: str = "bf16",
    *,
    tp: int = 1,
    pp: int = 1,
    stage: int = 0,
    ep: int = 1,
    rope_cache: bool = True,
    mxfp4_backend: str = "marlin",
) -> int:
    """Bytes of weights one GPU holds after loading, as vLLM 0.19 stores them: what its log
    reports as "Model loading took … GiB".

    ``quantization`` is one of :data:`QUANTIZATIONS` (the module names each method's source);
    unquantised tensors are ``dtype``. Under tensor parallelism each GPU holds its shard of every
    tensor as :mod:`parmem.sharding` splits it (Shoeybi et al. 2019 §3); ``pp`` stages get an
    even split of the layers (``vllm/distributed/utils.py: get_pp_indices``), the embedding on
    the first and the final norm and LM head on the last; ``ep`` divides the experts. MXFP4
    pads each expert's intermediate size per rank and its hidden size to the multiples of
    ``mxfp4_backend`` (:data:`MXFP4_PADDING`). ``rope_cache`` adds :func:`rope_cache_bytes`.
    """
    _spec(spec)
    choice("quantization", quantization, QUANTIZATIONS)
    choice("dtype", dtype, DTYPES)
    choice("mxfp4_backend", mxfp4_backend, MXFP4_PADDING)
    tp, ep, pp = integer("tp", tp), integer("ep", ep), integer("pp", pp, 1, spec.layers)
    stage = integer("stage", stage, 0, pp - 1)
    boolean("rope_cache", rope_cache)
    check_tp(spec, tp, ep)
    _refuse(spec, quantization)
    q = QUANTIZATIONS[quantization]
    wbytes = DTYPES[dtype]
    pad = MXFP4_PADDING[mxfp4_backend]
    split = even_split(spec.layers, pp)
    n, start = split[stage], sum(split[:stage])
    first, last = stage == 0, stage == pp - 1
    total = 0
    groups, whole = stage_tensors(spec, n, first, last, start=start, mtp=False)
    for count, tensors in groups:
        for x in tensors:
            touched = bool(q["bits"]) and (q["touches"] == "linear" or x.expert)
            total += count * _matrix_bytes(spec, x, tp, ep, q, touched, wbytes, pad)
    for x in whole:
        total += local_numel(spec, x, tp, ep) * wbytes
    return total + (rope_cache_bytes(spec, wbytes) if rope_cache else 0)


def _kv_bytes(spec: ModelSpec, kv_cache_dtype: str, dtype: str) -> int:
    b = SERVE_KV_DTYPES[kv_cache_dtype]
    return b or DTYPES[dtype]


def profile_peak_bytes(
    spec: ModelSpec,
    tokens: int,
    seqs: int,
    tp: int = 1,
    last_stage: bool = True,
    engine: str = "vllm",
    act_bytes: int = 2,
    version: str | None = None,
) -> int:
    """The torch peak increase of vLLM's profiling run: the larger of the forward pass over
    ``tokens`` tokens (:func:`parmem.inference.prefill_workspace_bytes`) and, on the last pipeline stage, the sampler
    warm-up on ``min(seqs, tokens)`` rows of full-vocabulary logits (bf16 logits gathered over
    the t ranks, their fp32 copy and the top-k/top-p buffers of ``v1/sample``), at the
    calibrated bytes per logit of ``ENGINES`` (``version``: vLLM's, one of its
    ``versions``; default the newest)."""
    fwd = prefill_workspace_bytes(spec, tokens, tp, sequences=0, act_bytes=act_bytes)
    if not last_stage:
        return fwd
    rows = min(seqs, tokens)
    e = ENGINES[engine]
    per_logit = e["versions"][version] if version else e["sampler_bytes_per_logit"]
    sampler = int(per_logit * rows * spec.vocab_size)
    return max(fwd, sampler)


@dataclass(frozen=True)
class Startup:
    """What an engine sets aside at startup on its busiest GPU, in bytes, and what is left.

    Attributes:
        engine: "vllm", "sglang" or "trtllm".
        total: device memory as CUDA reports it.
        budget: what the engine may use (vLLM: ⌈total · utilisation⌉).
        weights: :func:`loaded_weight_bytes` of the busiest stage.
        activation: the profiled transient peak (:func:`profile_peak_bytes`).
        non_torch: memory outside PyTorch's allocator that grows during profiling.
        kv: bytes given to the KV cache (negative: the budget is exceeded).
        kv_token_bytes: KV bytes of one token on one GPU (all its layers).
        blocks: KV blocks per GPU.
        tokens: tokens of KV cache, as the engine's log counts them.
        max_model_len: the context length asked for.
        longest: the longest context one request can have with this cache.
        concurrency: requests of ``max_model_len`` tokens the cache holds at once.
        starts: whether the engine starts.
        verdict: one line: what starts, or what to change.
        warnings: risks the verdict does not decide (headroom for CUDA graphs, ...).
    """

    engine: str
    total: int
    budget: int
    weights: int
    activation: int
    non_torch: int
    kv: int
    kv_token_bytes: int
    blocks: int
    tokens: int
    max_model_len: int
    longest: int
    concurrency: float
    starts: bool
    verdict: str
    warnings: tuple[str, ...] = field(default=())


#: device memory as CUDA reports it (``torch.cuda.mem_get_info``), where a log gives it: an
#: H100 80GB HBM3 reports 79.19 GiB ("total capacity of 79.19 GiB", data/serving_logs.toml),
#: below the 81,559 MiB (79.65 GiB) ``nvidia-smi`` shows; other cards fall back to nvidia-smi's
CUDA_TOTAL = {"h100-sxm": round(79.19 * GIB)}


def _total(gpu, total_bytes: int | None) -> int:
    if total_bytes is not None:
        return integer("total_bytes", total_bytes, 1, MAX_MEMORY_BYTES)
    name = gpu if isinstance(gpu, str) else getattr(gpu, "name", None)
    return CUDA_TOTAL.get(str(name), 0) or device_memory_bytes(gpu)


def _defaults(engine: str, total: int, gpu) -> tuple[int, int]:
    big = total >= 70 * GIB and "a100" not in str(getattr(gpu, "name", gpu)).lower()
    return ENGINES[engine]["big_gpu" if big else "small_gpu"]


def _layers_on(spec: ModelSpec, pp: int) -> int:
    return max(even_split(spec.layers, pp))


def startup(
    spec: ModelSpec,
    gpu="h100-sxm",
    *,
    engine: str = "vllm",
    tp: int = 1,
    pp: int = 1,
    quantization: str = "none",
    dtype: str = "bf16",
    kv_cache_dtype: str = "auto",
    utilization: float | None = None,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    total_bytes: int | None = None,
    free_bytes: int | None = None,
    mxfp4_backend: str = "marlin",
    version: str | None = None,
) -> Startup:
    """Startup memory of ``engine`` serving ``spec`` on ``tp × pp`` GPUs of ``gpu``, and the KV
    cache it is left with (the module docstring gives each engine's formula and source).

    ``utilization`` is vLLM's ``gpu_memory_utilization`` (default 0.9), SGLang's
    ``mem_fraction_static`` (default :func:`sglang_mem_fraction_static`) or TensorRT-LLM's ``free_gpu_memory_fraction`` (default
    0.9). ``max_model_len`` defaults to the model's ``max_positions``; ``max_num_batched_tokens``
    and ``max_num_seqs`` to the engine's defaults for the GPU. ``total_bytes`` overrides the
    device memory (default: the preset's, as ``nvidia-smi`` reports it; CUDA reports a little
    less, 79.19 GiB of an H100's 79.65, and a log's figure is the one to use); ``free_bytes``
    is SGLang's free memory before loading (default: the total less the CUDA context);
    ``version`` picks an earlier vLLM's profiling peak (``ENGINES["vllm"]["versions"]``).
    """
    _spec(spec)
    choice("engine", engine, ENGINES)
    choice("kv_cache_dtype", kv_cache_dtype, SERVE_KV_DTYPES)
    _engine_kv(engine, kv_cache_dtype)
    versions = ENGINES[engine].get("versions", {})
    if version is not None and version not in versions:
        known = ", ".join(versions) or "none"
        raise ValueError(f"version={version!r:.20}: {engine} versions modelled: {known}")
    tp, pp = integer("tp", tp), integer("pp", pp, 1, spec.layers)
    total = _total(gpu, total_bytes)
    max_len = integer(
        "max_model_len",
        spec.max_positions if max_model_len is None else max_model_len,
        1,
        MAX_SEQ_LEN,
    )
    tokens_d, seqs_d = _defaults(engine, total, gpu) if engine != "sglang" else (8192, 256)
    tokens = integer(
        "max_num_batched_tokens",
        tokens_d if max_num_batched_tokens is None else max_num_batched_tokens,
        1,
        MAX_SEQ_LEN,
    )
    seqs = integer("max_num_seqs", seqs_d if max_num_seqs is None else max_num_seqs, 1, MAX_BATCH)
    wb = DTYPES[choice("dtype", dtype, DTYPES)]
    stages = [
        loaded_weight_bytes(
            spec, quantization, dtype, tp=tp, pp=pp, stage=i, mxfp4_backend=mxfp4_backend
        )
        for i in range(pp)
    ]
    kvb = _kv_bytes(spec, kv_cache_dtype, dtype)
    per_layer = layer_kv_values(spec, tp) * kvb
    layers = _layers_on(spec, pp)
    token_bytes = layers * per_layer
    if engine == "sglang":
        gpu_mib = device_memory_bytes(gpu) >> 20 if total_bytes is None else total >> 20
        return _sglang(
            spec,
            total,
            stages,
            token_bytes,
            tp * pp,
            utilization,
            max_len,
            free_bytes,
            gpu_mib,
            tp,
            pp,
        )
    e = ENGINES[engine]
    # vLLM's MLA backend on Hopper (FlashMLA) takes blocks of 64 tokens, others 16
    block = 64 if engine == "vllm" and spec.attention == "mla" else e["block"]
    nt = e["non_torch"]["tp" if tp > 1 else "pp" if pp > 1 else "single"]
    # the busiest stage: the one whose budget leaves the least for the cache
    peaks = [
        profile_peak_bytes(spec, tokens, seqs, tp, i == pp - 1, engine, wb, version)
        for i in range(pp)
    ]
    if engine == "vllm":
        util = number(
            "utilization",
            e["utilization"] if utilization is None else utilization,
            0,
            1,
            lo_open=True,
        )
        budget = math.ceil(total * util)
        kvs = [budget - w - a - nt for w, a in zip(stages, peaks, strict=True)]
    else:
        frac = number(
            "utilization",
            e["free_fraction"] if utilization is None else utilization,
            0,
            1,
            lo_open=True,
        )
        budget = total
        kvs = [int((total - w - a - nt) * frac) for w, a in zip(stages, peaks, strict=True)]
    i = min(range(pp), key=lambda j: kvs[j])
    return _verdict(
        engine,
        spec,
        total,
        budget,
        stages[i],
        peaks[i],
        nt,
        kvs[i],
        token_bytes,
        block,
        layers,
        max_len,
        tokens,
    )


def _sliding_need(spec: ModelSpec, max_len: int, tokens: int, block: int) -> tuple[int, int]:
    """(full-attention layers, their blocks) and (local layers, their blocks) one request of
    ``max_len`` tokens needs in vLLM (``SlidingWindowSpec.max_memory_usage_bytes``: a local
    layer keeps ⌈min(W − 1 + tokens, max_len)/block⌉ + 1 blocks)."""
    local = spec.num_local_layers
    full_blocks = -(-max_len // block)
    if not local:
        return full_blocks, 0
    w = spec.sliding_window
    return full_blocks, -(-min(w - 1 + tokens, max_len) // block) + 1


def _kv_groups(spec: ModelSpec) -> int:
    """vLLM's KV-cache groups: one for layers of one kind, two for sliding-window plus full."""
    return 2 if 0 < spec.num_local_layers < spec.layers else 1


def kv_blocks(
    spec: ModelSpec, kv: int, token_bytes: int, layers: int, block: int = 16
) -> tuple[int, int]:
    """(blocks, tokens) of vLLM's KV cache in ``kv`` bytes on one GPU holding ``layers`` layers
    whose cache costs ``token_bytes`` per token (``v1/core/kv_cache_utils.py``): layers of one
    kind form one group, a model with sliding-window and full layers two groups of L/2 that
    share every block; blocks = ⌊⌊kv / page⌋ / layers per group⌋, page = one block of one
    layer; the log's token count is blocks // groups × block."""
    groups = _kv_groups(spec)
    page = token_bytes // layers * block
    blocks = max(kv, 0) // page // (layers // groups)
    return blocks, blocks // groups * block


def _verdict(
    engine, spec, total, budget, weights, act, nt, kv, token_bytes, block, layers, max_len, tokens
) -> Startup:
    groups = _kv_groups(spec)
    page_group = token_bytes // layers * block * (layers // groups)
    blocks, shown = kv_blocks(spec, kv, token_bytes, layers, block)
    full_b, local_b = _sliding_need(spec, max_len, tokens, block)
    need_blocks = full_b + local_b  # blocks of the shared pool one request of max_len needs
    concurrency = blocks / need_blocks
    # the longest request: full-attention blocks left after the local layers' share
    longest = min(max(0, blocks - local_b) * block, MAX_SEQ_LEN)
    gib = GIB
    if kv <= 0:
        starts, verdict = (
            False,
            (
                f"does not start: no memory for the KV cache ({kv / gib:.2f} GiB left after "
                f"weights {weights / gib:.2f}, activations {act / gib:.2f} and non-torch "
                f"{nt / gib:.2f} GiB); raise the utilisation, add GPUs (tp) or quantise"
            ),
        )
    elif blocks < need_blocks:
        starts, verdict = (
            False,
            (
                f"does not start: one request of max_model_len={max_len} needs "
                f"{need_blocks * page_group / gib:.2f} GiB of KV cache, {kv / gib:.2f} GiB is "
                f"left; set --max-model-len {longest} or less"
            ),
        )
    else:
        starts, verdict = (
            True,
            (
                f"starts: {kv / gib:.2f} GiB of KV cache, {shown:,} tokens, "
                f"{concurrency:.2f} requests of {max_len:,} tokens at once"
            ),
        )
    return Startup(
        engine,
        total,
        budget,
        weights,
        act,
        nt,
        kv,
        token_bytes,
        blocks,
        shown,
        max_len,
        longest,
        concurrency,
        starts,
        verdict,
    )


#: SGLang 0.5's defaults by the GPU's memory in MiB as nvidia-smi reports it (``server_args.py:
#: ServerArgs._handle_gpu_memory_settings``): (below this many MiB, chunked_prefill_size,
#: cuda_graph_max_bs at tp < 4, at tp >= 4)
_SGLANG_SIZES = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (math.inf, 16384, 512, 512),
)


def _piecewise_sizes(max_tokens: int) -> int:
    """How many piecewise CUDA graphs SGLang 0.5 captures up to ``max_tokens`` tokens
    (``_generate_piecewise_cuda_graph_tokens``)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_tokens + 1, 512),
    ]
    return sum(x <= max_tokens for x in sizes)


def sglang_mem_fraction_static(gpu_mib: int, tp: int = 1, pp: int = 1, mla: bool = False) -> float:
    """SGLang 0.5's default ``mem_fraction_static`` (``server_args.py``, no DP attention, no
    speculative decoding): (memory − reserved) / memory, rounded to 3 decimals, with reserved =
    512 MiB + 1.5 × the chunked-prefill size + 2 × the largest CUDA-graph batch + t·p/8 GiB +
    8 MiB per piecewise CUDA graph (1.5 GiB for MLA), at least 10 GiB on a GPU above 60 GiB.
    Read from the source; no log recorded here checks it (the one SGLang log with its fraction
    printed is 0.4.3's)."""
    gpu_mib = integer("gpu_mib", gpu_mib, 1, MAX_MEMORY_BYTES >> 20)
    _, chunk, bs_small, bs_big = next(r for r in _SGLANG_SIZES if gpu_mib < r[0])
    graph_bs = bs_small if tp < 4 else bs_big
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    reserved += 1.5 * 1024 if mla else _piecewise_sizes(2048 if mla else chunk) * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def _sglang(spec, total, stages, token_bytes, gpus, fraction, max_len, free, gpu_mib, tp, pp):
    if fraction is None:
        fraction = sglang_mem_fraction_static(gpu_mib, tp, pp, spec.attention == "mla")
    frac = number("utilization", fraction, 0, 1, lo_open=True)
    ctx = ENGINES["sglang"]["context"]["multi" if gpus > 1 else "single"]
    free_before = total - ctx if free is None else integer("free_bytes", free, 1, total)
    weights = max(stages)
    rest = free_before - weights - int(free_before * (1 - frac))
    tokens = max(rest, 0) // token_bytes
    longest = min(tokens, MAX_SEQ_LEN)
    starts = rest > 0 and tokens >= 1
    verdict = (
        f"starts: {rest / GIB:.2f} GiB of KV cache, {tokens:,} tokens"
        if starts
        else f"does not start: no memory for the KV cache ({rest / GIB:.2f} GiB); raise "
        "mem_fraction_static or add GPUs"
    )
    return Startup(
        "sglang",
        total,
        int(free_before * frac),
        weights,
        0,
        0,
        rest,
        token_bytes,
        tokens,
        tokens,
        max_len,
        longest,
        tokens / max_len,
        starts,
        verdict,
    )


#: how each parmem quantisation is named on each engine's command line (None: the engine
#: reads it from the checkpoint's quantization_config, nothing to pass)
_QUANT_FLAG = {
    "vllm": {
        "none": None,
        "fp8": "fp8",
        "fp8-block": None,
        "fp8-channel": None,
        "w8a8": None,
        "awq": "awq_marlin",
        "gptq": "gptq_marlin",
        "w4a16": None,
        "mxfp4": None,
        "nvfp4": None,
    },
    "sglang": {
        "none": None,
        "fp8": "fp8",
        "fp8-block": None,
        "fp8-channel": None,
        "w8a8": "w8a8_int8",
        "awq": "awq_marlin",
        "gptq": "gptq_marlin",
        "w4a16": None,
        "mxfp4": "mxfp4",
        "nvfp4": "modelopt_fp4",
    },
    "trtllm": {},
}
#: the KV-cache dtypes each engine's parser accepts, as it spells them ("auto": the weights'
#: dtype, every engine's default; TensorRT-LLM sets the cache dtype outside the command line)
_KV_FLAG = {
    "vllm": {"auto": "auto", "fp8": "fp8", "bf16": "bfloat16", "fp16": "float16"},
    "sglang": {"auto": "auto", "fp8": "fp8_e4m3", "bf16": "bf16"},
    "trtllm": {"auto": "auto"},
}
_DTYPE_FLAG = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _engine_kv(engine: str, kv_cache_dtype: str) -> str:
    """The engine's spelling of ``kv_cache_dtype``; a dtype its parser refuses is refused here."""
    if kv_cache_dtype not in _KV_FLAG[engine]:
        raise ValueError(
            f"kv_cache_dtype={kv_cache_dtype!r}: {engine} takes "
            f"{', '.join(_KV_FLAG[engine])} (data/serving_args.toml)"
        )
    return _KV_FLAG[engine][kv_cache_dtype]


def emit_command(
    engine: str,
    model: str,
    *,
    tp: int = 1,
    pp: int = 1,
    max_model_len: int | None = None,
    utilization: float | None = None,
    quantization: str = "none",
    kv_cache_dtype: str = "auto",
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    dtype: str = "bf16",
) -> str:
    """The launch command for ``engine`` with the settings :func:`startup` priced, spelled as
    the engine's parser takes them (``data/serving_args.toml`` records every engine's flags from
    its source; ``tests/test_serving.py`` checks each emitted command against it).
    TensorRT-LLM takes neither the quantisation nor the cache dtype on ``trtllm-serve``'s
    command line (they come from the checkpoint and an extra-options file), so a value other
    than the default is refused there."""
    choice("engine", engine, ENGINES)
    choice("quantization", quantization, QUANTIZATIONS)
    choice("kv_cache_dtype", kv_cache_dtype, SERVE_KV_DTYPES)
    choice("dtype", dtype, DTYPES)
    if not isinstance(model, str) or not model or any(c.isspace() for c in model):
        raise ValueError(f"model={model!r:.60} must be a repository id or path without spaces")
    tp, pp = integer("tp", tp), integer("pp", pp)
    q = _QUANT_FLAG[engine].get(quantization)
    kv = _engine_kv(engine, kv_cache_dtype)
    if engine == "trtllm" and (quantization != "none" or dtype != "bf16"):
        raise ValueError(
            "engine='trtllm': trtllm-serve reads the quantisation and the dtype from the "
            "checkpoint and --extra_llm_api_options, not from flags"
        )
    names = {
        "vllm": (
            "vllm serve",
            "--tensor-parallel-size",
            "--pipeline-parallel-size",
            "--max-model-len",
            "--gpu-memory-utilization",
            "--max-num-seqs",
            "--max-num-batched-tokens",
        ),
        "sglang": (
            "python -m sglang.launch_server --model-path",
            "--tp-size",
            "--pp-size",
            "--context-length",
            "--mem-fraction-static",
            "--max-running-requests",
            "--chunked-prefill-size",
        ),
        "trtllm": (
            "trtllm-serve",
            "--tp_size",
            "--pp_size",
            "--max_seq_len",
            "--kv_cache_free_gpu_memory_fraction",
            "--max_batch_size",
            "--max_num_tokens",
        ),
    }[engine]
    head, *flags = names
    values = [tp, pp, max_model_len, utilization, max_num_seqs, max_num_batched_tokens]
    parts = [head, model]
    for k, (flag, value) in enumerate(zip(flags, values, strict=True)):
        if value is not None and (value != 1 or k >= 2):  # t = p = 1 are the defaults
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if engine != "trtllm":
        parts += ["--dtype", _DTYPE_FLAG[dtype]]
    if q:
        parts += ["--quantization", q]
    if kv_cache_dtype != "auto":
        parts += ["--kv-cache-dtype", kv]
    return " ".join(parts)


def check_command(engine: str, command: str) -> None:
    """Raise ValueError unless every flag of ``command`` is one ``engine``'s parser accepts
    (``data/serving_args.toml``), with a value where it takes one and a listed choice where
    the parser enforces choices."""
    from ._data import load_toml

    flags = load_toml("serving_args.toml")[engine]["flags"]
    words = command.split()
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if not w.startswith("--"):
            continue
        name, _, inline = w.partition("=")
        if name not in flags:
            raise ValueError(f"{engine}: {name} is not a flag of its parser")
        spec = flags[name]
        spec = flags.get(spec.get("alias_of", ""), spec)
        if spec.get("takes_value", True):
            value = inline or (words[i] if i < len(words) else "")
            i += 0 if inline else 1
            allowed = spec.get("choices") or spec.get("valid_values")
            if not value or value.startswith("--"):
                raise ValueError(f"{engine}: {name} needs a value")
            if allowed and value not in allowed:
                raise ValueError(f"{engine}: {name} {value} is not one of {allowed}")
