"""Model states: the bytes of parameters, gradients and optimizer states on one GPU (and, when
they are offloaded, on its host).

Rajbhandari et al. 2020 (ZeRO) §3.1 and §5: mixed-precision Adam keeps 2 + 2 + 12 bytes per
parameter (16-bit weights and gradients; fp32 master weights, momentum and variance); ZeRO stage
1, 2 and 3 shard the optimizer states, then the gradients, then the parameters over the
data-parallel group. That is the ``paper`` engine profile; the other profiles of
:mod:`parmem.engines` (Megatron-Core, DeepSpeed, FSDP2, Hugging Face) list their own categories
(fp32 main gradients, fp32 gradient partitions, fp32 sharded weights …), read here by one
function. Optimizer states per parameter come from the optimizer presets (Adam and AdamW: two
moments; Lion, Chen et al. 2023: one; 8-bit Adam, Dettmers et al. 2022: two 1-byte moments and an
fp32 absmax per 2048 values; Adafactor, Shazeer & Stern 2018: a factored second moment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ._check import boolean, cdiv, choice, integer, normalised_cache
from .config import OPTIMIZERS, PRECISIONS
from .engines import (
    GRAD_DTYPES,
    OFFLOADS,
    OptimizerPreset,
    engines,
    itemsizes,
    offloads_to_host,
    optimizer_preset,
)
from .engines import engine as _engine

if TYPE_CHECKING:  # pragma: no cover
    from .model import ModelSpec

__all__ = [
    "reduced_grad_itemsize",
    "ModelStateBytes",
    "StateRule",
    "model_state_bytes",
    "optimizer_state_bytes",
    "state_rule",
    "apply_rule",
    "step_only_bytes",
    "total_model_state_floor",
]

_FIELD = {"params": 0, "grads": 1, "optimizer": 2}
_GPU, _HOST, _DROP, _STEP = 0, 1, 2, 3


@dataclass(frozen=True)
class ModelStateBytes:
    """Per-GPU bytes of parameters, gradients and optimizer states (``total``, on the GPU), the
    bytes this GPU's process keeps on its host (``host``: offloaded states), and the bytes that
    exist only during the optimizer step (``step``: DeepSpeed's fp32 gradient partition at ZeRO-1
    and 2; counted in ``total``, which is what the states need at their largest)."""

    params: int
    grads: int
    optimizer: int
    host: int = 0
    step: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.step


class StateRule(NamedTuple):
    """Where each model-state category goes for one (engine, precision, optimizer, ZeRO stage,
    offload): ``cats`` holds (field index, bytes per element, sharded, place, the most elements
    held at once or 0) per category;
    the optimizer's states are sharded when ``opt_sharded``, in elements of ``opt_itemsize``
    bytes, on the host when ``opt_host``."""

    cats: tuple[tuple[int, int, bool, int, int], ...]
    preset: OptimizerPreset
    opt_itemsize: int
    opt_sharded: bool
    opt_host: bool


@normalised_cache(maxsize=1024)
def state_rule(
    engine_name: str,
    precision: str,
    optimizer: str,
    zero: int,
    offload: str = "none",
    grad_dtype: str | None = None,
    master_weights: bool | None = None,
) -> StateRule:
    """The :class:`StateRule` of a profile (cached; arguments already validated)."""
    prof = _engine(engine_name)
    sizes = itemsizes(PRECISIONS[precision], grad_dtype, master_weights)
    cats = []
    for c in prof.categories(precision, zero):
        size = sizes[c.dtype]
        if c.name == "grads" and grad_dtype is not None:
            size = GRAD_DTYPES[grad_dtype]
        sharded = zero >= c.shard_from
        place = _GPU
        if sharded and offloads_to_host(c.offload, offload):
            place = _DROP if c.offload == "drop" else _HOST
        elif c.phase == "step":
            place = _STEP
        if size:
            cap = c.max_elements if place == _STEP else 0
            cats.append((_FIELD[c.field], size, sharded, place, cap))
    return StateRule(
        cats=tuple(cats),
        preset=optimizer_preset(optimizer),
        opt_itemsize=sizes[prof.optimizer_dtype],
        opt_sharded=zero >= 1,
        opt_host=zero >= 1 and offload != "none",
    )


def optimizer_state_bytes(
    n: int, preset: OptimizerPreset, itemsize: int, factored: int | None = None
) -> int:
    """Bytes of ``preset``'s states for ``n`` parameters whose state element is ``itemsize``
    bytes: ``states`` elements each (8-bit Adam, Dettmers et al. 2022 §2: 1 byte plus one fp32
    absmax per block of 2048, per state); a factored second moment (Adafactor, Shazeer & Stern
    2018 §3) adds ``factored`` elements (rows + columns of each matrix, the whole of each vector)
    or, without shapes (a flat shard), ``n``."""
    if preset.block:
        per_state = preset.state_bytes * n + 4 * cdiv(n, preset.block)
    else:
        per_state = (preset.state_bytes or itemsize) * n
    out = preset.states * per_state
    if preset.factored:
        out += itemsize * (n if factored is None else factored)
    return out


def apply_rule(rule: StateRule, n: int, dp: int, factored: int | None = None) -> ModelStateBytes:
    """Model-state bytes of ``n`` parameters under ``rule``, sharded over ``dp`` ranks: a sharded
    tensor of n values gives each rank ⌈n/d⌉ (flat-buffer padding, as DeepSpeed and FSDP do).
    ``factored``: the factored second-moment elements of these parameters (used only while the
    optimizer states are unsharded: a ZeRO shard is a flat 1-D buffer)."""
    shard = cdiv(n, dp)
    out = [0, 0, 0, 0, 0]  # params, grads, optimizer, host, optimizer step only
    for field, size, sharded, place, cap in rule.cats:
        if place == _DROP:
            continue
        slot = {_HOST: 3, _STEP: 4}.get(place, field)
        elements = shard if sharded else n
        out[slot] += size * (min(elements, cap) if cap else elements)
    o_n = shard if rule.opt_sharded else n
    opt = optimizer_state_bytes(
        o_n, rule.preset, rule.opt_itemsize, None if rule.opt_sharded else factored
    )
    out[3 if rule.opt_host else 2] += opt
    return ModelStateBytes(params=out[0], grads=out[1], optimizer=out[2], host=out[3], step=out[4])


def step_only_bytes(rule: StateRule, *parts: int) -> int:
    """The optimizer-step-only bytes of several parameter groups under one ``rule`` (a stage's
    dense and expert parameters): their sum, unless every step-only category is made one
    sub-group at a time (``max_elements``, DeepSpeed ZeRO-3's ``sub_group_size``), in which case
    no more than one sub-group's bytes exist at once, whichever group it belongs to."""
    step_cats = [(size, cap) for _, size, _, place, cap in rule.cats if place == _STEP]
    total = sum(parts)
    if step_cats and all(cap for _, cap in step_cats):
        return min(total, sum(size * cap for size, cap in step_cats))
    return total


def model_state_bytes(
    num_params: int,
    dp: int = 1,
    zero: int = 0,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    *,
    engine: str = "paper",
    offload: str = "none",
    grad_dtype: str | None = None,
    master_weights: bool | None = None,
    factored: int | None = None,
) -> ModelStateBytes:
    """Parameters, gradients and optimizer states per GPU for Ψ = ``num_params``.

    Rajbhandari et al. 2020 (ZeRO) §5.1 for mixed-precision Adam (K = 12): without ZeRO each GPU
    holds (2 + 2 + K)Ψ bytes; stage 1 holds 2Ψ + 2Ψ + KΨ/d; stage 2 2Ψ + (2 + K)Ψ/d; stage 3
    (2 + 2 + K)Ψ/d. A sharded tensor of n values gives each rank ⌈n/d⌉ values (flat-buffer
    padding, as DeepSpeed and FSDP do). Other precisions and optimizers follow the same pattern
    with their own byte sizes (:data:`~parmem.config.PRECISIONS`, the optimizer presets).

    ``engine`` picks a profile of :mod:`parmem.engines` (Megatron-Core: 6 + 12/d with the
    distributed optimizer, 18 without; DeepSpeed: 2 + 18/d at ZeRO-2, 18/d at ZeRO-3; FSDP2: fp32
    sharded weights and gradients …). ``offload`` (``"optimizer"``, ZeRO-Offload, Ren et al.
    2021; ``"optimizer+params"``, ZeRO-Infinity) moves the offloaded bytes to ``host``;
    ``grad_dtype`` and ``master_weights`` override the profile's gradient element and fp32 master
    copy; ``factored`` gives Adafactor's factored second-moment elements (default: unfactored).
    """
    num_params = integer("num_params", num_params, minimum=0)
    dp = integer("dp", dp)
    zero = integer("zero", zero, 0, 3)
    choice("precision", precision, PRECISIONS)
    choice("optimizer", optimizer, OPTIMIZERS)
    choice("engine", engine, engines())
    choice("offload", offload, OFFLOADS)
    if grad_dtype is not None:
        choice("grad_dtype", grad_dtype, GRAD_DTYPES)
    if master_weights is not None:
        boolean("master_weights", master_weights)
    if factored is not None:
        factored = integer("factored", factored, minimum=0)
    _engine(engine).check(zero, 1, "none", offload)
    rule = state_rule(engine, precision, optimizer, zero, offload, grad_dtype, master_weights)
    return apply_rule(rule, num_params, dp, factored)


def total_model_state_floor(
    spec: ModelSpec, precision: str = "bf16-mixed", optimizer: str = "adamw"
) -> int:
    """The bytes of one full copy of the model states: no layout can hold less in total."""
    return model_state_bytes(spec.num_params(), 1, 0, precision, optimizer).total


def reduced_grad_itemsize(
    engine_name: str,
    precision: str,
    zero: int,
    grad_dtype: str | None = None,
    master_weights: bool | None = None,
) -> int:
    """Bytes of one gradient element as the profile keeps and reduces it (what the data-parallel
    reduction sends): Megatron-Core's fp32 ``main_grad`` (4 under bf16), FSDP2's fp32
    ``reduce_dtype`` (4), DeepSpeed's and the paper's 16-bit gradients (2). A profile without a
    gradient category at this stage reduces in the precision's gradient element."""
    sizes = itemsizes(PRECISIONS[precision], grad_dtype, master_weights)
    for c in _engine(engine_name).categories(precision, zero):
        if c.name == "grads":
            return GRAD_DTYPES[grad_dtype] if grad_dtype is not None else sizes[c.dtype] or 2
    return sizes["grad"]
