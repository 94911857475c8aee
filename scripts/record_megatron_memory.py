"""Record Megatron-LM's own memory formula for a set of configurations, as a test fixture.

Megatron-LM's ``megatron/training/theoretical_memory_usage.py`` exists only as source (it is
not part of the megatron-core package). This script reads that file from a Megatron-LM checkout
at a named commit (``git show <commit>:<path>``), loads the text with importlib from a temporary
copy (its ``.utils`` import is given a two-function stub), and runs
``compute_weight_and_optimizer_memory``, ``compute_activation_memory`` (the sequence-parallel +
selective-recompute path) and ``compute_activation_memory_without_sp`` for the configurations
below. The padded vocabulary comes from Megatron's own ``vocab_size_with_padding``
(``megatron/core/tokenizers/utils/build_tokenizer.py``), taken from the same checkout.

It writes ``tests/fixtures/megatron_theoretical_memory.json`` with the commit hash; no Megatron
code is copied into this repository. ``tests/test_engines.py`` compares the ``megatron-core``
profile with the fixture.

Usage::

    python scripts/record_megatron_memory.py /path/to/Megatron-LM [--commit d98e8a64dd]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import logging
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "megatron_theoretical_memory.json"
FORMULA = "megatron/training/theoretical_memory_usage.py"
PADDING = "megatron/core/tokenizers/utils/build_tokenizer.py"

# A stub for the two names the formula file imports from megatron/training/utils.py.
UTILS_STUB = '''
def is_hybrid_model(args):
    return False


def print_rank_0(*args, **kwargs):
    pass
'''

# Models (ModelSpec fields; the test rebuilds them). gpt-*: dense, multi-head attention, GeLU,
# LayerNorm, no linear biases (Megatron's weight formula counts none), rotary positions (no
# position table): where the formula applies. The others exercise GQA, SwiGLU and MoE.
MODELS: dict[str, dict[str, Any]] = {
    "gpt-1.3b": dict(vocab_size=50257, hidden=2048, layers=24, heads=16, ffn_kind="gelu",
                     norm="layernorm", tied_embeddings=True, dropout=0.1),
    "gpt-6.7b": dict(vocab_size=50257, hidden=4096, layers=32, heads=32, ffn_kind="gelu",
                     norm="layernorm", tied_embeddings=False, dropout=0.1),
    "gpt-22b": dict(vocab_size=51200, hidden=6144, layers=48, heads=64, ffn_kind="gelu",
                    norm="layernorm", tied_embeddings=True, dropout=0.1),
    "llama-2-7b": dict(vocab_size=32000, hidden=4096, layers=32, heads=32, ffn_hidden=11008,
                       ffn_kind="swiglu", norm="rmsnorm", tied_embeddings=False, dropout=0.0),
    "llama-2-70b": dict(vocab_size=32000, hidden=8192, layers=80, heads=64, kv_heads=8,
                        ffn_hidden=28672, ffn_kind="swiglu", norm="rmsnorm",
                        tied_embeddings=False, dropout=0.0),
    "mixtral-8x7b": dict(vocab_size=32000, hidden=4096, layers=32, heads=32, kv_heads=8,
                         ffn_hidden=14336, ffn_kind="swiglu", norm="rmsnorm",
                         tied_embeddings=False, num_experts=8, top_k=2,
                         expert_ffn_hidden=14336, dropout=0.0),
}

# Layouts: t, p, d, e, v (virtual stages), m micro-batches, s, b, the distributed optimizer,
# sequence parallelism, recompute granularity (None = no recompute).
CASES: list[dict[str, Any]] = [
    dict(model="gpt-1.3b", t=2, p=1, d=4, m=1, dist_opt=True, recompute="selective"),
    dict(model="gpt-6.7b", t=4, p=1, d=2, m=1, dist_opt=False, recompute="selective"),
    dict(model="gpt-22b", t=8, p=1, d=8, m=1, dist_opt=True, recompute="selective"),
    dict(model="gpt-6.7b", t=4, p=4, d=2, m=8, dist_opt=True, recompute="selective"),
    dict(model="gpt-22b", t=8, p=4, d=2, m=2, dist_opt=True, recompute="selective"),
    dict(model="gpt-22b", t=8, p=4, d=2, m=8, v=2, dist_opt=True, recompute="selective"),
    dict(model="gpt-6.7b", t=4, p=1, d=2, m=1, dist_opt=True, recompute="full"),
    dict(model="llama-2-7b", t=4, p=1, d=8, m=1, dist_opt=True, recompute="selective"),
    dict(model="llama-2-70b", t=8, p=4, d=4, m=8, dist_opt=True, recompute="selective"),
    dict(model="mixtral-8x7b", t=2, p=1, d=8, e=8, m=1, dist_opt=True, recompute="selective"),
]


def git_show(checkout: Path, commit: str, path: str) -> str:
    """The text of ``path`` at ``commit`` in the Megatron-LM checkout (work tree or git dir)."""
    return subprocess.run(["git", "-C", str(checkout), "show", f"{commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def load_formula(text: str, tmp: Path):
    """Import the formula file from a temporary package whose ``utils`` is the stub."""
    pkg = tmp / "megatron_formula"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "utils.py").write_text(UTILS_STUB)
    (pkg / "theoretical_memory_usage.py").write_text(text)
    sys.path.insert(0, str(tmp))
    try:
        return importlib.import_module("megatron_formula.theoretical_memory_usage")
    finally:
        sys.path.remove(str(tmp))


def load_padding(text: str):
    """Megatron's ``vocab_size_with_padding``, compiled alone from its module's source."""
    tree = ast.parse(text)
    fn = next(n for n in tree.body
              if isinstance(n, ast.FunctionDef) and n.name == "vocab_size_with_padding")
    namespace: dict[str, Any] = {"math": math, "logger": logging.getLogger("megatron")}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), PADDING, "exec"), namespace)
    return namespace["vocab_size_with_padding"]


def megatron_args(model: dict[str, Any], case: dict[str, Any], pad) -> SimpleNamespace:
    """The ``args`` namespace Megatron-LM's arguments.py would build for ``case``."""
    h, a = model["hidden"], model["heads"]
    t, p, d, e = case["t"], case["p"], case["d"], case.get("e", 1)
    kv = model.get("kv_heads", a)
    experts = model.get("num_experts") or None
    args = SimpleNamespace(
        hidden_size=h, num_attention_heads=a, kv_channels=h // a, num_layers=model["layers"],
        ffn_hidden_size=model.get("ffn_hidden") or 4 * h, swiglu=model["ffn_kind"] == "swiglu",
        group_query_attention=kv != a, num_query_groups=kv,
        normalization="RMSNorm" if model["norm"] == "rmsnorm" else "LayerNorm",
        untie_embeddings_and_output_weights=not model["tied_embeddings"],
        add_bias_linear=False, multi_latent_attention=False, mtp_num_layers=None,
        num_experts=experts, moe_ffn_hidden_size=model.get("expert_ffn_hidden") or None,
        moe_router_topk=model.get("top_k", 2), moe_layer_freq=1,
        moe_shared_expert_intermediate_size=None, moe_latent_size=None,
        tensor_model_parallel_size=t, pipeline_model_parallel_size=p, data_parallel_size=d,
        expert_model_parallel_size=e, expert_tensor_parallel_size=t, world_size=t * p * d,
        virtual_pipeline_model_parallel_size=case.get("v"),
        use_distributed_optimizer=case["dist_opt"], sequence_parallel=t > 1,
        recompute_granularity=case["recompute"], seq_length=case.get("s", 2048),
        micro_batch_size=case.get("b", 1), make_vocab_size_divisible_by=128, rank=1,
    )
    args.padded_vocab_size = pad(model["vocab_size"], args, logging_enabled=False)
    return args


def record(checkout: Path, commit: str) -> dict[str, Any]:
    """Run the formula for every case; return the fixture."""
    full = subprocess.run(["git", "-C", str(checkout), "rev-parse", commit], check=True,
                          capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tmu = load_formula(git_show(checkout, full, FORMULA), Path(tmp))
        pad = load_padding(git_show(checkout, full, PADDING))
        rows = []
        for case in CASES:
            model = MODELS[case["model"]]
            args = megatron_args(model, case, pad)
            weights = tmu.compute_weight_and_optimizer_memory(SimpleNamespace(**vars(args)))
            act_sp = tmu.compute_activation_memory(SimpleNamespace(**vars(args)), case["m"])
            act_nosp = tmu.compute_activation_memory_without_sp(SimpleNamespace(**vars(args)),
                                                                case["m"])
            rows.append({**case, "padded_vocab_size": args.padded_vocab_size,
                         "weight_and_optimizer_bytes": weights,
                         "activation_bytes_sp_selective": act_sp,
                         "activation_bytes_without_sp": act_nosp})
    return {"megatron_lm_commit": full, "formula": FORMULA, "padding": PADDING,
            "generated_by": "scripts/record_megatron_memory.py", "models": MODELS, "cases": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="Megatron-LM checkout (work tree or git dir)")
    ap.add_argument("--commit", default="HEAD", help="commit to read the files at")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    fixture = record(args.checkout, args.commit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.out}: {len(fixture['cases'])} cases at {fixture['megatron_lm_commit']}")


if __name__ == "__main__":
    main()
