"""torchtitan's own op-level SAC against the ``fsdp2`` profile's selective recomputation
(``selective_flops = "every-second-matmul"``, :func:`parmem.flops.selective_flops_per_sequence`).

One block of torchtitan 0.3.0's Llama 3 ``debugmodel`` (dim 256, ffn 768) runs forward and
backward on CPU, plain and wrapped by torchtitan's ``SelectiveAC``; the matmul FLOPs its backward
pass runs beyond the plain one are what SAC recomputes. By hand: the 2nd and 4th matmuls, wo
(256 x 256) and w3 (256 x 768), 2 FLOPs per weight and token."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from parmem.distributed.engine_runs import (  # noqa: E402
    datasets_stub,
    torchtitan_modules,
    torchtitan_spec,
    triton_stub,
)
from parmem.flops import selective_flops_per_sequence  # noqa: E402

B, S, H, F = 2, 64, 256, 768


class _MatmulFlops(TorchDispatchMode):
    """2·M·K·N of every mm/addmm run while ``on``."""

    def __init__(self) -> None:
        super().__init__()
        self.flops, self.on = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.on and func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            a, b = args[-2], args[-1]
            self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return out


def _backward_flops(block) -> int:
    x = torch.randn(B, S, H, requires_grad=True)
    count = _MatmulFlops()
    with count:
        y = block(x, None)
        count.on = True
        y.sum().backward()
    return count.flops


def test_torchtitan_sac_recomputes_what_the_profile_prices():
    tt = torchtitan_modules()
    with triton_stub(), datasets_stub():
        from torchtitan.distributed.activation_checkpoint import SelectiveAC
    cfg = tt.registry.llama3_debugmodel()
    mc = cfg.model_spec.model
    for block in mc.layers:
        block.attention.inner_attention = tt.SDPA.Config()
    mc.update_from_config(config=cfg)
    torch.manual_seed(0)
    block = mc.build().layers["0"]
    plain = _backward_flops(block)
    sac = SelectiveAC(SelectiveAC.Config())._wrap_block(copy.deepcopy(block))
    recomputed = _backward_flops(sac) - plain
    assert recomputed == 2 * B * S * (H * H + H * F)  # wo and w3, by hand
    assert recomputed == B * selective_flops_per_sequence(torchtitan_spec(), S, "every-second-matmul")
