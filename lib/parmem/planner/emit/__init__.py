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

__all__ = ["EMITTERS", "ENGINES", "TARGETS", "Recipe"]

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
