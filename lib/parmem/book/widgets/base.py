"""What every explorer shares: :func:`explorer` (controls, a render function, an output area that
redraws), the one error message a render returns for an invalid combination, and small helpers.

Executed headless (CI, the static site) an explorer also leaves the figure for its default
values as a plain image, so a reader without a kernel still sees it. ipywidgets and matplotlib
are imported lazily.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any

from ...config import TrainingSetup
from ...model import ModelSpec

__all__ = [
    "STYLE",
    "explorer",
    "show_static",
    "error_html",
    "divisors",
    "fit_seq_len",
    "model_setup",
]

#: The style of every control: the description is shown in full.
STYLE = {"description_width": "initial"}


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
