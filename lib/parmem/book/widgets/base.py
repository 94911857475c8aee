"""What every explorer shares: :func:`explorer` (controls, a render function, an output area that
redraws), the controls themselves (:func:`dropdown`, :func:`slider`, :func:`int_slider`,
:func:`float_slider`, :func:`checkbox`: each checks its starting value first, so an explorer's
argument outside a control's range is a ``ValueError`` naming that argument, not a traitlets
error), the one error message a render returns for an invalid combination, and small helpers.

Executed headless (CI, the static site) an explorer also leaves the figure for its default
values as a plain image, so a reader without a kernel still sees it. ipywidgets and matplotlib
are imported lazily.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..._check import boolean, integer, number
from ...config import TrainingSetup
from ...hardware import hardware_preset
from ...model import ModelSpec
from ...units import GIB

__all__ = [
    "STYLE",
    "DEFAULT_GPU_GIB",
    "explorer",
    "dropdown",
    "slider",
    "int_slider",
    "float_slider",
    "checkbox",
    "text",
    "gib",
    "show_static",
    "error_html",
    "divisors",
    "fit_seq_len",
    "model_setup",
]

#: The style of every control: the description is shown in full.
STYLE = {"description_width": "initial"}

#: The explorers' default GPU capacity: the H100 SXM preset's memory as nvidia-smi reports it
#: (79.6 GiB for a GPU sold as "80 GB"), the book's one convention for "fits".
DEFAULT_GPU_GIB = round(hardware_preset("h100-sxm").memory_bytes / GIB, 1)


def show_static(fig) -> None:
    """Display a matplotlib figure as a plain image and close it."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    display(fig)
    plt.close(fig)


def explorer(
    controls: Mapping[str, Any],
    render: Callable[..., object],
    static: bool = True,
    columns: int = 3,
):
    """A dashboard: ``controls`` (name → ipywidget) laid out in a grid above an output area that
    shows ``render(**values)`` (a matplotlib Figure, or anything displayable) and redraws on
    change. With ``static=True`` the figure for the initial values is also displayed as a plain
    image below the widget. Returns the widget (display it as the cell's last expression).
    Every explorer of the book is built with it."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    boolean("static", static)
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
    rows = [w.HBox(items[i : i + columns]) for i in range(0, len(items), columns)]
    for c in items:
        c.observe(
            lambda _change: redraw(**{k: v.value for k, v in controls.items()}), names="value"
        )
    redraw(**{k: v.value for k, v in controls.items()})
    box = w.VBox([*rows, out])
    if static:
        fig = render(**{k: v.value for k, v in controls.items()})
        if hasattr(fig, "savefig"):
            show_static(fig)
    return box


def _one_of(name: str, value: Any, options: Sequence[Any]) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is one of ``options`` (of the same
    type: ``4.0`` is not the option ``4``, ``True`` is not ``1``)."""
    if not any(type(value) is type(o) and value == o for o in options):
        shown = ", ".join(map(repr, options[:12])) + (", ..." if len(options) > 12 else "")
        raise ValueError(f"{name}={value!r:.60} must be one of {shown}")


def dropdown(name: str, value: Any, options: Sequence[Any], description: str, **kw: Any):
    """An ``ipywidgets.Dropdown`` of ``options`` starting at ``value`` (the explorer's argument
    ``name``, checked to be one of them)."""
    import ipywidgets as w

    options = list(options)
    _one_of(name, value, options)
    return w.Dropdown(options=options, value=value, description=description, style=STYLE, **kw)


def slider(name: str, value: Any, options: Sequence[Any], description: str, **kw: Any):
    """An ``ipywidgets.SelectionSlider`` over ``options`` starting at ``value`` (checked to be one
    of them)."""
    import ipywidgets as w

    options = list(options)
    _one_of(name, value, options)
    return w.SelectionSlider(
        options=options, value=value, description=description, style=STYLE, **kw
    )


def int_slider(name: str, value: Any, lo: int, hi: int, description: str, **kw: Any):
    """An ``ipywidgets.IntSlider`` from ``lo`` to ``hi`` starting at ``value`` (checked to be an
    integer in that range)."""
    import ipywidgets as w

    integer(name, value, lo, hi)
    return w.IntSlider(value=value, min=lo, max=hi, description=description, style=STYLE, **kw)


def float_slider(name: str, value: Any, lo: float, hi: float, description: str, **kw: Any):
    """An ``ipywidgets.FloatSlider`` from ``lo`` to ``hi`` starting at ``value`` (checked to be a
    finite number in that range)."""
    import ipywidgets as w

    number(name, value, lo, hi)
    return w.FloatSlider(value=value, min=lo, max=hi, description=description, style=STYLE, **kw)


def checkbox(name: str, value: Any, description: str, **kw: Any):
    """An ``ipywidgets.Checkbox`` starting at ``value`` (checked to be True or False)."""
    import ipywidgets as w

    boolean(name, value)
    return w.Checkbox(value=value, description=description, style=STYLE, **kw)


def text(name: str, value: Any, description: str, **kw: Any):
    """An ``ipywidgets.Text`` starting at ``value`` (checked to be a string)."""
    import ipywidgets as w

    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r:.60} must be a string")
    return w.Text(value=value, description=description, style=STYLE, **kw)


def gib(name: str, value: Any) -> int:
    """A GPU size given in GiB (``gpu_gib``): a finite number > 0 and at most 1 PiB, in bytes."""
    from ...units import GIB

    return int(number(name, value, 0, 2**20, lo_open=True) * GIB)


def error_html(e: Exception, lead: str = "Not a valid layout"):
    """What a render shows instead of a figure when the controls make no valid combination:
    ``lead`` and the ``ValueError``'s message, which names the field and the rule."""
    from IPython.display import HTML

    return HTML(f"<p><b>{lead}:</b> {html.escape(str(e), quote=False)}</p>")


def divisors(n: int, limit: int = 64) -> list[int]:
    """The divisors of ``n`` up to ``limit``, ascending."""
    return [k for k in range(1, min(n, limit) + 1) if n % k == 0]


def fit_seq_len(spec: ModelSpec, seq_len: int) -> int:
    """``seq_len`` cut to the model's positions when they are learned (GPT-style), else as is."""
    return min(seq_len, spec.max_positions) if spec.position == "learned" else seq_len


def model_setup(model: str, seq_len: int, **kw) -> tuple[ModelSpec, TrainingSetup]:
    """The preset ``model`` and a setup of ``seq_len`` tokens (cut by :func:`fit_seq_len`),
    no dropout, and the other fields ``kw``."""
    spec = ModelSpec.preset(model)
    return spec, TrainingSetup(seq_len=fit_seq_len(spec, seq_len), dropout=False, **kw)
