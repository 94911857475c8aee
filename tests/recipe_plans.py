"""The plans whose launch recipes the engines' own code checks (tests/test_recipes.py): the four
cases of issue 15 (each search's best layout) and forced layouts that cover pipeline,
interleaving, context, expert, ZeRO-1/2/3, an uneven split and full recomputation."""

from __future__ import annotations

from functools import cache

from parmem import Cluster, ModelSpec, plan
from parmem.planner import Plan

FAST = {"flash_attention": True, "dropout": False}

#: name -> (model, cluster (gpu, gpus per node, nodes), global batch, seq len, plan() options)
CASES: dict[str, tuple[str, tuple[str, int, int], int, int, dict]] = {
    "gpt3-175b-best": ("gpt3-175b", ("a100-80gb", 8, 96), 1536, 2048, {}),
    "llama3-70b-best": ("llama-3-70b", ("h100-sxm", 8, 128), 1024, 4096, FAST),
    "mixtral-best": ("mixtral-8x7b", ("h100-sxm", 8, 8), 256, 4096, FAST),
    "llama2-7b-best": ("llama-2-7b", ("a100-40gb", 8, 1), 64, 4096, {}),
    "gpt3-pipeline-interleaved": (
        "gpt3-175b", ("a100-80gb", 8, 96), 1536, 2048,
        {"tp": 8, "pp": 12, "vpp": 2, "zero": 1, "recompute": "full"},
    ),
    "mixtral-ep-pp-vp": (
        "mixtral-8x7b", ("h100-sxm", 8, 8), 256, 4096,
        {"tp": 1, "ep": 8, "pp": 4, "vpp": 8, "micro_batch": 1, **FAST},
    ),
    "llama3-8b-context": (
        "llama-3-8b", ("h100-sxm", 8, 4), 32, 32768,
        {"cp": 4, "tp": 8, "recompute": "full", **FAST},
    ),
    "llama2-7b-uneven": (
        "llama-2-7b", ("a100-80gb", 4, 3), 24, 4096, {"pp": 3, "uneven_pp": True, "zero": 0, "tp": 1, "recompute": "full"},
    ),
    "llama2-13b-zero3": ("llama-2-13b", ("h100-sxm", 8, 4), 128, 4096, {"zero": 3, "tp": 1}),
    "llama2-7b-zero1": ("llama-2-7b", ("a100-80gb", 8, 2), 64, 4096, {"zero": 1, "tp": 1}),
    "llama2-7b-zero2": ("llama-2-7b", ("a100-80gb", 8, 2), 64, 4096, {"zero": 2, "tp": 1}),
    "llama2-13b-zero2-tp": (
        "llama-2-13b", ("h100-sxm", 8, 4), 128, 4096, {"zero": 2, "tp": 2, "sp": True},
    ),
    "mixtral-zero0-ep": (
        "mixtral-8x7b", ("h100-sxm", 8, 8), 256, 4096,
        {"zero": 0, "ep": 4, "tp": 2, "sp": False, "recompute": "selective", **FAST},
    ),
    # two chunks per rank: interleaved 1F1B under Megatron-LM, ZB-V under torchtitan
    "llama3-8b-two-chunks": (
        "llama-3-8b", ("h100-sxm", 8, 2), 64, 4096, {"pp": 4, "vpp": 2, "tp": 1, **FAST},
    ),
}  # fmt: skip


@cache
def case_plan(name: str) -> Plan:
    """The plan of case ``name`` (cached: each case is planned once per process)."""
    model, (gpu, gpn, nodes), batch, seq, kw = CASES[name]
    pl = plan(ModelSpec.preset(model), Cluster(gpu, gpn, nodes), batch, seq, top=1, **kw)
    assert pl.best is not None, f"{name}: {pl.message}"
    return pl
