"""Matplotlib figures for the book: draw only.

Every function receives data (an :class:`~parmem.estimate.Estimate`, rows of a study in
:mod:`parmem.analyses`, a :func:`parmem.pipeline.simulate` or :func:`parmem.planner.plan` result)
and returns the matplotlib ``Figure``; none of them estimates anything. A chapter computes, then
draws: ``plot_zero_stages(zero_stages(7_500_000_000, 64))``. Units on axes are GiB (2**30 bytes)
unless the label says otherwise; matplotlib is imported lazily.

The figures are grouped by concept, and all of them can be imported from here:

* :mod:`~parmem.book.plots.base`: colours, the one stacked-bar drawer;
* :mod:`~parmem.book.plots.memory`: one estimate's stages, layouts side by side, byte
  components, activation terms, line charts;
* :mod:`~parmem.book.plots.comm`: collective time against message size;
* :mod:`~parmem.book.plots.data_parallel`: the ZeRO stages, ZeRO-3 against TP;
* :mod:`~parmem.book.plots.tensor`: tensor-parallel shards, components, memory against traffic;
* :mod:`~parmem.book.plots.pipeline`: schedules, micro-batches in flight, micro-batch sweeps;
* :mod:`~parmem.book.plots.layouts`: d·t·p layouts, axes added one at a time;
* :mod:`~parmem.book.plots.planner`: the planner's Pareto front;
* :mod:`~parmem.book.plots.allocator` and :mod:`~parmem.book.plots.serving`: allocator replays,
  KV-cache simulations.
"""

from __future__ import annotations

from .allocator import plot_replay
from .base import COLORS, LABELS
from .comm import plot_collective_times
from .data_parallel import plot_zero3_vs_tp, plot_zero_stages
from .layouts import plot_axis_steps, plot_tradeoff
from .memory import (
    plot_breakdown,
    plot_breakdowns,
    plot_compare,
    plot_lines,
    plot_stacked,
    plot_terms,
    plot_terms_compare,
)
from .pipeline import plot_in_flight, plot_microbatch_sweep, plot_pipeline, plot_schedules
from .planner import plot_pareto
from .serving import plot_kv_cache_sim
from .tensor import COMPONENT_COLORS, plot_tp_components, plot_tp_shards, plot_tp_tradeoff

__all__ = [
    "COLORS", "LABELS", "COMPONENT_COLORS",
    "plot_breakdown", "plot_compare", "plot_breakdowns", "plot_stacked", "plot_terms",
    "plot_terms_compare", "plot_lines",
    "plot_collective_times", "plot_zero_stages", "plot_zero3_vs_tp",
    "plot_tp_shards", "plot_tp_components", "plot_tp_tradeoff",
    "plot_pipeline", "plot_in_flight", "plot_schedules", "plot_microbatch_sweep",
    "plot_tradeoff", "plot_axis_steps", "plot_pareto", "plot_replay", "plot_kv_cache_sim",
]  # fmt: skip
