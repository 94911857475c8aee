"""ipywidgets dashboards for the book's "Explore" sections.

Every explorer is built with :func:`explorer`: a set of controls, a function that draws a figure
from their values, and an output area that redraws when a control moves. Executed headless (CI,
the static site) the cell also leaves the figure for the default values as a plain image, so a
reader without a kernel still sees it. ipywidgets and matplotlib are imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .memory import GIB, ParallelConfig, TrainingSetup, estimate
from .model import ModelSpec, presets

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
