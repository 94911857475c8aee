"""parmem: how parallelism strategies change GPU memory.

Exact, sourced estimators of per-GPU memory under data, tensor, sequence, pipeline, expert and
context parallelism and ZeRO; measurements that check them; and real ``torch.distributed`` demos.
Everything here except :mod:`parmem.measure`, :mod:`parmem.reference` and :mod:`parmem.distributed`
is plain Python: importing ``parmem`` does not import torch.

Layers (each module imports only from the layers below it; ``tests/test_layers.py`` checks it):
``units``, ``_check``, ``_data`` → ``sharding``, ``engines``, ``hardware`` → ``model`` →
``config``, ``papers`` → ``states``, ``pipeline``, ``activations`` → ``comm``, ``flops`` →
``estimate``, ``inference`` → ``allocator``, ``traces``, ``analyses``, ``engine_analyses``,
``measure``, ``reference`` → ``bounds`` → ``fit`` → ``planner`` → ``book``, ``distributed`` → ``cli``.
"""

from . import activations, comm, pipeline
from .config import ParallelConfig, TrainingSetup
from .engines import engine, engines
from .estimate import Estimate, MemoryBreakdown, estimate
from .fit import FitAnswer, fewest_gpus, max_micro_batch, max_requests, max_seq_len
from .hardware import Hardware, Link, hardware_preset, hardware_presets, link_preset
from .inference import kv_cache_bytes, kv_cache_bytes_per_token, weight_bytes
from .model import ModelSpec, presets
from .planner import Cluster, plan
from .states import ModelStateBytes, model_state_bytes
from .units import GIB

__version__ = "0.1.0"

__all__ = [
    "GIB",
    "Cluster",
    "Estimate",
    "FitAnswer",
    "Hardware",
    "Link",
    "MemoryBreakdown",
    "ModelSpec",
    "ModelStateBytes",
    "ParallelConfig",
    "TrainingSetup",
    "activations",
    "comm",
    "engine",
    "engines",
    "estimate",
    "fewest_gpus",
    "hardware_preset",
    "hardware_presets",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "link_preset",
    "max_micro_batch",
    "max_requests",
    "max_seq_len",
    "model_state_bytes",
    "pipeline",
    "plan",
    "presets",
    "weight_bytes",
]
