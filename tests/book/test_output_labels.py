"""The labels of the computed outputs in the Chinese edition (issue 33): tables, controls.

The chapters run once, in English; the Chinese build rewrites the labels of those outputs with
one small catalog (``lib/parmem/book/output_labels_zh.toml``, :class:`parmem.book.i18n.
OutputLabels`).

* The rewriting, on outputs written here by hand or drawn by :class:`parmem.book.tables.Table`:
  a table's caption, headers and note become Chinese when the catalog has them (with other
  numbers too), the ``yes``/``no`` cells that Table writes for booleans become 是/否, anything
  else is left as it was, HTML escaping included; so do the headers and note of an Estimate's
  own table; a widget state gets its descriptions and option labels translated, in a copy.
* :func:`parmem.book.i18n.output_labels` lists the labels of an executed notebook that have
  words to translate.
* The committed catalog: every glossary term in a label is translated as the glossary says
  (``chapters/glossary.md``), every number of a label is kept, the book's review terms are
  used (单步耗时 for step time, 重计算 for recomputation), and ``keep`` holds only labels that
  have words (others need no entry) and none that ``[zh]`` also translates.

That the catalog holds every label of the executed chapters, and that the built Chinese pages
show them, is checked after the build: ``tests/browser/test_zh_outputs.py``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

babel = pytest.importorskip("babel.messages.catalog")

from parmem.book import i18n  # noqa: E402
from parmem.book.tables import Table  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "chapters" / "glossary.md"

LABELS = i18n.OutputLabels(
    {
        "stage": "阶段",
        "sent (GiB)": "发送量（GiB）",
        "Stage 0 of 2: bytes per rank": "2 个阶段中的阶段 0：每个 rank 的字节数",
        "a < b & c": "甲 < 乙 & 丙",
        "Named extra: Adam step counters.": "列明的额外开销：Adam 的步数计数器。",
        "activations": "激活值",
    },
    cells={"yes": "是", "no": "否"},
    keep=["DDP"],
    options={"kept": "保留", "activations": "激活值"},
)


def test_a_table_gets_its_caption_headers_note_and_boolean_cells_in_chinese():
    table = Table(
        [{"stage": 0, "sent (GiB)": 1.5, "fits": True, "DDP": "no", "term": "activations"}],
        title="Stage 1 of 4: bytes per rank",  # other numbers than the entry's
        note="Named extra: Adam step counters.",
    )
    out = LABELS.table_html(table._repr_html_())
    assert "<caption>4 个阶段中的阶段 1：每个 rank 的字节数</caption>" in out
    assert "<th>阶段</th><th>发送量（GiB）</th><th>fits</th><th>DDP</th>" in out  # fits: no entry
    assert "<p><small>列明的额外开销：Adam 的步数计数器。</small></p>" in out
    assert out.count('<td style="text-align:right">是</td>') == 1  # the boolean True
    assert out.count('<td style="text-align:right">否</td>') == 1  # the string "no" reads so too
    assert '<td style="text-align:right">1.5</td>' in out  # numbers untouched
    # a row's name stays as its neighbours do (an option's word is not a cell's)
    assert '<td style="text-align:right">activations</td>' in out


def test_escaped_labels_are_matched_and_written_escaped():
    html = Table([{"a < b & c": 1}])._repr_html_()
    assert "<th>a &lt; b &amp; c</th>" in html
    assert "<th>甲 &lt; 乙 &amp; 丙</th>" in LABELS.table_html(html)


def test_a_label_run_on_more_ranks_is_renumbered_where_one_number_became_two():
    """Run on 4 ranks, "rank 0 of 2 (... b=2)" reads "rank 0 of 4 (... b=2)": the entry's 2
    became 4 once and stayed 2 once, which :func:`parmem.book.i18n.renumber` refuses."""
    labels = i18n.OutputLabels({
        "One GPT layer, rank 0 of 2 (h=32, b=2)": "一个 GPT 层，2 个 rank 中的 rank 0（h=32，b=2）",
        "Tiny decoder (L=2, b=2), t=2": "微型解码器（L=2，b=2），t=2",
        "2 ranks: 2 steps": "两步，两个 rank",  # the translation writes no number: no match
    })
    assert labels.lookup("One GPT layer, rank 0 of 4 (h=32, b=2)") == (
        "一个 GPT 层，4 个 rank 中的 rank 0（h=32，b=2）")
    assert labels.lookup("Tiny decoder (L=2, b=2), t=4") == "微型解码器（L=2，b=2），t=4"
    assert labels.lookup("4 ranks: 2 steps") is None
    assert i18n.renumber_in_order("a 2, b 2", ("2", "2"), ("4", "2")) == "a 4, b 2"
    assert i18n.renumber_in_order("a 2", ("2", "2"), ("4", "2")) is None  # one 2 missing


def test_an_estimate_gets_its_headers_and_its_note_in_chinese_and_keeps_its_code():
    """:class:`parmem.estimate.Estimate` draws its own table: a title in code, headers, and a
    note in HTML (``2<sup>30</sup>``), matched as HTML with its new numbers."""
    from parmem import ModelSpec, estimate

    labels = i18n.OutputLabels({
        "stage": "阶段",
        "GiB per GPU (2<sup>30</sup> bytes). Peak: stage 0, 151.71 GiB.":
            "单卡显存，GiB（2<sup>30</sup> 字节）。峰值：阶段 0，151.71 GiB。",
    })
    shown = estimate(ModelSpec.preset("llama-2-7b"))._repr_html_()
    peak = re.search(r"Peak: stage 0, ([\d.]+) GiB", shown).group(1)
    assert peak != "151.71"  # another setting than the entry's
    out = labels.table_html(shown)
    assert f"<p>单卡显存，GiB（2<sup>30</sup> 字节）。峰值：阶段 0，{peak} GiB。</p>" in out
    assert "<th>阶段</th><th>layers</th>" in out  # layers: no entry here
    title = re.search(r"<p><code>.*?</code></p>", shown).group(0)
    assert title in out
    assert [k for k, _ in i18n.output_labels({"cells": [{"outputs": [
        {"data": {"text/html": shown}}]}]})][:2] == ["header", "header"]  # not the code title
    assert ("paragraph", "GiB per GPU (2<sup>30</sup> bytes). Peak: stage 0, "
            f"{peak} GiB.") in i18n.output_labels({"cells": [{"outputs": [
                {"data": {"text/html": shown}}]}]})


def test_other_html_and_unknown_labels_are_left_as_they_are():
    other = "<p><b>Not a valid layout:</b> stage</p>"
    assert LABELS.table_html(other) == other
    table = Table([{"unknown": 1}], title="Stage 0 of 2: bytes per GPU")._repr_html_()
    assert LABELS.table_html(table) == table


def test_a_widget_state_gets_its_descriptions_and_option_labels_in_a_copy():
    state = {
        "version_major": 2,
        "state": {
            "a": {"model_name": "DropdownModel", "state": {
                "description": "activations", "_options_labels": ["kept", "offloaded"]}},
            "b": {"model_name": "IntSliderModel", "state": {"description": "micro-batches m"}},
            "c": {"model_name": "LayoutModel", "state": {"width": "auto"}},
        },
    }
    out = LABELS.widget_state(state)
    assert out["state"]["a"]["state"] == {
        "description": "激活值", "_options_labels": ["保留", "offloaded"]}
    assert out["state"]["b"]["state"]["description"] == "micro-batches m"  # no entry: English
    assert out["state"]["c"] == state["state"]["c"] and out["version_major"] == 2
    assert state["state"]["a"]["state"]["description"] == "activations"  # the input unchanged


def test_output_labels_lists_what_a_chapter_shows():
    table = Table([{"S (MiB)": 1, "t": 2, "sent per GPU (MiB)": 3}], title="One collective",
                  note="Named extra: none.")
    notebook = {
        "cells": [
            {"cell_type": "code", "outputs": [
                {"output_type": "display_data", "data": {"text/html": table._repr_html_()}},
                {"output_type": "display_data", "data": {"text/html": "<p>not a table</p>"}},
                {"output_type": "stream", "text": "sent per GPU"},
            ]},
            {"cell_type": "markdown", "source": "stage"},
        ],
        "metadata": {"widgets": {i18n.WIDGET_STATE: {"state": {
            "x": {"state": {"description": "ranks n"}},
            "y": {"state": {"description": "t"}},
        }}}},
    }
    assert i18n.output_labels(notebook) == [
        ("caption", "One collective"),
        ("header", "sent per GPU (MiB)"),  # "S (MiB)" and "t" have no word to translate
        ("note", "Named extra: none."),
        ("control", "ranks n"),
    ]


@pytest.mark.parametrize(("label", "needs"), [
    ("sent per GPU (MiB)", True), ("DDP", True), ("S (MiB)", False), ("Ψ/t (B)", False),
    ("4K", False), ("TP + SP", False), ("b = B/d", False), ("TFLOP/s", False),
])
def test_needs_label(label, needs):
    assert i18n.needs_label(label) is needs


# ---------------------------------------------------------------------------- the committed catalog
@pytest.fixture(scope="module")
def committed():
    return tomllib.loads(i18n.OUTPUT_LABELS.read_text(encoding="utf-8"))


def _as_catalog(pairs: dict[str, str]):
    c = babel.Catalog(locale="zh_CN")
    for msgid, msgstr in pairs.items():
        c.add(msgid, msgstr)
    return {"output_labels_zh": c}


def test_the_catalog_reads_and_translates_into_chinese(committed):
    labels = i18n.OutputLabels.read()
    assert len(committed["zh"]) >= 400 and committed["cells"]["yes"] == "是"
    english = [k for k, v in {**committed["zh"], **committed["cells"],
                               **committed["options"]}.items()
               if not i18n.has_cjk(v)]
    assert not english, f"entries whose Chinese has no Chinese: {english}"
    assert labels.lookup("DDP") == "DDP" and labels.lookup("not a label") is None


def test_the_catalog_keeps_every_number_and_the_glossary_terms(committed):
    pairs = {**committed["zh"], **committed["cells"], **committed["options"]}
    problems = i18n.catalog_problems(_as_catalog(pairs))
    terms = i18n.glossary_terms(GLOSSARY.read_text(encoding="utf-8"))
    problems += i18n.term_problems(_as_catalog(pairs), terms)
    assert not problems, "\n".join(map(str, problems))


def test_the_catalog_uses_the_books_terms(committed):
    """The review's terms (issue 33): 单步耗时 for step time, 重计算 for recomputation."""
    for english, chinese in committed["zh"].items():
        if "step time" in english or english.startswith("step ("):
            assert "单步耗时" in chinese, english
        if "recomput" in english:
            assert "重计算" in chinese, english


def test_keep_holds_only_labels_with_words_and_none_translated(committed):
    keep = committed["keep"]
    assert len(keep) == len(set(keep))
    assert [k for k in keep if not i18n.needs_label(k)] == []
    assert [k for k in keep if k in committed["zh"]] == []
