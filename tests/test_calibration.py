"""The cost model against published runs (issue 15): the runs' data are consistent with their
sources' own arithmetic, the tie rule prefers the simpler layout, and the calibrated planner
ranks and models the layouts their authors chose within the issue's targets (top 3, within 5%
of the best modelled step time, TFLOP/s within 10%), where it can; the runs it cannot place
(Llama 3's own schedule) are checked for the reason."""

from __future__ import annotations

from functools import cache

import pytest

from parmem import Cluster, ModelSpec, plan
from parmem.papers import published_runs as groups
from parmem.papers import table
from parmem.planner import Assumptions
from parmem.planner.calibration import GAP, TOLERANCE, TOP, comparison, published_runs
from parmem.planner.search import TIE, rank_candidates, simplicity


@cache
def results():
    return {r.run.key: r for r in comparison()}


def test_runs_agree_with_their_sources_arithmetic():
    runs = published_runs()
    t1 = table("narayanan2021_table1")
    assert sum(r.group == "narayanan2021_table1" for r in runs) == len(t1.rows) == 10
    for r in runs:
        lay = r.layout
        assert r.cluster.world_size % (lay["t"] * lay["p"] * lay["cp"]) == 0, r.key
        d = r.cluster.world_size // (lay["t"] * lay["p"] * lay["cp"])
        assert r.global_batch % d == 0 and lay["e"] <= d * lay["cp"], r.key
    for row in groups()["llama3_table4"]["rows"]:  # GPUs = TP·CP·PP·DP; 16M tokens per batch
        assert row["t"] * row["cp"] * row["p"] * row["d"] == row["gpus"]
        assert row["d"] * row["batch_per_dp"] * row["seq_len"] == 16 * 2**20
        # BF16 MFU of the H100's 989 TFLOP/s (the second row prints 41% for 400/989 = 40.4%)
        assert abs(100 * row["tflops_per_gpu"] / 989 - row["mfu_percent"]) < 1
    for row in groups()["narayanan2021_table2"]["rows"]:
        if row["scheme"] == "PTD-P":  # model-parallel size 96 (174.6B) or 280 (529.6B)
            assert row["t"] * row["p"] in (96, 280)
    # the 174.6B model of Table 2 has 174.6B parameters by the paper's eq. (2)
    gpt3 = next(r.spec for r in runs if "174.6" in r.spec.name)
    assert round(gpt3.num_params() / 1e9, 1) == 174.6


def test_ties_go_to_the_simpler_layout():
    pl = plan(ModelSpec.preset("llama-2-13b"), Cluster("h100-sxm", 8, 4), 128, 4096, top=50)
    cands = pl.candidates
    for i, c in enumerate(cands):  # nothing after c is both simpler and within a tie of it
        for later in cands[i + 1:]:
            if later.step_time <= c.step_time * (1 + TIE) and c.step_time <= later.step_time:
                assert simplicity(later) >= simplicity(c) or later.step_time > c.step_time
    assert rank_candidates(list(reversed(cands))) == cands


def test_defaults_are_the_fitted_ones_and_documented():
    a = Assumptions()
    assert 0 < a.mfu <= 1 and a.mfu_half_width > 0 and a.mfu_half_hidden > 0
    assert a.dp_overlap < 1  # ZeRO-3's gathers do not all hide (Narayanan et al. Table 2)


def _chosen(group):
    return [r for r in results().values() if r.run.group == group and r.run.role == "chosen"]


@pytest.mark.parametrize("group", ["narayanan2021_table1", "narayanan2021_table2",
                                   "mcore_mixtral_8x7b"])
def test_chosen_layouts_are_near_the_best_and_modelled_within_tolerance(group):
    for r in _chosen(group):
        assert r.fits, r.run.key
        assert r.gap <= GAP, (r.run.key, r.gap)
        assert abs(r.error) <= TOLERANCE, (r.run.key, r.error)
    ranks = [r.rank for r in _chosen(group)]
    assert sum(k <= TOP for k in ranks) >= len(ranks) / 2, ranks


def test_table2_ptdp_beats_zero3_as_published():
    res = [r for r in results().values() if r.run.group == "narayanan2021_table2"]
    for gpus in (768, 1536):  # published: PTD-P 149 vs ZeRO-3 88, and 141 vs 44 TFLOP/s
        ptd = next(r for r in res if r.run.cluster.world_size == gpus and r.run.layout["p"] > 1)
        z3 = next(r for r in res if r.run.cluster.world_size == gpus and r.run.layout["p"] == 1)
        published = ptd.run.tflops / z3.run.tflops
        modelled = ptd.modelled_tflops / z3.modelled_tflops
        assert modelled > 1.5 and published > 1.5
        assert z3.rank > ptd.rank


def test_llama3_rows_are_placed_and_their_gap_explained():
    """Llama 3's layouts rank in the top 3; their throughput is far below the published one
    because the planner's pipeline is not Meta's: with the uneven 126-layer split over 16
    stages it cannot interleave, so m = 32 (16) micro-batches leave a bubble of (p-1)/m of the
    ideal step, and it must recompute (none of the settings without recomputation fits its
    memory estimate)."""
    for r in _chosen("llama3_table4"):
        assert r.rank <= TOP
        c = r.candidate
        lost = (c.time.bubble + c.time.recompute) / c.step_time
        assert c.setup.recompute == "full" and c.parallel.vpp == 1
        assert -r.error < lost + 0.1, (r.run.key, r.error, lost)
