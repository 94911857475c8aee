"""The book's calculator and planner pages: what their JavaScript calls, in Pyodide.

The pages (``chapters/tools/calculator.md``, ``chapters/tools/planner.md``) run this very
library in the reader's browser, in a Web Worker, with Pyodide; the JavaScript is glue that
sends the form's settings here and shows what comes back. Everything returned is JSON-ready and
every number is parmem's: :func:`calculate` is :func:`~parmem.estimate.estimate`,
:func:`plan_layouts` is :func:`~parmem.planner.plan` and :meth:`~parmem.planner.Plan.emit`.

Settings are a dict of strings (a form, or a URL query string: :func:`parse_query`); a value
that is missing takes its default. The result is ``{"ok": True, ...}`` or ``{"ok": False,
"errors": {field: message}}``, the message being the library's own ``ValueError`` text, filed
under the field it names (``"tp=3 must divide heads=32"`` goes to ``t``); ``"_"`` holds an error
that names no field.

URL parameters of the calculator (``calculator.html?model=llama-2-7b&t=4&p=2&m=8``), each
with its default:

* ``model``: model preset (``parmem models``), ``llama-2-7b``;
* ``config``: a Hugging Face ``config.json`` as JSON text, which wins over ``model`` (the page
  takes it from a text box; it is never put in the URL);
* ``gpu``: GPU preset (``a100-40gb``, ``a100-80gb``, ``h100-sxm``, ``h200``), ``h100-sxm``;
* ``engine``: engine profile (``paper``, ``megatron-core``, ``deepspeed``, ``fsdp2``, ``hf``),
  ``paper``;
* ``d``, ``t``, ``p``, ``e``, ``cp``: data-, tensor-, pipeline-, expert- and context-parallel
  sizes, 1;
* ``v``: virtual stages per pipeline rank (> 1 selects the interleaved schedule), 1;
* ``zero``: ZeRO stage 0-3, 0; ``sp``: sequence parallelism, 0 or 1, 0;
* ``recompute``: ``none``, ``selective`` or ``full``, ``none``;
* ``seq``: sequence length s, 4096; ``b``: micro-batch size, 1; ``m``: micro-batches per step, 1;
* ``precision``: ``bf16-mixed``, ``fp16-mixed``, ``bf16`` or ``fp32``, ``bf16-mixed``;
  ``optimizer``: an optimizer preset (``parmem.config.OPTIMIZERS``), ``adamw``;
* ``flash``: fused attention (no s x s scores kept): ``auto`` (the engine's kernel), 1 or 0,
  ``auto``;
* ``adapter``: fine-tuning with ``engine=hf``: ``none`` (every weight trained), ``lora`` or
  ``qlora`` (the ``adapter`` of :class:`parmem.config.TrainingSetup`), ``none``; ``r``: the
  LoRA rank, 16; ``targets``: ``all-linear``, ``attention`` or ``qv``, ``all-linear``;
  ``quant``: QLoRA's ``nf4`` or ``fp4``, ``nf4``; ``offload_act``: every saved activation to
  the host, 0 or 1, 0; ``fp8``: FP8 linear layers, ``none``, ``torchao`` or ``te``, ``none``;
  ``galore_r``: GaLore's rank with ``optimizer=galore-adamw``, 128;
* ``solve``: ``seq`` (the longest sequence) or ``b`` (the largest micro-batch) that fits this
  layout, judged on the high bound (:func:`parmem.fit.max_seq_len`,
  :func:`parmem.fit.max_micro_batch`), ``none``.

"fits" is the book's rule (:func:`parmem.fit.fits`): the estimate within the usable memory, the
GPU's memory less the planner's headroom (:meth:`parmem.planner.Assumptions.usable_bytes`), and
the high bound within the GPU; one rule for both pages and the chapters.
Beside it both pages show the band of :func:`parmem.bounds.bounds`: allocated (the estimate),
expected reserved (the caching allocator's overhead on the step's trace) and the high bound
(with the CUDA context, NCCL's buffers and the cuBLAS workspace), and the headroom the high
bound leaves on the GPU (``band``; the planner's for the picked layout).

URL parameters of the planner (``planner.html?model=gpt3-175b&gpu=a100-80gb&nodes=96``):

* ``model``: model preset, ``llama-3-8b``; ``gpu``: GPU preset, ``h100-sxm``;
* ``gpn``: GPUs per node, 8; ``nodes``: nodes, 1;
* ``batch``: global batch (sequences per step), 64; ``seq``: sequence length, 4096;
* ``top``: how many layouts to list (1-50), 10;
* ``engine``: the engine profile whose layouts are searched, sized and timed,
  ``megatron-core``;
* ``emit``: launch recipe, ``auto`` (the engine's: ``megatron`` for ``megatron-core``,
  ``deepspeed``, ``torchtitan`` for ``fsdp2``; none for ``paper`` and ``hf``) or the name of the
  engine's own recipe;
* ``pick``: the layout (its rank, from 1) whose recipe is shown, 1;
* ``adapter``: ``none``, or ``lora`` / ``qlora`` fine-tuning (``engine=hf``, bf16 weights,
  r = 16 on every linear layer, NF4), ``none``.

The calculator's serving mode (``calculator.html?mode=serve&model=llama-3-70b&tp=2``) is
:func:`serve_page`: the startup memory of a serving engine (:func:`parmem.serving.startup`) and
its launch command (:func:`parmem.serving.emit_command`). Its URL parameters, with defaults
(``auto``: the engine's or the model's own):

* ``mode``: ``serve`` (the training calculator takes no ``mode``), ``serve``;
* ``model``: model preset, ``llama-3-8b``; ``gpu``: GPU preset, ``h100-sxm``;
* ``engine``: ``vllm``, ``sglang`` or ``trtllm`` (``parmem.serving.ENGINES``), ``vllm``;
* ``tp``, ``pp``: tensor- and pipeline-parallel sizes, 1;
* ``quant``: how the weights are stored (``parmem.serving.QUANTIZATIONS``), ``none``;
  ``dtype``: the unquantised weights' dtype, ``bf16``; ``kv``: the KV cache's dtype
  (``parmem.serving.SERVE_KV_DTYPES``), ``auto`` (the weights');
* ``util``: vLLM's ``gpu_memory_utilization``, SGLang's ``mem_fraction_static`` (its default
  depends on the GPU and the layout), TensorRT-LLM's ``free_gpu_memory_fraction``, ``auto``;
* ``len``: ``max_model_len``, ``auto`` (the model's ``max_positions``); ``seqs``:
  ``max_num_seqs``, ``auto``; ``tokens``: ``max_num_batched_tokens``, ``auto``.

A chapter's Explore section links to the calculator with its own settings with a raw HTML link
(MyST's Markdown links to a page drop the query): ``<a
href="../tools/calculator.html?model=llama-2-7b&t=4&sp=1">`` from a chapter in
``chapters/<part>/``.

Standard library only (the rest of parmem's estimator and planner), so it runs in Pyodide.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, urlencode

from ..bounds import bounds
from ..config import (
    ADAPTERS,
    BASE_QUANTS,
    FP8_RECIPES,
    LORA_TARGETS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    ParallelConfig,
    TrainingSetup,
    vpp_schedule,
)
from ..engines import engines
from ..estimate import Estimate, MemoryBreakdown, estimate
from ..fit import fits, max_micro_batch, max_seq_len
from ..hardware import hardware_preset, hardware_presets
from ..model import ModelSpec, presets
from ..planner import ENGINES, Assumptions, Cluster, Plan, pareto_front, plan
from ..planner.emit import EMITTER_OF, PROFILES
from ..serving import DTYPES as SERVE_DTYPES
from ..serving import ENGINES as SERVE_ENGINES
from ..serving import QUANTIZATIONS, SERVE_KV_DTYPES, check_command, emit_command, startup
from ..units import GIB
from .svg import LABELS, stacked_bars

__all__ = [
    "CALC_FIELDS",
    "PLAN_FIELDS",
    "SERVE_FIELDS",
    "calculate",
    "plan_layouts",
    "serve_page",
    "options",
    "parse_query",
    "to_query",
    "calculator_query",
    "run_json",
]

#: The calculator's settings: URL name -> (default, what it is). The order is the URL's.
CALC_FIELDS: dict[str, tuple[str, str]] = {
    "model": ("llama-2-7b", "model preset"),
    "config": ("", "a Hugging Face config.json, as JSON text (wins over model)"),
    "gpu": ("h100-sxm", "GPU preset"),
    "engine": ("paper", "engine profile"),
    "d": ("1", "data-parallel size"),
    "t": ("1", "tensor-parallel size"),
    "p": ("1", "pipeline-parallel size"),
    "e": ("1", "expert-parallel size"),
    "cp": ("1", "context-parallel size"),
    "v": ("1", "virtual stages per pipeline rank (> 1: interleaved schedule)"),
    "zero": ("0", "ZeRO stage, 0-3"),
    "sp": ("0", "sequence parallelism, 0 or 1"),
    "recompute": ("none", "activation recomputation: none, selective or full"),
    "seq": ("4096", "sequence length s"),
    "b": ("1", "micro-batch size"),
    "m": ("1", "micro-batches per step"),
    "precision": ("bf16-mixed", "number formats"),
    "optimizer": ("adamw", "optimizer (its states per parameter; galore-adamw: engine hf)"),
    "flash": ("auto", "fused attention (no s x s scores kept): auto (the engine's kernel), 1 or 0"),
    "adapter": ("none", "fine-tuning: none (every weight trained), lora or qlora (engine hf)"),
    "r": ("16", "LoRA rank"),
    "targets": ("all-linear", "layers with adapters: all-linear, attention or qv"),
    "quant": ("nf4", "QLoRA's 4-bit base format: nf4 or fp4"),
    "offload_act": ("0", "saved activations to the host (save_on_cpu), 0 or 1"),
    "fp8": ("none", "FP8 linear layers (engine hf, bf16): none, torchao or te"),
    "galore_r": ("128", "GaLore's rank (optimizer galore-adamw)"),
    "solve": ("none", "find the largest that fits on the high bound: none, seq or b"),
}

#: The planner's settings, as :data:`CALC_FIELDS`.
PLAN_FIELDS: dict[str, tuple[str, str]] = {
    "model": ("llama-3-8b", "model preset"),
    "gpu": ("h100-sxm", "GPU preset"),
    "gpn": ("8", "GPUs per node"),
    "nodes": ("1", "nodes"),
    "batch": ("64", "global batch, sequences per step"),
    "seq": ("4096", "sequence length"),
    "top": ("10", "how many layouts to list"),
    "engine": ("megatron-core", "engine to plan for: its layouts, memory, time and recipe"),
    "emit": ("auto", "launch recipe: auto (the engine's), megatron, deepspeed or torchtitan"),
    "adapter": ("none", "fine-tuning (engine hf, bf16): none, lora or qlora (r=16, all-linear)"),
    "pick": ("1", "the layout (rank, from 1) whose recipe is shown"),
}

#: The calculator's serving mode (:func:`serve_page`), as :data:`CALC_FIELDS`; ``auto``: the
#: engine's default (the model's ``max_positions`` for ``len``).
SERVE_FIELDS: dict[str, tuple[str, str]] = {
    "mode": ("serve", "the calculator's mode: serve (the training calculator has none)"),
    "model": ("llama-3-8b", "model preset"),
    "gpu": ("h100-sxm", "GPU preset"),
    "engine": ("vllm", "serving engine: vllm, sglang or trtllm"),
    "tp": ("1", "tensor-parallel size"),
    "pp": ("1", "pipeline-parallel size"),
    "quant": ("none", "how the weights are stored (quantization)"),
    "dtype": ("bf16", "dtype of the unquantised weights"),
    "kv": ("auto", "KV-cache dtype (auto: the weights')"),
    "util": ("auto", "share of the GPU the engine may use (SGLang: mem_fraction_static)"),
    "len": ("auto", "max_model_len: the longest request (auto: the model's max_positions)"),
    "seqs": ("auto", "max_num_seqs: requests per step (auto: the engine's default)"),
    "tokens": ("auto", "max_num_batched_tokens: tokens per step (auto: the engine's default)"),
}

# the library's argument names (as its ValueError messages spell them) -> the page's fields
_LIBRARY_NAMES = {
    "dp": "d",
    "tp": "t",
    "pp": "p",
    "ep": "e",
    "vpp": "v",
    "schedule": "v",
    "seq_len": "seq",
    "micro_batch": "b",
    "num_microbatches": "m",
    "flash_attention": "flash",
    "gpus_per_node": "gpn",
    "global_batch": "batch",
    "candidate": "pick",
    "lora_rank": "r",
    "lora_targets": "targets",
    "base_quant": "quant",
    "offload_activations": "offload_act",
    "galore_rank": "galore_r",
    "name": "model",
}
# the same for the serving mode (parmem.serving's arguments)
_SERVE_NAMES = {
    "quantization": "quant",
    "kv_cache_dtype": "kv",
    "utilization": "util",
    "mem_fraction_static": "util",
    "max_model_len": "len",
    "max_num_seqs": "seqs",
    "max_num_batched_tokens": "tokens",
    "name": "model",
}
_NAMED = re.compile(r"(?<![A-Za-z0-9_])(?:--)?([a-z][a-z0-9_]*)\s*=")
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no", "")


class FieldError(ValueError):
    """A ``ValueError`` that belongs to one field of the page."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def field_of(
    message: str,
    fields: Mapping[str, Any],
    default: str = "_",
    names: Mapping[str, str] = _LIBRARY_NAMES,
) -> str:
    """The field a library message is about: the first ``name=`` in it that is a field (or the
    library's name of one, by ``names``), else ``default``."""
    for match in _NAMED.finditer(message):
        name = names.get(match.group(1), match.group(1))
        if name in fields:
            return name
    return default


def _settings(raw: Mapping[str, Any], fields: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """``raw`` with defaults filled in, every value a stripped string; unknown names fail."""
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise FieldError("_", f"unknown setting(s) {unknown}; known: {', '.join(fields)}")
    out = {k: default for k, (default, _) in fields.items()}
    for key, value in raw.items():
        if isinstance(value, bool):
            value = "1" if value else "0"
        out[key] = str(value).strip()
    return out


def _int(values: Mapping[str, str], key: str) -> int:
    text = values[key]
    if not re.fullmatch(r"[+-]?\d{1,9}", text):
        raise FieldError(key, f"{key}={text!r:.40} must be a whole number")
    return int(text)


def _flag(values: Mapping[str, str], key: str) -> bool:
    text = values[key].lower()
    if text not in _TRUE + _FALSE:
        raise FieldError(key, f"{key}={values[key]!r:.40} must be 0 or 1")
    return text in _TRUE


def _auto_flag(values: Mapping[str, str], key: str) -> bool | None:
    """``None`` for ``auto`` (the engine's default), else :func:`_flag`."""
    return None if values[key].lower() == "auto" else _flag(values, key)


def _one_of(values: Mapping[str, str], key: str, known: Any) -> str:
    text = values[key]
    if text not in known:
        raise FieldError(key, f"{key}={text!r:.40} must be one of {', '.join(known)}")
    return text


def _model(values: Mapping[str, str]) -> ModelSpec:
    if values.get("config"):
        try:
            config = json.loads(values["config"])
        except json.JSONDecodeError as e:
            raise FieldError("config", f"config is not valid JSON: {e}") from None
        if not isinstance(config, dict):
            raise FieldError("config", "config must be a JSON object (a config.json)")
        try:
            return ModelSpec.from_hf_config(
                config, name=str(config.get("_name_or_path") or "") or None
            )
        except ValueError as e:
            raise FieldError("config", str(e)) from None
    _one_of(values, "model", presets())
    return ModelSpec.preset(values["model"])


def _guarded(
    fields: Mapping[str, Any],
    work: Callable[[], dict[str, Any]],
    names: Mapping[str, str] = _LIBRARY_NAMES,
) -> dict[str, Any]:
    """``work()`` with its ``ValueError`` turned into ``{"ok": False, "errors": ...}``."""
    try:
        return {"ok": True, **work()}
    except FieldError as e:
        return {"ok": False, "errors": {e.field: str(e)}}
    except ValueError as e:
        return {"ok": False, "errors": {field_of(str(e), fields, names=names): str(e)}}


# ------------------------------------------------------------------------------- calculator
def _calc_inputs(v: Mapping[str, str]) -> tuple[ModelSpec, ParallelConfig, TrainingSetup]:
    spec = _model(v)
    _one_of(v, "gpu", hardware_presets())
    vpp = _int(v, "v")
    par = ParallelConfig(
        dp=_int(v, "d"),
        tp=_int(v, "t"),
        pp=_int(v, "p"),
        ep=_int(v, "e"),
        cp=_int(v, "cp"),
        sp=_flag(v, "sp"),
        zero=_int(v, "zero"),
        vpp=vpp,
    )
    setup = TrainingSetup(
        seq_len=_int(v, "seq"),
        micro_batch=_int(v, "b"),
        num_microbatches=_int(v, "m"),
        precision=_one_of(v, "precision", tuple(PRECISIONS)),
        optimizer=_one_of(v, "optimizer", tuple(OPTIMIZERS)),
        recompute=_one_of(v, "recompute", RECOMPUTE),
        schedule=vpp_schedule(vpp),
        flash_attention=_auto_flag(v, "flash"),
        engine=_one_of(v, "engine", tuple(engines())),
        adapter=_one_of(v, "adapter", ADAPTERS),
        lora_rank=_int(v, "r"),
        lora_targets=_one_of(v, "targets", LORA_TARGETS),
        base_quant=_one_of(v, "quant", BASE_QUANTS),
        offload_activations=_flag(v, "offload_act"),
        fp8=_one_of(v, "fp8", FP8_RECIPES),
        galore_rank=_int(v, "galore_r"),
    )
    return spec, par, setup


def band(est: Estimate, gpu: str) -> dict[str, Any]:
    """:func:`parmem.bounds.bounds` of ``est`` on ``gpu`` as the pages show it: bytes and GiB of
    allocated, reserved and high, the high bound's parts, its headroom and verdict."""
    b = bounds(est, gpu)
    p = b.peak
    out: dict[str, Any] = {
        "stage": p.stage,
        "allocated": p.allocated,
        "reserved": p.reserved,
        "high": p.high,
        "allocator": p.allocator,
        "cuda_context": p.cuda_context,
        "nccl": p.nccl,
        "workspace": p.workspace,
        "headroom": b.headroom,
        "fits": b.fits,
    }
    out["gib"] = {k: f"{v / GIB:.2f}" for k, v in out.items() if isinstance(v, int)
                  and not isinstance(v, bool) and k != "stage"}  # fmt: skip
    return out


def _solve(
    what: str, spec: ModelSpec, par: ParallelConfig, setup: TrainingSetup, gpu: str
) -> dict[str, Any] | None:
    """The calculator's inverse query (``solve``): the longest sequence or the largest
    micro-batch that fits on the high bound, with the bytes there and one step beyond."""
    what = _one_of({"solve": what}, "solve", ("none", "seq", "b"))
    if what == "none":
        return None
    ans = (max_seq_len if what == "seq" else max_micro_batch)(spec, par, setup, gpu)
    return {
        "quantity": what,
        "value": ans.value,
        "next": ans.next_value,
        "gib": f"{ans.bytes / GIB:.2f}",
        "next_gib": None if ans.next_bytes is None else f"{ans.next_bytes / GIB:.2f}",
        "text": str(ans),
    }


def _stage_row(stage: MemoryBreakdown) -> dict[str, Any]:
    row: dict[str, Any] = {"stage": stage.stage, "layers": stage.layers, "total": stage.total}
    row.update({k: getattr(stage, k) for k in MemoryBreakdown.DRAWN})
    row["gib"] = {k: f"{getattr(stage, k) / GIB:.2f}" for k in (*MemoryBreakdown.DRAWN, "total")}
    row["notes"] = list(stage.notes)
    return row


def calculate(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Per-GPU memory of every pipeline stage for the calculator's ``settings`` (see the module
    docstring), and whether the fullest GPU fits the chosen GPU."""

    def work() -> dict[str, Any]:
        values = _settings(settings, CALC_FIELDS)
        spec, par, setup = _calc_inputs(values)
        est = estimate(spec, par, setup)
        hw = hardware_preset(values["gpu"])
        usable = Assumptions().usable_bytes(hw)  # the planner's rule: headroom kept free
        stages = [_stage_row(s) for s in est.stages]
        return {
            "model": spec.name,
            "num_params": spec.num_params(),
            "gpu": hw.name,
            "memory_bytes": hw.memory_bytes,
            "memory_gib": f"{hw.memory_bytes / GIB:.2f}",
            "world_size": par.world_size,
            "peak_stage": est.peak.stage,
            "peak_bytes": est.peak_bytes,
            "peak_gib": f"{est.peak_bytes / GIB:.2f}",
            "usable_bytes": usable,
            "usable_gib": f"{usable / GIB:.2f}",
            "headroom": f"{Assumptions().headroom:.0%}",
            "fits": fits(est, hw),  # the book's rule (both parts; the band gives the numbers)
            "band": band(est, hw.name),
            "solve": _solve(values["solve"], spec, par, setup, hw.name),
            "components": list(MemoryBreakdown.DRAWN),
            "labels": {k: LABELS.get(k, k) for k in MemoryBreakdown.DRAWN},
            "stages": stages,
            "text": str(est),
            "svg": stacked_bars(stages, list(MemoryBreakdown.DRAWN), hw.memory_bytes, GIB),
            "query": to_query(values, CALC_FIELDS),
        }

    return _guarded(CALC_FIELDS, work)


# ------------------------------------------------------------------------ calculator: serving
#: the serving mode's bar: each part's name and colour (weights and activations keep the
#: book's colours of parameters and activations)
SERVE_PARTS = {
    "weights": ("weights", "#4C72B0"),
    "activation": ("activation peak", "#8172B2"),
    "non_torch": ("non-torch memory", "#8C8C8C"),
    "kv": ("KV cache", "#55A868"),
}
_NUMBER = re.compile(r"[+-]?(?:\d{1,9}(?:\.\d*)?|\.\d+)")


def _auto_int(values: Mapping[str, str], key: str) -> int | None:
    """``None`` for ``auto`` (the default), else :func:`_int`."""
    return None if values[key].lower() == "auto" else _int(values, key)


def _auto_number(values: Mapping[str, str], key: str) -> float | None:
    text = values[key]
    if text.lower() == "auto":
        return None
    if not _NUMBER.fullmatch(text):
        raise FieldError(key, f"{key}={text!r:.40} must be a number or auto")
    return float(text)


def _command(model: str, engine: str, kw: Mapping[str, Any], max_len: int) -> str:
    """The launch command (the CLI's ``parmem serve --emit``), or why the engine's command
    line cannot say it."""
    try:
        cmd = emit_command(
            engine,
            model,
            tp=kw["tp"],
            pp=kw["pp"],
            max_model_len=max_len,
            utilization=kw["utilization"],
            quantization=kw["quantization"],
            kv_cache_dtype=kw["kv_cache_dtype"],
            max_num_seqs=kw["max_num_seqs"],
            max_num_batched_tokens=kw["max_num_batched_tokens"],
            dtype=kw["dtype"],
        )
    except ValueError as e:
        return f"# no command: {e}"
    check_command(engine, cmd)
    return cmd


def serve_page(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The calculator's serving mode: :func:`parmem.serving.startup` for ``settings`` (the
    module docstring's serving parameters) on the busiest GPU, its parts in GiB, the KV cache
    in tokens, the verdict, the launch command (:func:`parmem.serving.emit_command`) and the
    budget as a stacked bar."""

    def work() -> dict[str, Any]:
        values = _settings(settings, SERVE_FIELDS)
        _one_of(values, "mode", ("serve",))
        spec = _model(values)
        gpu = _one_of(values, "gpu", hardware_presets())
        engine = _one_of(values, "engine", tuple(SERVE_ENGINES))
        kw: dict[str, Any] = {
            "tp": _int(values, "tp"),
            "pp": _int(values, "pp"),
            "quantization": _one_of(values, "quant", tuple(QUANTIZATIONS)),
            "dtype": _one_of(values, "dtype", tuple(SERVE_DTYPES)),
            "kv_cache_dtype": _one_of(values, "kv", tuple(SERVE_KV_DTYPES)),
            "utilization": _auto_number(values, "util"),
            "max_model_len": _auto_int(values, "len"),
            "max_num_batched_tokens": _auto_int(values, "tokens"),
            "max_num_seqs": _auto_int(values, "seqs"),
        }
        try:
            r = startup(spec, gpu, engine=engine, **kw)
        except ValueError as e:  # "version: ...", "utilization: ..." (a library field's name)
            lead = re.match(r"([a-z_]+):", str(e))
            if lead and field_of(str(e), SERVE_FIELDS, names=_SERVE_NAMES) == "_":
                name = _SERVE_NAMES.get(lead.group(1), lead.group(1))
                if name in SERVE_FIELDS:
                    raise FieldError(name, str(e)) from None
            raise
        parts = {"weights": r.weights, "activation": r.activation,
                 "non_torch": r.non_torch, "kv": r.kv}  # fmt: skip
        rows = [
            {"term": k, "label": SERVE_PARTS[k][0], "bytes": v, "gib": f"{v / GIB:.2f}"}
            for k, v in parts.items()
        ]
        query = to_query(values, SERVE_FIELDS)
        return {
            "mode": "serve",
            "model": spec.name,
            "gpu": gpu,
            "engine": engine,
            "gpus": kw["tp"] * kw["pp"],
            "total": r.total,
            "total_gib": f"{r.total / GIB:.2f}",
            "budget": r.budget,
            "budget_gib": f"{r.budget / GIB:.2f}",
            "rows": rows,
            "kv": r.kv,
            "kv_gib": f"{r.kv / GIB:.2f}",
            "kv_token_bytes": r.kv_token_bytes,
            "blocks": r.blocks,
            "tokens": r.tokens,
            "max_model_len": r.max_model_len,
            "longest": r.longest,
            "concurrency": f"{r.concurrency:.2f}",
            "starts": r.starts,
            "verdict": r.verdict,
            "warnings": list(r.warnings),
            "command": _command(values["model"], engine, kw, r.max_model_len),
            "svg": stacked_bars(
                [{"stage": "", **parts}],
                list(parts),
                r.total,
                GIB,
                colors={k: c for k, (_, c) in SERVE_PARTS.items()},
                labels={k: label for k, (label, _) in SERVE_PARTS.items()},
                row_label="per GPU",
                title="startup memory of the busiest GPU",
                marks=[(r.budget, "engine budget")],
            ),
            "query": "mode=serve" + (f"&{query}" if query else ""),
        }

    return _guarded(SERVE_FIELDS, work, _SERVE_NAMES)


# ---------------------------------------------------------------------------------- planner
def _candidate_row(rank: int, c: Any) -> dict[str, Any]:
    par, st = c.parallel, c.setup
    return {
        "rank": rank,
        "label": c.label(),
        "t": par.tp,
        "p": par.pp,
        "d": par.dp,
        "cp": par.cp,
        "e": par.ep,
        "v": par.vpp,
        "zero": par.zero,
        "sp": par.sp,
        "recompute": st.recompute,
        "b": st.micro_batch,
        "m": st.num_microbatches,
        "peak_bytes": c.peak_bytes,
        "peak_gib": f"{c.peak_bytes / GIB:.1f}",
        "step_time_s": c.step_time,
        "step_s": f"{c.step_time:.3f}",
        "tokens_per_s": f"{c.tokens_per_s:,.0f}",
        "mfu": f"{c.mfu:.1%}",
    }


def _recipe(result: Plan, pick: int) -> str:
    """The picked layout's launch recipe, or why the engine's recipe cannot express the model."""
    try:
        return result.emit(None, pick - 1)
    except ValueError as e:
        return f"# no recipe: {e}"


@lru_cache(maxsize=8)
def _plan(
    spec: ModelSpec,
    gpu: str,
    gpn: int,
    nodes: int,
    batch: int,
    seq: int,
    top: int,
    engine: str,
    adapter: str = "none",
) -> Plan:
    """:func:`~parmem.planner.plan`, remembered: picking another row does not search again.
    An adapter is planned on bf16 weights (the Trainer's 16-bit checkpoint)."""
    kw: dict[str, Any] = {} if adapter == "none" else {"adapter": adapter, "precision": "bf16"}
    return plan(spec, Cluster(gpu, gpn, nodes), batch, seq, top=top, engine=engine, **kw)


def plan_layouts(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The planner's ranked layouts for ``settings`` (see the module docstring), with the
    launch recipe of the picked one (``Plan.emit``) and, as ``pareto``, the ranks of the listed
    layouts on the Pareto front of step time against peak memory
    (:func:`~parmem.planner.pareto_front`), which the page's chart draws."""

    def work() -> dict[str, Any]:
        values = _settings(settings, PLAN_FIELDS)
        spec = _model(values)
        _one_of(values, "gpu", hardware_presets())
        engine = _one_of(values, "engine", tuple(engines()))
        emit = _one_of(values, "emit", ("auto", *ENGINES))
        if emit != "auto" and PROFILES[emit] != engine:
            raise FieldError(
                "emit",
                f"emit={emit!r} needs engine={PROFILES[emit]!r}: a recipe is written for the "
                "engine the layouts were planned with",
            )
        top, pick = _int(values, "top"), _int(values, "pick")
        if not 1 <= top <= 50:
            raise FieldError("top", f"top={top} must be between 1 and 50")
        result = _plan(
            spec, values["gpu"], _int(values, "gpn"), _int(values, "nodes"),
            _int(values, "batch"), _int(values, "seq"), top, engine,
            _one_of(values, "adapter", ADAPTERS),
        )  # fmt: skip
        rows = [_candidate_row(i, c) for i, c in enumerate(result.candidates, 1)]
        if rows and not 1 <= pick <= len(rows):
            raise FieldError("pick", f"pick={pick} must be between 1 and {len(rows)}")
        return {
            "model": spec.name,
            "world_size": result.cluster.world_size,
            "usable_gib": f"{result.usable_bytes / GIB:.1f}",
            "candidates": rows,
            "pareto": [
                i + 1
                for i in pareto_front([(c.step_time, c.peak_bytes) for c in result.candidates])
            ],
            "message": result.message or "",
            "rejected": dict(result.rejected),
            "engine": engine,
            "recipe": _recipe(result, pick) if rows and engine in EMITTER_OF else "",
            "band": band(result.candidates[pick - 1].estimate, values["gpu"]) if rows else None,
            # how far an engine profile's step time is from measured runs it was not fitted to
            "accuracy": result.accuracy_text(),
            "query": to_query(values, PLAN_FIELDS),
        }

    return _guarded(PLAN_FIELDS, work)


# ------------------------------------------------------------------------------- the pages
def options() -> dict[str, Any]:
    """What the pages' drop-downs offer and the fields' defaults and meanings."""
    return {
        "models": presets(),
        "gpus": {n: f"{hardware_preset(n).memory_bytes / GIB:.1f}" for n in hardware_presets()},
        "engines": dict(engines()),
        "precisions": list(PRECISIONS),
        "recompute": list(RECOMPUTE),
        "adapters": list(ADAPTERS),
        "lora_targets": list(LORA_TARGETS),
        "base_quants": list(BASE_QUANTS),
        "fp8": list(FP8_RECIPES),
        "optimizers": list(OPTIMIZERS),
        "emit": ["auto", *ENGINES],
        "calc_fields": {k: {"default": d, "doc": doc} for k, (d, doc) in CALC_FIELDS.items()},
        "plan_fields": {k: {"default": d, "doc": doc} for k, (d, doc) in PLAN_FIELDS.items()},
        "serve": {
            "engines": list(SERVE_ENGINES),
            "quantizations": list(QUANTIZATIONS),
            "dtypes": list(SERVE_DTYPES),
            "kv_dtypes": list(SERVE_KV_DTYPES),
        },
        "serve_fields": {k: {"default": d, "doc": doc} for k, (d, doc) in SERVE_FIELDS.items()},
    }


def parse_query(query: str, fields: Mapping[str, Any] = CALC_FIELDS) -> dict[str, str]:
    """A URL query string (``"model=llama-2-7b&t=4"``, a leading ``?`` or ``#`` allowed) as
    settings; names that are not fields are kept, so that :func:`calculate` reports them."""
    del fields  # every name is kept; the argument documents which table applies
    return dict(parse_qsl(query.lstrip("?#"), keep_blank_values=True))


def to_query(values: Mapping[str, str], fields: Mapping[str, tuple[str, str]]) -> str:
    """The settings that differ from their defaults, as a query string in the fields' order
    (``config`` is left out: a pasted file is too long for a URL)."""
    kept = [
        (k, values[k])
        for k in fields
        if k != "config" and values.get(k, fields[k][0]) != fields[k][0]
    ]
    return urlencode(kept)


def calculator_query(settings: Mapping[str, Any]) -> str:
    """The calculator's query string for ``settings`` (URL names of :data:`CALC_FIELDS`; values
    as a form would send them: ints, bools as 0/1): what a chapter's explorer links to.

    Raises:
        ValueError: for a name the calculator does not have.
    """
    unknown = sorted(set(settings) - set(CALC_FIELDS))
    if unknown:
        raise ValueError(
            f"calculator settings {unknown} are not fields; known: {', '.join(CALC_FIELDS)}"
        )
    form = {k: str(int(v)) if isinstance(v, bool) else str(v) for k, v in settings.items()}
    return to_query(form, CALC_FIELDS)


_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "calculate": calculate,
    "plan": plan_layouts,
    "serve": serve_page,
}


def run_json(kind: str, settings_json: str) -> str:
    """The Web Worker's one entry point: ``kind`` (``"calculate"``, ``"plan"``, ``"serve"`` or
    ``"options"``) on the settings as JSON text; the result as JSON text."""
    if kind == "options":
        return json.dumps(options())
    if kind not in _HANDLERS:
        raise ValueError(f"kind={kind!r} must be one of options, {', '.join(_HANDLERS)}")
    settings = json.loads(settings_json or "{}")
    if not isinstance(settings, dict):
        return json.dumps({"ok": False, "errors": {"_": "settings must be a JSON object"}})
    return json.dumps(_HANDLERS[kind](settings))
