"""The GPU check: measured step times and peak memory on one GPU beside parmem's, for the record.

    python scripts/gpu_check.py --out DIR            # on a machine with one CUDA GPU
    python scripts/gpu_check.py --out DIR --smoke    # the same code path on CPU, tiny models

Two parts, each written to ``DIR/gpu_check.json`` with the date, the GPU's name and the
versions of torch and Transformers:

* **step time** (issue 29: a measured run no fit has seen): full-size Llama models (the shapes of
  Llama 3.2 1B and 3B, from their Hugging Face config.json, and the ``llama-2-7b`` preset) built
  with Transformers and sharded as the ``fsdp2`` profile describes, on one GPU
  (:func:`parmem.distributed.time_step.timed`: 3 warm-up steps, then 10 timed), beside
  :func:`parmem.planner.evaluate`'s step time and :func:`parmem.estimate`'s peak for the same
  layout (d = 1, ZeRO-3, one micro-batch a step);
* **memory**: ``parmem measure --device cuda --dp 1`` (a shrunk model's real step, every category
  beside the estimate, ``torch.cuda.max_memory_allocated`` too) for the ``hf`` and ``fsdp2``
  profiles on ``llama-3-8b`` and ``mixtral-8x7b``.

Nothing in the test suite depends on a GPU; what this prints is recorded by hand in ``data/``
(``measured_runs.toml`` for the step times) with the date and the GPU.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

from parmem import ModelSpec  # noqa: E402
from parmem._data import load_toml  # noqa: E402
from parmem.distributed import Pool  # noqa: E402
from parmem.measure_model import preset_config  # noqa: E402
from parmem.planner import evaluate  # noqa: E402
from parmem.planner.heldout import run_from_row  # noqa: E402

#: the group of data/measured_runs.toml these runs are recorded in: its `models` are the shapes
#: timed (Llama 3.2 1B and 3B from their config.json), and each run is modelled as that group's
#: row is scored (parmem.planner.heldout.run_from_row), so the printed comparison is the
#: held-out one
GROUP = "parmem_h200_2026_12"

#: a tiny model for --smoke: the code path only
SMOKE = dict(vocab_size=256, hidden=64, layers=2, heads=4, kv_heads=2, ffn_hidden=128,
             ffn_kind="swiglu", norm="rmsnorm", tied_embeddings=True, position="rotary",
             max_positions=8192, dropout=0.0)  # fmt: skip

#: (model, micro-batch, sequence length) timed without recomputation, then with full recomputation
RECOMPUTE_RUNS = [
    ("llama-3.2-1b", 16, 2048),
    ("llama-3.2-1b", 8, 4096),
    ("llama-3.2-3b", 4, 8192),
    ("llama-2-7b", 2, 4096),
    ("llama-2-7b", 4, 4096),
]
RUNS = [
    ("llama-3.2-1b", 4, 2048),
    ("llama-3.2-1b", 1, 8192),
    ("llama-3.2-3b", 2, 2048),
    ("llama-3.2-3b", 1, 8192),
    ("llama-2-7b", 1, 2048),
    ("llama-2-7b", 1, 4096),
]


def group(gpu: str, smoke: bool) -> dict:
    """The measured-runs group of these runs, on ``gpu``; with ``smoke``, its models tiny."""
    g = {**load_toml("measured_runs.toml")[GROUP], "gpu": gpu}
    if smoke:
        names = {name for name, _, _ in RUNS + RECOMPUTE_RUNS}
        g["models"] = {n: {"name": f"{n}-smoke", **SMOKE} for n in names}
    return g


def modelled(g: dict, name: str, b: int, s: int, recompute: str, measured: float) -> tuple:
    """The run as its row of ``g`` is scored: its spec, and the planner's step time and
    estimated peak for its layout."""
    row = {"model": name, "gpus": 1, "t": 1, "p": 1, "d": 1, "zero": 3, "micro_batch": b,
           "batch": b, "seq_len": s, "recompute": recompute, "step_time_s": measured}  # fmt: skip
    run = run_from_row(GROUP, g, row)
    c = evaluate(run.spec, run.cluster, run.parallel, run.setup)
    return run.spec, {"step_s": c.step_time, "peak": c.peak_bytes, "time": c.time.as_dict()}


def step_times(out: dict, smoke: bool, gpu: str, recompute: bool = False) -> None:
    rows = out.setdefault("step_time", [])
    runs = RECOMPUTE_RUNS if recompute else RUNS
    steps, warmup = (6, 2) if recompute else (10, 3)
    mode = "full" if recompute else "none"
    g = group(gpu, smoke)
    with Pool(world_size=1, backend="gloo" if smoke else "nccl", pg_timeout=600) as pool:
        for name, b, s in runs:
            if smoke:
                b, s = 1, 32
            spec, _ = modelled(g, name, b, s, mode, 1.0)
            t0 = time.time()
            (got,) = pool.run("parmem.distributed.time_step:timed", timeout=600,
                              cfg=preset_config(spec), seq_len=s, micro_batch=b, steps=steps,
                              warmup=warmup, recompute=recompute)  # fmt: skip
            median = statistics.median(got["step_s"])
            _, mod = modelled(g, name, b, s, mode, median)
            rows.append({"model": name, "micro_batch": b, "seq_len": s, "recompute": mode,
                         "num_params": got["num_params"], "step_s": got["step_s"],
                         "median_s": median, "modelled_s": mod["step_s"],
                         "modelled_time": mod["time"], "peak": got["peak"],
                         "estimate_peak": mod["peak"], "wall_s": time.time() - t0})  # fmt: skip
            print(f"{name} b{b} s{s} recompute {mode}: measured {median:.4f} s, modelled "
                  f"{mod['step_s']:.4f} s ({mod['step_s'] / median - 1:+.1%}); peak "
                  f"{got['peak']} vs estimate {mod['peak']}", flush=True)  # fmt: skip


def small_saved(out: dict, smoke: bool) -> None:
    """The tensors of at most 64 bytes that one forward of a shrunk two-layer Llama-3-8B and
    Mixtral-8x7B keeps for the backward (dtype, device, shape): what ``parmem measure --device
    cuda`` finds beyond the estimate, named."""
    import torch

    from parmem.distributed.measure_step import build, quiet
    from parmem.measure_model import shrink

    dev = torch.device("cpu" if smoke else "cuda")
    rows = out.setdefault("small_saved", [])
    for model in ("llama-3-8b", "mixtral-8x7b"):
        cfg = shrink(preset_config(ModelSpec.preset(model))).config_at(2)
        seen: list = []

        def pack(t, seen=seen):
            if t.untyped_storage().nbytes() <= 64:
                seen.append([str(t.dtype), t.device.type, list(t.shape),
                             t.untyped_storage().nbytes()])  # fmt: skip
            return t

        with quiet():
            m = build(cfg, "sdpa", "bf16").to(dev)
            ids = torch.randint(0, int(cfg["vocab_size"]), (1, 32)).to(dev)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = m(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
        rows.append({"model": model, "layers": 2, "small": seen})
        print(f"{model}: {len(seen)} small saved tensors: {seen}", flush=True)


def memory(out: dict, smoke: bool) -> None:
    rows = out.setdefault("memory", [])
    for model in ("llama-3-8b", "mixtral-8x7b"):
        for engine in ("hf", "fsdp2"):
            cmd = [sys.executable, "-c", "import sys; from parmem.cli import main; sys.exit(main())",
                   "measure", "--model", model, "--dp", "1", "--engine", engine, "--json",
                   "--zero", "3" if engine == "fsdp2" else "0",
                   *([] if smoke else ["--device", "cuda"])]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            rec = {"model": model, "engine": engine, "rc": p.returncode}
            try:
                rec["report"] = json.loads(p.stdout)
            except json.JSONDecodeError:
                rec["stdout"], rec["stderr"] = p.stdout[-2000:], p.stderr[-2000:]
            rows.append(rec)
            print(f"measure {model} {engine}: rc {p.returncode}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu_out"))
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny models: the code path only")
    ap.add_argument("--only", choices=("time", "recompute", "memory", "saved"), nargs="*",
                    default=None, help="the parts to run (default: all)")
    args = ap.parse_args()
    import torch

    smoke = args.smoke
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run with --smoke on CPU")
    name = "cpu" if smoke else torch.cuda.get_device_name(0)
    gpu = "h200" if "H200" in name else "h100-sxm" if "H100" in name else "h200"
    out = {"date": datetime.date.today().isoformat(), "device": name, "gpu_preset": gpu,
           "versions": {d: importlib.metadata.version(d) for d in ("torch", "transformers")}}  # fmt: skip
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    parts = args.only or ["time", "recompute", "memory", "saved"]
    try:
        if "time" in parts:
            step_times(out, smoke, gpu)
        if "recompute" in parts:
            step_times(out, smoke, gpu, recompute=True)
        if "memory" in parts:
            memory(out, smoke)
        if "saved" in parts:
            small_saved(out, smoke)
    finally:
        (path / "gpu_check.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
