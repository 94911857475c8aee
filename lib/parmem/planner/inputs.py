"""What a plan is asked for: the cluster (:class:`Cluster`) and the modelling assumptions
(:class:`Assumptions`, with :class:`AssumptionOptions` naming them for typed callers), and the
setup fields one request shares (:class:`SetupOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TypedDict

from .._check import integer, number
from ..hardware import Hardware, hardware_preset, hardware_presets

__all__ = ["Cluster", "Assumptions", "AssumptionOptions", "SetupOptions"]


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of one kind.

    ``gpu`` is a :func:`~parmem.hardware.hardware_preset` name (``"a100-40gb"``, ``"a100-80gb"``,
    ``"h100-sxm"``, ``"h200"``) or a :class:`~parmem.hardware.Hardware`; its ``intra_node`` link
    (NVLink) joins GPUs of a node and its ``inter_node`` link (one InfiniBand port per GPU) joins
    nodes.
    """

    gpu: str | Hardware = "h100-sxm"
    gpus_per_node: int = 8
    nodes: int = 1
    hardware: Hardware = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.gpu, Hardware):
            hw = self.gpu
        elif isinstance(self.gpu, str):
            try:
                hw = hardware_preset(self.gpu)
            except ValueError:
                raise ValueError(
                    f"gpu={self.gpu!r} is not a hardware preset; known: "
                    f"{', '.join(hardware_presets())}"
                ) from None
        else:
            raise ValueError(f"gpu={self.gpu!r} must be a preset name or a Hardware")
        integer("gpus_per_node", self.gpus_per_node)
        integer("nodes", self.nodes)
        object.__setattr__(self, "hardware", hw)

    @property
    def world_size(self) -> int:
        """All GPUs, ``gpus_per_node · nodes``."""
        return self.gpus_per_node * self.nodes

    def __str__(self) -> str:
        return f"{self.nodes} x {self.gpus_per_node} {self.hardware.name}"


@dataclass(frozen=True)
class Assumptions:
    """Every assumption of the planner's memory and time model, with its default.

    Pass any of them to :func:`parmem.planner.plan` or :func:`parmem.planner.evaluate` by name
    (``plan(..., mfu=0.5)``).
    """

    mfu: float = 0.55
    """Fraction of the GPU's dense BF16 peak (``Hardware.peak_flops_bf16``) that the training
    kernels sustain while a GPU is busy (executed FLOPs, recomputation included, over busy time).
    An assumption, not a measurement. End-to-end utilisation comes out lower, once bubbles and
    exposed communication are added: Narayanan et al. 2021, Table 1, report 44–52% of peak end
    to end for GPT models of 1.7B–1T parameters on A100s, so the busy fraction must be above
    that."""

    headroom: float = 0.10
    """Fraction of GPU memory kept free for what :func:`~parmem.estimate.estimate` does not count:
    allocator fragmentation (PyTorch's caching allocator), the CUDA context and kernels, NCCL's
    own buffers, temporaries of fused kernels. A layout fits when its peak stage is at most
    ``(1 − headroom) · memory``."""

    tp_overlap: float = 0.0
    """Fraction of TP/SP collective time hidden behind computation. 0: Megatron-LM's default,
    where the all-reduces (all-gathers, reduce-scatters) wait for the GEMMs around them;
    Transformer Engine's user-buffer overlap can hide part of them."""

    dp_overlap: float = 1.0
    """Fraction of the window during which data-parallel collectives are issued that hides them:
    the gradient reduce-scatter (all-reduce) runs during the backward pass of the last
    micro-batch (every micro-batch with ZeRO-2/3), ZeRO's parameter all-gather during the first
    forward of the next step (every forward and backward with ZeRO-3). 1: Megatron-LM's
    ``--overlap-grad-reduce --overlap-param-gather``; 0: nothing overlaps."""

    dp_bucket_params: int = 40_000_000
    """Parameters per gradient bucket. The last bucket's reduction starts after the last
    gradient is computed, so it is never hidden. 40M is Megatron-LM's default bucket size."""

    pp_overlap: float = 0.0
    """Fraction of pipeline point-to-point transfer time hidden behind computation (0: the
    sends and receives of each micro-batch sit between its forward and backward passes)."""

    cp_overlap: float = 1.0
    """Fraction of the attention computation that the context-parallel K/V ring can hide behind
    (ring attention overlaps each block's transfer with the previous block's attention; Liu et
    al. 2023). Exposed CP time is ``max(0, cp_time − cp_overlap · attention_time)``."""

    ep_overlap: float = 0.0
    """Fraction of expert-parallel all-to-all time hidden behind computation (0: dispatch and
    combine wait for the router and the experts)."""

    def __post_init__(self) -> None:
        number("mfu", self.mfu, 0.0, 1.0, lo_open=True)
        number("headroom", self.headroom, 0.0, 1.0, hi_open=True)
        for f in ("tp_overlap", "dp_overlap", "pp_overlap", "cp_overlap", "ep_overlap"):
            number(f, getattr(self, f), 0.0, 1.0)
        integer("dp_bucket_params", self.dp_bucket_params)

    @classmethod
    def from_kwargs(cls, kwargs: AssumptionOptions) -> Assumptions:
        """The assumptions named in ``kwargs`` (the rest at their defaults); an unknown name is a
        ``ValueError`` that lists the known ones."""
        known = {f.name for f in fields(cls)}
        for k in kwargs:
            if k not in known:
                raise ValueError(
                    f"unknown option {k!r}; planner assumptions are: {', '.join(sorted(known))}"
                )
        return cls(**kwargs)

    def usable_bytes(self, hardware: Hardware) -> int:
        """GPU memory a layout may use: ``(1 − headroom)`` of ``hardware.memory_bytes``."""
        return int(hardware.memory_bytes * (1 - self.headroom))


class AssumptionOptions(TypedDict, total=False):
    """The ``**assumptions`` keywords of :func:`parmem.planner.plan` and
    :func:`parmem.planner.evaluate`: any fields of :class:`Assumptions` (its docstrings say what
    each means; keep the two lists equal)."""

    mfu: float
    headroom: float
    tp_overlap: float
    dp_overlap: float
    dp_bucket_params: int
    pp_overlap: float
    cp_overlap: float
    ep_overlap: float


class SetupOptions(TypedDict):
    """The :class:`~parmem.config.TrainingSetup` fields that every layout of one request shares
    (the planner chooses ``micro_batch``, ``num_microbatches``, ``recompute`` and ``schedule``)."""

    precision: str
    optimizer: str
    flash_attention: bool
    dropout: bool | None
    capacity_factor: float
    cuda_context: int


# ---------------------------------------------------------------------------- results
