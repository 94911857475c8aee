"""What every explorer shares: :func:`explorer` (controls, a render function, an output area that
redraws), the controls themselves (:func:`dropdown`, :func:`slider`, :func:`int_slider`,
:func:`float_slider`, :func:`checkbox`: each checks its starting value first, so an explorer's
argument outside a control's range is a ``ValueError`` naming that argument, not a traitlets
error), the one error message a render returns for an invalid combination, and small helpers.

Executed headless (CI, the static site) an explorer leaves one figure, for its default values,
as a plain image that a live kernel then redraws in place, so every reader sees one figure. ipywidgets and matplotlib
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
    "EXPLORER_CLASS",
    "figure_bundle",
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


#: The CSS class of every explorer's controls: the site greys them out and says how to run them
#: live (``_static/explore.css``, ``_static/explore.js``); a live kernel ignores it.
EXPLORER_CLASS = "parmem-explorer"
#: The CSS class of the hidden element that carries an explorer's calculator settings.
CALC_QUERY_CLASS = "parmem-calc-query"


def figure_bundle(result: object) -> dict[str, str]:
    """The MIME bundle that shows ``result``: a matplotlib Figure as a PNG (then closed), any other
    object as IPython formats it (``error_html``'s HTML, a table)."""
    import base64
    import io

    if hasattr(result, "savefig"):
        import matplotlib.pyplot as plt

        buf = io.BytesIO()
        result.savefig(buf, format="png", bbox_inches="tight")
        plt.close(result)
        return {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
                "text/plain": "<Figure>"}  # fmt: skip
    from IPython import get_ipython
    from IPython.core.formatters import DisplayFormatter

    shell = get_ipython()
    formatter = shell.display_formatter if shell is not None else DisplayFormatter()
    data, _ = formatter.format(result)
    return dict(data)


def explorer(
    controls: Mapping[str, Any],
    render: Callable[..., object],
    static: bool = True,
    columns: int = 3,
    calculator: Mapping[str, Any] | None = None,
):
    """A dashboard: ``controls`` (name → ipywidget) laid out in a grid, and below them one figure,
    ``render(**values)`` (a matplotlib Figure, or anything displayable), redrawn in place when a
    control moves. Returns the controls (an ``ipywidgets.VBox``); display it as the cell's last
    expression. Every explorer of the book is built with it.

    The figure is a plain display output with a display id, not an ``Output`` widget: executed
    headless (CI, the site) the cell leaves exactly one figure, for the default values, and a live
    kernel updates that same output (``update_display``), so no reader sees the figure twice.
    ``static`` is kept for callers of the earlier API: ``False`` shows the controls only.

    ``calculator``: the explorer's default settings in the calculator's URL names
    (:data:`parmem.book.web.CALC_FIELDS`, e.g. ``{"model": "llama-2-7b", "t": 2}``). They are
    carried as a hidden query string (class ``parmem-calc-query``); on the static site, where the
    controls are inactive, ``_static/explore.js`` turns it into a link to the in-browser
    calculator with the same settings."""
    import html

    import ipywidgets as w

    boolean("static", static)
    items = list(controls.values())
    rows = [w.HBox(items[i : i + columns]) for i in range(0, len(items), columns)]
    if calculator is not None:
        from ..web import calculator_query

        query = html.escape(calculator_query(calculator))
        rows.append(w.HTML(f'<span class="{CALC_QUERY_CLASS}" hidden>{query}</span>'))
    box = _Explorer(rows, render=render, controls=dict(controls), show_figure=static)
    box.add_class(EXPLORER_CLASS)
    for c in items:
        c.observe(lambda _change: box.redraw(), names="value")
    return box


def _explorer_class():
    import IPython.display as ipd  # looked up on each call (the class is built once)
    import ipywidgets as w

    class Explorer(w.VBox):
        """The controls of an explorer; displaying it also displays its figure below."""

        def __init__(self, rows, *, render, controls, show_figure):
            super().__init__(rows)
            self._render, self._controls, self._show = render, controls, show_figure
            self._display_id: str | None = None
            self.figure = figure_bundle(self._draw())  # drawn now: a bad default fails here

        def _draw(self) -> object:
            return self._render(**{k: v.value for k, v in self._controls.items()})

        def redraw(self) -> None:
            self.figure = figure_bundle(self._draw())
            if self._display_id is not None:
                ipd.update_display(self.figure, raw=True, display_id=self._display_id)

        def _ipython_display_(self) -> None:
            ipd.display(self._repr_mimebundle_(), raw=True)
            if self._show:
                import uuid

                self._display_id = uuid.uuid4().hex
                ipd.display(self.figure, raw=True, display_id=self._display_id)

    return Explorer


def _Explorer(rows, **kw):  # noqa: N802 (a class, built on first use: ipywidgets is lazy)
    global _EXPLORER
    if _EXPLORER is None:
        _EXPLORER = _explorer_class()
    return _EXPLORER(rows, **kw)


_EXPLORER: Any = None


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
