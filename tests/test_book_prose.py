"""parmem.book.prose: glued numbers filled into prose, pending values, Colab's plain Markdown;
and the explorers' one figure (parmem.book.widgets.base.explorer)."""

from __future__ import annotations

import importlib

import pytest

P = importlib.import_module("parmem.book.prose")


def test_fill_formats_and_marks_pending():
    src = "a {glue:text}`x:.1f` GiB, b {glue:text}`n`, c {glue:text}`later:.0%`"
    assert P.names(src) == ["x", "n", "later"]
    assert P.fill(src, {"x": 3.14159, "n": "1,024"}) == f"a 3.1 GiB, b 1,024, c {P.PENDING}"
    assert P.fill(src, {"x": 1.0, "n": 2, "later": 0.5}) == "a 1.0 GiB, b 2, c 50%"


def test_record_updates_a_waiting_paragraph(monkeypatch):
    shown, updated = [], []
    import IPython.display as d

    monkeypatch.setattr(d, "display", lambda data, raw, display_id: shown.append((display_id, data)))
    monkeypatch.setattr(d, "update_display",
                        lambda data, raw, display_id: updated.append((display_id, data)))
    monkeypatch.setattr(P, "_values", {})
    monkeypatch.setattr(P, "_shown", [])
    P.prose("states {glue:text}`s:.1f` GiB")
    assert P.PENDING in shown[0][1]["text/markdown"]
    P.record("other", 1)
    assert not updated  # a value the paragraph does not quote changes nothing
    P.record("s", 100.44)
    assert updated == [(shown[0][0], {"text/markdown": "states 100.4 GiB",
                                      "text/plain": "states 100.4 GiB"})]
    assert P._shown == []  # nothing left to wait for


def test_to_commonmark_turns_myst_into_plain_markdown():
    src = ":::{admonition} Short answer\n:class: tip\n2{sup}`30` bytes, {cite:t}`a, b`\n:::\nafter"
    out = P.to_commonmark(src)
    assert out == "> **Short answer**\n>\n> 2<sup>30</sup> bytes, [a, b]\nafter"
    assert "{" not in out


def test_explorer_leaves_one_figure_and_redraws_in_place(monkeypatch):
    pytest.importorskip("ipywidgets")
    import IPython.display as d

    from parmem.book.widgets import base

    calls = []
    monkeypatch.setattr(d, "display", lambda data, raw, display_id=None: calls.append(
        ("display", display_id, sorted(data))))
    monkeypatch.setattr(d, "update_display", lambda data, raw, display_id: calls.append(
        ("update", display_id, sorted(data))))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def render(n):
        fig, ax = plt.subplots()
        ax.bar([0], [n])
        return fig

    open_before = set(plt.get_fignums())  # other tests in this process may leave figures open
    box = base.explorer({"n": base.int_slider("n", 2, 1, 8, "n")}, render)
    assert base.EXPLORER_CLASS in box._dom_classes
    box._ipython_display_()
    figures = [c for c in calls if c[0] == "display" and "image/png" in c[2]]
    assert len(figures) == 1, calls  # the controls, then one figure
    box.children[0].children[0].value = 3
    assert calls[-1] == ("update", figures[0][1], ["image/png", "text/plain"])
    assert set(plt.get_fignums()) <= open_before  # every figure it drew is closed
