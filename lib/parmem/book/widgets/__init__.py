"""ipywidgets dashboards for the book's "Explore" sections, grouped by concept.

Every explorer is built with :func:`~parmem.book.widgets.base.explorer`: a set of controls, a
function that draws a figure from their values (the library computes, a figure of
:mod:`parmem.book.plots` draws), and an output area that redraws when a control moves. Executed
headless (CI, the static site) the cell also leaves the figure for the default values as a plain
image, so a reader without a kernel still sees it. Each explorer's docstring names the chapters
that use it; all of them can be imported from here.
"""

from __future__ import annotations

from .allocator import explore_allocator
from .base import explorer
from .comm import explore_collectives
from .data_parallel import explore_data_parallel, explore_zero, explore_zero3_tp
from .engines import explore_engines
from .finetune import explore_finetune
from .layouts import explore_3d, explore_axes, explore_experts
from .memory import explore_estimate, explore_remedies
from .pipeline import (
    explore_bubble,
    explore_microbatch,
    explore_pp_memory,
    explore_schedules,
    explore_stage_balance,
)
from .planner import explore_plan
from .serving import explore_kv_cache, explore_serving
from .tensor import (
    explore_layer_activations,
    explore_tp_shards,
    explore_tp_tradeoff,
    explore_tp_weights,
)

__all__ = [
    "explorer", "explore_estimate", "explore_remedies", "explore_collectives",
    "explore_data_parallel", "explore_zero", "explore_zero3_tp",
    "explore_tp_shards", "explore_tp_weights", "explore_tp_tradeoff", "explore_layer_activations",
    "explore_pp_memory", "explore_schedules", "explore_stage_balance", "explore_bubble",
    "explore_microbatch", "explore_experts", "explore_3d", "explore_axes", "explore_plan",
    "explore_allocator", "explore_serving", "explore_kv_cache", "explore_engines",
    "explore_finetune",
]  # fmt: skip
