"""The computed outputs of the Chinese edition: tables and controls in Chinese (issue 33).

The chapters run once, in English (``_build/.jupyter_cache``); the Chinese build rewrites the
labels of those outputs with one small catalog, ``lib/parmem/book/output_labels_zh.toml``
(``_ext/booki18n.py``, :class:`parmem.book.i18n.OutputLabels`). After ``make book``:

* every label of the executed chapters that has words (a table's caption, header or note, an
  Explore control's description) is in that catalog, read from the execution cache the build
  renders (a new table header fails here until it is translated);
* each chapter page of the Chinese edition shows its tables and controls with those labels in
  Chinese, position by position against the English page, with nothing else changed: where the
  English label is a term of the glossary (``chapters/glossary.md``: "gradients", "KV cache"),
  the Chinese one is the glossary's term;
* in a browser, the note that explains the inactive controls ("run it live") is in Chinese on a
  Chinese page and in English on an English one, with its Binder and calculator links, and the
  controls' labels are drawn in Chinese.

Figures are PNG images drawn once, in English; their text is not checked here.
"""

from __future__ import annotations

import html
import json
import re
import sys

import pytest
import test_site
from test_site import ROOT, SITE, TIMEOUT_MS, PageVisit, _unavailable

from parmem.book import i18n

pytestmark = pytest.mark.browser
browser = test_site.browser  # the site test's fixtures, shared
origin = test_site.origin

ZH = SITE / "zh"
CACHE = ROOT / "_build" / ".jupyter_cache"
CJK = re.compile(r"[\u4e00-\u9fff]")
TABLE = re.compile(r"<table>(.*?)</table>", re.S)  # parmem.book.tables.Table (no class)
LABEL = re.compile(r"<(caption|th)>(.*?)</\1>", re.S)
WIDGET_STATE = re.compile(
    r'<script type="application/vnd\.jupyter\.widget-state\+json">(.*?)</script>', re.S)
#: a chapter whose Explore section has controls and carries its settings to the calculator
EXPLORE_CHAPTER = "chapters/p1_foundations/ch00_memory_anatomy.html"


@pytest.fixture(scope="module")
def zh_built():
    if not (ZH / "index.html").is_file():
        _unavailable("_build/html/zh/index.html does not exist: run `make book` first")


def executed_chapters():
    """(chapter, executed notebook) for every chapter of the toc, from the execution cache the
    build renders, and the chapters the cache lacks."""
    import nbformat
    from jupyter_cache import get_cache

    sys.path.insert(0, str(ROOT / "scripts"))
    from execute_notebooks import toc_notebooks

    if not CACHE.is_dir():
        _unavailable("_build/.jupyter_cache does not exist: run `make book` first")
    cache = get_cache(str(CACHE))
    found, uncached = [], []
    for path in toc_notebooks():
        try:
            record = cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            uncached.append(path.name)
            continue
        found.append((path.relative_to(ROOT).as_posix(), cache.get_cache_bundle(record.pk).nb))
    return found, uncached


def test_every_label_of_the_executed_chapters_is_in_the_catalog():
    labels = i18n.OutputLabels.read()
    chapters, uncached = executed_chapters()
    assert not uncached, f"chapters not in the execution cache (run `make book`): {uncached}"
    missing: dict[str, list[str]] = {}
    count = 0
    for chapter, nb in chapters:
        for kind, text in i18n.output_labels(nb):
            count += 1
            if labels.lookup(text) is None:
                missing.setdefault(chapter, []).append(f"{kind} {text!r}")
    assert count >= 400, f"only {count} labels in {len(chapters)} chapters: a bad reading"
    assert not missing, (
        f"labels of computed outputs not in {i18n.OUTPUT_LABELS.name} (translate them there, or "
        "list them under keep): " + "; ".join(f"{c}: {', '.join(m)}" for c, m in missing.items()))


def _tables(page) -> list[list[str]]:
    return [[html.unescape(t) for _, t in LABEL.findall(body)]
            for body in TABLE.findall(page.read_text(encoding="utf-8"))]


def _descriptions(page) -> dict[str, str]:
    """Each control's description in the page's saved widget state, by model id."""
    out = {}
    for body in WIDGET_STATE.findall(page.read_text(encoding="utf-8")):
        state = json.loads(body.replace("<\\/script>", "</script>"))
        out |= {k: m["state"]["description"] for k, m in state["state"].items()
                if m["state"].get("description")}
    return out


def _glossary():
    """English form → the glossary's Chinese forms that may write it (stems included)."""
    terms = i18n.glossary_terms((ROOT / "chapters" / "glossary.md").read_text(encoding="utf-8"))
    out = {}
    for term in terms:
        for i, form in enumerate(term.english):
            want = term.chinese_for(i)
            out[form.lower()] = (want, want[:-1] if len(want) >= 3 and want[-1] in "层值" else want)
    return out


def _check(en: str, zh: str, keep: frozenset[str], glossary, where: str) -> str | None:
    """What is wrong with the Chinese label ``zh`` of the English label ``en``: a kept label
    must be unchanged, one without words unchanged or in Chinese, any other in Chinese."""
    if en in keep or not i18n.needs_label(en):
        return None if zh == en or (en not in keep and CJK.search(zh)) else (
            f"{where}: {en!r} changed to {zh!r}")
    if not CJK.search(zh):
        return f"{where}: {en!r} is not in Chinese"
    term = glossary.get(en.lower())
    if term and not any(t in zh for t in term):
        return f"{where}: {en!r} is {zh!r}, the glossary writes {term[0]!r}"
    return None


def test_the_chinese_pages_show_the_labels_in_chinese(zh_built):
    keep = i18n.OutputLabels.read().keep
    glossary = _glossary()
    problems, labels, controls, terms = [], 0, 0, 0
    for en_page in sorted(SITE.glob("chapters/**/*.html")):
        rel = en_page.relative_to(SITE).as_posix()
        zh_page = ZH / rel
        en_tables, zh_tables = _tables(en_page), _tables(zh_page)
        assert len(zh_tables) == len(en_tables), f"{rel}: the tables differ"
        for i, (en, zh) in enumerate(zip(en_tables, zh_tables, strict=True)):
            assert len(en) == len(zh), f"{rel}, table {i + 1}: the labels differ"
            problems += [_check(e, z, keep, glossary, f"{rel}, table {i + 1}")
                         for e, z in zip(en, zh, strict=True)]
            labels += len(en)
            terms += sum(e.lower() in glossary for e in en)
        # the controls, by model id where both editions render the same execution (an
        # incremental build may have kept an older one on one side: then by their number)
        en_desc, zh_desc = _descriptions(en_page), _descriptions(zh_page)
        assert len(en_desc) == len(zh_desc), f"{rel}: the controls differ"
        if en_desc.keys() == zh_desc.keys():
            problems += [_check(e, zh_desc[k], keep, glossary, f"{rel}, control")
                         for k, e in en_desc.items()]
        else:
            problems += [f"{rel}, control: {z!r} is not in Chinese" for z in zh_desc.values()
                         if i18n.needs_label(z) and z not in keep and not CJK.search(z)]
        controls += len(en_desc)
    assert labels >= 400 and controls >= 100 and terms >= 20, (labels, controls, terms)
    problems = [p for p in problems if p]
    assert not problems, f"{len(problems)} labels:\n" + "\n".join(problems[:40])


def _note(visit: PageVisit) -> str:
    note = visit.page.locator("section#explore .parmem-static-note").first
    note.wait_for(timeout=TIMEOUT_MS)
    return note.inner_html()


def test_the_run_it_live_note_and_the_controls_are_in_the_pages_language(
        browser, origin, zh_built):
    visit = PageVisit(browser, origin, f"zh/{EXPLORE_CHAPTER}")
    try:
        note = _note(visit)
        assert CJK.search(note) and "These controls" not in note, note
        assert "mybinder.org" in note and "实时运行本章" in note, note
        href = visit.page.locator(
            "section#explore .parmem-static-note a.parmem-calculator-link").first.evaluate(
            "a => a.href")
        assert href.startswith(f"{origin}/zh/chapters/tools/calculator.html?"), href
        visit.page.wait_for_selector("section#explore .jupyter-widgets", timeout=TIMEOUT_MS)
        drawn = visit.page.eval_on_selector_all(
            "section#explore .widget-label", "els => els.map(e => e.innerText.trim())")
        worded = [d for d in drawn if i18n.needs_label(d)]
        assert drawn and all(CJK.search(d) or d in ("FlashAttention", "ZeRO") for d in worded), (
            drawn)
        visit.screenshot("zh-explore")
        assert not visit.errors, visit.errors
    finally:
        visit.close()
    visit = PageVisit(browser, origin, EXPLORE_CHAPTER)
    try:
        note = _note(visit)
        assert note.startswith("These controls are inactive on this page") and not CJK.search(
            note), note
    finally:
        visit.close()
