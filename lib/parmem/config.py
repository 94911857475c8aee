"""The vocabulary of a training job: the layout (:class:`ParallelConfig`), the step
(:class:`TrainingSetup`), the names they accept, and the checks that tie them to a model.

Each vocabulary is defined here once and imported everywhere else: number formats
(:data:`PRECISIONS`), optimizers (:data:`OPTIMIZERS`, from the presets of
:mod:`parmem.engines`), engine profiles (:func:`parmem.engines.engines`), activation recomputation
(:data:`RECOMPUTE`, Korthikanti et al. 2022 §5), pipeline schedules (:data:`SCHEDULES`: GPipe,
Huang et al. 2019; 1F1B and interleaved 1F1B, Narayanan et al. 2021 §2.2) and DDP gradient buckets
(:data:`GRAD_BUCKETS`). :func:`even_split` is the one default layer split of a pipeline and
:func:`parmem.layout.check_layout` (a :class:`~parmem.layout.Layout`) the one check that a
layout fits a model and its engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._check import (
    MAX_BATCH,
    MAX_GPUS,
    MAX_LAYERS,
    MAX_SEQ_LEN,
    boolean,
    choice,
    integer,
    number,
)
from .engines import GRAD_DTYPES, OFFLOADS, engine, engines, optimizer_presets

if TYPE_CHECKING:  # pragma: no cover
    from .model import ModelSpec

__all__ = [
    "ParallelConfig",
    "TrainingSetup",
    "PRECISIONS",
    "OPTIMIZERS",
    "ADAM8BIT_BLOCK",
    "RECOMPUTE",
    "SCHEDULES",
    "vpp_schedule",
    "GRAD_BUCKETS",
    "GRAD_DTYPES",
    "OFFLOADS",
    "ADAPTERS",
    "LORA_TARGETS",
    "BASE_QUANTS",
    "FP8_RECIPES",
    "ADAPTER_OPTIMIZERS",
    "even_split",
]

#: bytes per parameter of (16/32-bit) weights, gradients, fp32 master copy, optimizer state
#: element, and activations.
PRECISIONS: dict[str, dict[str, int]] = {
    "fp32": {"param": 4, "grad": 4, "master": 0, "state": 4, "act": 4},
    "bf16-mixed": {"param": 2, "grad": 2, "master": 4, "state": 4, "act": 2},
    "fp16-mixed": {"param": 2, "grad": 2, "master": 4, "state": 4, "act": 2},
    "bf16": {"param": 2, "grad": 2, "master": 0, "state": 2, "act": 2},
    # fp32 weights, gradients and optimizer states, the forward under torch.autocast(bfloat16):
    # the Trainer with bf16=True on a checkpoint loaded (or built) in fp32. The hf profile alone
    # models what such a layer keeps (16-bit matmul inputs, fp32 residual stream and norms,
    # autocast's bf16 weight copies): parmem.activations, precision "bf16-autocast".
    "bf16-autocast": {"param": 4, "grad": 4, "master": 0, "state": 4, "act": 2},
}
#: the precision whose forward runs fp32 weights under bf16 autocast
AUTOCAST = "bf16-autocast"
#: optimizer states per parameter, in units of the precision's state size (adam-8bit: 1 byte;
#: adafactor: 0 moments plus a factored second moment), from ``data/engines.toml``.
OPTIMIZERS: dict[str, int] = {name: p.states for name, p in optimizer_presets().items()}
#: bitsandbytes block-wise quantisation keeps one fp32 absmax per block of 2048 values
#: (Dettmers et al. 2022, §2).
ADAM8BIT_BLOCK = optimizer_presets()["adam-8bit"].block
#: Activation recomputation: none, selective (the attention core, Korthikanti et al. 2022 §5),
#: full (each layer's input only).
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
#: Pipeline schedules: GPipe, 1F1B (PipeDream-Flush), interleaved 1F1B and ZB-V (zero bubble in
#: a V: two chunks per rank, each backward split into its input's and its weights' gradients;
#: Qi et al., "Zero Bubble (Almost) Pipeline Parallelism", ICLR 2024, §6).
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zbv")


def vpp_schedule(vpp: int) -> str:
    """The schedule a layout with ``vpp`` model chunks per stage runs when none is named:
    interleaved 1F1B for ``vpp > 1`` (Megatron-LM's), else 1F1B."""
    return "interleaved" if vpp > 1 else "1f1b"


#: PyTorch DDP buckets: views of the gradients, or a second copy of them.
GRAD_BUCKETS: tuple[str, ...] = ("view", "copy")
#: The fine-tuning method: every weight trained (``"none"``), or frozen weights with PEFT's LoRA
#: adapters (Hu et al. 2022) on a 16-bit base (``"lora"``) or on a bitsandbytes 4-bit base
#: (``"qlora"``, Dettmers et al. 2023). :mod:`parmem.lora`, :mod:`parmem.quant`.
ADAPTERS: tuple[str, ...] = ("none", "lora", "qlora")
#: The linear layers with adapters, PEFT's ``target_modules="all-linear"`` (every linear layer
#: but the output head), the attention projections, or PEFT's classic q and v projections.
LORA_TARGETS: tuple[str, ...] = ("all-linear", "attention", "qv")
#: QLoRA's base-weight format: bitsandbytes' 4-bit NormalFloat or 4-bit float.
BASE_QUANTS: tuple[str, ...] = ("nf4", "fp4")
#: FP8 training of the linear layers: none; torchao's ``Float8Linear`` (measured: it keeps what
#: ``nn.Linear`` keeps); Transformer Engine's ``te.Linear`` (from its source, not measured).
#: :func:`parmem.finetune_acts.fp8_layer_terms`.
FP8_RECIPES: tuple[str, ...] = ("none", "torchao", "te")
#: the engines whose fine-tuning setups parmem models: the Transformers Trainer with PEFT
ADAPTER_ENGINES: tuple[str, ...] = ("hf",)
#: GaLore's AdamW (galore_torch 1.0), modelled for full fine-tuning under the hf profile
GALORE = "galore-adamw"
#: The optimizer presets an adapter setup may use, with the bitsandbytes 0.50.2 optimizer whose
#: states each one allocates (:func:`parmem.quant.bnb_optimizer_state_bytes`): torch's AdamW
#: (the Trainer's default, two moments in the adapters' fp32), AdamW8bit, PagedAdamW (32-bit)
#: and PagedAdamW8bit.
ADAPTER_OPTIMIZERS: dict[str, str] = {
    "adamw": "adamw",
    "adam": "adamw",
    "adam-8bit": "adamw8bit",
    "paged-adamw": "paged_adamw",
    "paged-adam-8bit": "paged_adamw8bit",
}
#: bitsandbytes' paged optimizers (states in CUDA unified memory), modelled for adapters only
PAGED_OPTIMIZERS: tuple[str, ...] = tuple(n for n in ADAPTER_OPTIMIZERS if n.startswith("paged"))


def even_split(layers: int, p: int) -> tuple[int, ...]:
    """The default split of ``layers`` over ``p`` pipeline stages: as even as possible, the
    extra layers on the first stages (Megatron-LM's default for p | L is L/p each)."""
    base, extra = divmod(layers, p)
    return tuple(base + (1 if i < extra else 0) for i in range(p))


@dataclass(frozen=True)
class ParallelConfig:
    """A parallel layout: data (d), tensor (t), pipeline (p), expert (e) and context (cp)
    parallel sizes, sequence parallelism, the ZeRO stage and v virtual stages per pipeline rank.

    The world size is d·t·p·cp; expert parallelism reuses the d·cp data- and context-parallel
    ranks (Megatron-Core), so e must divide d·cp.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    sp: bool = False
    zero: int = 0
    vpp: int = 1

    def __post_init__(self) -> None:
        # stored as checked: an int, not the NumPy integer given (its arithmetic wraps, and it
        # hashes like the equal int, so the caches would hand its results to the int's layout)
        sizes = [(f, 1, MAX_GPUS) for f in ("dp", "tp", "pp", "ep", "cp")]
        for f, lo, hi in (*sizes, ("vpp", 1, MAX_LAYERS), ("zero", 0, 3)):
            object.__setattr__(self, f, integer(f, getattr(self, f), lo, hi))
        boolean("sp", self.sp)
        if self.sp and self.tp == 1:
            raise ValueError(
                "sp=True needs tp >= 2 (sequence parallelism splits over the TP group)"
            )
        if self.dp_group % self.ep:
            raise ValueError(
                f"ep={self.ep} must divide dp*cp={self.dp_group} (experts are "
                "sharded over the data- and context-parallel ranks, as in "
                "Megatron-Core)"
            )
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"vpp={self.vpp} needs pp >= 2")

    @property
    def world_size(self) -> int:
        """d·t·p·cp GPUs."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def dp_group(self) -> int:
        """Ranks that hold the same dense weights and reduce their gradients together (the ZeRO
        sharding group): d·cp, context-parallel ranks holding the same weights (Megatron-Core's
        data-parallel group with context parallelism)."""
        return self.dp * self.cp

    @property
    def expert_dp_group(self) -> int:
        """Ranks that hold the same experts: d·cp/e (Megatron-Core's expert-data-parallel
        group)."""
        return self.dp_group // self.ep

    def check_world_size(self, world_size: int) -> None:
        """Raise ``ValueError`` unless d·t·p·cp equals ``world_size``."""
        world_size = integer("world_size", world_size)
        if self.world_size != world_size:
            raise ValueError(
                f"dp*tp*pp*cp = {self.dp}*{self.tp}*{self.pp}*{self.cp} = "
                f"{self.world_size} must equal world size={world_size}"
            )

    def __str__(self) -> str:
        parts = [f"d={self.dp}", f"t={self.tp}", f"p={self.pp}"]
        if self.ep > 1:
            parts.append(f"e={self.ep}")
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.vpp > 1:
            parts.append(f"v={self.vpp}")
        if self.sp:
            parts.append("SP")
        parts.append(f"ZeRO-{self.zero}")
        return ", ".join(parts)


@dataclass(frozen=True)
class TrainingSetup:
    """What one training step does: sequence length s, micro-batch b, micro-batches m per step,
    number formats, optimizer, activation recomputation and pipeline schedule.

    ``engine`` names the profile of :mod:`parmem.engines` the estimate follows (``"paper"``, the
    default: the papers' accounting; ``"megatron-core"``, ``"deepspeed"``, ``"fsdp2"``, ``"hf"``).
    ``flash_attention=None`` and ``dropout=None`` (the defaults) take the engine's own defaults
    (``[engines.*.defaults]`` of ``data/engines.toml``: Megatron-Core, torchtitan and Transformers
    run a fused attention kernel that keeps no s × s scores, the papers' accounting keeps them;
    dropout follows the model, :attr:`ModelSpec.has_dropout
    <parmem.model.ModelSpec.has_dropout>`, except under torchtitan, whose models have none);
    :class:`parmem.layout.Layout` resolves them.

    ``grad_buckets="copy"`` models PyTorch DDP's default (``gradient_as_bucket_view=False``): the
    all-reduce buckets hold a second copy of every gradient. ``"view"`` is DDP with
    ``gradient_as_bucket_view=True`` and what Megatron-LM, DeepSpeed and FSDP do; ``None`` (the
    default) takes the profile's (``"view"``, or ``"copy"`` for ``hf``).
    ``grad_dtype`` (``"fp32"``, ``"bf16"``, ``"fp16"``) and ``master_weights`` override the
    profile's gradient element and fp32 master copy (``None``: the profile's and precision's).
    ``offload`` moves optimizer states (``"optimizer"``, ZeRO-Offload) or also the parameters
    (``"optimizer+params"``, ZeRO-Infinity) to the host; the estimate reports them as host memory.
    ``cuda_context`` is a fixed per-GPU cost you measured (the CUDA context and kernels take
    several hundred MiB; it depends on driver, libraries and lazy loading), 0 by default.

    Fine-tuning (``engine="hf"``: the Trainer with PEFT 0.21): ``adapter="lora"`` freezes the
    weights and trains LoRA adapters of rank ``lora_rank`` on ``lora_targets`` (with a dropout
    mask when ``lora_dropout``); ``adapter="qlora"`` also stores the frozen linear weights in
    bitsandbytes' 4-bit format ``base_quant``, with ``double_quant`` quantising the block
    scales. The frozen weights keep neither gradients nor optimizer states; the adapters are
    fp32 (PEFT's ``autocast_adapter_dtype=True``). ``offload_activations`` moves every saved
    tensor to the host as it is saved (PyTorch's ``save_on_cpu``). ``fp8`` trains the linear
    layers in FP8 (``engine="hf"``, bf16 weights, no adapter): ``"torchao"`` keeps exactly what
    bf16 keeps, ``"te"`` keeps Transformer Engine's fp8 inputs and per-micro-batch fp8 weights
    instead of the 16-bit inputs; the weights, gradients and optimizer states do not change.
    ``optimizer="galore-adamw"`` (full fine-tuning, ``engine="hf"``) keeps GaLore's states at
    rank ``galore_rank`` (:func:`parmem.quant.galore_state_total`).

    ``tp_comm_overlap=True`` turns on the engine's opt-in overlap of every tensor-parallel
    collective with a GEMM (``[engines.*.defaults] tp_comm_overlap``: Megatron-LM's
    ``--tp-comm-overlap``, Transformer Engine's userbuffers; torchtitan's async TP,
    ``--compile.enable_async_tensor_parallel``); off, the engine hides only the collectives its
    code issues beside a GEMM (``tp_overlap`` there). Memory does not change; the planner's time
    and recipes follow it.

    ``loss_chunks``: the sequence chunks the LM head and the loss run in. ``None`` (the default)
    is what the engine's recipe does for the model
    (:meth:`parmem.engines.EngineProfile.default_loss_chunks`: torchtitan 0.3.0 chunks its own
    Llama 3 models' loss in 8, ``ChunkedLossWrapper``; every other engine and model computes it
    whole); 0 computes the loss over the whole micro-batch at once; ``N`` runs torchtitan's
    ``ChunkedLossWrapper`` with ``N`` chunks (``engine="fsdp2"``, a model torchtitan builds
    itself, ``N`` dividing the rank's ``s/cp``; :func:`parmem.estimate.loss_transient`).
    """

    seq_len: int
    micro_batch: int = 1
    num_microbatches: int = 1
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    recompute: str = "none"
    schedule: str = "1f1b"
    flash_attention: bool | None = None
    dropout: bool | None = None
    grad_buckets: str | None = None
    capacity_factor: float = 1.0
    cuda_context: int = 0
    engine: str = "paper"
    grad_dtype: str | None = None
    master_weights: bool | None = None
    offload: str = "none"
    adapter: str = "none"
    lora_rank: int = 16
    lora_targets: str = "all-linear"
    lora_dropout: bool = False
    base_quant: str = "nf4"
    double_quant: bool = True
    offload_activations: bool = False
    fp8: str = "none"
    galore_rank: int = 128
    tp_comm_overlap: bool = False
    loss_chunks: int | None = None

    def __post_init__(self) -> None:
        # stored as checked: ints and a float, not the NumPy numbers given (ParallelConfig)
        for f, lo, hi in (
            ("seq_len", 1, MAX_SEQ_LEN),
            ("micro_batch", 1, MAX_BATCH),
            ("num_microbatches", 1, MAX_BATCH),
            ("cuda_context", 0, 2**40),  # bytes: at most 1 TiB
        ):
            object.__setattr__(self, f, integer(f, getattr(self, f), lo, hi))
        choice("precision", self.precision, PRECISIONS)
        choice("optimizer", self.optimizer, OPTIMIZERS)
        choice("recompute", self.recompute, RECOMPUTE)
        choice("schedule", self.schedule, SCHEDULES)
        cf = number("capacity_factor", self.capacity_factor, 1.0, 1e6)
        object.__setattr__(self, "capacity_factor", cf)
        choice("engine", self.engine, engines())
        choice("offload", self.offload, OFFLOADS)
        boolean("tp_comm_overlap", self.tp_comm_overlap)
        if self.loss_chunks is not None:
            object.__setattr__(
                self, "loss_chunks", integer("loss_chunks", self.loss_chunks, 0, MAX_SEQ_LEN)
            )
        self._check_finetune()
        self._check_optional()
        self._check_autocast()

    def _check_finetune(self) -> None:
        """The adapter fields: each checked by name; an adapter needs a profile that models it
        (the Transformers Trainer with PEFT) and a 16-bit or autocast step."""
        choice("adapter", self.adapter, ADAPTERS)
        object.__setattr__(self, "lora_rank", integer("lora_rank", self.lora_rank, 1, 65536))
        choice("lora_targets", self.lora_targets, LORA_TARGETS)
        boolean("lora_dropout", self.lora_dropout)
        choice("base_quant", self.base_quant, BASE_QUANTS)
        boolean("double_quant", self.double_quant)
        boolean("offload_activations", self.offload_activations)
        self._check_fp8_galore()
        if self.offload_activations:
            if self.engine not in ADAPTER_ENGINES:
                raise ValueError(
                    "offload_activations=True (save_on_cpu around each decoder layer) is "
                    f"modelled for engine='hf' (measured with Transformers 5.23), not "
                    f"engine={self.engine!r}"
                )
            if self.recompute != "none":
                raise ValueError(
                    "offload_activations=True with recompute="
                    f"{self.recompute!r} is not modelled (offload or recompute, not both)"
                )
        if self.adapter == "none":
            if self.optimizer in PAGED_OPTIMIZERS:
                raise ValueError(
                    f"optimizer={self.optimizer!r} (bitsandbytes' paged optimizer) is modelled "
                    "with adapter='lora' or 'qlora' only"
                )
            return
        if self.engine not in ADAPTER_ENGINES:
            raise ValueError(
                f"adapter={self.adapter!r} is modelled for engine='hf' (Transformers 5.23 with "
                f"PEFT 0.21), not engine={self.engine!r}"
            )
        if self.flash_attention is False:
            raise ValueError(
                f"adapter={self.adapter!r} is modelled with SDPA attention "
                "(flash_attention=True or None, Transformers' default), not flash_attention=False"
            )
        if self.precision not in ("bf16", "fp32"):
            raise ValueError(
                f"adapter={self.adapter!r} needs precision 'bf16' or 'fp32' (the weights as "
                f"loaded; autocast with adapters is not measured), not {self.precision!r}"
            )
        if self.optimizer not in ADAPTER_OPTIMIZERS:
            raise ValueError(
                f"optimizer={self.optimizer!r} with adapter={self.adapter!r} is not modelled: "
                f"use one of {', '.join(ADAPTER_OPTIMIZERS)}"
            )

    def _check_fp8_galore(self) -> None:
        """``fp8`` and GaLore (``optimizer="galore-adamw"``, ``galore_rank``): the Trainer's
        profile, full fine-tuning; FP8 on bf16 weights."""
        choice("fp8", self.fp8, FP8_RECIPES)
        object.__setattr__(self, "galore_rank", integer("galore_rank", self.galore_rank, 1, 65536))
        hf = self.engine in ADAPTER_ENGINES
        if self.optimizer == GALORE and (not hf or self.adapter != "none"):
            raise ValueError(
                f"optimizer={GALORE!r} is modelled for full fine-tuning with engine='hf' "
                f"(galore_torch 1.0), not engine={self.engine!r}, adapter={self.adapter!r}"
            )
        if self.fp8 == "none":
            return
        if not hf or self.precision != "bf16":
            raise ValueError(
                f"fp8={self.fp8!r} is modelled for engine='hf' with precision='bf16' (HF "
                f"layers), not engine={self.engine!r}, precision={self.precision!r}"
            )
        if self.adapter != "none" or self.offload_activations:
            raise ValueError(
                f"fp8={self.fp8!r} with an adapter or offloaded activations is not modelled"
            )

    def _check_autocast(self) -> None:
        """``precision="bf16-autocast"`` needs a profile that measured autocast (``hf``) and is
        not modelled with full recomputation (the checkpointed layer input is the fp32 residual
        stream, not a 16-bit tensor)."""
        if self.precision != AUTOCAST:
            return
        if not engine(self.engine).autocast:
            raise ValueError(
                f"precision={AUTOCAST!r} (fp32 weights under bf16 autocast) is modelled by "
                f"engine='hf' only, not engine={self.engine!r}"
            )
        if self.recompute == "full":
            raise ValueError(
                f"recompute='full' with precision={AUTOCAST!r} is not modelled (the kept layer "
                "inputs are fp32 under autocast; not measured)"
            )

    def _check_optional(self) -> None:
        """The fields where ``None`` means "the model's" or "the profile's"."""
        if self.flash_attention is not None:
            boolean("flash_attention", self.flash_attention)
        if self.dropout is not None:
            boolean("dropout", self.dropout)
        if self.grad_buckets is not None:
            choice("grad_buckets", self.grad_buckets, GRAD_BUCKETS)
        if self.grad_dtype is not None:
            choice("grad_dtype", self.grad_dtype, GRAD_DTYPES)
        if self.master_weights is not None:
            boolean("master_weights", self.master_weights)
            if self.master_weights and PRECISIONS[self.precision]["param"] == 4:
                raise ValueError(
                    f"master_weights=True needs 16-bit weights; precision={self.precision!r} "
                    "keeps fp32 weights (use bf16 or bf16-mixed)"
                )

    def dropout_for(self, spec: ModelSpec) -> bool:
        """Whether the layers keep dropout masks: ``dropout`` if given, else the engine's
        default for the model (the model's own, :attr:`~parmem.model.ModelSpec.has_dropout`, or
        none under an engine whose models have no dropout)."""
        if self.dropout is not None:
            return self.dropout
        return spec.has_dropout and engine(self.engine).defaults.dropout == "model"

    @property
    def flash(self) -> bool:
        """Whether attention keeps no s × s scores: ``flash_attention`` if given, else the
        engine's default."""
        if self.flash_attention is not None:
            return self.flash_attention
        return engine(self.engine).defaults.flash_attention

    @property
    def buckets(self) -> str:
        """The DDP bucket mode: ``grad_buckets``, or the engine profile's default."""
        return self.grad_buckets or engine(self.engine).grad_buckets
