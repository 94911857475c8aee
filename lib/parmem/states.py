"""Model states: the bytes of parameters, gradients and optimizer states on one GPU.

Rajbhandari et al. 2020 (ZeRO) §3.1 and §5: mixed-precision Adam keeps 2 + 2 + 12 bytes per
parameter (16-bit weights and gradients; fp32 master weights, momentum and variance); ZeRO stage
1, 2 and 3 shard the optimizer states, then the gradients, then the parameters over the
data-parallel group. 8-bit Adam per Dettmers et al. 2022.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._check import cdiv, choice, integer
from .config import ADAM8BIT_BLOCK, OPTIMIZERS, PRECISIONS

if TYPE_CHECKING:  # pragma: no cover
    from .model import ModelSpec

__all__ = ["ModelStateBytes", "model_state_bytes", "total_model_state_floor"]


@dataclass(frozen=True)
class ModelStateBytes:
    """Per-GPU bytes of parameters, gradients and optimizer states."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def _optimizer_bytes(n: int, precision: str, optimizer: str) -> int:
    prec = PRECISIONS[precision]
    states = OPTIMIZERS[optimizer]
    if optimizer == "adam-8bit":
        per_state = n + 4 * cdiv(n, ADAM8BIT_BLOCK)
    else:
        per_state = prec["state"] * n
    return prec["master"] * n + states * per_state


def model_state_bytes(
    num_params: int,
    dp: int = 1,
    zero: int = 0,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
) -> ModelStateBytes:
    """Parameters, gradients and optimizer states per GPU for Ψ = ``num_params``.

    Rajbhandari et al. 2020 (ZeRO) §5.1 for mixed-precision Adam (K = 12): without ZeRO each GPU
    holds (2 + 2 + K)Ψ bytes; stage 1 holds 2Ψ + 2Ψ + KΨ/d; stage 2 2Ψ + (2 + K)Ψ/d; stage 3
    (2 + 2 + K)Ψ/d. A sharded tensor of n values gives each rank ⌈n/d⌉ values (flat-buffer
    padding, as DeepSpeed and FSDP do). Other precisions and optimizers follow the same pattern
    with their own byte sizes (:data:`parmem.config.PRECISIONS`, :data:`parmem.config.OPTIMIZERS`; 8-bit Adam per Dettmers et
    al. 2022: two 1-byte states plus one fp32 scale per 2048 values).
    """
    integer("num_params", num_params, minimum=0)
    integer("dp", dp)
    integer("zero", zero, 0, 3)
    choice("precision", precision, PRECISIONS)
    choice("optimizer", optimizer, OPTIMIZERS)
    shard = cdiv(num_params, dp)
    prec = PRECISIONS[precision]
    p_n = shard if zero >= 3 else num_params
    g_n = shard if zero >= 2 else num_params
    o_n = shard if zero >= 1 else num_params
    return ModelStateBytes(
        params=prec["param"] * p_n,
        grads=prec["grad"] * g_n,
        optimizer=_optimizer_bytes(o_n, precision, optimizer),
    )


def total_model_state_floor(
    spec: ModelSpec, precision: str = "bf16-mixed", optimizer: str = "adamw"
) -> int:
    """The bytes of one full copy of the model states: no layout can hold less in total."""
    return model_state_bytes(spec.num_params(), 1, 0, precision, optimizer).total
