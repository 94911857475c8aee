"""ipywidgets dashboards for the book's "Explore" sections.

Every explorer is built with :func:`explorer`: a set of controls, a function that draws a figure
from their values, and an output area that redraws when a control moves. Executed headless (CI,
the static site) the cell also leaves the figure for the default values as a plain image, so a
reader without a kernel still sees it. ipywidgets and matplotlib are imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .config import ParallelConfig, TrainingSetup
from .estimate import estimate
from .model import ModelSpec, presets
from .units import GIB

__all__ = ["explorer", "explore_estimate"]


def _show_static(fig) -> None:
    import matplotlib.pyplot as plt
    from IPython.display import display

    display(fig)
    plt.close(fig)


def explorer(controls: Mapping[str, object], render: Callable[..., object],
             static: bool = True, columns: int = 3):
    """A dashboard: ``controls`` (name → ipywidget) laid out in a grid above an output area that
    shows ``render(**values)`` (a matplotlib Figure, or anything displayable) and redraws on
    change. With ``static=True`` the figure for the initial values is also displayed as a plain
    image below the widget. Returns the widget (display it as the cell's last expression)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    out = w.Output()

    def redraw(**values):
        with out:
            out.clear_output(wait=True)
            result = render(**values)
            if hasattr(result, "savefig"):
                display(result)
                plt.close(result)
            elif result is not None:
                display(result)

    items = list(controls.values())
    rows = [w.HBox(items[i:i + columns]) for i in range(0, len(items), columns)]
    for c in items:
        c.observe(lambda _change: redraw(**{k: v.value for k, v in controls.items()}),
                  names="value")
    redraw(**{k: v.value for k, v in controls.items()})
    box = w.VBox([*rows, out])
    if static:
        fig = render(**{k: v.value for k, v in controls.items()})
        if hasattr(fig, "savefig"):
            _show_static(fig)
    return box


def _divisors(n: int, limit: int = 64) -> list[int]:
    return [k for k in range(1, min(n, limit) + 1) if n % k == 0]


def explore_estimate(model: str = "llama-2-7b", tp: int = 1, pp: int = 1, dp: int = 8,
                     zero: int = 1, seq_len: int = 4096, micro_batch: int = 1,
                     num_microbatches: int = 8, recompute: str = "none", sp: bool = False,
                     flash: bool = False, gpu_gib: float = 80.0, static: bool = True):
    """Model, layout and batch controls bound to :func:`parmem.estimate`; shows every stage's
    memory as stacked bars against a GPU of ``gpu_gib`` GiB."""
    import ipywidgets as w

    from .plots import plot_breakdown

    style = {"description_width": "initial"}
    spec0 = ModelSpec.preset(model)
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "tp": w.SelectionSlider(options=_divisors(spec0.heads, 16), value=tp, description="t",
                                style=style),
        "pp": w.SelectionSlider(options=_divisors(spec0.layers, 16), value=pp, description="p",
                                style=style),
        "dp": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128], value=dp,
                                description="d", style=style),
        "zero": w.IntSlider(value=zero, min=0, max=3, description="ZeRO", style=style),
        "seq_len": w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768],
                                     value=seq_len, description="s", style=style),
        "micro_batch": w.SelectionSlider(options=[1, 2, 4, 8, 16], value=micro_batch,
                                         description="b", style=style),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute", style=style),
        "sp": w.Checkbox(value=sp, description="sequence parallel", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
    }

    def render(model, tp, pp, dp, zero, seq_len, micro_batch, recompute, sp, flash):
        spec = ModelSpec.preset(model)
        try:
            seq = min(seq_len, spec.max_positions) if spec.position == "learned" else seq_len
            est = estimate(spec, ParallelConfig(dp=dp, tp=tp, pp=pp, zero=zero, sp=sp and tp > 1),
                           TrainingSetup(seq_len=seq, micro_batch=micro_batch,
                                         num_microbatches=num_microbatches, recompute=recompute,
                                         flash_attention=flash))
        except ValueError as e:  # an invalid combination: say why instead of drawing
            from IPython.display import HTML

            return HTML(f"<p><b>Not a valid layout:</b> {e}</p>")
        return plot_breakdown(est, capacity=int(gpu_gib * GIB))

    return explorer(controls, render, static=static)


# ---------------------------------------------------------------------------- part II explorers
_SIZES_MIB = [2.0**k for k in range(-10, 16)]  # 1 KiB … 32 GiB, in MiB


def explore_collectives(op: str = "all_reduce", n: int = 8, size_mib: float = 64.0,
                        slow: str = "ib-ndr", fast: str = "nvlink4", static: bool = True):
    """Collective, ranks n and message size → alpha-beta time on two links
    (:func:`parmem.plots.plot_collective_times`); the title gives the bytes each rank sends."""
    import ipywidgets as w

    from .comm import COLLECTIVES, collective_bytes, collective_time
    from .hardware import link_presets
    from .plots import plot_collective_times

    style = {"description_width": "initial"}
    controls = {
        "op": w.Dropdown(options=list(COLLECTIVES), value=op, description="collective",
                         style=style),
        "n": w.SelectionSlider(options=[2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], value=n,
                               description="ranks n", style=style),
        "size_mib": w.SelectionSlider(options=_SIZES_MIB, value=size_mib,
                                      description="S (MiB)", style=style),
        "fast": w.Dropdown(options=link_presets(), value=fast, description="link 1", style=style),
        "slow": w.Dropdown(options=link_presets(), value=slow, description="link 2", style=style),
    }

    def render(op, n, size_mib, fast, slow):
        size = int(size_mib * 2**20)
        sent = collective_bytes(op, size, n)
        times = ", ".join(f"{name} {collective_time(op, size, n, name) * 1e3:.3g} ms"
                          for name in (fast, slow))
        return plot_collective_times(op, n, (fast, slow), mark=size,
                                     title=f"{op.replace('_', '-')}, n={n}, S={size_mib:g} MiB: "
                                           f"each rank sends {sent / 2**20:.4g} MiB; {times}")

    return explorer(controls, render, static=static)


def explore_data_parallel(model: str = "llama-2-7b", global_batch: int = 8, seq_len: int = 4096,
                          grad_buckets: str = "copy", flash: bool = True, zero: int = 0,
                          gpu_gib: float = 80.0, static: bool = True):
    """Fixed global batch B, data-parallel sizes d = 1, 2, 4, … ≤ B: per-GPU memory of each
    (b = B/d sequences per GPU, one micro-batch, no dropout), from :func:`parmem.estimate`."""
    import ipywidgets as w

    from .plots import plot_compare

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "global_batch": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64], value=global_batch,
                                          description="global batch B", style=style),
        "seq_len": w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384],
                                     value=seq_len, description="s", style=style),
        "grad_buckets": w.Dropdown(options=["copy", "view"], value=grad_buckets,
                                   description="DDP buckets", style=style),
        "zero": w.IntSlider(value=zero, min=0, max=3, description="ZeRO", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
    }

    def render(model, global_batch, seq_len, grad_buckets, zero, flash):
        spec = ModelSpec.preset(model)
        if spec.position == "learned":
            seq_len = min(seq_len, spec.max_positions)
        ests = {}
        d = 1
        while d <= global_batch and d <= 64:
            ests[f"d={d}\nb={global_batch // d}"] = estimate(
                spec, ParallelConfig(dp=d, zero=zero),
                TrainingSetup(seq_len=seq_len, micro_batch=global_batch // d, dropout=False,
                              flash_attention=flash, grad_buckets=grad_buckets))
            d *= 2
        return plot_compare(ests, capacity=int(gpu_gib * GIB),
                            title=f"{model}: global batch {global_batch} × {seq_len} tokens")

    return explorer(controls, render, static=static)


def explore_zero(params_b: float = 7.5, dp: int = 64, num_microbatches: int = 1,
                 static: bool = True):
    """Ψ (billions), d and micro-batches m → per-GPU model states and DP communication of ZeRO
    stages 0–3 (:func:`parmem.plots.plot_zero_stages`, mixed-precision AdamW)."""
    import ipywidgets as w

    from .plots import plot_zero_stages

    style = {"description_width": "initial"}
    controls = {
        "params_b": w.SelectionSlider(options=[1.0, 3.0, 7.0, 7.5, 13.0, 34.0, 70.0, 175.0,
                                               405.0], value=params_b,
                                      description="Ψ (billions)", style=style),
        "dp": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], value=dp,
                                description="d", style=style),
        "num_microbatches": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=num_microbatches,
                                              description="micro-batches m", style=style),
    }

    def render(params_b, dp, num_microbatches):
        return plot_zero_stages(int(params_b * 1e9), dp, num_microbatches)

    return explorer(controls, render, static=static)


def explore_zero3_tp(model: str = "llama-3-70b", seq_len: int = 8192, tp: int = 8,
                     recompute: str = "none", flash: bool = True, gpu_gib: float = 80.0,
                     static: bool = True):
    """Model, sequence length, t and recomputation → per-GPU model states and activations under
    ZeRO-3 against d, with and without TP+SP (:func:`parmem.plots.plot_zero3_vs_tp`)."""
    import ipywidgets as w

    from .plots import plot_zero3_vs_tp

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "seq_len": w.SelectionSlider(options=[2048, 4096, 8192, 16384, 32768, 65536, 131072],
                                     value=seq_len, description="s", style=style),
        "tp": w.SelectionSlider(options=[2, 4, 8, 16], value=tp, description="t", style=style),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
    }

    def render(model, seq_len, tp, recompute, flash):
        spec = ModelSpec.preset(model)
        try:
            if spec.position == "learned" and seq_len > spec.max_positions:
                raise ValueError(f"{model} has learned positions up to {spec.max_positions}")
            return plot_zero3_vs_tp(spec, seq_len, tp, flash=flash, recompute=recompute,
                                    capacity=gpu_gib)
        except ValueError as e:
            from IPython.display import HTML

            return HTML(f"<p><b>Not a valid layout:</b> {e}</p>")

    return explorer(controls, render, static=static)


__all__ += ["explore_collectives", "explore_data_parallel", "explore_zero", "explore_zero3_tp"]


# ---------------------------------------------------------------------------- part III: TP / SP
def _invalid(e: Exception):
    from IPython.display import HTML

    return HTML(f"<p><b>Not a valid layout:</b> {e}</p>")


def explore_tp_shards(model: str = "llama-3-70b", tp: int = 8, static: bool = True):
    """Model and t → which rank holds which slice of every weight
    (:func:`parmem.plots.plot_tp_shards`), with the parameters one rank holds in the title."""
    import ipywidgets as w

    from .plots import plot_tp_shards
    from .sharding import tp_param_counts

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "tp": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=tp, description="t",
                                style=style),
    }

    def render(model, tp):
        spec = ModelSpec.preset(model)
        try:
            rows = tp_param_counts(spec, tp)
        except ValueError as e:
            return _invalid(e)
        mine = sum(r.per_rank for r in rows)
        rep = sum(r.per_rank for r in rows if r.replicated)
        return plot_tp_shards(spec, tp, title=f"{model}, t={tp}: {mine / 1e9:.3g}B parameters "
                                              f"per rank ({rep / 1e6:.3g}M replicated)")

    return explorer(controls, render, static=static, columns=2)


def explore_tp_weights(model: str = "llama-2-7b", max_tp: int = 8, what: str = "weights",
                       gpu_gib: float = 80.0, static: bool = True):
    """Model, largest t and which state → stacked bars of what one tensor-parallel rank holds,
    component by component, for t = 1, 2, 4, … (:func:`parmem.plots.plot_tp_components`)."""
    import ipywidgets as w

    from .plots import plot_tp_components

    per_param = {"weights": 2, "gradients": 2, "optimizer states": 12, "model states": 16}
    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "max_tp": w.SelectionSlider(options=[2, 4, 8, 16, 32], value=max_tp,
                                    description="largest t", style=style),
        "what": w.Dropdown(options=list(per_param), value=what,
                           description="bf16-mixed AdamW", style=style),
    }

    def render(model, max_tp, what):
        spec = ModelSpec.preset(model)
        tps = [t for t in (1, 2, 4, 8, 16, 32) if t <= max_tp and spec.heads % t == 0
               and spec.ffn_hidden % t == 0 and (spec.kv_heads % t == 0 or t % spec.kv_heads == 0)]
        return plot_tp_components(spec, tps, per_param[what], capacity=int(gpu_gib * GIB),
                                  title=f"{model}: {what} ({per_param[what]} B/param) per GPU")

    return explorer(controls, render, static=static)


def explore_tp_tradeoff(model: str = "llama-2-7b", seq_len: int = 4096, micro_batch: int = 1,
                        flash: bool = False, gpu_gib: float = 80.0, static: bool = True):
    """Model, s, b → per-GPU memory and tensor-parallel bytes sent per step for t = 1 … 8
    (:func:`parmem.plots.plot_tp_tradeoff`; no dropout, one micro-batch)."""
    import ipywidgets as w

    from .plots import plot_tp_tradeoff

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "seq_len": w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768],
                                     value=seq_len, description="s", style=style),
        "micro_batch": w.SelectionSlider(options=[1, 2, 4, 8], value=micro_batch,
                                         description="b", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
    }

    def render(model, seq_len, micro_batch, flash):
        spec = ModelSpec.preset(model)
        if spec.position == "learned":
            seq_len = min(seq_len, spec.max_positions)
        tps = [t for t in (1, 2, 4, 8) if spec.heads % t == 0 and spec.ffn_hidden % t == 0]
        try:
            return plot_tp_tradeoff(spec, TrainingSetup(seq_len=seq_len, micro_batch=micro_batch,
                                                        dropout=False, flash_attention=flash),
                                    tps, capacity=int(gpu_gib * GIB))
        except ValueError as e:
            return _invalid(e)

    return explorer(controls, render, static=static, columns=2)


def explore_layer_activations(model: str = "gpt3-175b", seq_len: int = 2048, tp: int = 8,
                              sp: bool = True, recompute: str = "none", flash: bool = False,
                              static: bool = True):
    """Model, s, t, SP, recomputation and FlashAttention → the activation terms one layer keeps
    per micro-batch on one rank (:func:`parmem.activations.kept_terms`), TP alone beside the
    chosen setting. Dropout is on for GPT-shaped presets (GeLU MLP) and off for Llama-shaped
    ones, as each family was trained."""
    import ipywidgets as w

    from .activations import kept_terms
    from .plots import plot_terms_compare

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "seq_len": w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                                              131072], value=seq_len, description="s",
                                     style=style),
        "tp": w.SelectionSlider(options=[1, 2, 4, 8, 16], value=tp, description="t",
                                style=style),
        "sp": w.Checkbox(value=sp, description="sequence parallel", style=style),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
    }

    def render(model, seq_len, tp, sp, recompute, flash):
        spec = ModelSpec.preset(model)
        kw = {"flash": flash, "dropout": spec.ffn_kind == "gelu"}  # Llama-style: no dropout
        try:
            base = kept_terms(spec, seq_len, 1, tp=tp, **kw)
            mine = kept_terms(spec, seq_len, 1, tp=tp, sp=sp and tp > 1, recompute=recompute,
                              **kw)
        except ValueError as e:
            return _invalid(e)
        label = f"t={tp}{' + SP' if sp and tp > 1 else ''}, recompute={recompute}"
        return plot_terms_compare({f"t={tp}, no SP, no recompute": base, label: mine},
                                  title=f"{model}, s={seq_len}, b=1: one layer on one rank")

    return explorer(controls, render, static=static)


__all__ += ["explore_tp_shards", "explore_tp_weights", "explore_tp_tradeoff",
            "explore_layer_activations"]


def _invalid(e: Exception):
    from IPython.display import HTML

    return HTML(f"<p><b>Not a valid layout:</b> {e}</p>")


def explore_experts(model: str = "mixtral-8x7b", dp: int = 16, tp: int = 1, pp: int = 4,
                    zero: int = 1, seq_len: int = 4096, num_microbatches: int = 16,
                    imbalance: float = 1.0, gpu_gib: float = 80.0, static: bool = True):
    """Expert parallelism: the peak stage's memory for every e that divides both the experts and
    d, under a layout (d, t, p, ZeRO) and a router ``imbalance`` (the busiest rank receives that
    many times its even share of tokens, modelled as ``capacity_factor``)."""
    import ipywidgets as w

    from .plots import plot_compare

    style = {"description_width": "initial"}
    moe = [n for n in presets() if ModelSpec.preset(n).is_moe]
    controls = {
        "model": w.Dropdown(options=moe, value=model, description="model", style=style),
        "dp": w.SelectionSlider(options=[8, 16, 32, 64, 128], value=dp, description="d",
                                style=style),
        "tp": w.SelectionSlider(options=[1, 2, 4, 8], value=tp, description="t", style=style),
        "pp": w.SelectionSlider(options=[1, 2, 4, 8], value=pp, description="p", style=style),
        "zero": w.IntSlider(value=zero, min=0, max=3, description="ZeRO", style=style),
        "seq_len": w.SelectionSlider(options=[1024, 2048, 4096, 8192, 16384, 32768],
                                     value=seq_len, description="s", style=style),
        "imbalance": w.FloatSlider(value=imbalance, min=1.0, max=4.0, step=0.25,
                                   description="router imbalance", style=style),
    }

    def render(model, dp, tp, pp, zero, seq_len, imbalance):
        spec = ModelSpec.preset(model)
        es = [e for e in range(1, spec.num_experts + 1) if spec.num_experts % e == 0 and dp % e == 0]
        setup = TrainingSetup(seq_len=seq_len, num_microbatches=num_microbatches,
                              flash_attention=True, dropout=False, capacity_factor=imbalance)
        try:
            ests = {f"e={e}": estimate(spec, ParallelConfig(dp=dp, tp=tp, pp=pp, ep=e, zero=zero,
                                                            sp=tp > 1), setup) for e in es}
        except ValueError as e:
            return _invalid(e)
        return plot_compare(ests, capacity=int(gpu_gib * GIB),
                            title=f"{model}: d={dp}, t={tp}, p={pp}, ZeRO-{zero}, "
                                  f"imbalance {imbalance:g}× (peak stage)")

    return explorer(controls, render, static=static)


def explore_3d(model: str = "llama-3-70b", world: int = 64, tp: int = 8, pp: int = 4,
               seq_len: int = 4096, global_batch: int = 256, zero: int = 1,
               gpu: str = "h100-sxm", gpus_per_node: int = 8, static: bool = True):
    """3D parallelism: every d·t·p layout of ``world`` GPUs as peak memory against modelled
    communication time (:func:`parmem.analyses.layout_sweep`), the chosen (t, p) ringed, and the
    chosen layout's memory per pipeline stage."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .analyses import layout_sweep
    from .hardware import hardware_preset, hardware_presets
    from .plots import plot_breakdown, plot_tradeoff

    style = {"description_width": "initial"}
    powers = [2**k for k in range(0, 11)]
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "world": w.SelectionSlider(options=[8, 16, 32, 64, 128, 256, 512, 1024], value=world,
                                   description="GPUs", style=style),
        "tp": w.SelectionSlider(options=powers[:7], value=tp, description="t", style=style),
        "pp": w.SelectionSlider(options=powers[:8], value=pp, description="p", style=style),
        "seq_len": w.SelectionSlider(options=[1024, 2048, 4096, 8192], value=seq_len,
                                     description="s", style=style),
        "zero": w.IntSlider(value=zero, min=0, max=1, description="ZeRO", style=style),
        "gpu": w.Dropdown(options=hardware_presets(), value=gpu, description="GPU", style=style),
    }

    def render(model, world, tp, pp, seq_len, zero, gpu):
        spec = ModelSpec.preset(model)
        hw = hardware_preset(gpu)
        seq = min(seq_len, spec.max_positions) if spec.position == "learned" else seq_len
        setup = TrainingSetup(seq_len=seq, flash_attention=True, dropout=False)
        batch = max(global_batch, world)
        rows = layout_sweep(spec, world, setup, global_batch=batch, zero=zero, hardware=hw,
                            gpus_per_node=gpus_per_node)
        pick = [r for r in rows if r["t"] == tp and r["p"] == pp]
        if not rows:
            return _invalid(ValueError(f"no valid d·t·p layout of {world} GPUs for {model}"))
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained",
                                       width_ratios=(1.3, 1))
        plot_tradeoff(rows, ax=ax1, capacity=hw.memory_bytes,
                      highlight=(pick[0]["d"], tp, pp) if pick else None,
                      title=f"{model} on {world} × {gpu}, {batch} sequences of {seq}")
        if pick:
            from dataclasses import replace

            r = pick[0]
            est = estimate(spec, ParallelConfig(dp=r["d"], tp=tp, pp=pp, sp=tp > 1, zero=zero),
                           replace(setup, num_microbatches=r["m"]))
            plot_breakdown(est, ax=ax2, capacity=hw.memory_bytes,
                           title=f"d={r['d']}, t={tp}, p={pp}: {r['comm_bytes'] / GIB:,.0f} GiB "
                                 f"sent, {r['comm_time_s']:.2f} s")
            if pp > 8:
                ax2.set_xticks([])
        else:
            ax2.text(0.5, 0.5, f"t={tp}, p={pp} is not a valid layout\nof {world} GPUs here",
                     ha="center", va="center", transform=ax2.transAxes)
            ax2.set_axis_off()
        return fig

    return explorer(controls, render, static=static)


def explore_axes(model: str = "gpt3-175b", dp: int = 24, tp: int = 8, pp: int = 8, cp: int = 1,
                 zero: int = 1, sp: bool = True, recompute: str = "selective",
                 seq_len: int = 2048, num_microbatches: int = 96, gpu_gib: float = 80.0,
                 static: bool = True):
    """Which axis removes which term: the peak stage after adding d, ZeRO, t, SP, p, cp and
    recomputation one at a time (:func:`parmem.analyses.axis_by_axis`), against a GPU."""
    import ipywidgets as w

    from .analyses import axis_by_axis
    from .plots import plot_axis_steps

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "dp": w.SelectionSlider(options=[1, 2, 4, 6, 8, 16, 24, 32, 64, 128], value=dp,
                                description="d", style=style),
        "tp": w.SelectionSlider(options=[1, 2, 4, 8, 16], value=tp, description="t",
                                style=style),
        "pp": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64], value=pp, description="p",
                                style=style),
        "cp": w.SelectionSlider(options=[1, 2, 4, 8, 16], value=cp, description="cp",
                                style=style),
        "zero": w.IntSlider(value=zero, min=0, max=3, description="ZeRO", style=style),
        "sp": w.Checkbox(value=sp, description="sequence parallel", style=style),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute", style=style),
        "seq_len": w.SelectionSlider(options=[1024, 2048, 4096, 8192, 16384, 32768, 131072],
                                     value=seq_len, description="s", style=style),
    }

    def render(model, dp, tp, pp, cp, zero, sp, recompute, seq_len):
        spec = ModelSpec.preset(model)
        try:
            if spec.position == "learned" and seq_len > spec.max_positions:
                raise ValueError(f"seq_len={seq_len} > {model}'s {spec.max_positions} positions")
            par = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, sp=sp and tp > 1)
            steps = axis_by_axis(spec, par, TrainingSetup(
                seq_len=seq_len, num_microbatches=num_microbatches, recompute=recompute,
                flash_attention=seq_len > 8192))
        except ValueError as e:
            return _invalid(e)
        return plot_axis_steps(steps, capacity=int(gpu_gib * GIB),
                               title=f"{model}: adding one axis at a time (peak stage)")

    return explorer(controls, render, static=static)


__all__ += ["explore_experts", "explore_3d", "explore_axes"]


# ---------------------------------------------------------------------------- the planner
def explore_plan(model: str = "llama-3-70b", gpu: str = "h100-sxm", nodes: int = 16,
                 global_batch: int = 256, seq_len: int = 4096, gpus_per_node: int = 8,
                 flash: bool = True, rank: int = 1, top: int = 8, static: bool = True):
    """Model, GPU, node count, global batch and sequence controls bound to
    :func:`parmem.planner.plan`: the Pareto plot of memory against step time, the memory of the
    layout ranked ``rank`` stage by stage, and the top layouts as a table. Plans are cached, so
    moving ``rank`` only redraws."""
    import functools

    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .hardware import hardware_preset, hardware_presets
    from .planner import Cluster, plan
    from .plots import _stack, plot_pareto

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "gpu": w.Dropdown(options=hardware_presets(), value=gpu, description="GPU", style=style),
        "nodes": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], value=nodes,
                                   description=f"nodes (x{gpus_per_node})", style=style),
        "global_batch": w.SelectionSlider(options=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                                          value=global_batch, description="global batch",
                                          style=style),
        "seq_len": w.SelectionSlider(options=[1024, 2048, 4096, 8192, 16384, 32768],
                                     value=seq_len, description="s", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
        "rank": w.IntSlider(value=rank, min=1, max=top, description="show rank", style=style),
    }

    @functools.lru_cache(maxsize=64)
    def planned(model, gpu, nodes, global_batch, seq_len, flash):
        spec = ModelSpec.preset(model)
        seq = min(seq_len, spec.max_positions) if spec.position == "learned" else seq_len
        return plan(spec, Cluster(gpu, gpus_per_node, nodes), global_batch, seq, top=top,
                    flash_attention=flash)

    def render(model, gpu, nodes, global_batch, seq_len, flash, rank):
        try:
            result = planned(model, gpu, nodes, global_batch, seq_len, flash)
        except ValueError as e:  # e.g. no data-parallel size divides the batch
            from IPython.display import HTML

            return HTML(f"<p><b>Cannot plan:</b> {e}</p>")
        fig = plt.figure(figsize=(11, 6.4), layout="constrained")
        grid = fig.add_gridspec(2, 2, height_ratios=(1.25, 1))
        plot_pareto(result, ax=fig.add_subplot(grid[0, 0]))
        ax = fig.add_subplot(grid[0, 1])
        text = fig.add_subplot(grid[1, :])
        text.axis("off")
        if not result.candidates:
            ax.axis("off")
            text.text(0, 1, result.message, va="top", fontsize=9, wrap=True)
            return fig
        pick = result.candidates[min(rank, len(result.candidates)) - 1]
        est = pick.estimate
        _stack(ax, [f"stage {s.stage}" for s in est.stages], est.stages,
               hardware_preset(gpu).memory_bytes,
               f"rank {result.candidates.index(pick) + 1}: {pick.label()}")
        lines = result.table().splitlines()
        text.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=7.5)
        return fig

    return explorer(controls, render, static=static, columns=4)


__all__ += ["explore_plan"]


# ---------------------------------------------------------------------------- part IV explorers
def _html_error(e: Exception):
    from IPython.display import HTML

    return HTML(f"<p><b>Not a valid layout:</b> {e}</p>")


def _model_setup(model: str, seq_len: int, **kw) -> tuple[ModelSpec, TrainingSetup]:
    spec = ModelSpec.preset(model)
    seq = min(seq_len, spec.max_positions) if spec.position == "learned" else seq_len
    return spec, TrainingSetup(seq_len=seq, dropout=False, **kw)


def explore_pp_memory(model: str = "llama-2-13b", seq_len: int = 4096, micro_batch: int = 1,
                      num_microbatches: int = 16, schedule: str = "1f1b",
                      recompute: str = "none", flash: bool = True, gpu_gib: float = 80.0,
                      static: bool = True):
    """Pipeline size p → memory of the first and of the last stage (one GPU each, no other
    parallelism, no dropout), from :func:`parmem.estimate`: weights fall as 1/p, the first stage's
    activations do not (1F1B)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .plots import plot_compare

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "seq_len": w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384], value=seq_len,
                                     description="s", style=style),
        "micro_batch": w.SelectionSlider(options=[1, 2, 4, 8], value=micro_batch,
                                         description="b", style=style),
        "num_microbatches": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64],
                                              value=num_microbatches, description="m",
                                              style=style),
        "schedule": w.Dropdown(options=["gpipe", "1f1b"], value=schedule,
                               description="schedule", style=style),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
    }

    def render(model, seq_len, micro_batch, num_microbatches, schedule, recompute, flash):
        spec, setup = _model_setup(model, seq_len, micro_batch=micro_batch,
                                   num_microbatches=num_microbatches, schedule=schedule,
                                   recompute=recompute, flash_attention=flash)
        ps = [p for p in (1, 2, 4, 8, 16) if p <= spec.layers]
        ests = {f"p={p}": estimate(spec, ParallelConfig(pp=p), setup) for p in ps}
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True, layout="constrained")
        plot_compare(ests, ax=axes[0], stage=0, capacity=int(gpu_gib * GIB),
                     title=f"{model}: first stage")
        axes[0].get_legend().remove()
        plot_compare(ests, ax=axes[1], stage=-1, capacity=int(gpu_gib * GIB),
                     title="last stage")
        axes[1].set_ylabel("")
        return fig

    return explorer(controls, render, static=static, columns=4)


def explore_schedules(p: int = 4, m: int = 8, schedules=("gpipe", "1f1b"), static: bool = True):
    """p and m → the timelines of ``schedules`` (:func:`parmem.pipeline.simulate`, t_b = 2 t_f)
    and the micro-batches each stage holds over time (:func:`parmem.plots.plot_schedules`)."""
    import ipywidgets as w

    from .pipeline import simulate
    from .plots import plot_schedules

    style = {"description_width": "initial"}
    controls = {
        "p": w.IntSlider(value=p, min=1, max=8, description="stages p", style=style),
        "m": w.IntSlider(value=m, min=1, max=24, description="micro-batches m", style=style),
    }

    def render(p, m):
        results = [simulate(s, p, m) for s in schedules]
        titles = [f"{r.schedule}: p={p}, m={m}, bubble {r.bubble_fraction:.0%}, stage 0 holds "
                  f"{r.peak_in_flight[0]:g} micro-batches" for r in results]
        return plot_schedules(results, titles)

    return explorer(controls, render, static=static)


def explore_bubble(schedule: str = "interleaved", p: int = 4, m: int = 8, v: int = 2,
                   static: bool = True):
    """Schedule, p, m and v → the simulated timeline, its bubble fraction and the micro-batches
    (activations) each stage holds over time; the title compares with plain 1F1B."""
    import ipywidgets as w

    from .pipeline import simulate
    from .plots import plot_schedules

    style = {"description_width": "initial"}
    controls = {
        "schedule": w.Dropdown(options=["gpipe", "1f1b", "interleaved"], value=schedule,
                               description="schedule", style=style),
        "p": w.IntSlider(value=p, min=1, max=8, description="stages p", style=style),
        "m": w.IntSlider(value=m, min=1, max=32, description="micro-batches m", style=style),
        "v": w.IntSlider(value=v, min=2, max=4, description="chunks v (interleaved)",
                         style=style),
    }

    def render(schedule, p, m, v):
        try:
            r = simulate(schedule, p, m, v if schedule == "interleaved" else 1)
        except ValueError as e:
            return _html_error(e)
        base = simulate("1f1b", p, m)
        title = (f"{schedule}: p={p}, m={m}" + (f", v={v}" if r.v > 1 else "")
                 + f": bubble {r.bubble_fraction:.1%} (1F1B {base.bubble_fraction:.1%}), "
                 f"stage 0 holds {r.peak_in_flight[0]:g} micro-batches "
                 f"(1F1B {base.peak_in_flight[0]:g})")
        return plot_schedules([r], [title])

    return explorer(controls, render, static=static, columns=4)


def explore_stage_balance(model: str = "llama-2-7b", pp: int = 4, seq_len: int = 4096,
                          micro_batch: int = 1, num_microbatches: int = 16,
                          recompute: str = "none", flash: bool = True, split: str = "",
                          gpu_gib: float = 80.0, static: bool = True):
    """Model, p and batch → every stage's memory under the even split, the split of
    :func:`parmem.analyses.balance_layers` that minimises the peak stage, and (if typed, e.g.
    ``"6,9,9,8"``) a split of your own."""
    import ipywidgets as w

    from .analyses import balance_layers
    from .plots import plot_breakdowns

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "pp": w.SelectionSlider(options=[2, 3, 4, 6, 8, 12, 16], value=pp, description="p",
                                style=style),
        "seq_len": w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384], value=seq_len,
                                     description="s", style=style),
        "micro_batch": w.SelectionSlider(options=[1, 2, 4, 8], value=micro_batch,
                                         description="b", style=style),
        "num_microbatches": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64],
                                              value=num_microbatches, description="m",
                                              style=style),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
        "split": w.Text(value=split, description="your split", placeholder="e.g. 6,9,9,8",
                        style=style, continuous_update=False),
    }

    def render(model, pp, seq_len, micro_batch, num_microbatches, recompute, flash, split):
        spec, setup = _model_setup(model, seq_len, micro_batch=micro_batch,
                                   num_microbatches=num_microbatches, recompute=recompute,
                                   flash_attention=flash)
        par = ParallelConfig(pp=pp)
        try:
            even = estimate(spec, par, setup)
            best = balance_layers(spec, par, setup)
            ests = {f"even, peak {even.peak_bytes / GIB:.1f} GiB": even}
            bal = estimate(spec, par, setup, layers_per_stage=best)
            ests[f"balanced, peak {bal.peak_bytes / GIB:.1f} GiB"] = bal
            if split.strip():
                lps = [int(x) for x in split.replace(" ", "").split(",") if x]
                own = estimate(spec, par, setup, layers_per_stage=lps)
                ests[f"yours, peak {own.peak_bytes / GIB:.1f} GiB"] = own
        except ValueError as e:
            return _html_error(e)
        return plot_breakdowns(ests, capacity=int(gpu_gib * GIB),
                               title=f"{model}, p={pp}, s={setup.seq_len}, b={micro_batch}, "
                                     f"m={num_microbatches}, 1F1B")

    return explorer(controls, render, static=static, columns=4)


def explore_microbatch(model: str = "llama-2-7b", pp: int = 4, global_batch: int = 32,
                       micro_batch: int = 2, seq_len: int = 4096, schedule: str = "1f1b",
                       recompute: str = "none", flash: bool = True, static: bool = True):
    """A fixed batch of ``global_batch`` sequences per pipeline and step, cut into m = B/b
    micro-batches: memory of the peak stage and the bubble for every b
    (:func:`parmem.analyses.microbatch_sweep`), with the chosen b marked."""
    import ipywidgets as w

    from .analyses import microbatch_sweep
    from .plots import plot_microbatch_sweep

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "pp": w.SelectionSlider(options=[1, 2, 4, 8], value=pp, description="p", style=style),
        "global_batch": w.SelectionSlider(options=[4, 8, 16, 32, 64, 128], value=global_batch,
                                          description="B (sequences/step)", style=style),
        "micro_batch": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128],
                                         value=micro_batch, description="b", style=style),
        "seq_len": w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192], value=seq_len,
                                     description="s", style=style),
        "schedule": w.Dropdown(options=["gpipe", "1f1b"], value=schedule,
                               description="schedule", style=style),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute", style=style),
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
    }

    def render(model, pp, global_batch, micro_batch, seq_len, schedule, recompute, flash):
        spec, setup = _model_setup(model, seq_len, schedule=schedule, recompute=recompute,
                                   flash_attention=flash)
        try:
            rows = microbatch_sweep(spec, ParallelConfig(pp=pp), setup,
                                    global_batch=global_batch)
        except ValueError as e:
            return _html_error(e)
        pick = [r for r in rows if r["b"] == micro_batch]
        title = f"{model}, p={pp}, B={global_batch}, {schedule}"
        if pick:
            r = pick[0]
            title += (f": b={r['b']}, m={r['m']} -> peak {r['peak_total'] / GIB:.1f} GiB, "
                      f"bubble {r['bubble_fraction']:.0%}")
        return plot_microbatch_sweep(rows, title=title,
                                     highlight=micro_batch if pick else None)

    return explorer(controls, render, static=static, columns=4)


__all__ += ["explore_pp_memory", "explore_schedules", "explore_bubble", "explore_stage_balance",
            "explore_microbatch"]


# ---------------------------------------------------------------------------- part VI explorers
def explore_allocator(model: str = "llama-2-7b", tp: int = 2, pp: int = 2, seq_len: int = 4096,
                      jitter: float = 0.25, steps: int = 3, flash: bool = True,
                      static: bool = True):
    """Model, layout and sequence-length variation bound to the caching-allocator simulator:
    :func:`parmem.allocator.training_step_events` for ``steps`` training steps of lengths
    s·(1 + ``jitter``·u) with u = 0, −1, +1, −½, +½, −¾, +¾, +¼ in turn (rounded to multiples of
    128), replayed with and without expandable segments (:func:`parmem.plots.plot_replay`)."""
    import ipywidgets as w

    from .allocator import replay, training_step_events
    from .plots import plot_replay

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "tp": w.SelectionSlider(options=[1, 2, 4, 8], value=tp, description="t", style=style),
        "pp": w.SelectionSlider(options=[1, 2, 4, 8], value=pp, description="p", style=style),
        "seq_len": w.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384],
                                     value=seq_len, description="s", style=style),
        "jitter": w.FloatSlider(value=jitter, min=0.0, max=0.5, step=0.05,
                                description="length spread", style=style),
        "steps": w.IntSlider(value=steps, min=1, max=8, description="steps", style=style),
        # (lengths follow a fixed pattern so that a figure is reproducible)
        "flash": w.Checkbox(value=flash, description="FlashAttention", style=style),
    }

    def render(model, tp, pp, seq_len, jitter, steps, flash):
        spec = ModelSpec.preset(model)
        top = spec.max_positions if spec.position == "learned" else 1 << 30
        pattern = (0, -1, 1, -0.5, 0.5, -0.75, 0.75, 0.25)
        lens = [max(128, min(top, round(seq_len * (1 + jitter * u) / 128) * 128))
                for u in pattern[:steps]]
        try:
            par = ParallelConfig(tp=tp, pp=pp, sp=tp > 1)
            ev = training_step_events(spec, par, TrainingSetup(
                seq_len=lens[0], num_microbatches=max(pp, 1), flash_attention=flash,
                dropout=False), seq_lens=lens)
        except ValueError as e:
            from IPython.display import HTML

            return HTML(f"<p><b>Not a valid layout:</b> {e}</p>")
        runs = {"default": replay(ev), "expandable segments": replay(ev, expandable_segments=True)}
        return plot_replay(runs, title=f"{model}, t={tp}, p={pp}, stage 0, s = {lens}")

    return explorer(controls, render, static=static, columns=4)


def explore_serving(model: str = "llama-3-70b", weight_dtype: str = "fp16",
                    kv_dtype: str = "fp16", seq_len: int = 8192, batch: int = 32,
                    gpu: str = "h100-sxm", utilization: float = 0.9, static: bool = True):
    """Serving memory per GPU for every tensor-parallel size t in 1, 2, 4, 8: weights
    (:func:`parmem.inference.serving_weight_bytes`) and the KV cache of ``batch`` sequences of
    ``seq_len`` tokens, against the usable memory; each bar's label says how many such sequences
    fit (:func:`parmem.inference.max_concurrency`)."""
    import ipywidgets as w

    from .hardware import hardware_preset, hardware_presets
    from .inference import (
        KV_DTYPES,
        WEIGHT_DTYPES,
        kv_cache_bytes,
        max_concurrency,
        serving_weight_bytes,
    )
    from .plots import plot_stacked

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "gpu": w.Dropdown(options=hardware_presets(), value=gpu, description="GPU", style=style),
        "weight_dtype": w.Dropdown(options=[k for k in WEIGHT_DTYPES if k != "fp32"],
                                   value=weight_dtype, description="weights", style=style),
        "kv_dtype": w.Dropdown(options=list(KV_DTYPES), value=kv_dtype,
                               description="KV cache", style=style),
        "seq_len": w.SelectionSlider(options=[1024, 2048, 4096, 8192, 16384, 32768, 131072],
                                     value=seq_len, description="context", style=style),
        "batch": w.SelectionSlider(options=[1, 4, 8, 16, 32, 64, 128, 256], value=batch,
                                   description="sequences", style=style),
    }

    def render(model, gpu, weight_dtype, kv_dtype, seq_len, batch):
        spec = ModelSpec.preset(model)
        rows = {}
        for t in (1, 2, 4, 8):
            try:
                wb = serving_weight_bytes(spec, weight_dtype, t)
                kv = kv_cache_bytes(spec, seq_len, batch, kv_dtype, t)
                n = max_concurrency(spec, seq_len, gpu, t, weight_dtype, kv_dtype, utilization)
            except ValueError:
                continue
            rows[f"t={t}\n{n:,} fit"] = {"weights": wb, f"KV cache ({batch} seqs)": kv}
        cap = int(hardware_preset(gpu).memory_bytes * utilization)
        return plot_stacked(rows, capacity=cap, capacity_label=f"{utilization:.0%} of {gpu}",
                            title=f"{model} serving on {gpu}: {weight_dtype} weights, "
                                  f"{kv_dtype} KV, {seq_len:,} tokens per sequence")

    return explorer(controls, render, static=static, columns=3)


__all__ += ["explore_allocator", "explore_serving"]


def explore_remedies(model: str = "llama-3-70b", seq_len: int = 32768, tp: int = 8, pp: int = 4,
                     dp: int = 8, micro_batch: int = 2, tokens_per_step: int = 16,
                     zero: int = 0, sp: bool = False, cp: int = 1, recompute: str = "none",
                     gpu: str = "h100-sxm", static: bool = True):
    """A long-sequence layout and the remedies of chapter 20 as controls: ZeRO stage
    (distributed optimizer), sequence parallelism, context parallelism, recomputation and the
    micro-batch size b (with m = ``tokens_per_step``/b micro-batches, so the batch per step is
    fixed); FlashAttention on, no dropout. Draws every stage against the GPU's memory."""
    import ipywidgets as w

    from .hardware import hardware_preset, hardware_presets
    from .plots import plot_breakdown

    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=presets(), value=model, description="model", style=style),
        "gpu": w.Dropdown(options=hardware_presets(), value=gpu, description="GPU", style=style),
        "seq_len": w.SelectionSlider(options=[4096, 8192, 16384, 32768, 65536, 131072],
                                     value=seq_len, description="s", style=style),
        "tp": w.SelectionSlider(options=[1, 2, 4, 8], value=tp, description="t", style=style),
        "pp": w.SelectionSlider(options=[1, 2, 4, 8, 16], value=pp, description="p",
                                style=style),
        "dp": w.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=dp, description="d",
                                style=style),
        "micro_batch": w.SelectionSlider(options=[1, 2, 4, 8], value=micro_batch,
                                         description="b", style=style),
        "zero": w.IntSlider(value=zero, min=0, max=3, description="ZeRO", style=style),
        "cp": w.SelectionSlider(options=[1, 2, 4, 8], value=cp, description="cp", style=style),
        "sp": w.Checkbox(value=sp, description="sequence parallel", style=style),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=recompute,
                                description="recompute", style=style),
    }

    def render(model, gpu, seq_len, tp, pp, dp, micro_batch, zero, cp, sp, recompute):
        spec = ModelSpec.preset(model)
        try:
            if spec.position == "learned" and seq_len > spec.max_positions:
                raise ValueError(f"seq_len={seq_len} > {model}'s {spec.max_positions} positions")
            m = max(tokens_per_step // micro_batch, pp)
            est = estimate(spec, ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero,
                                                sp=sp and tp > 1),
                           TrainingSetup(seq_len=seq_len, micro_batch=micro_batch,
                                         num_microbatches=m, recompute=recompute,
                                         flash_attention=True, dropout=False))
        except ValueError as e:
            from IPython.display import HTML

            return HTML(f"<p><b>Not a valid layout:</b> {e}</p>")
        cap = hardware_preset(gpu).memory_bytes
        verdict = "fits" if est.peak_bytes <= cap else "does not fit"
        return plot_breakdown(est, capacity=cap,
                              title=f"{model}, {est.parallel}, s={seq_len}, b={micro_batch}, "
                                    f"m={m}: peak {est.peak_bytes / GIB:.0f} GiB, {verdict}")

    return explorer(controls, render, static=static, columns=4)


__all__ += ["explore_remedies"]
