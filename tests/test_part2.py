"""Part I–II additions: send/recv and ZeRO loss-curve demos, collective/ZeRO/TP figures, explorers.

Expected values are derived here from the sources, not copied from a run: the ring and
point-to-point byte counts (Thakur et al. 2005 §4), the alpha-beta model, ZeRO's Figure 1 and §7
communication volumes (Rajbhandari et al. 2020), with the per-micro-batch collectives of ZeRO-2
and ZeRO-3 under gradient accumulation (DeepSpeed).
"""

from __future__ import annotations

import os

import matplotlib
import pytest

matplotlib.use("Agg")

from parmem import ModelSpec  # noqa: E402
from parmem.analyses import collective_curves, zero3_vs_tp, zero_stages  # noqa: E402
from parmem.book.plots import (  # noqa: E402
    plot_collective_times,
    plot_zero3_vs_tp,
    plot_zero_stages,
)

N = int(os.environ.get("PARMEM_WORLD_SIZE", "2"))
GIB = 2**30


def bar_heights(ax):
    return [p.get_height() for p in ax.patches]


# ---------------------------------------------------------------------------- figures
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


# ---------------------------------------------------------------------------- explorers
@pytest.mark.parametrize("name", ["explore_collectives", "explore_data_parallel", "explore_zero",
                                  "explore_zero3_tp"])
def test_explorers_build_headless(name):
    pytest.importorskip("ipywidgets")
    import matplotlib.pyplot as plt

    from parmem.book import widgets

    box = getattr(widgets, name)(static=False)
    assert box.children  # controls and the output area
    plt.close("all")


# ---------------------------------------------------------------------------- dist demos


@pytest.mark.dist
def test_send_recv_sends_the_tensor_once_per_boundary(pool):
    from parmem.comm import send_recv_bytes

    numel = 1000
    res = pool.run("parmem.dist.collectives:demo_send_recv", numel=numel)
    size = 4 * numel  # fp32
    for r, row in enumerate(res):
        assert row["size_bytes"] == size and row["received_ok"]
        assert row["bytes_sent"] == (size if r < N - 1 else 0)
        assert row["bytes_received"] == (size if r > 0 else 0)
    assert max(row["bytes_sent"] for row in res) == send_recv_bytes(size)


@pytest.mark.dist
def test_ddp_zero1_fsdp2_loss_curves_equal_single_process(pool):
    steps = 4
    res = pool.run("parmem.dist.zero:demo_losses", steps=steps)
    for row in res:
        ref = row["reference"]
        assert len(ref) == steps
        for k in ("ddp", "zero1", "fsdp2"):
            assert row[k] == pytest.approx(ref, abs=1e-6)
        assert row["max_diff"] < 1e-6
    assert all(row["ddp"] == res[0]["ddp"] for row in res)  # one curve, on every rank
