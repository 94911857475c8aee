"""One DDP step of TinyGPT on 2 ranks: measured bytes equal estimate() plus named extras."""

import pytest

pytest.importorskip("torch")

from parmem.distributed import Pool  # noqa: E402
from parmem.distributed.anatomy import compare  # noqa: E402


@pytest.mark.dist
def test_anatomy_matches_the_estimate_on_every_rank():
    with Pool(2) as pool:
        results = pool.run("parmem.distributed.anatomy:demo", layers=2, seq=32, batch=2)
    for r in results:
        assert r["max_weight_diff_vs_rank0"] == 0.0
        rows = compare(r)
        assert all(row["unexplained"] == 0 for row in rows), rows
        # the model-state part is exactly 16 bytes per parameter (ZeRO paper, K = 12)
        ms = r["measured"]
        assert ms["params"] + ms["grads"] + ms["optimizer"] - r["extras"]["adam_steps"] == \
            16 * r["num_params"]
