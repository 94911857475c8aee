"""Explorers of the caching allocator: a training step's tensors replayed with and without
expandable segments."""

from __future__ import annotations

from ...allocator import replay
from ...config import ParallelConfig, TrainingSetup
from ...model import ModelSpec, presets
from ...traces import training_step_events
from ..plots.allocator import plot_replay
from .base import checkbox, dropdown, error_html, explorer, float_slider, int_slider, slider

__all__ = ["explore_allocator"]


def explore_allocator(
    model: str = "llama-2-7b",
    tp: int = 2,
    pp: int = 2,
    seq_len: int = 4096,
    jitter: float = 0.25,
    steps: int = 3,
    flash: bool = True,
    static: bool = True,
):
    """Model, layout and sequence-length variation bound to the caching-allocator simulator:
    :func:`parmem.traces.training_step_events` for ``steps`` training steps of lengths
    s·(1 + ``jitter``·u) with u = 0, −1, +1, −½, +½, −¾, +¾, +¼ in turn (rounded to multiples of
    128), replayed with and without expandable segments
    (:func:`parmem.book.plots.allocator.plot_replay`).

    Used in chapter 19 (what else unbalances per-GPU memory?)."""
    controls = {
        "model": dropdown("model", model, presets(), "model"),
        "tp": slider("tp", tp, [1, 2, 4, 8], "t"),
        "pp": slider("pp", pp, [1, 2, 4, 8], "p"),
        "seq_len": slider("seq_len", seq_len, [512, 1024, 2048, 4096, 8192, 16384], "s"),
        "jitter": float_slider("jitter", jitter, 0.0, 0.5, "length spread", step=0.05),
        "steps": int_slider("steps", steps, 1, 8, "steps"),
        # (lengths follow a fixed pattern so that a figure is reproducible)
        "flash": checkbox("flash", flash, "FlashAttention"),
    }

    def render(model, tp, pp, seq_len, jitter, steps, flash):
        spec = ModelSpec.preset(model)
        top = spec.max_positions if spec.position == "learned" else 1 << 30
        pattern = (0, -1, 1, -0.5, 0.5, -0.75, 0.75, 0.25)
        lens = [
            max(128, min(top, round(seq_len * (1 + jitter * u) / 128) * 128))
            for u in pattern[:steps]
        ]
        try:
            par = ParallelConfig(tp=tp, pp=pp, sp=tp > 1)
            ev = training_step_events(
                spec,
                par,
                TrainingSetup(
                    seq_len=lens[0],
                    num_microbatches=max(pp, 1),
                    flash_attention=flash,
                    dropout=False,
                ),
                seq_lens=lens,
            )
        except ValueError as e:
            return error_html(e)
        runs = {"default": replay(ev), "expandable segments": replay(ev, expandable_segments=True)}
        return plot_replay(runs, title=f"{model}, t={tp}, p={pp}, stage 0, s = {lens}")

    return explorer(controls, render, static=static, columns=4)
