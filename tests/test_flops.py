"""parmem.flops: the FLOPs of a training step against Narayanan et al. 2021 eq. (3), written out
here in exact rationals."""

from __future__ import annotations

from fractions import Fraction

import pytest
from helpers import gpt

from parmem.flops import narayanan_flops, step_flops


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
