"""Explorer of fine-tuning on one GPU: full fine-tuning, LoRA and QLoRA under the Transformers
Trainer with PEFT (the ``hf`` profile), with the optimizer and what happens to the saved
activations (kept, recomputed or offloaded to the host)."""

from __future__ import annotations

from ...config import ADAPTERS, LORA_TARGETS
from ...estimate import estimate
from ...finetune_analyses import ADAPTER_OPTIMIZERS, finetune_setup, paged_state_bytes
from ...hardware import hardware_preset, hardware_presets
from ...model import ModelSpec
from ...units import GIB
from ..plots.memory import plot_compare
from .base import dropdown, error_html, explorer, slider

__all__ = ["explore_finetune"]

#: dense models whose LoRA layer is modelled (:data:`parmem.finetune_acts.LORA_FAMILIES`)
_MODELS = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b",
           "qwen3-32b"]  # fmt: skip
#: what happens to the saved activations: kept on the GPU, recomputed (gradient checkpointing),
#: offloaded to the host (save_on_cpu); the last two exclude each other
_ACTIVATIONS = ["kept", "recomputed", "offloaded"]
_RANKS = [4, 8, 16, 32, 64, 128, 256]
_SEQS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
_BATCHES = [1, 2, 4, 8, 16]


def explore_finetune(
    model: str = "llama-2-7b",
    gpu: str = "a100-40gb",
    adapter: str = "lora",
    rank: int = 16,
    targets: str = "all-linear",
    seq_len: int = 2048,
    micro_batch: int = 1,
    activations: str = "kept",
    optimizer: str = "adamw",
    static: bool = True,
):
    """Model, GPU, adapter (``none`` is full fine-tuning), LoRA rank and targets, s, b, the
    saved activations (``kept``, ``recomputed``: gradient checkpointing, ``offloaded``:
    ``save_on_cpu``; recomputation and offload are one control because parmem models either,
    not both) and the optimizer (:data:`parmem.finetune_analyses.ADAPTER_OPTIMIZERS`; the paged
    ones need an adapter). Draws the peak GPU of the chosen setup (:func:`parmem.estimate`
    with :func:`parmem.finetune_analyses.finetune_setup`, one GPU) beside full fine-tuning
    with AdamW under the same s, b and activations, against the GPU's memory; the title says
    whether it fits, the host bytes of an offload and the paged optimizer states the driver may
    move to the host.

    Used in chapter 23 (fine-tuning on one card)."""
    controls = {
        "model": dropdown("model", model, _MODELS, "model"),
        "gpu": dropdown("gpu", gpu, hardware_presets(), "GPU"),
        "adapter": dropdown("adapter", adapter, list(ADAPTERS), "adapter"),
        "rank": slider("rank", rank, _RANKS, "r"),
        "targets": dropdown("targets", targets, list(LORA_TARGETS), "targets"),
        "seq_len": slider("seq_len", seq_len, _SEQS, "s"),
        "micro_batch": slider("micro_batch", micro_batch, _BATCHES, "b"),
        "activations": dropdown("activations", activations, _ACTIVATIONS, "activations"),
        "optimizer": dropdown("optimizer", optimizer, list(ADAPTER_OPTIMIZERS), "optimizer"),
    }

    def render(model, gpu, adapter, rank, targets, seq_len, micro_batch, activations, optimizer):
        spec = ModelSpec.preset(model)
        kw = {"recompute": "full" if activations == "recomputed" else "none",
              "offload": activations == "offloaded"}  # fmt: skip
        method = "full" if adapter == "none" else adapter
        try:
            setup = finetune_setup(method, seq_len, micro_batch, rank=rank, targets=targets,
                                   optimizer=optimizer, **kw)  # fmt: skip
            est = estimate(spec, None, setup)
            ests = {f"{adapter if adapter != 'none' else 'full'}\n({optimizer})": est}
            if adapter != "none":
                full = estimate(spec, None, finetune_setup("full", seq_len, micro_batch, **kw))
                ests = {"full fine-tuning\n(adamw)": full, **ests}
            paged = paged_state_bytes(spec, setup)
        except ValueError as e:
            return error_html(e, "Not a valid setup")
        cap = hardware_preset(gpu).memory_bytes
        st = est.peak
        verdict = "fits" if st.total <= cap else "does not fit"
        extra = f", {st.host / GIB:.0f} GiB on the host" if st.host else ""
        extra += f", {paged / GIB:.1f} GiB pageable" if paged else ""
        return plot_compare(
            ests,
            capacity=cap,
            title=f"{model}, {gpu}, s={seq_len}, b={micro_batch}: {method} peak "
            f"{st.total / GIB:.1f} GiB, {verdict}{extra}",
        )

    calc = {"model": model, "gpu": gpu, "engine": "hf", "precision": "bf16", "adapter": adapter,
            "r": rank, "targets": targets, "seq": seq_len, "b": micro_batch,
            "recompute": "full" if activations == "recomputed" else "none",
            "offload_act": activations == "offloaded"}  # fmt: skip
    return explorer(controls, render, static=static, columns=3, calculator=calc)
