"""The pinned engines, imported once per test process, for the recipe tests: DeepSpeed 0.19.8
(on its CPU accelerator), torchtitan 0.3.0, Megatron-Core 0.16.1; and the Megatron-LM argument
parser rebuilt from the recorded fixture (scripts/record_megatron_args.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import types
from functools import cache
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


@cache
def recorded(name: str) -> dict:
    """A recorded argument list: ``megatron_lm_args`` or ``megatron_deepspeed_args``."""
    return json.loads((FIXTURES / f"{name}.json").read_text())


_TYPES = {"int": int, "float": float, "str": str}


@cache
def recorded_parser(name: str) -> argparse.ArgumentParser:
    """An argparse parser with every recorded option (flags, whether it takes a value, nargs,
    int/float/str type, choices): unknown flags, missing values and bad choices fail as they
    would in the engine."""
    ap = argparse.ArgumentParser(prog=name, allow_abbrev=False, add_help=False)
    ap.exit_on_error = False
    for o in recorded(name)["options"]:
        kw: dict = {"dest": o["dest"], "default": None}
        if not o["takes_value"]:
            if "False" in o["action"]:
                kw.update(action="store_false", default=True)
            elif "True" in o["action"]:
                kw.update(action="store_true", default=False)
            else:
                kw.update(action="store_const", const=o["const"])
        else:
            if o["nargs"] is not None:
                kw["nargs"] = o["nargs"]
            typ = _TYPES.get(o["type"] or "str")
            if typ is not None:
                kw["type"] = typ
            if o["choices"] is not None and typ is not None:
                kw["choices"] = [typ(c) if not isinstance(c, bool) else c for c in o["choices"]]
        with contextlib.suppress(argparse.ArgumentError):
            ap.add_argument(*o["flags"], **kw)
    return ap


def parse_recorded(name: str, args: list[str]) -> argparse.Namespace:
    """``args`` parsed by :func:`recorded_parser`; an unknown option is an error."""
    ns, unknown = recorded_parser(name).parse_known_args(args)
    assert not unknown, f"options {name} does not know: {unknown}"
    return ns


@cache
def deepspeed_config_class():
    """DeepSpeed's ``DeepSpeedConfig`` (CPU accelerator)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig


@cache
def torchtitan():
    """torchtitan 0.3.0's ``ConfigManager``, ``ParallelDims`` and pipeline-split functions,
    imported under :func:`parmem.distributed.engine_runs.triton_stub` (its model modules import
    ``triton``, absent from the CPU build of PyTorch)."""
    from parmem.distributed.engine_runs import triton_stub

    with triton_stub():
        import torchtitan.experiments.transformers_modeling_backend.config_registry  # noqa: F401
        import torchtitan.models.llama3.config_registry  # noqa: F401
        from torchtitan.config import ConfigManager
        from torchtitan.distributed import pipeline_parallel
        from torchtitan.distributed.parallel_dims import ParallelDims
    return types.SimpleNamespace(
        ConfigManager=ConfigManager,
        ParallelDims=ParallelDims,
        pipeline_metadata=pipeline_parallel._get_pipeline_metadata,
        split=pipeline_parallel._generate_llm_fqn_per_model_part,
        rank_stages=pipeline_parallel._get_pp_rank_to_stage_indices_mapping,
    )


@cache
def megatron_core():
    """Megatron-Core 0.16.1's ``TransformerConfig`` and ``PipelineParallelLayerLayout``."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    return types.SimpleNamespace(
        TransformerConfig=TransformerConfig, Layout=PipelineParallelLayerLayout
    )
