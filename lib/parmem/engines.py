"""Engine profiles: what Megatron-Core, DeepSpeed, FSDP2 (torchtitan) and Hugging Face keep on a
GPU, as data read by the one estimator (:func:`parmem.estimate.estimate`).

A profile (``data/engines.toml``, read with the standard library's ``tomllib``) holds

* the model-state categories (weights, gradients, fp32 gradient partitions, master weights) with
  their element size, the ZeRO stage from which each is sharded and how each offloads
  (:class:`StateCategory`); the optimizer's own states come from an :class:`OptimizerPreset`;
* the tensors a layer keeps for backward (:class:`SavedTensor`, evaluated by
  :func:`parmem.activations.layer_terms`), those every stage keeps once for all its layers
  (Transformers' rotary cos and sin) and the first and last pipeline stages' own tensors; the
  element sizes that depend on the device's kernels come from the ``[devices.*]`` tables
  (:func:`devices`, :func:`activation_itemsizes`);
* the buffers the engine adds (:class:`Buffers`), its vocabulary padding, the ZeRO stages,
  recomputation modes and offload modes it supports (:meth:`EngineProfile.check`).

``paper`` is the default: the papers' accounting, to the byte what parmem computed before
profiles existed. Each other profile names the engine version it describes and its TOML comments
cite the engine source of every number; ``tests/test_engines.py`` checks them against DeepSpeed's
estimators and Megatron-LM's ``theoretical_memory_usage.py``, ``tests/test_hf_layers.py`` against
Transformers' decoder layers and ``tests/test_torchtitan_fsdp2.py`` against torchtitan's FSDP2
(:mod:`parmem.distributed.engine_runs` runs both measurements).

This module imports only the validators and the data loader (it sits on the layer of
:mod:`parmem.sharding`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ._check import MAX_SEQ_LEN, choice, integer
from ._data import load_toml

__all__ = [
    "EngineProfile",
    "OptimizerPreset",
    "SavedTensor",
    "StateCategory",
    "Buffers",
    "Defaults",
    "FEATURES",
    "OFFLOADS",
    "GRAD_DTYPES",
    "engine",
    "engines",
    "optimizer_preset",
    "optimizer_presets",
    "itemsizes",
    "activation_itemsizes",
    "devices",
    "offloads_to_host",
]

#: Where optimizer states (and parameters) may live: on the GPU, optimizer states and master
#: weights on the host (ZeRO-Offload, Ren et al. 2021), or parameters too (ZeRO-Infinity).
OFFLOADS: tuple[str, ...] = ("none", "optimizer", "optimizer+params")
#: Gradient element sizes a setup may ask for (``TrainingSetup.grad_dtype``).
GRAD_DTYPES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Model-state dtype symbols (see the header of ``data/engines.toml``).
STATE_DTYPES: tuple[str, ...] = ("param", "grad", "master", "high", "state", "fp32", "none")
#: Saved-tensor dtypes and their fixed sizes (0: ``act`` and ``stat`` come from the caller,
#: ``mask`` and ``lnstat`` from the device table of ``data/engines.toml``).
ACT_DTYPES: dict[str, int] = {
    "act": 0,
    "stat": 0,
    "mask": 0,
    "lnstat": 0,
    "rmsin": 0,
    "rmsmid": 0,
    "res": 0,
    "fp32": 4,
    "i32": 4,
    "i64": 8,
}
#: The element sizes a ``[devices.*]`` table sets: a byte count or ``"act"``.
DEVICE_DTYPES: tuple[str, ...] = ("mask", "lnstat", "rmsin", "rmsmid")
WIDTHS: tuple[str, ...] = (
    "h",
    "q",
    "kv",
    "hd",
    "f",
    "f2",
    "ef",
    "sf",
    "E",
    "scores",
    "heads",
    "kvheads",
    "one",
    "o",
    "qa",
    "kva",
    "kvl",
    "vocab",
    "wlin",
)
#: What a saved tensor's count multiplies: the tokens of the micro-batch on this rank, its
#: positions (one sequence's, shared by the b sequences), or nothing (a fixed size per layer).
PER: tuple[str, ...] = ("token", "position", "layer")
REGIONS: tuple[str, ...] = ("norm", "tp")
CONDITIONS: tuple[str, ...] = (
    "dropout",
    "flash",
    "no_flash",
    "gelu",
    "swiglu",
    "dense",
    "moe",
    "shared",
    "layernorm",
    "rmsnorm",
    "act16",
    "act32",
    "rotary",
    "learned",
    "qk_norm",
    "mla",
    # the code paths of Transformers families (parmem.activations._spec_kinds): the complement
    # of dropout; Gemma's RMSNorm (fp32, 1 + weight) or Llama's (weight * x cast back); the
    # sandwich norms; eager attention's logit soft-capping; Qwen2-MoE's gated shared expert;
    # top-k renormalisation; routing weights cast to the activation dtype or kept fp32; Gemma's
    # embedding scale; the final logit soft-capping; Gemma 3's two rotary tables
    "no_dropout",
    "gemma_norm",
    "cast_norm",
    "sandwich",
    "softcap",
    "shared_gate",
    "topk_norm",
    "router_cast",
    "router_fp32",
    "embed_scale",
    "logit_softcap",
    "two_rope",
    # fp32 weights under bf16 autocast (precision "bf16-autocast")
    "autocast",
)
FIELDS: tuple[str, ...] = ("params", "grads", "optimizer")
STATE_OFFLOAD: tuple[str, ...] = ("never", "optimizer", "params", "drop")
NEVER = 4  # shard_from for a category no ZeRO stage shards
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
ZERO3_PARAMS: tuple[str, ...] = ("layers", "largest-module", "none")
#: What the ZeRO-3 buffers span under pipeline parallelism: one layer at a time (``layers``), or
#: the whole stage, unsharded between micro-batches (``stage``: torchtitan's FSDP2 under PP).
PIPELINE_ZERO3: tuple[str, ...] = ("layers", "stage")
#: When a model-state category exists: throughout the step, or only in the optimizer step.
PHASES: tuple[str, ...] = ("always", "step")
#: The layout features an engine may refuse (``[engines.*.refuses]``): tensor, sequence, context
#: and expert parallelism, virtual pipeline stages, and the GPipe, 1F1B and ZB-V schedules.
FEATURES: tuple[str, ...] = ("tp", "sp", "cp", "ep", "interleaved", "gpipe", "1f1b", "zbv")
#: Overlap features an engine turns on by default (``[engines.*.defaults] overlap``).
OVERLAPS: tuple[str, ...] = ("fsdp-prefetch", "ddp-buckets", "grad-reduce", "param-gather")
#: What an engine's selective recomputation runs again in the backward pass (``selective_flops``
#: of ``[engines.*]``): ``"core"``, the attention core (Korthikanti et al. 2022 §5; Megatron-LM's
#: ``recompute_granularity='selective'``); ``"every-second-matmul"``, torchtitan's op-level SAC
#: (:func:`parmem.flops.selective_flops_per_sequence`).
SELECTIVE_RULES: tuple[str, ...] = ("core", "every-second-matmul")
#: What each tensor-parallel collective of one layer is (the ``what`` of a
#: :class:`parmem.comm.CommOp` of categories "tp" and "sp"): without sequence parallelism an
#: all-reduce after the attention block and the MLP in the forward and in the backward pass; with
#: it, the forward all-gather before and reduce-scatter after them, their backward counterparts
#: (a reduce-scatter of the input's gradient, an all-gather of the output's), and Megatron-LM's
#: re-gather of the saved input for the weight gradient (``sp_regather``:
#: :func:`parmem.comm.collectives`). ``[engines.*.defaults] tp_overlap`` names those an engine
#: runs beside a GEMM.
TP_OPS: tuple[str, ...] = (
    "forward all-reduce (attention + MLP)",
    "backward all-reduce",
    "forward all-gather",
    "forward reduce-scatter",
    "backward reduce-scatter",
    "backward all-gather",
    "backward re-gather of saved input",
)


@dataclass(frozen=True)
class OptimizerPreset:
    """An optimizer's states per parameter: ``states`` elements of the profile's state dtype (or
    of ``state_bytes`` bytes, with one fp32 scale per ``block`` values per state for block-wise
    quantisation), plus a factored second moment (rows + columns per matrix) if ``factored``."""

    name: str
    title: str
    states: int
    state_bytes: int = 0
    block: int = 0
    factored: bool = False


@dataclass(frozen=True)
class StateCategory:
    """One kind of model state: element size ``dtype`` (a symbol of :func:`itemsizes`), the
    :class:`~parmem.estimate.MemoryBreakdown` ``field`` it adds to, the ZeRO stage from which it
    is sharded (``shard_from``; 4 = never), the stages at which the engine keeps it, the
    precisions it applies to (empty = all), how it offloads (``never``, ``optimizer``,
    ``params`` or ``drop``), when it exists (``phase``) and, for a state the engine makes one
    group at a time, the most elements it holds at once (``max_elements``; 0: no bound)."""

    name: str
    dtype: str
    field: str
    shard_from: int
    stages: tuple[int, ...] = (0, 1, 2, 3)
    precisions: tuple[str, ...] = ()
    offload: str = "never"
    note: str = ""
    phase: str = "always"
    max_elements: int = 0


@dataclass(frozen=True)
class SavedTensor:
    """One tensor a layer keeps for backward: ``times`` copies of ``width`` values per token (on
    one rank) of ``dtype``, in ``region`` (``norm``: divided by t under sequence parallelism),
    present when every condition of ``when`` holds, dropped by selective recomputation if
    ``core``; ``scale="k"`` multiplies by top_k × capacity factor (tokens sent to experts);
    ``per="position"`` counts one sequence's positions instead of the micro-batch's tokens,
    ``per="layer"`` a fixed size; ``only_selective``: kept only under the profile's selective
    recomputation (torchtitan's SAC keeps some matmul outputs a plain forward does not)."""

    name: str
    width: str
    dtype: str = "act"
    times: int = 1
    scale: str = ""
    per: str = "token"
    region: str = "tp"
    when: frozenset[str] = frozenset()
    core: bool = False
    note: str = ""
    only_selective: bool = False


@dataclass(frozen=True)
class Buffers:
    """Buffers an engine adds: at ZeRO-3 the gathered parameters (``layers``: the current and
    the prefetched layer; ``largest-module``: DeepSpeed's estimator's 4 × the largest module),
    one layer's unsharded gradient of dtype ``zero3_grads`` (FSDP2's reduce-scatter input), and a
    16-bit gradient-reduction bucket of ``reduce_bucket`` elements at ZeRO >= 1."""

    zero3_params: str = "layers"
    zero3_grads: str = "none"
    reduce_bucket: int = 0
    pipeline_zero3: str = "layers"


@dataclass(frozen=True)
class Defaults:
    """What an engine does unless told otherwise: its attention kernel keeps no s × s scores
    (``flash_attention``), its dropout (``"model"``: as the model's config says, or ``False``),
    the communication overlaps it turns on (:data:`OVERLAPS`), and those the recipe parmem emits
    for it turns on (``recipe_overlap``: Megatron-LM's ``--overlap-grad-reduce`` and
    ``--overlap-param-gather``, DeepSpeed's ``overlap_comm``)."""

    flash_attention: bool
    dropout: bool | str
    overlap: tuple[str, ...] = ()
    recipe_overlap: tuple[str, ...] = ()
    #: the tensor-parallel collectives (:data:`TP_OPS`) the engine issues beside a
    #: GEMM, which the planner's time hides by ``tp_overlap``; the others wait for their GEMM
    tp_overlap: tuple[str, ...] = ()
    #: whether, with sequence parallelism, the backward pass gathers the saved input of a
    #: column-parallel layer again for its weight gradient (the layer keeps its shard only)
    sp_regather: bool = False
    #: the engine's switch that overlaps every tensor-parallel collective with a GEMM
    #: (``TrainingSetup.tp_comm_overlap``), as its recipe writes it; ``""``: none
    tp_comm_overlap: str = ""
    #: whether that switch needs sequence parallelism (Megatron-LM's does)
    tp_comm_overlap_needs_sp: bool = False
    #: whether that switch compiles the model (torchtitan's async TP runs under torch.compile
    #: only), which PyTorch's ZB-V schedule refuses (its split backward is not compiled)
    tp_comm_overlap_compiles: bool = False
    #: how the planner times the profile: ``"papers"``, as the published runs its base
    #: assumptions are fitted to ran (kernels at ``mfu`` with no GPU-generation scale and no
    #: micro-batch cost, one network port a GPU), or ``"engine"``, a current engine version
    #: (:func:`parmem.planner.cost.kernel_scale`, :func:`parmem.planner.cost.shares_ports`)
    timing: str = "engine"

    @property
    def dp_overlap(self) -> bool:
        """Whether a run of this engine, as parmem's recipe launches it, overlaps its
        data-parallel collectives with computation (the planner's time then uses
        ``dp_overlap_on``, :class:`parmem.planner.Assumptions`)."""
        return bool(self.overlap or self.recipe_overlap)


@dataclass(frozen=True)
class EngineProfile:
    """An engine, as data (``data/engines.toml``): see the module docstring."""

    name: str
    title: str
    version: str
    zero_stages: tuple[int, ...]
    pipeline_zero_max: int
    pipeline: bool
    recompute: tuple[str, ...]
    selective: str
    #: what its selective recomputation runs again, as FLOPs (:data:`SELECTIVE_RULES`)
    selective_flops: str
    offload: tuple[str, ...]
    vocab_multiple: int
    activations: str
    optimizer_dtype: str
    grad_buckets: str
    states: tuple[StateCategory, ...]
    buffers: Buffers
    layer: tuple[SavedTensor, ...]
    stage: tuple[SavedTensor, ...]
    first: tuple[SavedTensor, ...]
    last: tuple[SavedTensor, ...]
    defaults: Defaults = Defaults(flash_attention=False, dropout="model")
    refuses: tuple[tuple[str, str], ...] = ()
    plan_pipeline_zero_max: int = 3
    #: the Transformers ``model_type`` values whose decoder layer was measured equal to the
    #: activation table (``families`` of ``[activations.*]``; empty: the table does not depend
    #: on the family)
    families: tuple[str, ...] = ()
    #: of those, the families Transformers runs with eager attention only (no SDPA)
    eager_only: tuple[str, ...] = ()
    #: the families measured under bf16 autocast with fp32 weights (``autocast`` of
    #: ``[activations.*]``); empty: the profile does not model autocast
    autocast: tuple[str, ...] = ()
    #: of those, the families measured without dropout only
    dropout_free: tuple[str, ...] = ()
    #: the structural features of parmem.activations.FEATURES the activation table models
    features: tuple[str, ...] = ()
    #: the optimizer presets the engine can run (``optimizers`` of ``[engines.*]``); empty: all
    optimizers: tuple[str, ...] = ()
    #: bytes per logit on one rank at the loss's peak, forward and backward (``loss_peak`` of
    #: ``[engines.*]``): 4 is the fp32 logits the loss keeps (the ``logits`` term), more is the
    #: loss's transient (an unfused ``F.cross_entropy`` on fp32-cast logits: 12)
    loss_peak: int = 4
    #: ``loss_peak`` under tensor parallelism, t > 1 (``loss_peak_tp`` of ``[engines.*]``): the
    #: vocabulary-parallel loss the engine runs there
    loss_peak_tp: int = 4
    #: sequence chunks the engine's loss runs in for its own models (``loss_chunks`` of
    #: ``[engines.*]``): 0, the loss over the whole micro-batch at once; ``N``: torchtitan's
    #: ``ChunkedLossWrapper``, the LM head and the loss one ``s/N`` chunk at a time
    #: (:func:`parmem.estimate.loss_transient`) for the models of ``native``
    loss_chunks: int = 0
    #: the models the engine builds itself (``[engines.*.native]``: parmem preset -> the
    #: engine's own "module/config"); the others it trains through its Transformers backend
    native: tuple[tuple[str, str], ...] = ()

    def loss_peak_at(self, tp: int) -> int:
        """Bytes per logit at the loss's peak on a rank of a TP group of ``tp``: ``loss_peak``,
        or ``loss_peak_tp`` when ``tp > 1``."""
        return self.loss_peak_tp if tp > 1 else self.loss_peak

    def default_loss_chunks(self, model: str) -> int:
        """The loss chunks of the engine's recipe for preset ``model``: ``loss_chunks`` for a
        model of ``native`` (the engine's own configs chunk the loss), else 0 (the loss over
        the whole micro-batch: every other engine, and torchtitan's Transformers backend)."""
        return self.loss_chunks if model in dict(self.native) else 0

    def loss_chunks_for(self, model: str, requested: int | None) -> int:
        """The chunks a step of preset ``model`` runs its loss in: ``requested``
        (``TrainingSetup.loss_chunks``), or :meth:`default_loss_chunks` when it is ``None``."""
        return self.default_loss_chunks(model) if requested is None else requested

    def check_optimizer(self, optimizer: str) -> None:
        """Raise ``ValueError``, naming the profile, unless it can run ``optimizer``."""
        if self.optimizers and optimizer not in self.optimizers:
            raise ValueError(
                f"{self.who} cannot run optimizer={optimizer!r}: it offers "
                f"{', '.join(self.optimizers)}"
            )

    def refusal(self, feature: str) -> str:
        """Why the engine cannot run ``feature`` (one of :data:`FEATURES`), or ``""``."""
        return dict(self.refuses).get(feature, "")

    @property
    def who(self) -> str:
        """The profile's name and engine version, for messages."""
        return f"engine={self.name!r} ({self.version})"

    def check(self, zero: int, pp: int, recompute: str, offload: str) -> None:
        """Raise ``ValueError``, naming the profile, unless it can express ZeRO stage ``zero``
        with ``pp`` pipeline stages, recomputation ``recompute`` and offload ``offload``."""
        who = f"engine={self.name!r} ({self.version})"
        if zero not in self.zero_stages:
            stages = ", ".join(map(str, self.zero_stages))
            raise ValueError(f"{who} cannot express zero={zero}: it supports ZeRO stage {stages}")
        if pp > 1 and not self.pipeline:
            raise ValueError(f"{who} has no pipeline parallelism: pp={pp} needs another engine")
        if pp > 1 and zero > self.pipeline_zero_max:
            raise ValueError(
                f"{who} cannot combine pp={pp} with zero={zero}: its pipeline supports ZeRO "
                f"stage <= {self.pipeline_zero_max}"
            )
        self.check_recompute(recompute)
        if offload not in self.offload:
            raise ValueError(
                f"{who} cannot offload={offload!r}: it offers {', '.join(self.offload)}"
            )
        if offload == "optimizer" and zero < 1:
            raise ValueError(f"offload={offload!r} needs zero >= 1 (ZeRO-Offload shards first)")
        if offload == "optimizer+params" and zero < 3:
            raise ValueError(f"offload={offload!r} needs zero=3 (parameters are offloaded shards)")

    def check_recompute(self, recompute: str) -> None:
        """Raise ``ValueError``, naming the profile, unless it offers ``recompute``."""
        if recompute not in self.recompute:
            raise ValueError(
                f"engine={self.name!r} ({self.version}) has no recompute={recompute!r}: it "
                f"offers {', '.join(self.recompute)}"
            )

    def categories(self, precision: str, zero: int) -> tuple[StateCategory, ...]:
        """The model-state categories kept at ZeRO stage ``zero`` under ``precision``."""
        return _categories(self.name, precision, zero)


@lru_cache(maxsize=256)
def _categories(name: str, precision: str, zero: int) -> tuple[StateCategory, ...]:
    prof = _profiles()[name]
    return tuple(
        c
        for c in prof.states
        if zero in c.stages and (not c.precisions or precision in c.precisions)
    )


# ---------------------------------------------------------------------------- resolution
def itemsizes(
    prec: dict[str, int], grad_dtype: str | None, master_weights: bool | None
) -> dict[str, int]:
    """Bytes of each model-state dtype symbol for precision row ``prec`` (of
    :data:`parmem.config.PRECISIONS`): ``grad_dtype`` (``"fp32"``, ``"bf16"``, ``"fp16"``)
    replaces the gradient element, ``master_weights`` switches the fp32 master copy on or off."""
    master_on = prec["master"] > 0 if master_weights is None else master_weights
    grad = prec["grad"] if grad_dtype is None else GRAD_DTYPES[grad_dtype]
    return {
        "param": prec["param"],
        "grad": grad,
        "master": 4 if master_on else 0,
        "high": 4 if master_on else prec["param"],
        "state": prec["state"],
        "fp32": 4,
        "none": 0,
    }


@lru_cache(maxsize=64)
def activation_itemsizes(device: str, act: int, stat: int, res: int = 0) -> dict[str, int]:
    """Bytes of each saved-tensor dtype symbol on ``device`` (a name of :func:`devices`) for
    activations of ``act`` bytes and norm statistics of ``stat`` bytes (``stat``: the size the
    caller passes as ``norm_stat_bytes``; 0 leaves the ``stat`` entries out); ``res``: the
    residual stream's element (0: ``act``; 4 for fp32 weights under bf16 autocast). Cached: do
    not modify the result."""
    out = dict(ACT_DTYPES)
    out["act"], out["stat"], out["res"] = act, stat, res or act
    for key, size in _devices()[device].items():
        out[key] = size if isinstance(size, int) else act
    return out


def devices() -> tuple[str, ...]:
    """The device names the ``[devices.*]`` tables of ``data/engines.toml`` describe (``cuda``,
    where the profiles' numbers hold, and ``cpu``, where the tests measure)."""
    return tuple(_devices())


def offloads_to_host(rule: str, offload: str) -> bool:
    """Whether a sharded category with offload ``rule`` leaves the GPU under ``offload``."""
    if rule in ("optimizer", "drop"):
        return offload != "none"
    return rule == "params" and offload == "optimizer+params"


# ---------------------------------------------------------------------------- loading
def _native(model: Any, config: Any, where: str) -> tuple[str, str]:
    """One ``[engines.*.native]`` entry: a parmem preset and the engine's "module/config"."""
    if not isinstance(config, str) or config.count("/") != 1 or "" in config.split("/"):
        raise ValueError(f"data/engines.toml: {where} native {model!r} = {config!r} must be "
                         '"module/config"')  # fmt: skip
    return str(model), config


def _get(table: dict[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise ValueError(f"data/engines.toml: {where} lacks {key!r}")
    return table[key]


def _saved(row: dict[str, Any], where: str) -> SavedTensor:
    name = str(_get(row, "name", where))
    here = f"{where} {name!r}"
    when = frozenset(str(c) for c in row.get("when", ()))
    for c in when:
        choice(f"{here} when", c, CONDITIONS)
    return SavedTensor(
        name=name,
        width=choice(f"{here} width", _get(row, "width", here), WIDTHS),
        dtype=choice(f"{here} dtype", row.get("dtype", "act"), ACT_DTYPES),
        times=integer(f"{here} times", row.get("times", 1)),
        scale=choice(f"{here} scale", row.get("scale", ""), ("", "k")),
        per=choice(f"{here} per", row.get("per", "token"), PER),
        region=choice(f"{here} region", row.get("region", "tp"), REGIONS),
        when=when,
        core=bool(row.get("core", False)),
        note=str(row.get("note", "")),
        only_selective=bool(row.get("only_selective", False)),
    )


def _category(row: dict[str, Any], where: str) -> StateCategory:
    here = f"{where} state {row.get('name')!r}"
    return StateCategory(
        name=str(_get(row, "name", where)),
        dtype=choice(f"{here} dtype", _get(row, "dtype", here), STATE_DTYPES),
        field=choice(f"{here} field", _get(row, "field", here), FIELDS),
        shard_from=integer(f"{here} shard_from", _get(row, "shard_from", here), 1, NEVER),
        stages=tuple(integer(f"{here} stages", z, 0, 3) for z in row.get("stages", (0, 1, 2, 3))),
        precisions=tuple(str(p) for p in row.get("precisions", ())),
        offload=choice(f"{here} offload", row.get("offload", "never"), STATE_OFFLOAD),
        note=str(row.get("note", "")),
        phase=choice(f"{here} phase", row.get("phase", "always"), PHASES),
        max_elements=integer(f"{here} max_elements", row.get("max_elements", 0), 0, 2**62),
    )


def _defaults(t: dict[str, Any], where: str) -> Defaults:
    dropout = t.get("dropout", "model")
    if dropout not in ("model", False):
        raise ValueError(f"data/engines.toml: {where} defaults dropout must be 'model' or false")
    return Defaults(
        flash_attention=bool(_get(t, "flash_attention", f"{where} defaults")),
        dropout=dropout,
        overlap=tuple(choice(f"{where} overlap", o, OVERLAPS) for o in t.get("overlap", ())),
        recipe_overlap=tuple(
            choice(f"{where} recipe_overlap", o, OVERLAPS) for o in t.get("recipe_overlap", ())
        ),
        tp_overlap=tuple(choice(f"{where} tp_overlap", o, TP_OPS) for o in t.get("tp_overlap", ())),
        sp_regather=bool(t.get("sp_regather", False)),
        tp_comm_overlap=str(t.get("tp_comm_overlap", "")),
        tp_comm_overlap_needs_sp=bool(t.get("tp_comm_overlap_needs_sp", False)),
        tp_comm_overlap_compiles=bool(t.get("tp_comm_overlap_compiles", False)),
        timing=choice(f"{where} timing", t.get("timing", "engine"), ("papers", "engine")),
    )


def _profile(name: str, t: dict[str, Any], tables: dict[str, Any]) -> EngineProfile:
    where = f"engines.{name}"
    act_name = str(_get(t, "activations", where))
    acts = tables.get(act_name)
    if acts is None:
        raise ValueError(f"data/engines.toml: {where} names unknown activations {act_name!r}")
    b = _get(t, "buffers", where)
    aw = f"activations.{act_name}"
    return EngineProfile(
        name=name,
        title=str(_get(t, "title", where)),
        version=str(_get(t, "version", where)),
        zero_stages=tuple(integer(f"{where} zero_stages", z, 0, 3) for z in t["zero_stages"]),
        pipeline_zero_max=integer(f"{where} pipeline_zero_max", t["pipeline_zero_max"], 0, 3),
        plan_pipeline_zero_max=integer(
            f"{where} plan_pipeline_zero_max",
            t.get("plan_pipeline_zero_max", t["pipeline_zero_max"]),
            0,
            t["pipeline_zero_max"],
        ),
        pipeline=bool(t["pipeline"]),
        recompute=tuple(choice(f"{where} recompute", r, RECOMPUTE_MODES) for r in t["recompute"]),
        selective=str(t.get("selective", "")),
        selective_flops=choice(
            f"{where} selective_flops", t.get("selective_flops", "core"), SELECTIVE_RULES
        ),
        offload=tuple(choice(f"{where} offload", o, OFFLOADS) for o in t["offload"]),
        vocab_multiple=integer(f"{where} vocab_multiple", t["vocab_multiple"]),
        loss_peak=integer(f"{where} loss_peak", _get(t, "loss_peak", where), 4, 64),
        loss_peak_tp=integer(f"{where} loss_peak_tp", _get(t, "loss_peak_tp", where), 4, 64),
        loss_chunks=integer(f"{where} loss_chunks", _get(t, "loss_chunks", where), 0, MAX_SEQ_LEN),
        native=tuple(_native(k, v, where) for k, v in t.get("native", {}).items()),
        activations=act_name,
        optimizer_dtype=choice(f"{where} optimizer_dtype", t["optimizer_dtype"], STATE_DTYPES),
        grad_buckets=choice(f"{where} grad_buckets", t["grad_buckets"], ("view", "copy")),
        states=tuple(_category(row, where) for row in _get(t, "states", where)),
        buffers=Buffers(
            zero3_params=choice(f"{where} zero3_params", b["zero3_params"], ZERO3_PARAMS),
            zero3_grads=choice(f"{where} zero3_grads", b["zero3_grads"], STATE_DTYPES),
            reduce_bucket=integer(f"{where} reduce_bucket", b["reduce_bucket"], 0),
            pipeline_zero3=choice(
                f"{where} pipeline_zero3", b.get("pipeline_zero3", "layers"), PIPELINE_ZERO3
            ),
        ),
        defaults=_defaults(_get(t, "defaults", where), where),
        refuses=tuple(
            (choice(f"{where} refuses", k, FEATURES), str(v))
            for k, v in _get(t, "refuses", where).items()
        ),
        optimizers=tuple(
            choice(f"{where} optimizers", str(o), _optimizers()) for o in t.get("optimizers", ())
        ),
        layer=tuple(_saved(r, aw) for r in _get(acts, "layer", aw)),
        stage=tuple(_saved(r, aw) for r in acts.get("stage", ())),
        first=tuple(_saved(r, aw) for r in acts.get("first", ())),
        last=tuple(_saved(r, aw) for r in acts.get("last", ())),
        families=tuple(str(f) for f in acts.get("families", ())),
        eager_only=tuple(str(f) for f in acts.get("eager_only", ())),
        autocast=tuple(str(f) for f in acts.get("autocast", ())),
        dropout_free=tuple(str(f) for f in acts.get("dropout_free", ())),
        features=tuple(str(f) for f in acts.get("features", ())),
    )


@lru_cache(maxsize=1)
def _profiles() -> dict[str, EngineProfile]:
    data = load_toml("engines.toml")
    tables = data.get("activations", {})
    return {name: _profile(name, t, tables) for name, t in data["engines"].items()}


@lru_cache(maxsize=1)
def _devices() -> dict[str, dict[str, int | str]]:
    out: dict[str, dict[str, int | str]] = {}
    for name, t in load_toml("engines.toml")["devices"].items():
        where = f"devices.{name}"
        row: dict[str, int | str] = {}
        for key in DEVICE_DTYPES:
            size = _get(t, key, where)
            row[key] = "act" if size == "act" else integer(f"{where} {key}", size, 0, 8)
        out[name] = row
    return out


@lru_cache(maxsize=1)
def _optimizers() -> dict[str, OptimizerPreset]:
    out = {}
    for name, t in load_toml("engines.toml")["optimizers"].items():
        where = f"optimizers.{name}"
        out[name] = OptimizerPreset(
            name=name,
            title=str(_get(t, "title", where)),
            states=integer(f"{where} states", _get(t, "states", where), 0),
            state_bytes=integer(f"{where} state_bytes", t.get("state_bytes", 0), 0),
            block=integer(f"{where} block", t.get("block", 0), 0),
            factored=bool(t.get("factored", False)),
        )
    return out


def engine(name: str) -> EngineProfile:
    """The profile called ``name``; an unknown name raises ``ValueError`` listing the known
    ones."""
    profiles = _profiles()
    return profiles[choice("engine", name, profiles)]


def engines() -> dict[str, str]:
    """The profile names, in file order, with their one-line titles."""
    return {name: p.title for name, p in _profiles().items()}


def optimizer_preset(name: str) -> OptimizerPreset:
    """The optimizer preset called ``name``; an unknown name raises ``ValueError`` listing the
    known ones."""
    presets = _optimizers()
    return presets[choice("optimizer", name, presets)]


def optimizer_presets() -> dict[str, OptimizerPreset]:
    """Every optimizer preset, in file order."""
    return dict(_optimizers())
