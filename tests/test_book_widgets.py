"""parmem.book.widgets: every explorer builds headless (controls and an output area), with the
figures it draws.

Expected values (bar and line counts) follow from the data drawn: one figure per case, a line per
series and one for the capacity.
"""

from __future__ import annotations

import matplotlib
import pytest
from helpers import LLAMA7, gpt_spec

matplotlib.use("Agg")

from parmem import ParallelConfig, TrainingSetup, estimate  # noqa: E402
from parmem.allocator import replay  # noqa: E402
from parmem.analyses import (  # noqa: E402
    axis_by_axis,
    balance_layers,
    layout_sweep,
    microbatch_sweep,
)
from parmem.inference import Request, simulate_kv_cache  # noqa: E402
from parmem.pipeline import simulate  # noqa: E402

GiB = 2**30


@pytest.mark.parametrize("name", ["explore_collectives", "explore_data_parallel", "explore_zero",
                                  "explore_zero3_tp"])
def test_explorers_build_headless(name):
    pytest.importorskip("ipywidgets")
    import matplotlib.pyplot as plt

    from parmem.book import widgets

    box = getattr(widgets, name)(static=False)
    assert box.children  # controls and the output area
    plt.close("all")


def test_part4_plots_and_explorers_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parmem.book import widgets
    from parmem.book.plots import (
        plot_breakdowns,
        plot_in_flight,
        plot_microbatch_sweep,
        plot_schedules,
    )

    spec = gpt_spec(8)
    par, setup = ParallelConfig(pp=2), TrainingSetup(seq_len=64, num_microbatches=4)
    figs = [plot_in_flight(simulate("gpipe", 3, 4)),
            plot_schedules([simulate("1f1b", 3, 6), simulate("interleaved", 3, 6, 2)]),
            plot_breakdowns({"even": estimate(spec, par, setup),
                             "balanced": estimate(spec, par, setup,
                                                  layers_per_stage=balance_layers(spec, par,
                                                                                  setup))}),
            plot_microbatch_sweep(microbatch_sweep(spec, par, setup, global_batch=8),
                                  highlight=2)]
    assert all(f.axes for f in figs)
    for f in figs:
        plt.close(f)
    for make in (widgets.explore_pp_memory, widgets.explore_schedules, widgets.explore_bubble,
                 widgets.explore_stage_balance, widgets.explore_microbatch):
        box = make(static=False)
        assert box.children  # controls and an output area
    plt.close("all")


def test_figures_and_explorers_render():
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipywidgets")
    import matplotlib.pyplot as plt

    from parmem.book.plots import plot_axis_steps, plot_tradeoff
    from parmem.book.widgets import explore_3d, explore_axes, explore_experts

    rows = layout_sweep(LLAMA7, 8, TrainingSetup(seq_len=1024), global_batch=8)
    fig = plot_tradeoff(rows, capacity=80 * GiB, highlight=(rows[0]["d"], rows[0]["t"],
                                                            rows[0]["p"]))
    assert fig.axes and fig.axes[0].get_yscale() == "log"
    fig2 = plot_axis_steps(axis_by_axis(LLAMA7, ParallelConfig(dp=2, zero=1),
                                        TrainingSetup(seq_len=1024)), capacity=80 * GiB)
    assert len(fig2.axes[0].get_xticks()) == 3
    plt.close("all")
    for make in (lambda: explore_experts(static=False), lambda: explore_3d(world=16, tp=4, pp=2,
                                                                           static=False),
                 lambda: explore_axes(static=False)):
        box = make()
        assert box.children  # controls and the output area
    plt.close("all")


def test_part6_figures_and_explorers_render():
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipywidgets")
    import matplotlib.pyplot as plt

    from parmem.book import widgets
    from parmem.book.plots import plot_kv_cache_sim, plot_replay, plot_stacked

    ev = [("alloc", 1, 3 * 2**20), ("alloc", 2, 100), ("free", 1)]
    fig = plot_replay({"default": replay(ev), "expandable": replay(ev, expandable_segments=True)})
    assert len(fig.axes[0].lines) == 3
    sim = simulate_kv_cache([Request(0, 10, 5)], 64)
    assert len(plot_kv_cache_sim({"paged": sim}).axes[0].lines) == 3   # two series + capacity
    fig = plot_stacked({"a": {"x": 2**30, "y": 2**30}, "b": {"x": 2**29}}, capacity=3 * 2**30)
    assert len(fig.axes[0].patches) == 4
    for name in ("explore_allocator", "explore_serving", "explore_remedies"):
        box = getattr(widgets, name)(static=False)
        assert box.children
    plt.close("all")


def test_explore_plan_builds_a_widget():
    pytest.importorskip("ipywidgets")
    import matplotlib

    matplotlib.use("Agg")
    from parmem.book.widgets import explore_plan

    box = explore_plan(model="llama-2-7b", nodes=2, global_batch=64, static=False)
    assert box.children


def test_explore_estimate_links_the_calculator_with_its_own_settings():
    """The explorer's hidden query string, read back by the calculator's own parser, gives the
    estimate of the explorer's default settings (the figure the static site shows)."""
    import html
    import re

    import ipywidgets

    from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
    from parmem.book import web
    from parmem.book.widgets import explore_estimate

    box = explore_estimate(model="llama-2-7b", tp=2, dp=4, zero=1, seq_len=2048, flash=True)
    carried = [c.value for c in box.children if isinstance(c, ipywidgets.HTML)]
    assert len(carried) == 1 and 'class="parmem-calc-query"' in carried[0]
    query = html.unescape(re.search(r">([^<]*)</span>", carried[0]).group(1))
    assert "model=" not in query  # the calculator's default model is left out
    got = web.calculate(web.parse_query(query))
    assert got["ok"], got
    want = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=4, tp=2, zero=1),
                    TrainingSetup(seq_len=2048, num_microbatches=8, flash_attention=True))
    assert got["peak_bytes"] == want.peak_bytes


def test_calculator_query_names_an_unknown_setting():
    from parmem.book import web

    assert web.calculator_query({"t": 4, "sp": True, "d": 1}) == "t=4&sp=1"
    with pytest.raises(ValueError, match="tp"):
        web.calculator_query({"tp": 4})


def test_every_position_of_the_bubble_explorer_shows_a_schedule():
    """Review (issue 33): chapter 13's explorer starts at interleaved, p = 4, m = 8, and the
    first nudge of p or m gave "not a valid layout" (the interleaved schedule needs m to be a
    multiple of p). The slider's m is rounded up to one, so every position simulates."""
    from parmem.book.widgets.pipeline import bubble_microbatches
    from parmem.pipeline import simulate

    assert bubble_microbatches("interleaved", 5, 8) == (10, True)
    assert bubble_microbatches("interleaved", 4, 8) == (8, False)
    assert bubble_microbatches("1f1b", 5, 8) == (8, False)
    for schedule in ("gpipe", "1f1b", "interleaved"):
        for p in range(1, 9):  # the sliders' ranges
            for m in range(1, 33):
                for v in range(2, 5):
                    mm, _ = bubble_microbatches(schedule, p, m)
                    simulate(schedule, p, mm, v if schedule == "interleaved" else 1)
