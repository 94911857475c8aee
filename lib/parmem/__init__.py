"""parmem: how parallelism strategies change GPU memory.

Exact, sourced estimators of per-GPU memory under data, tensor, sequence, pipeline, expert and
context parallelism and ZeRO; measurements that check them; and real ``torch.distributed`` demos.
Everything here except :mod:`parmem.measure`, :mod:`parmem.reference` and :mod:`parmem.dist`
is plain Python: importing ``parmem`` does not import torch.
"""

from . import activations, comm, pipeline
from .hardware import Hardware, Link, hardware_preset, hardware_presets, link_preset
from .inference import kv_cache_bytes, kv_cache_bytes_per_token, weight_bytes
from .memory import (
    GIB,
    Estimate,
    MemoryBreakdown,
    ModelStateBytes,
    ParallelConfig,
    TrainingSetup,
    estimate,
    model_state_bytes,
)
from .model import ModelSpec, presets
from .planner import Cluster, plan

__version__ = "0.1.0"

__all__ = [
    "GIB", "Estimate", "Hardware", "Link", "comm", "hardware_preset", "hardware_presets",
    "link_preset", "pipeline", "MemoryBreakdown", "ModelSpec", "ModelStateBytes", "ParallelConfig",
    "TrainingSetup", "activations", "estimate", "kv_cache_bytes", "kv_cache_bytes_per_token",
    "model_state_bytes", "presets", "weight_bytes",
]
__all__ += ["Cluster", "plan"]
