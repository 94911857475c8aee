"""model_state_bytes(): ZeRO's published example (Rajbhandari et al. 2020, Figure 1 and §5),
other precisions and optimizers, uneven shards."""

import pytest

from parmem import model_state_bytes
from parmem.papers import table

FIGURE1 = table("rajbhandari2020_figure1")


@pytest.mark.parametrize("row", FIGURE1.rows, ids=[r["label"] for r in FIGURE1.rows])
def test_zero_paper_figure1(row):
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, K = 12 (mixed-precision Adam):
    # 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU (GB = 1e9 bytes).
    fig = FIGURE1.settings
    assert fig["K"] == 12  # the K of model_state_bytes' default, mixed-precision AdamW
    m = model_state_bytes(fig["params"], dp=fig["dp"], zero=row["zero"])
    assert round(m.total / 1e9, 1) == row["gb"]


def test_zero_stage_formulas_16_bytes_per_param():
    # TOPICS row 16 / ZeRO §5: (2+2+12)Psi -> 4Psi + 12Psi/d -> 2Psi + 14Psi/d -> 16Psi/d.
    psi, d = 1_000_000, 8
    assert model_state_bytes(psi, d, 0).total == 16 * psi
    assert model_state_bytes(psi, d, 1).total == 4 * psi + 12 * psi // d
    assert model_state_bytes(psi, d, 2).total == 2 * psi + 14 * psi // d
    assert model_state_bytes(psi, d, 3).total == 16 * psi // d


def test_other_precisions_and_optimizers():
    n = 1000
    assert model_state_bytes(n, precision="fp32", optimizer="adamw").total == (4 + 4 + 8) * n
    assert model_state_bytes(n, optimizer="sgd").total == (2 + 2 + 4) * n  # fp32 master only
    assert model_state_bytes(n, optimizer="sgd-momentum").total == (2 + 2 + 8) * n
    assert model_state_bytes(n, precision="bf16").total == (2 + 2 + 4) * n
    # 8-bit Adam (Dettmers et al. 2022): 2 one-byte states + one fp32 absmax per 2048 values,
    # plus the fp32 master copy under mixed precision.
    n = 4096
    assert model_state_bytes(n, optimizer="adam-8bit").optimizer == 4 * n + 2 * (n + 4 * 2)


def test_uneven_zero_shards_round_up():
    # 10 values over 4 ranks: each rank holds ceil(10/4) = 3 (flat-buffer padding).
    assert model_state_bytes(10, dp=4, zero=3).params == 2 * 3
