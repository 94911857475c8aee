"""Part VI (imbalance, still tight, inference): the demos on real ranks, the figures and the
explorers. Expected values come from the formulas (KV bytes per token, Korthikanti et al. 2022
Table 2 through parmem.estimate, the allocator's rules), not from runs.
World size: $PARMEM_WORLD_SIZE, default 2.
"""

from __future__ import annotations

import os

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup
from parmem.allocator import replay
from parmem.inference import Request, simulate_kv_cache
from parmem.traces import training_step_events

N = int(os.environ.get("PARMEM_WORLD_SIZE", "2"))


# ---------------------------------------------------------------------------- decoder, 1 process
def test_single_process_decoder_cache_grows_one_token_per_step():
    torch = pytest.importorskip("torch")
    from parmem.dist.serve import Decoder, generate, generate_without_cache
    from parmem.reference import tiny_spec

    spec = tiny_spec("llama", vocab=64, hidden=32, layers=3, heads=4, kv_heads=2, ffn_hidden=64,
                     seq=64)
    model = Decoder(spec)
    prompt = torch.randint(0, 64, (3, 5), generator=torch.Generator().manual_seed(0))
    ids, cache, sizes, _ = generate(model, prompt, 6)
    ref, _ = generate_without_cache(model, prompt, 6)
    assert torch.equal(ids, ref)
    # 2 (K, V) * L=3 * kv_heads=2 * head_dim=8 * 4 bytes (fp32) * b=3 per token
    assert sizes == [(n, 2 * 3 * 2 * 8 * 4 * 3 * n) for n in range(5, 11)]
    _, cache16, sizes16, _ = generate(model, prompt, 6, cache_dtype=torch.bfloat16)
    assert sizes16[-1][1] * 2 == sizes[-1][1]


def test_decoder_rejects_shapes_it_cannot_shard():
    pytest.importorskip("torch")
    from parmem.dist.serve import Decoder
    from parmem.reference import tiny_spec

    with pytest.raises(ValueError, match="tp=3"):
        Decoder(tiny_spec("llama", heads=8, kv_heads=2), tp_size=3)
    with pytest.raises(ValueError, match="Llama-shaped"):
        Decoder(ModelSpec.preset("gpt2"))


# ---------------------------------------------------------------------------- allocator replays
def test_expandable_segments_absorb_a_growing_sequence_length():
    # the N+1 case of the expandable-segments note, on a real model's terms: a shorter step then
    # a longer one leaves the default allocator holding segments that are each slightly too small
    spec = ModelSpec.preset("llama-2-7b")
    setup = TrainingSetup(seq_len=4096, flash_attention=True, dropout=False)
    ev = training_step_events(spec, ParallelConfig(), setup, seq_lens=[3072, 4096])
    default, expandable = replay(ev), replay(ev, expandable_segments=True)
    assert default.peak_requested == expandable.peak_requested
    assert default.peak_reserved - default.peak_requested > 2 * 2**30
    # expandable: at most one page per pool beyond the tensors
    assert expandable.peak_reserved - expandable.peak_requested < 22 * 2**20
    same = replay(training_step_events(spec, ParallelConfig(), setup, seq_lens=[4096, 4096]))
    assert same.peak_reserved < default.peak_reserved


def test_contiguous_reservation_holds_a_request_for_its_whole_life():
    # one request, prompt 100, output 10, pre-allocated 2048 slots for its 10 steps
    sim = simulate_kv_cache([Request(0, 100, 10)], 4096, "contiguous", max_len=2048)
    assert sim.allocated == (2048,) * 10
    assert sim.utilization == pytest.approx(sum(range(101, 111)) / (2048 * 10))


# ---------------------------------------------------------------------------- figures, explorers
def test_part6_figures_and_explorers_render():
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipywidgets")
    import matplotlib.pyplot as plt

    from parmem.book import widgets
    from parmem.book.plots import plot_kv_cache_sim, plot_replay, plot_stacked

    ev = [("alloc", 1, 3 * 2**20), ("alloc", 2, 100), ("free", 1)]
    fig = plot_replay({"default": replay(ev), "expandable": replay(ev, expandable_segments=True)})
    assert len(fig.axes[0].lines) == 3
    sim = simulate_kv_cache([Request(0, 10, 5)], 64)
    assert len(plot_kv_cache_sim({"paged": sim}).axes[0].lines) == 3   # two series + capacity
    fig = plot_stacked({"a": {"x": 2**30, "y": 2**30}, "b": {"x": 2**29}}, capacity=3 * 2**30)
    assert len(fig.axes[0].patches) == 4
    for name in ("explore_allocator", "explore_serving", "explore_remedies"):
        box = getattr(widgets, name)(static=False)
        assert box.children
    plt.close("all")


# ---------------------------------------------------------------------------- dist demos


@pytest.mark.dist
@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_tp_kv_cache_bytes_equal_the_formula(pool, kv_heads):
    res = pool.run("parmem.dist.serve:demo", heads=8, kv_heads=kv_heads)
    kv_local = max(kv_heads // N, 1)            # one head, duplicated, once t > kv_heads
    for r in res:
        assert r["kv_heads_local"] == kv_local
        assert r["same_tokens"] and r["max_logit_err"] < 1e-4
        assert r["weight_bytes"] == r["weight_bytes_estimate"]
        for tokens, measured in r["kv_bytes"]:
            # 2 * L=2 * kv_local * head_dim=8 * 4 bytes * b=2 per token
            assert measured == 2 * 2 * kv_local * 8 * 4 * 2 * tokens
        assert [b for _, b in r["kv_bytes"]] == r["kv_bytes_estimate"]


@pytest.mark.dist
def test_uneven_sequence_lengths_are_fully_explained(pool):
    lens = (256, 128, 192, 160)
    res = pool.run("parmem.dist.uneven:demo", seq_lens=lens, hidden=32, heads=2)
    for r in res:
        assert r["seq_len"] == lens[r["rank"] % 4]
        assert r["unexplained"] == 0
        assert r["reserved_peak"] >= r["allocated_peak"] >= r["requested_peak"] > r["activations"]
        assert r["activations_all_ranks"] == [x["activations"] for x in res]
    assert res[0]["activations"] == max(x["activations"] for x in res)
