"""parmem.planner.sensitivity: where a plan's ranking changes as one fitted assumption moves
(issue 29). Each reported value is checked by re-timing the layouts there, independently of the
search that found it."""

from __future__ import annotations

import pytest

from parmem import Cluster, ModelSpec, plan
from parmem.planner import evaluate
from parmem.planner.search import rank_candidates
from parmem.planner.sensitivity import FITTED, format_sensitivity, sensitivity


@pytest.fixture(scope="module")
def pool():
    return plan(ModelSpec.preset("llama-2-70b"), Cluster("h100-sxm", 8, 8), 256, 4096, top=30)


def _fastest(pl, name, x):
    kw = {name: round(x) if name.startswith("mfu_half") else x}
    timed = [evaluate(pl.spec, pl.cluster, c.parallel, c.setup,
                      layers_per_stage=c.layers_per_stage, **kw) for c in pl.candidates]
    return rank_candidates(timed)[0].label()


def test_each_reported_change_is_where_the_fastest_layout_changes(pool):
    base = pool.best.label()
    flips = sensitivity(pool)
    # the paper profile: no engine's DP overlap, no engine's kernel scale by GPU generation
    assert {f.name for f in flips} == set(FITTED) - {"dp_overlap_on", "mfu_ampere_scale",
                                                     "mfu_hopper_scale", "mfu_half_tokens"}
    changed = 0
    for f in flips:
        lo, hi = FITTED[f.name]
        assert _fastest(pool, f.name, f.value) == base
        for edge, winner, bound in ((f.below, f.below_winner, lo), (f.above, f.above_winner, hi)):
            if edge is None:
                assert winner is None
                continue
            changed += 1
            assert _fastest(pool, f.name, edge) == winner != base
            # just inside the edge the plan's own winner still leads
            inside = edge + (f.value - edge) * 0.05
            assert _fastest(pool, f.name, inside) == base, (f.name, edge, inside)
            assert min(f.value, bound) <= edge <= max(f.value, bound)
    assert changed >= 2  # this plan is not insensitive to everything


def test_an_assumption_that_cannot_matter_changes_nothing():
    """On one GPU every layout has d = 1: no DP collective, so the DP overlap changes nothing."""
    pl = plan(ModelSpec.preset("llama-2-7b"), Cluster("h200", 1, 1), 8, 2048, top=10)
    assert pl.best is not None and all(c.parallel.dp == 1 for c in pl.candidates)
    (f,) = sensitivity(pl, names=("dp_overlap",))
    assert (f.below, f.above, f.margin) == (None, None, None)


def test_the_engines_own_dp_overlap_is_the_one_tested():
    pl = plan(ModelSpec.preset("llama-2-13b"), Cluster("h100-sxm", 8, 2), 64, 4096, top=5,
              engine="megatron-core")
    names = {f.name for f in sensitivity(pl)}
    assert "dp_overlap_on" in names and "dp_overlap" not in names
    # an engine on H100s: the Hopper kernel scale is the one its time uses
    assert "mfu_hopper_scale" in names and "mfu_ampere_scale" not in names


def test_bad_input_is_refused(pool):
    with pytest.raises(ValueError, match="not a fitted assumption"):
        sensitivity(pool, names=("headroom",))
    nothing = plan(ModelSpec.preset("llama-2-70b"), Cluster("h100-sxm", 1, 1), 8, 4096)
    with pytest.raises(ValueError, match="nothing fits"):
        sensitivity(nothing)


def test_the_table_names_every_assumption(pool):
    flips = sensitivity(pool)
    text = format_sensitivity(flips, len(pool.candidates))
    assert f"the {len(pool.candidates)} fastest layouts" in text
    for f in flips:
        assert f.name in text
