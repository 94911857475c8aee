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
    src = (":::{admonition} Short answer\n:class: tip\n2{sup}`30` bytes, "
           "{cite:t}`shazeer2019fast`\n:::\nafter")
    out = P.to_commonmark(src)
    assert out == "> **Short answer**\n>\n> 2<sup>30</sup> bytes, Shazeer [2019]\nafter"
    assert "{" not in out


# Written by hand from references.bib (author family names and year), in the form the site's
# sphinxcontrib-bibtex author_year style prints: textual "A et al. [year]", parenthetical
# "[A et al., year]"; one author alone, two joined by "and", an organisation (a braced name) as
# written; several keys in the bibliography's order (by author), joined by commas.
CITES = [
    # Rajbhandari, Rasley, Ruwase, He; 2020
    ("{cite:t}`rajbhandari2020zero`", "Rajbhandari et al. [2020]"),
    ("{cite:p}`rajbhandari2020zero`", "[Rajbhandari et al., 2020]"),
    ("{cite}`rajbhandari2020zero`", "[Rajbhandari et al., 2020]"),
    # Noam Shazeer alone; 2019
    ("{cite:t}`shazeer2019fast`", "Shazeer [2019]"),
    # Patarasuk and Yuan; 2009
    ("{cite:p}`patarasuk2009bandwidth`", "[Patarasuk and Yuan, 2009]"),
    # author = {{NVIDIA}}; 2024
    ("{cite:t}`nvidia2024nccl`", "NVIDIA [2024]"),
    # Dettmers and {bitsandbytes contributors}; 2024
    ("{cite:t}`bitsandbytes2024`", "Dettmers and bitsandbytes contributors [2024]"),
    # Zhao et al. 2023 (PyTorch FSDP) and Liang et al. 2024 (torchtitan): Liang sorts first
    ("{cite:p}`zhao2023pytorch,liang2024torchtitan`", "[Liang et al., 2024, Zhao et al., 2023]"),
    ("{cite:t}`huang2019gpipe, narayanan2021efficient`",
     "Huang et al. [2019], Narayanan et al. [2021]"),
]


@pytest.mark.parametrize(("role", "text"), CITES, ids=[c[0] for c in CITES])
def test_cite_text_writes_author_year(role, text):
    assert P.cite_text(f"as {role} shows.") == f"as {text} shows."


def test_cite_text_leaves_other_text_and_shows_an_unknown_key():
    src = "{glue:text}`x:.1f` GiB, {sup}`2`, `{cite:t}` in code"
    assert P.cite_text(src) == src
    assert P.cite_text("{cite:p}`nosuchkey2099`") == "[nosuchkey2099]"


def test_every_bib_entry_has_authors_and_a_year():
    import re
    from pathlib import Path

    bib = (Path(__file__).resolve().parents[1] / "references.bib").read_text()
    keys = set(re.findall(r"^@\w+\{([^,\s]+),", bib, re.M))
    table = P.citations()
    assert set(table) == keys
    assert all(authors and re.fullmatch(r"\d{4}", year) for authors, year in table.values())


@pytest.mark.parametrize("live", [False, True], ids=["build", "jupyter-server"])
def test_prose_writes_citations_only_in_a_readers_kernel(monkeypatch, live):
    """A kernel that a Jupyter server started (JupyterLab, Binder) has JPY_SESSION_NAME: there
    the citation is author-year text; the build's kernels (nbclient, nbval) have none, and the
    output keeps the role for the site's bibliography."""
    monkeypatch.delitem(__import__("sys").modules, "google.colab", raising=False)
    if live:
        monkeypatch.setenv("JPY_SESSION_NAME", "/home/reader/ch03.ipynb")
    else:
        monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.setattr(P, "_values", {"n": 16})
    bundle = P._bundle("{glue:text}`n` bytes {cite:p}`rajbhandari2020zero`")
    expected = "[Rajbhandari et al., 2020]" if live else "{cite:p}`rajbhandari2020zero`"
    assert bundle["text/markdown"] == f"16 bytes {expected}"


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
