"""parmem.distributed.collectives on real gloo ranks: bytes sent equal the ring and point-to-point
formulas (Thakur et al. 2005 §4), written here, never copied from a run.
World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import FP32  # noqa: E402
from helpers import WORLD_SIZE as N  # noqa: E402

from parmem import comm  # noqa: E402

pytestmark = pytest.mark.dist


def test_collectives_bytes_sent_equal_ring_formulas(pool):
    numel = 3840
    size = numel * FP32
    res = pool.run("parmem.distributed.collectives:demo", numel=numel)
    for r, row in enumerate(res):
        assert all(row[c]["equal"] for c in row), row  # same result as gloo's own collective
        assert row["rs_then_ag"]["equal"]  # gloo's reduce-scatter + all-gather = its all-reduce
        assert row["all_reduce"]["bytes_sent"] == 2 * (N - 1) * size // N
        assert row["reduce_scatter"]["bytes_sent"] == (N - 1) * size // N
        assert row["all_gather"]["bytes_sent"] == (N - 1) * size // N
        assert row["all_to_all"]["bytes_sent"] == (N - 1) * size // N
        assert row["broadcast"]["bytes_sent"] == (size if r < N - 1 else 0)  # chain from rank 0
        for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
            assert row[c]["bytes_sent"] == comm.collective_bytes(c, size, N)
    # parmem.comm gives the busiest rank of the chain broadcast
    assert max(r["broadcast"]["bytes_sent"] for r in res) == comm.broadcast_bytes(size, N)


def test_send_recv_sends_the_tensor_once_per_boundary(pool):
    from parmem.comm import send_recv_bytes

    numel = 1000
    res = pool.run("parmem.distributed.collectives:demo_send_recv", numel=numel)
    size = 4 * numel  # fp32
    for r, row in enumerate(res):
        assert row["size_bytes"] == size and row["received_ok"]
        assert row["bytes_sent"] == (size if r < N - 1 else 0)
        assert row["bytes_received"] == (size if r > 0 else 0)
    assert max(row["bytes_sent"] for row in res) == send_recv_bytes(size)
