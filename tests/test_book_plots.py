"""parmem.book.plots: the figures draw what the library computed.

Expected values are derived here from the sources, not copied from a run: ZeRO's Figure 1 and §7
communication volumes (Rajbhandari et al. 2020) with the per-micro-batch collectives of ZeRO-2
and ZeRO-3 under gradient accumulation (DeepSpeed), the ring collectives and the alpha-beta model
(Thakur et al. 2005 §4), Megatron's tensor-parallel split (Shoeybi et al. 2019 §3) and Korthikanti
et al. 2022 Table 2.
"""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate  # noqa: E402
from parmem.analyses import collective_curves, zero3_vs_tp, zero_stages  # noqa: E402
from parmem.book.plots import (  # noqa: E402
    plot_collective_times,
    plot_zero3_vs_tp,
    plot_zero_stages,
)

GIB = 2**30


def bar_heights(ax):
    return [p.get_height() for p in ax.patches]


# ---------------------------------------------------------------------------- data parallel
def test_zero_stages_figure_reproduces_zero_paper_figure1():
    # Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, d = 64, K = 12: 120, 31.4, 16.6, 1.9 GB
    from parmem.papers import table

    paper = table("rajbhandari2020_figure1")
    psi, d = paper.settings["params"], paper.settings["dp"]
    fig = plot_zero_stages(zero_stages(psi, d))
    left, right = fig.axes
    h = bar_heights(left)  # params (4 bars), grads (4 bars), optimizer (4 bars), in GiB
    totals = [sum(h[i::4]) * GIB / 1e9 for i in range(4)]
    assert [round(t, 1) for t in totals] == paper.column("gb")
    # §7: DP and ZeRO-1/2 move 2Ψ values per step (here exactly 2(d-1)/d Ψ), ZeRO-3 3Ψ
    assert bar_heights(right) == pytest.approx([2 * (d - 1) / d] * 3 + [3 * (d - 1) / d])


@pytest.mark.parametrize("m", [1, 4])
def test_zero_communication_with_gradient_accumulation(m):
    # DDP all-reduces once per step (no_sync between micro-batches); ZeRO-1 reduce-scatters the
    # accumulated gradients once and all-gathers updated parameters once; ZeRO-2 reduce-scatters
    # every micro-batch (DeepSpeed: stage >= 2 communicates at every backward); ZeRO-3 also
    # all-gathers the parameters in every micro-batch's forward and backward.
    d = 8
    fig = plot_zero_stages(zero_stages(1_000_000_000, d, num_microbatches=m))
    frac = (d - 1) / d
    assert bar_heights(fig.axes[1]) == pytest.approx(
        [2 * frac, 2 * frac, (m + 1) * frac, 3 * m * frac])


def test_collective_times_curves_follow_alpha_beta():
    n, size = 8, 2**26
    curves = collective_curves("all_reduce", n, ("nvlink4", "ib-ndr"), mark=size)
    fig = plot_collective_times(curves)
    ax = fig.axes[0]
    marks = [line for line in ax.lines if len(line.get_xdata()) == 1 and line.get_marker() == "o"]
    # ring all-reduce: 2(n-1) latencies + 2(n-1)/n·S / bandwidth (450e9 and 50e9 B/s, 3 and 8 µs)
    expect = [2 * (n - 1) * 3e-6 + 2 * (n - 1) * size / n / 450e9,
              2 * (n - 1) * 8e-6 + 2 * (n - 1) * size / n / 50e9]
    assert [m.get_ydata()[0] for m in marks] == pytest.approx(expect)
    # the dotted crossover: latency term = bandwidth term at S = n·alpha·bandwidth
    cross = sorted(line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == ":")
    assert cross == pytest.approx(sorted([n * 3e-6 * 450e9, n * 8e-6 * 50e9]))


def test_zero3_vs_tp_figure_states_fall_activations_flat():
    spec = ModelSpec.preset("llama-3-70b")
    dps = (1, 2, 4, 8)
    fig = plot_zero3_vs_tp(zero3_vs_tp(spec, 4096, tp=8, dps=dps), capacity=None)
    lines = {line.get_label(): line.get_ydata() for line in fig.axes[0].lines}
    for tag in ("t=1", "t=8 + SP"):
        states = lines[f"model states, {tag}"]
        act = lines[f"activations + logits, {tag}"]
        assert states[0] / states[-1] == pytest.approx(8, rel=1e-3)  # 16Ψ/d
        assert len(set(act)) == 1  # ZeRO-3 never touches activations
    # TP+SP divides every activation term and the (vocab-parallel) logits by t = 8
    ratio = lines["activations + logits, t=1"][0] / lines["activations + logits, t=8 + SP"][0]
    assert ratio == pytest.approx(8, rel=1e-3)


# ---------------------------------------------------------------------------- tensor parallel
def test_tp_shards_figure_draws_one_panel_per_matrix():
    from parmem.analyses import tp_shard_layout
    from parmem.book.plots import plot_tp_shards

    fig = plot_tp_shards(tp_shard_layout(ModelSpec.preset("llama-2-7b"), 4))
    # embedding, QKV, attention out, MLP in, MLP out, norms, LM head
    assert len(fig.axes) == 7
    qkv = fig.axes[1]
    # Q split in 4, K in 4, V in 4, plus the outline
    assert len(qkv.patches) == 4 + 4 + 4 + 1
    tied = plot_tp_shards(tp_shard_layout(ModelSpec.preset("gpt3-175b"), 8))
    assert len(tied.axes) == 6  # no separate LM head


def test_tp_components_figure_stacks_to_weights_per_rank():
    from parmem.analyses import tp_component_bytes
    from parmem.book.plots import plot_tp_components

    spec = ModelSpec.preset("llama-2-7b")
    fig = plot_tp_components(tp_component_bytes(spec, (1, 4), bytes_per_param=2))
    ax = fig.axes[0]
    tops = {}
    for p in ax.patches:
        x = round(p.get_x() + p.get_width() / 2)
        tops[x] = max(tops.get(x, 0), p.get_y() + p.get_height())
    assert tops[0] == pytest.approx(2 * 6_738_415_616 / 2**30)
    t4 = estimate(spec, ParallelConfig(tp=4), TrainingSetup(seq_len=128)).stages[0].params
    assert tops[1] == pytest.approx(t4 / 2**30)


def test_terms_compare_and_tradeoff_figures():
    from parmem.activations import layer_terms
    from parmem.analyses import tp_tradeoff
    from parmem.book.plots import plot_terms_compare, plot_tp_tradeoff

    spec = ModelSpec.preset("gpt3-175b")
    fig = plot_terms_compare({"TP": layer_terms(spec, 2048, 1, tp=8),
                              "TP + SP": layer_terms(spec, 2048, 1, tp=8, sp=True)})
    assert "342.0 MiB" in fig.axes[0].get_legend().get_texts()[1].get_text()  # sbh(34+80)/8
    fig = plot_tp_tradeoff(tp_tradeoff(ModelSpec.preset("llama-2-7b"),
                                       TrainingSetup(seq_len=4096), (1, 2, 4)))
    assert len(fig.axes) == 2


# ---------------------------------------------------------------------------- planner
def test_plot_pareto(small_plan):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parmem.book.plots import plot_pareto

    fig = plot_pareto(small_plan)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "modelled step time (s)"
    assert len(ax.collections) >= 2  # the cloud, the front, the leaders
    plt.close(fig)
