"""Explorers of pipeline parallelism: first and last stage against p, schedules and bubbles,
stage balance, and the micro-batch size."""

from __future__ import annotations

from ..._check import choice
from ...analyses import balance_layers, microbatch_sweep
from ...config import ParallelConfig
from ...estimate import estimate
from ...model import presets
from ...pipeline import simulate
from ...units import GIB
from ..plots.memory import plot_breakdowns, plot_compare
from ..plots.pipeline import plot_microbatch_sweep, plot_schedules
from .base import (
    DEFAULT_GPU_GIB,
    checkbox,
    dropdown,
    error_html,
    explorer,
    gib,
    int_slider,
    model_setup,
    slider,
    text,
)

__all__ = [
    "explore_pp_memory",
    "explore_schedules",
    "explore_bubble",
    "bubble_microbatches",
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
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Pipeline size p → memory of the first and of the last stage (one GPU each, no other
    parallelism, no dropout), from :func:`parmem.estimate`: weights fall as 1/p, the first stage's
    activations do not (1F1B).

    Used in chapter 10 (what does pipeline parallelism split, and why does it save memory?)."""
    gib("gpu_gib", gpu_gib)
    import matplotlib.pyplot as plt

    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "seq_len": slider("seq_len", seq_len, [512, 1024, 2048, 4096, 8192, 16384], "s"),
        "micro_batch": slider("micro_batch", micro_batch, [1, 2, 4, 8], "b"),
        "num_microbatches": slider(
            "num_microbatches", num_microbatches, [1, 2, 4, 8, 16, 32, 64], "m"
        ),
        "schedule": dropdown("schedule", schedule, ["gpipe", "1f1b"], "schedule"),
        "recompute": dropdown("recompute", recompute, _RECOMPUTE, "recompute"),
        "flash": checkbox("flash", flash, "FlashAttention"),
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


def _two_schedules(schedules: object) -> tuple[str, ...]:
    """``schedules`` checked: a non-empty sequence of ``"gpipe"`` and ``"1f1b"``."""
    if isinstance(schedules, str) or not isinstance(schedules, tuple | list) or not schedules:
        raise ValueError(f"schedules={schedules!r:.60} must be a list of 'gpipe' and '1f1b'")
    return tuple(choice(f"schedules[{i}]", s, ("gpipe", "1f1b")) for i, s in enumerate(schedules))


def explore_schedules(p: int = 4, m: int = 8, schedules=("gpipe", "1f1b"), static: bool = True):
    """p and m → the timelines of ``schedules`` (:func:`parmem.pipeline.simulate`, t_b = 2 t_f)
    and the micro-batches each stage holds over time
    (:func:`parmem.book.plots.pipeline.plot_schedules`).

    Used in chapter 11 (1F1B versus GPipe: what is the memory difference?)."""
    schedules = _two_schedules(schedules)
    controls = {
        "p": int_slider("p", p, 1, 8, "stages p"),
        "m": int_slider("m", m, 1, 24, "micro-batches m"),
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


def bubble_microbatches(schedule: str, p: int, m: int) -> tuple[int, bool]:
    """The micro-batches :func:`explore_bubble` simulates for the slider's ``m``: the interleaved
    schedule needs a multiple of p (Megatron-LM's rule, :func:`parmem.pipeline.simulate`), so
    ``m`` is rounded up to one, and every position of the sliders shows a schedule; whether it
    was rounded."""
    if schedule != "interleaved" or m % p == 0:
        return m, False
    return -(-m // p) * p, True


def explore_bubble(
    schedule: str = "interleaved", p: int = 4, m: int = 8, v: int = 2, static: bool = True
):
    """Schedule, p, m and v → the simulated timeline, its bubble fraction and the micro-batches
    (activations) each stage holds over time; the title compares with plain 1F1B.

    Used in chapter 13 (do pipeline bubbles cost memory?)."""
    controls = {
        "schedule": dropdown(
            "schedule", schedule, ["gpipe", "1f1b", "interleaved", "zbv"], "schedule"
        ),  # fmt: skip
        "p": int_slider("p", p, 1, 8, "stages p"),
        "m": int_slider("m", m, 1, 32, "micro-batches m"),
        "v": int_slider("v", v, 2, 4, "chunks v (interleaved)"),
    }

    def render(schedule, p, m, v):
        m, rounded = bubble_microbatches(schedule, p, m)
        try:
            # ZB-V always runs two chunks per rank (the slider is the interleaved schedule's)
            r = simulate(schedule, p, m, {"interleaved": v, "zbv": 2}.get(schedule, 1))
        except ValueError as e:
            return error_html(e)
        base = simulate("1f1b", p, m)
        title = (
            f"{schedule}: p={p}, m={m}{' (rounded up to a multiple of p)' if rounded else ''}"
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
    gpu_gib: float = DEFAULT_GPU_GIB,
    static: bool = True,
):
    """Model, p and batch → every stage's memory under the even split, the split of
    :func:`parmem.analyses.balance_layers` that minimises the peak stage, and (if typed, e.g.
    ``"6,9,9,8"``) a split of your own.

    Used in chapter 12 (is memory balanced across pipeline stages, and how do you rebalance
    it?)."""
    gib("gpu_gib", gpu_gib)
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "pp": slider("pp", pp, [2, 3, 4, 6, 8, 12, 16], "p"),
        "seq_len": slider("seq_len", seq_len, [512, 1024, 2048, 4096, 8192, 16384], "s"),
        "micro_batch": slider("micro_batch", micro_batch, [1, 2, 4, 8], "b"),
        "num_microbatches": slider(
            "num_microbatches", num_microbatches, [1, 2, 4, 8, 16, 32, 64], "m"
        ),
        "recompute": dropdown("recompute", recompute, _RECOMPUTE, "recompute"),
        "flash": checkbox("flash", flash, "FlashAttention"),
        "split": text(
            "split", split, "your split", placeholder="e.g. 6,9,9,8", continuous_update=False
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
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "pp": slider("pp", pp, [1, 2, 4, 8], "p"),
        "global_batch": slider(
            "global_batch", global_batch, [4, 8, 16, 32, 64, 128], "B (sequences/step)"
        ),
        "micro_batch": slider("micro_batch", micro_batch, [1, 2, 4, 8, 16, 32, 64, 128], "b"),
        "seq_len": slider("seq_len", seq_len, [512, 1024, 2048, 4096, 8192], "s"),
        "schedule": dropdown("schedule", schedule, ["gpipe", "1f1b"], "schedule"),
        "recompute": dropdown("recompute", recompute, _RECOMPUTE, "recompute"),
        "flash": checkbox("flash", flash, "FlashAttention"),
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
