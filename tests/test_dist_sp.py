"""parmem.distributed.sp on real gloo ranks: sequence parallelism equals one process and divides every
activation by t (Korthikanti et al. 2022 §4.2.2), and every case of their Table 2 is measured.
World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from helpers import WORLD_SIZE as N  # noqa: E402
from helpers import table2  # noqa: E402

pytestmark = pytest.mark.dist


def test_sp_equals_single_process_and_divides_every_activation_by_t(pool):
    h, a, s, b = 32, 4, 16, 2
    res = pool.run("parmem.distributed.sp:demo", hidden=h, heads=a, seq=s, batch=b)
    sbh = s * b * h
    for row in res:
        assert row["out_err"] < 1e-5 and row["input_grad_err"] < 1e-5 and row["grad_err"] < 1e-5
        # Korthikanti et al. 2022 §4.2.2: sbh(34 + 5as/h)/t, plus LayerNorm stats (bf16 on CPU)
        assert row["table2_sp"] == (34 * sbh + 5 * a * s * s * b) // N
        assert row["saved_bytes_sp"] == row["table2_sp"] + 2 * 2 * (s * b // N) * 2
        assert row["saved_bytes_sp"] == row["layer_terms_sp"]
        # SP removes the replicated 10sbh (and the stats) down to 1/t of it
        removed = row["saved_bytes_tp"] - row["saved_bytes_sp"]
        assert removed == (10 * sbh + 2 * 2 * s * b * 2) * (N - 1) // N
        # forward: 2 all-gathers + 2 reduce-scatters; backward: 2 reduce-scatters and 4
        # all-gathers (2 for the gradients, 2 re-gathering the saved s/t inputs)
        assert (row["fwd_all_gather"], row["fwd_reduce_scatter"]) == (2, 2)
        assert (row["bwd_all_gather"], row["bwd_reduce_scatter"]) == (4, 2)
        # every collective works on one full bf16 [s, b, h] tensor: 2sbh bytes
        assert row["collective_bytes"] == {"fwd_all_gather": [2 * sbh] * 2,
                                           "fwd_reduce_scatter": [2 * sbh] * 2,
                                           "bwd_all_gather": [2 * sbh] * 4,
                                           "bwd_reduce_scatter": [2 * sbh] * 2}


def test_every_case_of_table2_measured(pool):
    h, a, s, b = 32, 4, 16, 2
    res = pool.run("parmem.distributed.sp:demo_recompute", hidden=h, heads=a, seq=s, batch=b)
    stats = 2 * 2 * s * b * 2  # 2 LayerNorms x (mean, rstd) x tokens x 2 bytes (bf16 on CPU)
    for row in res:
        for case, (sp, recompute) in {"tp": (False, "none"), "tp+sp": (True, "none"),
                                      "tp+selective": (False, "selective"),
                                      "tp+sp+selective": (True, "selective"),
                                      "full": (False, "full"),
                                      "tp+sp+full": (True, "full")}.items():
            got = row[case]
            assert got["table2"] == table2(s, b, h, a, N, sp, recompute)
            kept_stats = 0 if recompute == "full" else stats // (N if sp else 1)
            assert got["measured"] == got["table2"] + kept_stats, case
            assert got["grad_err"] == 0.0, case
