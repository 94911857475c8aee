"""parmem.distributed.hybrid on real gloo ranks: TP x DP/ZeRO-1 equals one process, and its states and
traffic are the formulas (Shoeybi et al. 2019 §3, Rajbhandari et al. 2020 §5/§7, Thakur et al.
2005 for the ring), derived here by hand. World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import WORLD_SIZE as N  # noqa: E402
from helpers import cdiv  # noqa: E402

from parmem.comm import all_gather_bytes, all_reduce_bytes, reduce_scatter_bytes  # noqa: E402

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("zero", [0, 1])
def test_hybrid_tp_dp_matches_one_process_and_the_formulas(pool, zero):
    L, h, V, s, b = 2, 32, 64, 16, 2
    for t in (k for k in (1, 2, 4) if N % k == 0):
        d = N // t
        for row in pool.run("parmem.distributed.hybrid:demo", tp=t, zero=zero, layers=L, hidden=h,
                            vocab=V, seq=s, batch=b):
            assert row["d"] == d and row["t"] == t
            assert row["grad_err"] < 1e-6 and row["param_err"] < 1e-4
            # GPT layer, biases everywhere (Shoeybi §3): QKV and FC1 column-parallel (weights
            # and biases split), projection and FC2 row-parallel (bias replicated), 2 LayerNorms
            layer = (3 * h * h + 3 * h) // t + h * h // t + h + (4 * h * h + 4 * h) // t \
                + 4 * h * h // t + h + 2 * 2 * h
            psi = L * layer + 2 * V * h // t + 2 * h   # + embedding, head, final LayerNorm
            assert row["params"] == row["grads"] == 4 * psi
            shard = cdiv(psi, d) if zero else psi
            assert row["optimizer"] == 8 * shard + 4     # Adam moments + its step counter
            # DP: ZeRO-0 one all-reduce; ZeRO-1 reduce-scatter + all-gather (same ring bytes)
            grads = 4 * psi
            dp = all_reduce_bytes(grads, d) if zero == 0 else \
                reduce_scatter_bytes(grads, d) + all_gather_bytes(grads, d)
            assert row["dp_bytes"] == row["dp_bytes_model"] == dp
            # TP: 4 all-reduces of s·b·h per layer, + embedding and head all-reduces, + logits
            x = s * b * h * 4
            tp = 4 * L * all_reduce_bytes(x, t) + 2 * all_reduce_bytes(x, t) \
                + all_gather_bytes(s * b * V * 4, t)
            assert row["tp_bytes"] == tp == row["tp_bytes_model"] + row["tp_bytes_extras"]
            assert row["tp_collectives"] == (4 * L + 3 if t > 1 else 0)


def test_hybrid_rejects_bad_arguments(pool):
    from parmem.distributed import RankError

    with pytest.raises(RankError, match="zero=2"):
        pool.run("parmem.distributed.hybrid:demo", tp=1, zero=2)
