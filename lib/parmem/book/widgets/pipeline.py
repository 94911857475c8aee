"""Explorers of pipeline parallelism: first and last stage against p, schedules and bubbles,
stage balance, and the micro-batch size."""

from __future__ import annotations

from ...analyses import balance_layers, microbatch_sweep
from ...config import ParallelConfig
from ...estimate import estimate
from ...model import presets
from ...pipeline import simulate
from ...units import GIB
from ..plots.memory import plot_breakdowns, plot_compare
from ..plots.pipeline import plot_microbatch_sweep, plot_schedules
from .base import STYLE, error_html, explorer, model_setup

__all__ = [
    "explore_pp_memory",
    "explore_schedules",
    "explore_bubble",
    "explore_stage_balance",
    "explore_microbatch",
]

_RECOMPUTE = ["none", "selective", "full"]


def explore_pp_memory(
    model: str = "llama-2-13b",
    seq_len: int = 4096,
    micro_batch: int = 1,
    num_microbatches: int = 16,
    schedule: str = "1f1b",
    recompute: str = "none",
    flash: bool = True,
    gpu_gib: float = 80.0,
    static: bool = True,
):
    """Pipeline size p → memory of the first and of the last stage (one GPU each, no other
    parallelism, no dropout), from :func:`parmem.estimate`: weights fall as 1/p, the first stage's
    activations do not (1F1B).

    Used in chapter 10 (what does pipeline parallelism split, and why does it save memory?)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=STYLE),
        "seq_len": w.SelectionSlider(
            options=[512, 1024, 2048, 4096, 8192, 16384],
            value=seq_len,
            description="s",
            style=STYLE,
        ),
        "micro_batch": w.SelectionSlider(
            options=[1, 2, 4, 8], value=micro_batch, description="b", style=STYLE
        ),
        "num_microbatches": w.SelectionSlider(
            options=[1, 2, 4, 8, 16, 32, 64], value=num_microbatches, description="m", style=STYLE
        ),
        "schedule": w.Dropdown(
            options=["gpipe", "1f1b"], value=schedule, description="schedule", style=STYLE
        ),
        "recompute": w.Dropdown(
            options=_RECOMPUTE, value=recompute, description="recompute", style=STYLE
        ),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=STYLE),
    }

    def render(model, seq_len, micro_batch, num_microbatches, schedule, recompute, flash):
        spec, setup = model_setup(
            model,
            seq_len,
            micro_batch=micro_batch,
            num_microbatches=num_microbatches,
            schedule=schedule,
            recompute=recompute,
            flash_attention=flash,
        )
        ps = [p for p in (1, 2, 4, 8, 16) if p <= spec.layers]
        ests = {f"p={p}": estimate(spec, ParallelConfig(pp=p), setup) for p in ps}
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True, layout="constrained")
        plot_compare(
            ests, ax=axes[0], stage=0, capacity=int(gpu_gib * GIB), title=f"{model}: first stage"
        )
        axes[0].get_legend().remove()
        plot_compare(ests, ax=axes[1], stage=-1, capacity=int(gpu_gib * GIB), title="last stage")
        axes[1].set_ylabel("")
        return fig

    return explorer(controls, render, static=static, columns=4)


def explore_schedules(p: int = 4, m: int = 8, schedules=("gpipe", "1f1b"), static: bool = True):
    """p and m → the timelines of ``schedules`` (:func:`parmem.pipeline.simulate`, t_b = 2 t_f)
    and the micro-batches each stage holds over time
    (:func:`parmem.book.plots.pipeline.plot_schedules`).

    Used in chapter 11 (1F1B versus GPipe: what is the memory difference?)."""
    import ipywidgets as w

    controls = {
        "p": w.IntSlider(value=p, min=1, max=8, description="stages p", style=STYLE),
        "m": w.IntSlider(value=m, min=1, max=24, description="micro-batches m", style=STYLE),
    }

    def render(p, m):
        results = [simulate(s, p, m) for s in schedules]
        titles = [
            f"{r.schedule}: p={p}, m={m}, bubble {r.bubble_fraction:.0%}, stage 0 holds "
            f"{r.peak_in_flight[0]:g} micro-batches"
            for r in results
        ]
        return plot_schedules(results, titles)

    return explorer(controls, render, static=static)


def explore_bubble(
    schedule: str = "interleaved", p: int = 4, m: int = 8, v: int = 2, static: bool = True
):
    """Schedule, p, m and v → the simulated timeline, its bubble fraction and the micro-batches
    (activations) each stage holds over time; the title compares with plain 1F1B.

    Used in chapter 13 (do pipeline bubbles cost memory?)."""
    import ipywidgets as w

    controls = {
        "schedule": w.Dropdown(
            options=["gpipe", "1f1b", "interleaved"],
            value=schedule,
            description="schedule",
            style=STYLE,
        ),
        "p": w.IntSlider(value=p, min=1, max=8, description="stages p", style=STYLE),
        "m": w.IntSlider(value=m, min=1, max=32, description="micro-batches m", style=STYLE),
        "v": w.IntSlider(value=v, min=2, max=4, description="chunks v (interleaved)", style=STYLE),
    }

    def render(schedule, p, m, v):
        try:
            r = simulate(schedule, p, m, v if schedule == "interleaved" else 1)
        except ValueError as e:
            return error_html(e)
        base = simulate("1f1b", p, m)
        title = (
            f"{schedule}: p={p}, m={m}"
            + (f", v={v}" if r.v > 1 else "")
            + f": bubble {r.bubble_fraction:.1%} (1F1B {base.bubble_fraction:.1%}), "
            f"stage 0 holds {r.peak_in_flight[0]:g} micro-batches "
            f"(1F1B {base.peak_in_flight[0]:g})"
        )
        return plot_schedules([r], [title])

    return explorer(controls, render, static=static, columns=4)


def _split_estimates(spec, par, setup, split: str) -> dict:
    """The even split, the balanced split (:func:`parmem.analyses.balance_layers`) and, if
    ``split`` is typed ("6,9,9,8"), that one: label (with the peak) → estimate."""
    even = estimate(spec, par, setup)
    best = balance_layers(spec, par, setup)
    ests = {f"even, peak {even.peak_bytes / GIB:.1f} GiB": even}
    bal = estimate(spec, par, setup, layers_per_stage=best)
    ests[f"balanced, peak {bal.peak_bytes / GIB:.1f} GiB"] = bal
    if split.strip():
        lps = [int(x) for x in split.replace(" ", "").split(",") if x]
        own = estimate(spec, par, setup, layers_per_stage=lps)
        ests[f"yours, peak {own.peak_bytes / GIB:.1f} GiB"] = own
    return ests


def explore_stage_balance(
    model: str = "llama-2-7b",
    pp: int = 4,
    seq_len: int = 4096,
    micro_batch: int = 1,
    num_microbatches: int = 16,
    recompute: str = "none",
    flash: bool = True,
    split: str = "",
    gpu_gib: float = 80.0,
    static: bool = True,
):
    """Model, p and batch → every stage's memory under the even split, the split of
    :func:`parmem.analyses.balance_layers` that minimises the peak stage, and (if typed, e.g.
    ``"6,9,9,8"``) a split of your own.

    Used in chapter 12 (is memory balanced across pipeline stages, and how do you rebalance
    it?)."""
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=STYLE),
        "pp": w.SelectionSlider(
            options=[2, 3, 4, 6, 8, 12, 16], value=pp, description="p", style=STYLE
        ),
        "seq_len": w.SelectionSlider(
            options=[512, 1024, 2048, 4096, 8192, 16384],
            value=seq_len,
            description="s",
            style=STYLE,
        ),
        "micro_batch": w.SelectionSlider(
            options=[1, 2, 4, 8], value=micro_batch, description="b", style=STYLE
        ),
        "num_microbatches": w.SelectionSlider(
            options=[1, 2, 4, 8, 16, 32, 64], value=num_microbatches, description="m", style=STYLE
        ),
        "recompute": w.Dropdown(
            options=_RECOMPUTE, value=recompute, description="recompute", style=STYLE
        ),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=STYLE),
        "split": w.Text(
            value=split,
            description="your split",
            placeholder="e.g. 6,9,9,8",
            style=STYLE,
            continuous_update=False,
        ),
    }

    def render(model, pp, seq_len, micro_batch, num_microbatches, recompute, flash, split):
        spec, setup = model_setup(
            model,
            seq_len,
            micro_batch=micro_batch,
            num_microbatches=num_microbatches,
            recompute=recompute,
            flash_attention=flash,
        )
        try:
            ests = _split_estimates(spec, ParallelConfig(pp=pp), setup, split)
        except ValueError as e:
            return error_html(e)
        return plot_breakdowns(
            ests,
            capacity=int(gpu_gib * GIB),
            title=f"{model}, p={pp}, s={setup.seq_len}, b={micro_batch}, "
            f"m={num_microbatches}, 1F1B",
        )

    return explorer(controls, render, static=static, columns=4)


def explore_microbatch(
    model: str = "llama-2-7b",
    pp: int = 4,
    global_batch: int = 32,
    micro_batch: int = 2,
    seq_len: int = 4096,
    schedule: str = "1f1b",
    recompute: str = "none",
    flash: bool = True,
    static: bool = True,
):
    """A fixed batch of ``global_batch`` sequences per pipeline and step, cut into m = B/b
    micro-batches: memory of the peak stage and the bubble for every b
    (:func:`parmem.analyses.microbatch_sweep`), with the chosen b marked.

    Used in chapter 14 (how does the micro-batch size affect memory?)."""
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=STYLE),
        "pp": w.SelectionSlider(options=[1, 2, 4, 8], value=pp, description="p", style=STYLE),
        "global_batch": w.SelectionSlider(
            options=[4, 8, 16, 32, 64, 128],
            value=global_batch,
            description="B (sequences/step)",
            style=STYLE,
        ),
        "micro_batch": w.SelectionSlider(
            options=[1, 2, 4, 8, 16, 32, 64, 128], value=micro_batch, description="b", style=STYLE
        ),
        "seq_len": w.SelectionSlider(
            options=[512, 1024, 2048, 4096, 8192], value=seq_len, description="s", style=STYLE
        ),
        "schedule": w.Dropdown(
            options=["gpipe", "1f1b"], value=schedule, description="schedule", style=STYLE
        ),
        "recompute": w.Dropdown(
            options=_RECOMPUTE, value=recompute, description="recompute", style=STYLE
        ),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=STYLE),
    }

    def render(model, pp, global_batch, micro_batch, seq_len, schedule, recompute, flash):
        spec, setup = model_setup(
            model, seq_len, schedule=schedule, recompute=recompute, flash_attention=flash
        )
        try:
            rows = microbatch_sweep(spec, ParallelConfig(pp=pp), setup, global_batch=global_batch)
        except ValueError as e:
            return error_html(e)
        pick = [r for r in rows if r["b"] == micro_batch]
        title = f"{model}, p={pp}, B={global_batch}, {schedule}"
        if pick:
            r = pick[0]
            title += (
                f": b={r['b']}, m={r['m']} -> peak {r['peak_total'] / GIB:.1f} GiB, "
                f"bubble {r['bubble_fraction']:.0%}"
            )
        return plot_microbatch_sweep(rows, title=title, highlight=micro_batch if pick else None)

    return explorer(controls, render, static=static, columns=4)
