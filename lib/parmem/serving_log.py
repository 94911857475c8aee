"""Serving startup logs: what vLLM and SGLang print when they start, read from a reader's own
log (:func:`read_log`) or from the public logs recorded in ``data/serving_logs.toml``
(:func:`predict_log`, :func:`log_rows`), each set beside :func:`parmem.serving.startup`'s
prediction for the same model, layout and settings.

vLLM prints (0.19, ``v1/worker/gpu_model_runner.py``, ``gpu_worker.py``,
``v1/core/kv_cache_utils.py``): "Model loading took X GiB", "Available KV cache memory: X GiB",
"GPU KV cache size: N tokens", "Maximum concurrency for L tokens per request: Cx", at DEBUG
"Memory profiling takes … torch peak memory increase: X GiB; non-torch forward increase memory:
Y GiB", and an out-of-memory error's "total capacity of X GiB"; its "non-default args: {…}" line
gives the settings. SGLang prints "Load weight end. … mem usage=X GB" and "KV Cache is
allocated. #tokens: N, K size: a GB, V size: b GB" (its GB are 2**30 bytes).
"""

from __future__ import annotations

import ast
import re

from .model import ModelSpec
from .serving import GIB, Startup, startup

__all__ = ["read_log", "compare_log", "log_models", "log_spec", "predict_log", "log_rows"]

_MIB = 2**20

_PATTERNS = {
    "weights_gib": r"Model loading took ([0-9.]+) ?GiB|Loading model weights took ([0-9.]+) ?GB"
    r"|Load weight end\..*?mem usage=([0-9.]+) GB",
    "kv_cache_gib": r"Available KV cache memory: (-?[0-9.]+) GiB",
    "kv_tokens": r"GPU KV cache size: ([0-9,]+) tokens|#tokens: ([0-9,]+)",
    "activation_peak_gib": r"torch peak memory increase: ([0-9.]+) ?GiB",
    "non_torch_gib": r"non-torch forward increase memory: ([0-9.]+) ?GiB",
    "total_gpu_gib": r"total capacity of ([0-9.]+) GiB|Free memory on device \([0-9.]+/([0-9.]+) GiB\)",
    "cuda_graph_gib": r"Graph capturing finished in [0-9.]+ secs?, took ([0-9.]+) GiB",
    "max_concurrency": r"Maximum concurrency for [0-9,]+ tokens per request: ([0-9.]+)x",
}
#: vLLM's "non-default args" keys that :func:`predict_log` reads
_ARGS = (
    "max_model_len",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "quantization",
    "dtype",
)


def read_log(text: str) -> dict:
    """The numbers and settings a vLLM or SGLang startup log prints (the module docstring lists
    the lines), keyed as ``data/serving_logs.toml`` keys them; a line the log lacks is left out.
    SGLang's KV cache is its K and V sizes added. Raises ValueError when the text holds none of
    the lines."""
    if not isinstance(text, str):
        raise ValueError(f"text={type(text).__name__}: a log must be a str")
    out: dict = {}
    for key, pattern in _PATTERNS.items():
        m = re.search(pattern, text)
        if m:
            value = next(g for g in m.groups() if g is not None).replace(",", "")
            out[key] = int(value) if key == "kv_tokens" else float(value)
    kv = re.search(r"K size: ([0-9.]+) GB, V size: ([0-9.]+) GB", text)
    if kv:
        out["kv_cache_gib"] = round(float(kv[1]) + float(kv[2]), 2)
        out["engine"] = "sglang"
    elif out:
        out["engine"] = "vllm"
    args = re.search(r"non-default args: (\{.*\})", text)
    if args:
        try:
            given = ast.literal_eval(args[1])
        except (ValueError, SyntaxError):
            given = {}
        out.update({k: given[k] for k in _ARGS if k in given})
    version = re.search(r"\(v(\d+\.\d+\.\d+)\)|vLLM API server version (\d+\.\d+\.\d+)", text)
    if version:
        out["engine_version"] = next(g for g in version.groups() if g)
    if not out:
        raise ValueError("text: no vLLM or SGLang startup line found (see parmem.serving_log)")
    return out


#: Hugging Face configurations of the logged checkpoints that are not parmem presets, keyed by
#: repository id (the fields of each config.json that parmem reads; sources in
#: ``data/serving_logs.toml``'s ``[models]`` table).
def log_models() -> dict[str, dict]:
    """The ``[models]`` table of ``data/serving_logs.toml``: repository id → config fields."""
    from ._data import load_toml

    return load_toml("serving_logs.toml").get("models", {})


def log_spec(entry: dict) -> ModelSpec:
    """The :class:`ModelSpec` a recorded log's checkpoint has: its ``[models]`` config, or the
    parmem preset the entry names; a multimodal checkpoint (vLLM loads its vision tower and
    profiles its encoder) is refused by name."""
    models = log_models()
    repo = entry["model"]
    if repo in models:
        cfg = dict(models[repo])
        if cfg.pop("multimodal", False):
            raise ValueError(
                f"model={repo!r}: vLLM loads this checkpoint's vision encoder and profiles it; "
                "parmem models the text decoder only"
            )
        cfg.pop("source", None)
        return ModelSpec.from_hf_config(cfg, name=repo)
    if entry.get("parmem_preset"):
        return ModelSpec.preset(entry["parmem_preset"])
    raise ValueError(f"model={repo!r}: no configuration recorded for this checkpoint")


def predict_log(entry: dict) -> Startup:
    """:func:`startup` for a recorded log's engine, layout and settings (``data/serving_logs.toml``),
    on the device memory the log prints; a log whose settings are incomplete (``unscored``) is
    refused with the reason."""
    if entry.get("unscored"):
        raise ValueError(f"log {entry['id']!r}: not predicted: {entry['unscored']}")
    spec = log_spec(entry)
    quant = {
        "none": "none",
        "fp8": "fp8",
        "mxfp4": "mxfp4",
        "gptq_marlin": "w4a16",
        "compressed-tensors": entry.get("parmem_quantization", "fp8"),
    }
    dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(entry.get("dtype", "bfloat16"), "bf16")
    kv = {"auto": "auto", "fp8": "fp8"}[entry.get("kv_cache_dtype", "auto")]
    util = entry.get("gpu_memory_utilization", entry.get("mem_fraction_static"))
    free = entry.get("avail_mem_before_load_gb")
    if "total_gpu_gib" in entry:
        total = round(entry["total_gpu_gib"] * GIB)
    elif "device_mib" in entry:
        total = entry["device_mib"] * _MIB
    else:
        total = None
    return startup(
        spec,
        entry.get("parmem_gpu", "h100-sxm"),
        engine=entry["engine"],
        tp=entry.get("tp", 1),
        pp=entry.get("pp", 1),
        quantization=quant[entry.get("quantization", "none")],
        dtype=dtype,
        kv_cache_dtype=kv,
        utilization=util,
        max_model_len=entry.get("max_model_len"),
        max_num_batched_tokens=entry.get("max_num_batched_tokens"),
        max_num_seqs=entry.get("max_num_seqs"),
        total_bytes=total,
        free_bytes=None if free is None else round(free * GIB),
        version=entry.get("parmem_engine_version"),
    )


def log_rows() -> list[dict]:
    """Every recorded log of ``data/serving_logs.toml`` beside parmem's prediction: id, engine
    and version, model, GPUs, quantisation, measured and predicted weights and KV cache (GiB,
    one GPU) and tokens, whether it started and whether parmem says it starts; ``note`` names
    why a row has no prediction (a multimodal checkpoint, a missing setting)."""
    from ._data import load_toml

    rows = []
    for e in load_toml("serving_logs.toml")["log"]:
        row = {
            "log": e["id"],
            "engine": f"{e['engine']} {e.get('engine_version', '?')}",
            "model": e["model"].split(" ")[0].split("/")[-1],
            "t×p": f"{e.get('tp', 1)}×{e.get('pp', 1)}",
            "quantization": e.get("quantization", "none"),
            "weights (log)": e.get("weights_gib"),
            "KV (log)": e.get("kv_cache_gib"),
            "tokens (log)": e.get("kv_tokens"),
            "started": e["starts"],
        }
        try:
            got = predict_log(e)
        except ValueError as err:
            row["note"] = str(err).rsplit("not predicted: ", 1)[-1].split(": ", 1)[-1]
        else:
            row.update(
                {
                    "weights": got.weights / GIB,
                    "KV": got.kv / GIB,
                    "tokens": got.tokens,
                    "starts": got.starts,
                }
            )
        rows.append(row)
    return rows


#: how vLLM's "non-default args" name the settings :func:`parmem.serving.startup` takes
_STARTUP_ARGS = {
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "max_model_len": "max_model_len",
    "gpu_memory_utilization": "utilization",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
}
_ROWS = (
    ("weights", "weights_gib", "weights"),
    ("profiled peak", "activation_peak_gib", "activation"),
    ("non-torch", "non_torch_gib", "non_torch"),
    ("KV cache", "kv_cache_gib", "kv"),
)


def compare_log(spec: ModelSpec, text: str, gpu="h100-sxm", **settings) -> tuple[Startup, list]:
    """A reader's own startup log beside parmem's prediction: :func:`read_log` reads the log;
    the settings it prints (vLLM's non-default args, the device's total memory) override
    ``settings`` (the keywords of :func:`parmem.serving.startup`), and each quantity the log
    prints is returned as a row: what, measured, predicted, predicted − measured (GiB; tokens
    for the KV tokens)."""
    seen = read_log(text)
    kw = dict(settings)
    kw.setdefault("engine", seen["engine"])
    for key, name in _STARTUP_ARGS.items():
        if key in seen:
            kw[name] = seen[key]
    if "total_gpu_gib" in seen:
        kw["total_bytes"] = round(seen["total_gpu_gib"] * GIB)
    got = startup(spec, gpu, **kw)
    rows = []
    for what, key, attr in _ROWS:
        if key in seen:
            pred = getattr(got, attr) / GIB
            rows.append(
                {"what": what, "log": seen[key], "parmem": pred, "difference": pred - seen[key]}
            )
    if "kv_tokens" in seen:
        rows.append(
            {
                "what": "KV tokens",
                "log": seen["kv_tokens"],
                "parmem": got.tokens,
                "difference": got.tokens - seen["kv_tokens"],
            }
        )
    return got, rows
