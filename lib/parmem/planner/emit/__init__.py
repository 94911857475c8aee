"""A planned layout as a launch recipe for a real engine
(:class:`~parmem.planner.emit.recipe.Recipe`): Megatron-LM (:mod:`parmem.planner.emit.megatron`),
DeepSpeed (:mod:`parmem.planner.emit.deepspeed`) and torchtitan
(:mod:`parmem.planner.emit.torchtitan`), one module per engine, each naming the engine version it
targets (``TARGETS``). :meth:`parmem.planner.result.Plan.recipe` and
:meth:`parmem.planner.result.Plan.emit` call these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from . import deepspeed as _ds
from . import megatron as _mg
from . import torchtitan as _tt
from .recipe import Recipe

if TYPE_CHECKING:
    from ..result import Candidate, Plan

__all__ = ["EMITTERS", "EMITTER_OF", "ENGINES", "PROFILES", "TARGETS", "Recipe"]

#: Engine name -> the function that writes its recipe.
EMITTERS: dict[str, Callable[[Plan, Candidate], Recipe]] = {
    "megatron": _mg.megatron,
    "deepspeed": _ds.deepspeed,
    "torchtitan": _tt.torchtitan,
}

#: Engine name -> the engine version its recipes are written for and checked against.
TARGETS: dict[str, str] = {
    "megatron": _mg.TARGET,
    "deepspeed": _ds.TARGET,
    "torchtitan": _tt.TARGET,
}

#: Engines :meth:`parmem.planner.Plan.emit` writes recipes for.
ENGINES = tuple(EMITTERS)

#: Recipe engine -> the profile of :mod:`parmem.engines` a plan must be sized with to emit it
#: (a recipe is written only for the engine whose memory and time the plan priced).
PROFILES: dict[str, str] = {
    "megatron": "megatron-core",
    "deepspeed": "deepspeed",
    "torchtitan": "fsdp2",
}
#: Profile -> its recipe engine (the inverse of :data:`PROFILES`).
EMITTER_OF: dict[str, str] = {v: k for k, v in PROFILES.items()}
