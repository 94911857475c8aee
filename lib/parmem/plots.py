"""Matplotlib figures for the book, built on the estimators.

Every function takes library objects (an :class:`~parmem.estimate.Estimate`, a
:class:`~parmem.pipeline.PipelineResult`, a list of activation terms) and returns the matplotlib
``Figure``; pass ``ax=`` to draw into an existing axes. Units on axes are GiB (2**30 bytes) unless
the label says otherwise. matplotlib is imported lazily.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .estimate import Estimate, MemoryBreakdown
from .units import GIB

__all__ = ["COLORS", "plot_breakdown", "plot_compare", "plot_pipeline", "plot_terms",
           "plot_lines"]

#: One colour per memory term, used by every figure in the book.
COLORS = {
    "params": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52", "activations": "#8172B2",
    "logits": "#CCB974", "comm_buffers": "#64B5CD", "cuda_context": "#8C8C8C",
}
LABELS = {
    "params": "parameters", "grads": "gradients", "optimizer": "optimizer states",
    "activations": "activations", "logits": "logits", "comm_buffers": "comm buffers",
    "cuda_context": "CUDA context",
}


def _axes(ax, figsize=(7, 3.6)):
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    return fig, ax


def _draw_stack(ax, labels: Sequence[str], series, capacity: int | None = None,
                title: str | None = None, capacity_label: str | None = None,
                total_fmt: str = "{:,.1f}"):
    """Stacked bars: ``series`` is a list of (legend label, colour, byte values, one per bar);
    GiB on the y axis, the total above each bar, an optional dashed capacity line."""
    import numpy as np

    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for name, color, values in series:
        vals = np.array([v / GIB for v in values])
        ax.bar(x, vals, bottom=bottom, color=color, label=name, width=0.65)
        bottom += vals
    for xi, total in zip(x, bottom, strict=True):
        ax.annotate(total_fmt.format(total), (xi, total), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    if capacity:
        ax.axhline(capacity / GIB, color="k", ls="--", lw=1)
        ax.annotate(capacity_label or f"{capacity / GIB:.0f} GiB GPU",
                    (x[-1] + 0.4, capacity / GIB), ha="right", va="bottom", fontsize=8)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("GiB per GPU")
    ax.margins(y=0.12)
    if title:
        ax.set_title(title, fontsize=10)


def _stack(ax, labels: Sequence[str], breakdowns: Sequence[MemoryBreakdown],
           capacity: int | None = None, title: str | None = None):
    series = [(LABELS[f], COLORS[f], [getattr(b, f) for b in breakdowns])
              for f in MemoryBreakdown.FIELDS if any(getattr(b, f) for b in breakdowns)]
    _draw_stack(ax, labels, series, capacity, title, total_fmt="{:.1f}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def plot_breakdown(est: Estimate, ax=None, capacity: int | None = None, title: str | None = None):
    """Stacked bars of every pipeline stage's memory terms for one estimate."""
    fig, ax = _axes(ax)
    labels = [f"stage {s.stage}\n({s.layers} layers)" for s in est.stages]
    _stack(ax, labels, est.stages, capacity, title or f"{est.spec.name}: {est.parallel}")
    return fig


def plot_compare(estimates: Mapping[str, Estimate], ax=None, capacity: int | None = None,
                 title: str | None = None, stage: str | int = "peak"):
    """Stacked bars comparing layouts: the peak stage of each (or a fixed stage index)."""
    fig, ax = _axes(ax, figsize=(max(5.0, 1.1 * len(estimates) + 2.5), 3.6))
    picks = [e.peak if stage == "peak" else e.stages[int(stage)] for e in estimates.values()]
    _stack(ax, list(estimates), picks, capacity, title)
    return fig


def plot_terms(terms, ax=None, title: str | None = None, unit: str = "MiB"):
    """Horizontal bars of named byte terms (e.g. :func:`parmem.activations.layer_terms`)."""
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    fig, ax = _axes(ax, figsize=(7, 0.28 * len(terms) + 1.2))
    names = [t.name for t in terms][::-1]
    vals = [t.bytes / scale for t in terms][::-1]
    colors = ["#C44E52" if getattr(t, "core", False) else "#4C72B0" for t in terms][::-1]
    ax.barh(names, vals, color=colors)
    ax.set_xlabel(f"{unit} per layer per micro-batch")
    ax.tick_params(axis="y", labelsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_pipeline(result, ax=None, title: str | None = None):
    """Gantt chart of a :func:`parmem.pipeline.simulate` result: one row per stage, forwards in
    blue, backwards in green, chunk index shaded, idle time left white."""
    fig, ax = _axes(ax, figsize=(8, 0.45 * result.p + 1.2))
    for ev in result.events:
        fwd = ev.kind == "F"
        shade = 0.55 + 0.45 * (ev.chunk + 1) / max(result.v, 1)
        color = (0.3 * shade, 0.45 * shade, 0.85 * shade) if fwd else \
            (0.3 * shade, 0.7 * shade, 0.35 * shade)
        ax.barh(ev.stage, ev.end - ev.start, left=ev.start, color=color, edgecolor="white",
                height=0.8)
        if ev.end - ev.start >= 0.45:
            ax.text((ev.start + ev.end) / 2, ev.stage, str(ev.microbatch), ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_yticks(range(result.p), [f"stage {i}" for i in range(result.p)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (units of one micro-batch forward)")
    ax.set_title(title or f"{result.schedule}: p={result.p}, m={result.m}, v={result.v}, "
                 f"bubble {result.bubble_fraction:.0%}", fontsize=10)
    return fig


def plot_lines(x, series: Mapping[str, Sequence[float]], ax=None, xlabel: str = "",
               ylabel: str = "GiB per GPU", title: str | None = None, logx: bool = False,
               capacity: float | None = None):
    """Simple line chart of several series against one x axis (values already in display units)."""
    fig, ax = _axes(ax)
    for name, ys in series.items():
        ax.plot(x, ys, marker="o", ms=3, label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if capacity is not None:
        ax.axhline(capacity, color="k", ls="--", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return fig


# ---------------------------------------------------------------------------- collectives, ZeRO
def plot_collective_times(op: str = "all_reduce", n: int = 8, links=("nvlink4", "ib-ndr"),
                          sizes=None, mark: int | None = None, ax=None, title: str | None = None):
    """Alpha-beta time of one collective against message size on each link (log-log).

    ``op`` and ``n`` as in :func:`parmem.comm.collective_time`; ``links`` are link preset names;
    ``sizes`` in bytes (default 1 KiB … 64 GiB). Each link's dotted line is where its latency
    term equals its bandwidth term: smaller messages are latency-bound. ``mark`` puts a point at
    one size on every curve.
    """
    from .comm import collective_bytes, collective_steps, collective_time
    from .hardware import link_preset

    fig, ax = _axes(ax)
    sizes = list(sizes) if sizes is not None else [2**k for k in range(10, 37)]
    for name in links:
        link = link_preset(name)
        line, = ax.plot(sizes, [collective_time(op, s, n, link) for s in sizes],
                        label=f"{name} ({link.bandwidth / 1e9:.0f} GB/s, "
                              f"{link.latency * 1e6:.0f} µs)")
        steps, per_byte = collective_steps(op, n), collective_bytes(op, 2**30, n) / 2**30
        if steps and per_byte:
            ax.axvline(steps * link.latency * link.bandwidth / per_byte, color=line.get_color(),
                       ls=":", lw=1)
        if mark is not None:
            ax.plot([mark], [collective_time(op, mark, n, link)], "o", color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [2**k for k in range(10, 37, 5)]
    ax.set_xticks(ticks, [_size_label(t) for t in ticks])
    ax.set_xlabel("message size S")
    ax.set_ylabel("seconds (alpha-beta model)")
    ax.set_title(title or f"{op.replace('_', '-')} on n={n} ranks", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3, which="both")
    return fig


def _size_label(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 2**k:
            return f"{n / 2**k:g} {unit}"
    return f"{n} B"


def plot_zero_stages(num_params: int, dp: int, num_microbatches: int = 1,
                     precision: str = "bf16-mixed", optimizer: str = "adamw", axes=None,
                     title: str | None = None):
    """ZeRO stages 0–3 side by side: per-GPU model states (left, GiB) and the bytes each GPU sends
    per optimizer step for data parallelism (right, in units of Ψ 16-bit values, 2Ψ bytes, the
    unit in which Rajbhandari et al. 2020 §7 count DP's 2Ψ and ZeRO-3's 3Ψ).

    Model states from :func:`parmem.model_state_bytes`; communication from
    :func:`parmem.comm.step_comm` with ``m = num_microbatches`` (ZeRO-2 reduce-scatters and
    ZeRO-3 gathers every micro-batch). ``axes``: two matplotlib axes to draw into.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    from .comm import StageShape, collectives
    from .states import model_state_bytes

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
    fig = axes[0].figure
    stages = [0, 1, 2, 3]
    states = [model_state_bytes(num_params, dp, z, precision, optimizer) for z in stages]
    x = np.arange(4)
    _draw_stack(axes[0], [f"ZeRO-{z}" for z in stages],
                [(LABELS[f], COLORS[f], [getattr(st, f) for st in states])
                 for f in ("params", "grads", "optimizer")], total_fmt="{:.1f}")
    axes[0].legend(fontsize=7, frameon=False)
    unit = 2 * num_params  # one 16-bit copy of the parameters
    sent = [collectives(StageShape(params=num_params, seq_len=1, micro_batch=1, hidden=1,
                                   layers=0, num_microbatches=num_microbatches, dp=dp,
                                   zero=z)).dp / unit for z in stages]
    axes[1].bar(x, sent, color="#64B5CD", width=0.65)
    for xi, v in zip(x, sent, strict=True):
        axes[1].annotate(f"{v:.2f}", (xi, v), ha="center", va="bottom", fontsize=8,
                         xytext=(0, 2), textcoords="offset points")
    axes[1].set_xticks(x, [f"ZeRO-{z}" for z in stages], fontsize=8)
    axes[1].set_ylabel("sent per GPU per step (Ψ values)")
    axes[1].margins(y=0.12)
    axes[1].set_title(f"communication, m={num_microbatches}", fontsize=10)
    axes[0].set_title(title or f"model states, Ψ={num_params / 1e9:g}B, d={dp}", fontsize=10)
    return fig


def plot_zero3_vs_tp(spec, seq_len: int, tp: int = 8, dps=(1, 2, 4, 8, 16, 32, 64, 128),
                     flash: bool = True, recompute: str = "none", ax=None,
                     capacity: float | None = 80.0, title: str | None = None):
    """Per-GPU model states and activations of ``spec`` under ZeRO-3 against d, for t = 1 and for
    t = ``tp`` with sequence parallelism (b = 1, one sequence of ``seq_len`` tokens per GPU, no
    dropout), from :func:`parmem.estimate`. Model states fall as 1/d; activations are flat in d and
    divided by t only by TP+SP. ``capacity`` draws a GPU's memory in GiB."""
    from .config import ParallelConfig, TrainingSetup
    from .estimate import estimate

    setup = TrainingSetup(seq_len=seq_len, flash_attention=flash, dropout=False,
                          recompute=recompute)
    series: dict[str, list[float]] = {}
    for t in dict.fromkeys((1, tp)):
        tag = f"t={t}" + (" + SP" if t > 1 else "")
        ests = [estimate(spec, ParallelConfig(dp=d, tp=t, sp=t > 1, zero=3), setup).stages[0]
                for d in dps]
        series[f"model states, {tag}"] = [e.model_states / GIB for e in ests]
        series[f"activations + logits, {tag}"] = [(e.activations + e.logits) / GIB for e in ests]
    fig = plot_lines(list(dps), series, ax=ax, xlabel="data-parallel size d (ZeRO-3)",
                     title=title or f"{spec.name}, s={seq_len}, b=1", logx=True,
                     capacity=capacity)
    ax = ax or fig.axes[0]
    for line in ax.get_lines():  # colour by term, dashes for the TP curves
        label = line.get_label()
        if label.startswith("model states") or label.startswith("activations"):
            line.set_color(COLORS["optimizer" if label.startswith("model") else "activations"])
            line.set_linestyle("-" if "t=1" in label else "--")
    ax.legend(fontsize=8, frameon=False)
    ax.set_yscale("log")
    return fig


__all__ += ["plot_collective_times", "plot_zero_stages", "plot_zero3_vs_tp"]


# ---------------------------------------------------------------------------- pipeline memory
def plot_in_flight(result, ax=None, title: str | None = None, stages=None):
    """Micro-batches each stage holds against time (:func:`parmem.pipeline.in_flight_timeline`),
    one step line per stage; the activations a stage keeps are this count times one micro-batch's
    activations for its layers."""
    from .pipeline import in_flight_timeline

    fig, ax = _axes(ax, figsize=(8, 2.4))
    stages = range(result.p) if stages is None else stages
    for i in stages:
        pts = in_flight_timeline(result, i)
        ax.step([t for t, _ in pts], [c for _, c in pts], where="post", lw=1.4,
                label=f"stage {i} (peak {result.peak_in_flight[i]:g})")
    ax.set_xlim(0, result.step_time)
    ax.set_ylim(0, max(result.peak_in_flight) * 1.15 + 0.2)
    ax.set_xlabel("time (units of one micro-batch forward)")
    ax.set_ylabel("micro-batches held")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_schedules(results, titles=None, width: float = 9.0):
    """For each :func:`parmem.pipeline.simulate` result, its Gantt chart
    (:func:`plot_pipeline`) above the micro-batches each stage holds over time
    (:func:`plot_in_flight`), all on one time axis so that schedules compare at a glance."""
    import matplotlib.pyplot as plt

    results = list(results)
    titles = list(titles) if titles is not None else [None] * len(results)
    ratios = []
    for r in results:
        ratios += [0.45 * r.p + 0.6, 1.9]
    fig, axes = plt.subplots(len(ratios), 1, figsize=(width, sum(ratios) + 0.4),
                             height_ratios=ratios, sharex=True, layout="constrained")
    for k, (r, t) in enumerate(zip(results, titles, strict=True)):
        plot_pipeline(r, ax=axes[2 * k], title=t)
        axes[2 * k].set_xlabel("")
        plot_in_flight(r, ax=axes[2 * k + 1])
        if k < len(results) - 1:
            axes[2 * k + 1].set_xlabel("")
    return fig


def plot_breakdowns(estimates: Mapping[str, Estimate], capacity: int | None = None,
                    title: str | None = None, width: float | None = None):
    """Several estimates side by side, each as its per-stage stacked bars (:func:`plot_breakdown`),
    on a shared GiB axis; the dict key titles each panel."""
    import matplotlib.pyplot as plt

    n = len(estimates)
    fig, axes = plt.subplots(1, n, figsize=(width or 3.2 * n + 1.6, 3.6), sharey=True,
                             layout="constrained", squeeze=False)
    for k, (name, est) in enumerate(estimates.items()):
        ax = axes[0][k]
        labels = [f"{s.stage}\n({s.layers} L)" for s in est.stages]
        _stack(ax, labels, est.stages, capacity, name)
        if k < n - 1:
            ax.get_legend().remove()
        if k:
            ax.set_ylabel("")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_microbatch_sweep(rows, axes=None, title: str | None = None,
                          highlight: int | None = None):
    """Rows of :func:`parmem.analyses.microbatch_sweep` against the micro-batch size b: the peak
    stage's memory and stage 0's activations (left, GiB) and the bubble fraction (right).
    ``highlight`` marks one b."""
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
    fig = axes[0].figure
    bs = [r["b"] for r in rows]
    axes[0].plot(bs, [r["peak_total"] / GIB for r in rows], marker="o", ms=3,
                 label="peak stage, total")
    axes[0].plot(bs, [r["activations"] / GIB for r in rows], marker="o", ms=3,
                 color=COLORS["activations"], label="stage 0 activations")
    axes[1].plot(bs, [r["bubble_fraction"] for r in rows], marker="o", ms=3, color="#C44E52")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [f"{b}\nm={r['m']}" for b, r in zip(bs, rows, strict=True)],
                      fontsize=7)
        ax.set_xlabel("micro-batch size b (and micro-batches m)")
        ax.grid(alpha=0.3)
        if highlight is not None:
            ax.axvline(highlight, color="k", lw=1, ls=":")
    axes[0].set_ylabel("GiB per GPU")
    axes[0].legend(fontsize=8, frameon=False)
    axes[1].set_ylabel("bubble fraction of the step")
    axes[1].set_ylim(0, 1)
    if title:
        axes[0].set_title(title, fontsize=10)
    axes[1].set_title("pipeline bubble", fontsize=10)
    return fig


__all__ += ["plot_in_flight", "plot_schedules", "plot_breakdowns", "plot_microbatch_sweep"]


# ---------------------------------------------------------------------------- part III: TP / SP
#: one colour per model component (:func:`parmem.sharding.tp_param_counts`)
COMPONENT_COLORS = {
    "embedding": "#4C72B0", "positions": "#64B5CD", "attention Q, O": "#DD8452",
    "attention K, V": "#C44E52", "MLP": "#55A868", "experts": "#55A868",
    "shared experts": "#8DBF8B", "router": "#CCB974", "row-parallel biases": "#8172B2",
    "norms": "#8C8C8C", "LM head": "#937860",
}


def _rank_colors(t: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if t <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(t)]


def plot_tp_shards(spec, tp: int, title: str | None = None):
    """Which rank holds which slice of each weight matrix under Megatron tensor parallelism.

    One panel per matrix, written as Y = X·A (A is [in, out]): the embedding [V, h] and the LM
    head [h, V] split the vocabulary, the QKV projection [h, (a + 2·kv)·d] and the MLP input
    split columns (heads, inner width), the output projection and the MLP output split rows, the
    norms are replicated. A colour is a rank; hatching marks a slice more than one rank keeps
    (K and V heads when t > kv_heads; a whole replicated tensor). Shapes are drawn to scale
    within a panel (the longer side is the panel's size; very thin sides are widened)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    from .sharding import tp_param_counts

    tp_param_counts(spec, tp)  # validates t against the shapes
    t, h, d = tp, spec.hidden, spec.head_dim
    a, kv, V = spec.heads, spec.kv_heads, spec.vocab_size
    f = spec.expert_ffn_hidden if spec.is_moe else spec.ffn_hidden
    up = 2 * f if spec.ffn_kind == "swiglu" else f
    colors = _rank_colors(t)
    ranks = list(range(t))
    kv_groups = [list(range(j * t // kv, (j + 1) * t // kv)) for j in range(kv)] if t > kv else \
        [[r] for r in ranks]
    mlp = "expert" if spec.is_moe else "MLP"
    # (title, rows, cols, axis, [(fraction of the split axis, owning ranks)])
    panels = [
        (f"embedding\n[V={V:,}, h]", V, h, "rows", [(1 / t, [r]) for r in ranks]),
        (f"Q | K | V\n[h, (a+2kv)·d], kv={kv}", h, (a + 2 * kv) * d, "cols",
         [(a / t / (a + 2 * kv), [r]) for r in ranks]
         + 2 * [(kv / len(kv_groups) / (a + 2 * kv), g) for g in kv_groups]),
        ("attention out\n[a·d, h]", a * d, h, "rows", [(1 / t, [r]) for r in ranks]),
        (f"{mlp} in{' (gate | up)' if spec.ffn_kind == 'swiglu' else ''}\n[h, {up:,}]", h, up,
         "cols", (up // f) * [(f / up / t, [r]) for r in ranks]),
        (f"{mlp} out\n[{f:,}, h]", f, h, "rows", [(1 / t, [r]) for r in ranks]),
        ("norms\n[h]", 1, h, "cols", [(1.0, ranks)]),
    ]
    if not spec.tied_embeddings:
        panels.append((f"LM head\n[h, V={V:,}]", h, V, "cols", [(1 / t, [r]) for r in ranks]))
    fig, axes = plt.subplots(1, len(panels), figsize=(1.35 * len(panels) + 1.6, 2.5),
                             layout="constrained")
    for ax, (name, rows, cols, axis, parts) in zip(axes, panels, strict=True):
        big = max(rows, cols)
        w, hgt = max(cols / big, 0.06), max(rows / big, 0.06)
        x0, y0 = (1 - w) / 2, (1 - hgt) / 2
        pos = 0.0
        for frac, owners in parts:
            shared = len(owners) > 1
            color = "#BBBBBB" if len(owners) == t and t > 1 else colors[owners[0]]
            if axis == "cols":
                rect = Rectangle((x0 + pos * w, y0), frac * w, hgt)
            else:  # rows: rank 0 on top
                rect = Rectangle((x0, y0 + hgt - (pos + frac) * hgt), w, frac * hgt)
            rect.set(facecolor=color, edgecolor="white", linewidth=0.6,
                     hatch="///" if shared else None)
            ax.add_patch(rect)
            pos += frac
        ax.add_patch(Rectangle((x0, y0), w, hgt, fill=False, edgecolor="black", lw=0.8))
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(name, fontsize=7)
    handles = [Patch(color=colors[r], label=f"rank {r}") for r in ranks[:8]]
    if t > 8:
        handles.append(Patch(color="white", label=f"... rank {t - 1}"))
    handles.append(Patch(facecolor="#BBBBBB", hatch="///", label="every rank"))
    if t > kv:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///",
                             label=f"K/V head on {t // kv} ranks"))
    fig.legend(handles=handles, loc="outside right center", fontsize=7, frameon=False)
    fig.suptitle(title or f"{spec.name}: which rank holds which slice, t = {t}", fontsize=10)
    return fig


def plot_tp_components(spec, tps=(1, 2, 4, 8), bytes_per_param: int = 2, ax=None,
                       capacity: int | None = None, title: str | None = None):
    """Stacked bars: bytes one tensor-parallel rank holds, by model component, for each t.

    ``bytes_per_param`` is 2 for 16-bit weights (or gradients), 12 for mixed-precision Adam's
    fp32 master copy and moments, 16 for all model states (:func:`parmem.sharding.tp_param_counts`
    gives the parameter counts)."""
    import numpy as np

    from .sharding import tp_param_counts

    fig, ax = _axes(ax, figsize=(max(5.0, 0.9 * len(tps) + 3.5), 3.6))
    per_t = [tp_param_counts(spec, t) for t in tps]
    names = list(dict.fromkeys(r.component for rows in per_t for r in rows))
    x = np.arange(len(tps))
    bottom = np.zeros(len(tps))
    for name in names:
        vals = np.array([sum(r.per_rank for r in rows if r.component == name)
                         for rows in per_t]) * bytes_per_param / GIB
        ax.bar(x, vals, bottom=bottom, width=0.65, label=name,
               color=COMPONENT_COLORS.get(name, "#AAAAAA"))
        bottom += vals
    for xi, total in zip(x, bottom, strict=True):
        ax.annotate(f"{total:.2f}" if total < 10 else f"{total:.1f}", (xi, total), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    if capacity:
        ax.axhline(capacity / GIB, color="k", ls="--", lw=1)
    ax.set_xticks(x, [f"t={t}" for t in tps], fontsize=8)
    ax.set_ylabel("GiB per GPU")
    ax.margins(y=0.12)
    ax.set_title(title or f"{spec.name}: {bytes_per_param} bytes per parameter on one rank",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def plot_terms_compare(named, ax=None, title: str | None = None, unit: str = "MiB"):
    """Grouped horizontal bars: the same named byte terms under several settings.

    ``named`` maps a label (e.g. ``"TP"``, ``"TP + SP"``) to a list of terms with ``name`` and
    ``bytes`` (:func:`parmem.activations.layer_terms`); a term missing from a list counts 0."""
    import numpy as np

    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    names = list(dict.fromkeys(t.name for terms in named.values() for t in terms))
    k = len(named)
    fig, ax = _axes(ax, figsize=(7, 0.3 * len(names) * max(k, 2) / 2 + 1.4))
    y = np.arange(len(names))[::-1]
    height = 0.8 / k
    for i, (label, terms) in enumerate(named.items()):
        by = {t.name: t.bytes for t in terms}
        vals = [by.get(n, 0) / scale for n in names]
        total = sum(by.values()) / scale
        ax.barh(y + (k / 2 - i - 0.5) * height, vals, height=height,
                label=f"{label} (total {total:,.1f} {unit})")
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(f"{unit} per layer per micro-batch")
    ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.4, -0.12),
              ncol=1)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_tp_tradeoff(spec, setup, tps=(1, 2, 4, 8), capacity: int | None = None,
                     title: str | None = None):
    """What tensor parallelism buys and what it costs, per GPU, for each t.

    Top: the memory of one GPU (:func:`parmem.estimate`, one pipeline stage, no data
    parallelism). Bottom: the bytes that GPU sends for tensor-parallel all-reduces in one step
    (:func:`parmem.comm.step_comm`), labelled with the size of one all-reduce buffer."""
    import matplotlib.pyplot as plt

    from .comm import step_comm
    from .config import ParallelConfig
    from .estimate import estimate

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.6), layout="constrained",
                                      height_ratios=(3, 2))
    ests = [estimate(spec, ParallelConfig(tp=t), setup) for t in tps]
    labels = [f"t={t}" for t in tps]
    _stack(top, labels, [e.stages[0] for e in ests], capacity,
           title or f"{spec.name}: s={setup.seq_len}, b={setup.micro_batch}")
    sent, bufs = [], []
    for t, e in zip(tps, ests, strict=True):
        c = step_comm(spec, ParallelConfig(tp=t), setup)
        sent.append(c.tp / GIB)
        bufs.append(e.stages[0].comm_buffers)
    bars = bottom.bar(labels, sent, color="#64B5CD", width=0.65)
    for bar, buf, val in zip(bars, bufs, sent, strict=True):
        if buf:
            bottom.annotate(f"{val:.1f} GiB\nbuffer {buf / 2**20:.0f} MiB",
                            (bar.get_x() + bar.get_width() / 2, val), ha="center", va="bottom",
                            fontsize=7, xytext=(0, 2), textcoords="offset points")
    bottom.set_ylabel("GiB sent per GPU\nper step (TP)")
    bottom.margins(y=0.3)
    return fig


def _precision_act_bytes() -> dict:
    from .config import PRECISIONS

    return {k: v["act"] for k, v in PRECISIONS.items()}


PRECISIONS_ACT = _precision_act_bytes()

__all__ += ["COMPONENT_COLORS", "plot_tp_shards", "plot_tp_components", "plot_terms_compare",
            "plot_tp_tradeoff"]


def plot_tradeoff(rows, x: str = "comm_time_s", y: str = "peak_bytes", ax=None,
                  capacity: int | None = None, highlight=None, title: str | None = None,
                  logx: bool = True, xlabel: str | None = None):
    """Scatter of layouts (rows of :func:`parmem.analyses.layout_sweep`): communication against
    peak memory per GPU, one colour per tensor-parallel size t, each point labelled t·p.

    ``y`` is in bytes and drawn in GiB; ``x`` is drawn as given (seconds, or bytes shown in GiB
    when the column name ends in ``bytes``). Layouts over ``capacity`` are drawn hollow;
    ``highlight`` = (d, t, p) rings one layout.
    """
    fig, ax = _axes(ax, figsize=(7, 4))
    scale_x = GIB if x.endswith("bytes") else 1
    ts = sorted({r["t"] for r in rows})
    cmap = __import__("matplotlib").colormaps["viridis"]
    for k, t in enumerate(ts):
        color = cmap(k / max(len(ts) - 1, 1))
        pts = [r for r in rows if r["t"] == t]
        for r in pts:
            over = capacity is not None and r[y] > capacity
            ax.scatter(r[x] / scale_x, r[y] / GIB, s=28, color=color,
                       facecolors="none" if over else color,
                       label=f"t={t}" if r is pts[0] else None)
            ax.annotate(f"{r['t']}·{r['p']}", (r[x] / scale_x, r[y] / GIB), fontsize=6,
                        xytext=(3, 2), textcoords="offset points")
    if highlight is not None:
        d, t, p = highlight
        for r in rows:
            if (r["d"], r["t"], r["p"]) == (d, t, p):
                ax.scatter(r[x] / scale_x, r[y] / GIB, s=160, facecolors="none",
                           edgecolors="#C44E52", linewidths=2)
    if capacity is not None:
        ax.axhline(capacity / GIB, color="k", ls="--", lw=1)
    if logx:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel or ("communication per GPU per step (GiB)" if scale_x == GIB else
                             "communication time per step (s, alpha-beta, no overlap)"))
    ax.set_ylabel("peak memory per GPU (GiB)")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, frameon=False, loc="upper right", title="labels: t·p",
              title_fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return fig


__all__ += ["plot_tradeoff"]


# ---------------------------------------------------------------------------- the planner
def plot_pareto(plan, ax=None, title: str | None = None, label_top: int = 5):
    """Memory per GPU against modelled step time for a :func:`parmem.planner.plan` result.

    Grey dots: every feasible layout the planner estimated; the line: the Pareto front (no other
    layout is both faster and smaller); numbered dots: the ``label_top`` fastest (rank 1 is the
    best); dashed line: the usable memory, ``(1 − headroom)`` of the GPU."""
    fig, ax = _axes(ax)
    if plan.points:
        ax.scatter([t for _, t in plan.points], [m / GIB for m, _ in plan.points], s=10,
                   color="#B0B0B0", label="feasible layouts", zorder=1)
    if plan.pareto:
        xs = [c.step_time for c in plan.pareto]
        ys = [c.peak_bytes / GIB for c in plan.pareto]
        ax.step(xs, ys, where="post", color=COLORS["params"], lw=1.5, label="Pareto front",
                zorder=2)
        ax.scatter(xs, ys, s=18, color=COLORS["params"], zorder=3)
    for rank, c in enumerate(plan.candidates[:label_top], 1):
        ax.scatter([c.step_time], [c.peak_bytes / GIB], s=60 if rank == 1 else 30,
                   marker="*" if rank == 1 else "o", color=COLORS["optimizer"], zorder=4)
        ax.annotate(str(rank), (c.step_time, c.peak_bytes / GIB), xytext=(4, 3),
                    textcoords="offset points", fontsize=8)
    ax.axhline(plan.usable_bytes / GIB, color="k", ls="--", lw=1)
    ax.annotate(f"{plan.usable_bytes / GIB:.0f} GiB usable", (1.0, plan.usable_bytes / GIB),
                xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8)
    ax.set_xlabel("modelled step time (s)")
    ax.set_ylabel("peak GiB per GPU")
    ax.set_title(title or f"{plan.spec.name} on {plan.cluster}: "
                 f"{plan.global_batch} x {plan.seq_len} tokens per step", fontsize=10)
    if plan.points:
        ax.legend(fontsize=7, frameon=False, loc="lower right")
    else:
        ax.text(0.5, 0.5, plan.message or "no layout fits", transform=ax.transAxes,
                ha="center", va="center", fontsize=8, wrap=True)
    ax.grid(alpha=0.3)
    return fig


__all__ += ["plot_pareto"]


def plot_axis_steps(estimates: Mapping[str, Estimate], ax=None, capacity: int | None = None,
                    title: str | None = None):
    """One line per memory term of the peak stage across a sequence of layouts (for example
    :func:`parmem.analyses.axis_by_axis`), on a log scale, with the total in black: a term's line
    drops at the step whose axis shards it."""
    fig, ax = _axes(ax, figsize=(max(6.0, 0.9 * len(estimates) + 3), 3.8))
    labels = list(estimates)
    peaks = [e.peak for e in estimates.values()]
    x = range(len(labels))
    for f in ("params", "grads", "optimizer", "activations", "logits"):
        vals = [getattr(b, f) / GIB for b in peaks]
        if any(vals):
            ax.plot(x, [v if v > 0 else float("nan") for v in vals], marker="o", ms=4,
                    color=COLORS[f], label=LABELS[f])
    totals = [b.total / GIB for b in peaks]
    ax.plot(x, totals, marker="s", ms=5, color="k", lw=2, label="total")
    for xi, v in zip(x, totals, strict=True):
        ax.annotate(f"{v:,.0f}" if v >= 100 else f"{v:.1f}", (xi, v), fontsize=7, ha="center",
                    xytext=(0, 5), textcoords="offset points")
    if capacity:
        ax.axhline(capacity / GIB, color="k", ls="--", lw=1)
        ax.annotate(f"{capacity / GIB:.0f} GiB GPU", (len(labels) - 1, capacity / GIB),
                    ha="right", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, fontsize=8, rotation=20)
    ax.set_ylabel("GiB per GPU (log scale)")
    ax.grid(alpha=0.3, which="both", axis="y")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


__all__ += ["plot_axis_steps"]


# ---------------------------------------------------------------------------- part VI
def plot_replay(results, ax=None, title: str | None = None, unit: str = "GiB"):
    """Reserved memory against event index for :func:`parmem.allocator.replay` results of the
    same events (one line each, e.g. ``{"default": r1, "expandable segments": r2}``), with the
    bytes the tensors asked for (``requested``) dashed in black: the gap is the allocator's."""
    scale = {"MiB": 2**20, "GiB": GIB}[unit]
    fig, ax = _axes(ax, figsize=(7.5, 3.4))
    first = next(iter(results.values()))
    ax.plot([v / scale for v in first.requested], color="k", ls="--", lw=1,
            label=f"requested (peak {first.peak_requested / scale:,.2f})")
    for (name, r), color in zip(results.items(), ("#C44E52", "#4C72B0", "#55A868", "#8172B2"),
                                strict=False):
        ax.plot([v / scale for v in r.reserved], color=color, lw=1.5,
                label=f"reserved, {name} (peak {r.peak_reserved / scale:,.2f})")
    ax.set_xlabel("allocation event")
    ax.set_ylabel(f"{unit} on the GPU")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    return fig


def plot_kv_cache_sim(sims, ax=None, title: str | None = None):
    """KV-cache slots set aside (solid) and tokens actually stored (dashed) per decoding step for
    :func:`parmem.inference.simulate_kv_cache` results, with the capacity dashed in grey."""
    fig, ax = _axes(ax, figsize=(7.5, 4.0))
    cap = 0
    for (name, s), color in zip(sims.items(), ("#C44E52", "#4C72B0", "#55A868"), strict=False):
        ax.plot([a / 1e3 for a in s.allocated], color=color, lw=1.2,
                label=f"{name}: set aside ({s.utilization:.0%} used, {s.steps:,} steps)")
        ax.plot([x / 1e3 for x in s.stored], color=color, lw=1, ls="--",
                label=f"{name}: tokens stored")
        cap = max(cap, s.capacity)
    ax.axhline(cap / 1e3, color="0.5", ls=":", lw=1)
    ax.set_xlabel("decoding step")
    ax.set_ylabel("thousand tokens of KV cache")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return fig


def plot_stacked(rows, ax=None, capacity: int | None = None, title: str | None = None,
                 colors=None, capacity_label: str | None = None):
    """Stacked bars of named byte components: ``rows`` maps a bar label to ``{component: bytes}``
    (components in the order of the first row); GiB on the y axis; an optional capacity line,
    labelled ``capacity_label`` (default "<n> GiB GPU")."""

    fig, ax = _axes(ax, figsize=(max(5.0, 1.2 * len(rows) + 2.5), 3.6))
    labels = list(rows)
    comps = list(dict.fromkeys(c for r in rows.values() for c in r))
    palette = colors or {}
    default = ("#4C72B0", "#C44E52", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#8C8C8C")
    series = [(c, palette.get(c, default[i % len(default)]), [rows[k].get(c, 0) for k in labels])
              for i, c in enumerate(comps)]
    _draw_stack(ax, labels, series, capacity, title, capacity_label)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


__all__ += ["plot_replay", "plot_kv_cache_sim", "plot_stacked"]
