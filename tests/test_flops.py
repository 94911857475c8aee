"""parmem.flops: the FLOPs of a training step against Narayanan et al. 2021 eq. (3), written out
here in exact rationals."""

from __future__ import annotations

from fractions import Fraction

import pytest
from helpers import gpt

from parmem.flops import narayanan_flops, step_flops
from parmem.model import ModelSpec


@pytest.mark.parametrize("B,s,L,h,V", [(2304, 2048, 80, 12288, 51200), (8, 1024, 24, 1024, 50257)])
def test_step_flops_is_narayanan_eq3_for_gpt(B, s, L, h, V):
    spec = gpt("g", heads=h // 128, hidden=h, layers=L, vocab=V)
    # eq. (3) with recomputation, and its no-recompute form, written out here
    with_rc = Fraction(96 * B * s * L * h * h) * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * L * h))
    without = Fraction(72 * B * s * L * h * h) * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * L * h))
    assert step_flops(spec, B, s, "full") == with_rc
    assert step_flops(spec, B, s, "none") == without
    assert narayanan_flops(B, s, L, h, V, recompute=True) == with_rc
    assert narayanan_flops(B, s, L, h, V, recompute=False) == without
    # selective recomputation re-runs only the attention core: 4·s²·h per layer per sequence
    assert step_flops(spec, B, s, "selective") == without + B * L * 4 * s * s * h


def test_torchtitan_sac_recomputes_every_second_matmul():
    """torchtitan's op-level SAC (distributed/activation_checkpoint.py: save every compute op
    "except every second mm/linear", the attention kernel kept, the router forced to recompute,
    the experts' grouped GEMMs not among the saved ops), counted by hand from the shapes:
    Llama-3-8B runs wqkv, wo, w1, w3, w2 and recomputes wo (4096 x 4096) and w3 (4096 x 14336);
    Mixtral-8x7B recomputes wo, the router (8 x 4096) and its top-2 experts' three matrices."""
    from parmem.flops import selective_flops_per_sequence

    s = 4096
    llama = ModelSpec.preset("llama-3-8b")
    assert selective_flops_per_sequence(llama, s, "every-second-matmul") == 2 * s * (
        4096 * 4096 + 4096 * 14336)
    mixtral = ModelSpec.preset("mixtral-8x7b")
    assert selective_flops_per_sequence(mixtral, s, "every-second-matmul") == 2 * s * (
        4096 * 4096 + 8 * 4096 + 2 * 3 * 4096 * 14336)
    # Megatron's selective: the attention core, 4·s²·(a·d_head)
    assert selective_flops_per_sequence(llama, s, "core") == 4 * s * s * 4096
    with pytest.raises(ValueError, match="rule"):
        selective_flops_per_sequence(llama, s, "half")


def test_the_planner_prices_each_engines_own_selective_recomputation():
    """Under fsdp2 selective recomputation costs torchtitan's SAC set, under megatron-core the
    attention core: the recompute seconds are in the ratio of those FLOPs (same GPU, kernels and
    micro-batch; the core at attention_efficiency 1)."""
    from parmem import Cluster, ParallelConfig, TrainingSetup
    from parmem.flops import selective_flops_per_sequence
    from parmem.planner import evaluate

    spec, cluster, s = ModelSpec.preset("llama-3-8b"), Cluster("h100-sxm", 8, 1), 4096
    par = {"fsdp2": ParallelConfig(dp=8, zero=3), "megatron-core": ParallelConfig(dp=8, zero=1)}
    rec = {e: evaluate(spec, cluster, par[e], TrainingSetup(seq_len=s, recompute="selective",
                                                         engine=e)).time.recompute
           for e in par}  # fmt: skip
    want = (selective_flops_per_sequence(spec, s, "every-second-matmul")
            / selective_flops_per_sequence(spec, s, "core"))  # fmt: skip
    assert rec["fsdp2"] / rec["megatron-core"] == pytest.approx(want, rel=1e-9)
    # and the executed FLOPs it reports (HFU) count the same recomputation
    c = evaluate(spec, cluster, par["fsdp2"], TrainingSetup(seq_len=s, recompute="selective",
                                                           engine="fsdp2"))  # fmt: skip
    extra = (c.hardware_flops_per_gpu - c.model_flops_per_gpu) * 8 * c.step_time
    assert extra == pytest.approx(c.global_batch * spec.layers * want
                                  * selective_flops_per_sequence(spec, s, "core"), rel=1e-9)
