"""Explorer of the engine profiles: one job under Megatron-Core, DeepSpeed, FSDP2 (torchtitan),
the Transformers Trainer and the papers' accounting."""

from __future__ import annotations

from ...config import ParallelConfig, TrainingSetup
from ...engine_analyses import engine_layout
from ...engines import engine, engines
from ...estimate import estimate
from ...model import ModelSpec
from ..plots.memory import plot_compare
from .base import checkbox, dropdown, error_html, explorer, fit_seq_len, gib, slider

__all__ = ["explore_engines"]

_MODELS = ["llama-2-7b", "llama-2-70b", "mixtral-8x7b", "llama-3-70b"]
_DP = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def explore_engines(
    model: str = "llama-2-70b",
    engine_name: str = "deepspeed",
    dp: int = 64,
    seq_len: int = 4096,
    flash: bool = True,
    gpu_gib: float = 80.0,
    static: bool = True,
):
    """Engine × ZeRO stage × d: the peak stage per GPU of ``model`` trained data-parallel over d
    GPUs (b = 1, no recomputation, no pipeline) under the engine profile ``engine_name``, one bar
    per ZeRO stage 0–3 (:func:`parmem.estimate` with ``engine=``; a stage the profile cannot run
    is drawn as the stage :func:`parmem.engine_analyses.engine_layout` gives it, marked ``→``).

    Used in chapter 22 (same model, four engines)."""
    gpu = gib("gpu_gib", gpu_gib)
    controls = {
        "model": dropdown("model", model, _MODELS, "model"),
        "engine_name": dropdown("engine_name", engine_name, list(engines()), "engine"),
        "dp": slider("dp", dp, _DP, "d"),
        "seq_len": slider("seq_len", seq_len, [1024, 2048, 4096, 8192, 16384], "s"),
        "flash": checkbox("flash", flash, "FlashAttention"),
    }

    def render(model, engine_name, dp, seq_len, flash):
        spec = ModelSpec.preset(model)
        setup = TrainingSetup(seq_len=fit_seq_len(spec, seq_len), flash_attention=flash)
        ests = {}
        try:
            for zero in range(4):
                par, run = engine_layout(engine_name, ParallelConfig(dp=dp, zero=zero), setup)
                label = f"ZeRO-{zero}" + (f"\n→ {par.zero}" if par.zero != zero else "")
                ests[label] = estimate(spec, par, run)
        except ValueError as e:
            return error_html(e)
        return plot_compare(
            ests,
            capacity=gpu,
            title=f"{model}, d={dp}, s={setup.seq_len}: {engine(engine_name).version}",
        )

    return explorer(controls, render, static=static)
