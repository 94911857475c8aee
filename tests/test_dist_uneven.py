"""parmem.distributed.uneven on real gloo ranks: uneven sequence lengths are fully explained by the
activations each rank's length implies (Korthikanti et al. 2022 Table 2 through parmem.estimate).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.dist


def test_uneven_sequence_lengths_are_fully_explained(pool):
    lens = (256, 128, 192, 160)
    res = pool.run("parmem.distributed.uneven:demo", seq_lens=lens, hidden=32, heads=2)
    for r in res:
        assert r["seq_len"] == lens[r["rank"] % 4]
        assert r["unexplained"] == 0
        assert r["reserved_peak"] >= r["allocated_peak"] >= r["requested_peak"] > r["activations"]
        assert r["activations_all_ranks"] == [x["activations"] for x in res]
    assert res[0]["activations"] == max(x["activations"] for x in res)
