"""The book's two editions: English (``_build/html``) and Chinese (``_build/html/zh``).

Both are built from the same notebooks and the same execution cache by
``scripts/build_book.py``; the Chinese one with ``language = "zh_CN"`` and the catalogs in
``locales/`` (``scripts/i18n.py extract`` writes them). This extension

* puts a language switch in every page's header, which leads to the same page in the other
  edition (``lang-switch.html``);
* turns each page's subtitle (the paragraph right under the title that is one emphasis: the
  question in Chinese in the English edition, in English in the Chinese one) into an upright
  ``<span class="book-subtitle" lang="...">``, so that a Chinese font is chosen for it and no
  slanted fake italic is drawn;
* in the Chinese edition, translates a prose cell's message whose numbers changed since it was
  translated with the new numbers (:class:`Catalog`), so both editions show the numbers of the
  same execution;
* translates the part captions of the table of contents (:class:`TranslateTocCaptions`), and
  the display formulas itself (Sphinx's Locale transform turns a translated one into ``::``
  under MyST, :func:`_translate_math_blocks`);
* translates the labels of the computed outputs, which come from the one English execution:
  the captions, headers and notes of the tables and the descriptions of the Explore controls
  (:class:`TranslateOutputs`, with the small catalog of
  :data:`parmem.book.i18n.OUTPUT_LABELS`);
* and warns (an error under ``-W``) for every message of a page that its catalog does not
  translate: a changed English sentence cannot slip into the Chinese edition in English. API
  docstrings are left in English on purpose and are not checked.
"""

from __future__ import annotations

import gettext
import json
import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx import locale as sphinx_locale
from sphinx.application import Sphinx
from sphinx.search import zh as zh_search
from sphinx.search.zh import JIEBA, SearchChinese
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx.util.i18n import docname_to_domain
from sphinx.util.nodes import extract_messages, is_translatable

from parmem.book.i18n import OUTPUT_LABELS, OutputLabels, Translations, compact

logger = logging.getLogger(__name__)

#: the Chinese edition's folder under the English one
ZH_DIR = "zh"
_CJK = re.compile(r"[\u3400-\u9fff]")


def is_zh(app_or_config) -> bool:
    config = getattr(app_or_config, "config", app_or_config)
    return str(config.language or "").startswith("zh")


class book_subtitle(nodes.inline):  # noqa: N801 (docutils node classes are lower case)
    """The subtitle under a page's title, with its language."""


def _visit_subtitle(self, node: book_subtitle) -> None:
    self.body.append(self.starttag(node, "span", "", CLASS="book-subtitle", lang=node["lang"]))


def _depart_subtitle(self, node: book_subtitle) -> None:
    self.body.append("</span>")


class MarkSubtitle(SphinxTransform):
    """The first paragraph under a page's title, when it is a single emphasis, becomes an
    upright subtitle marked with its language (after translation: priority 20 is Sphinx's)."""

    default_priority = 30

    def apply(self, **kwargs) -> None:
        for section in self.document.findall(nodes.section):
            if not isinstance(section.parent, nodes.document):
                continue
            body = [c for c in section.children if not isinstance(c, (nodes.title, nodes.target))]
            first = body[0] if body else None
            if not (isinstance(first, nodes.paragraph) and len(first.children) == 1
                    and isinstance(first.children[0], nodes.emphasis)):
                continue
            text = first.astext()
            span = book_subtitle("", *first.children[0].children)
            span["lang"] = "zh-Hans" if _CJK.search(text) else "en"
            first.replace(first.children[0], span)
            first["classes"].append("book-subtitle")
            break


class Catalog(gettext.NullTranslations):
    """A page's catalog, as Sphinx's Locale transform reads it, that also translates a message
    whose numbers changed since it was translated (:class:`parmem.book.i18n.Translations`):
    the Chinese edition shows the numbers of the execution it is built from, as the English
    one does, not those of the day it was translated; the words must be the same."""

    def __init__(self, po_files: list[Path]) -> None:
        super().__init__()
        from babel.messages.pofile import read_po

        pairs: list[tuple[str, str]] = []
        for po in po_files:
            with po.open("rb") as f:
                pairs += Translations.of(read_po(f)).exact.items()
        self.translations = Translations(pairs)
        # what Sphinx's Locale transform reads: it merges the ``_catalog`` of each translator
        self._catalog: dict[str, str] = dict(self.translations.exact)

    def lookup(self, message: str) -> str | None:
        return self.translations.lookup(message)

    def gettext(self, message: str) -> str:
        found = self.lookup(message)
        return found if found is not None else message

    def prepare(self, messages: list[str]) -> None:
        """Put the renumbered translations of ``messages`` where Sphinx looks them up."""
        for message in messages:
            if message not in self._catalog:
                found = self.lookup(message)
                if found is not None:
                    self._catalog[message] = found


class UseCatalog(SphinxTransform):
    """Give Sphinx's Locale transform (priority 20) this page's :class:`Catalog`, holding the
    renumbered translations of this page's messages: Sphinx keeps the translator of each
    catalog in ``sphinx.locale.translators``, reuses one that is there (adding its own reading
    of the ``.mo`` file as a fallback) and looks messages up in their ``_catalog`` dicts."""

    default_priority = 19

    def apply(self, **kwargs) -> None:
        if is_zh(self.config):
            domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
            catalog = _catalog(self.app, self.env.docname)
            catalog.prepare([msg for _, msg in extract_messages(self.document)])
            sphinx_locale.translators["general", domain] = catalog
            _translate_math_blocks(self.document, catalog)


def _translate_math_blocks(document: nodes.document, catalog: Catalog) -> None:
    """Translate the display formulas here, before Sphinx's Locale transform can: it re-parses a
    translated literal-type node as ``"::"`` followed by the indented text, which reST reads
    as a literal block but MyST as a paragraph ``"::"`` and an indented code block, so every
    translated ``math_block`` rendered as ``\\[::\\]``. The node keeps its own kind; only its
    text changes, and its new text translates to itself, so that the Locale transform marks it
    translated and leaves it alone."""
    for node, msg in extract_messages(document):
        if not isinstance(node, nodes.math_block):
            continue
        found = catalog.lookup(msg)
        if found is None or found == msg:
            continue
        text = found.strip("\n") if node.astext() == msg.strip("\n") else found
        node.children = []
        node += nodes.Text(text)
        node.rawsource = found
        # the Locale transform looks the node up again by its new text: found as its own
        # translation, it is marked translated and left as it is
        catalog._catalog[found] = found


class FlagUntranslated(SphinxTransform):
    """In the Chinese edition, a warning for each message its page's catalog lacks (or holds
    fuzzy: those are not translations yet)."""

    default_priority = 21  # right after Sphinx's Locale transform (20)

    def apply(self, **kwargs) -> None:
        if not is_zh(self.config) or "docstring of" in str(self.document.get("source", "")):
            return
        catalog = _catalog(self.app, self.env.docname)
        missing = 0
        for node, msg in extract_messages(self.document):
            if node.get("translated") or not is_translatable(node) or _in_api_entry(node):
                continue
            source = str(node.source or "")
            if "docstring of" in source or catalog.lookup(msg) is not None:
                continue  # (a translation equal to its message leaves the node untouched)
            missing += 1
            if missing <= 5:
                logger.warning("not in the Chinese catalog (run scripts/i18n.py extract, then "
                               "translate): %r", msg[:120], location=node, type="i18n",
                               subtype="untranslated")
        if missing > 5:
            logger.warning("%d messages of %s are not in the Chinese catalog", missing,
                           self.env.docname, type="i18n", subtype="untranslated")


class TranslateTocCaptions(SphinxTransform):
    """The part captions of the table of contents, in the Chinese edition. sphinx-external-toc
    inserts the toctrees (priority 100) after Sphinx's Locale transform has run, so their
    captions, which ``extract`` does collect, would stay in English."""

    default_priority = 150

    def apply(self, **kwargs) -> None:
        if not is_zh(self.config):
            return
        catalog = _catalog(self.app, self.env.docname)
        for toctree in self.document.findall(addnodes.toctree):
            caption = toctree.get("caption")
            if not caption:
                continue
            found = catalog.lookup(caption)
            if found is None:
                logger.warning("toc caption not in the Chinese catalog: %r", caption,
                               location=toctree, type="i18n", subtype="untranslated")
            else:
                toctree["caption"] = found


class TranslateOutputs(SphinxTransform):
    """In the Chinese edition, the labels of the chapters' computed outputs, which myst-nb takes
    from the English execution: each table of :class:`parmem.book.tables.Table` or
    :class:`parmem.estimate.Estimate` (a raw HTML node) gets its caption, headers and notes in
    Chinese (:meth:`parmem.book.i18n.OutputLabels.table_html`), and the page's saved widget
    state (the controls the static site draws) its descriptions. A label the catalog lacks
    stays in English (``tests/browser/test_zh_outputs.py`` lists them). The catalog is a
    dependency of every page that has outputs: editing it re-reads them."""

    default_priority = 22

    def apply(self, **kwargs) -> None:
        if not is_zh(self.config):
            return
        tables = [n for n in self.document.findall(nodes.raw)
                  if "html" in n.get("format", "").split() and "<table>" in n.astext()]
        js_files = getattr(self.env, "nb_metadata", {}).get(self.env.docname, {}).get("js_files")
        state = (js_files or {}).get("ipywidgets_state")
        if not tables and not state:
            return
        self.env.note_dependency(str(OUTPUT_LABELS))
        labels = _output_labels()
        for node in tables:
            text = labels.table_html(node.astext())
            if text != node.astext():
                node.replace(node[0], nodes.Text(text))
        if state:
            uri, attributes = state
            body = attributes.get("body", "")
            saved = json.loads(body.replace("<\\/script>", "</script>"))
            if saved.get("state"):
                translated = json.dumps(labels.widget_state(saved), ensure_ascii=False)
                js_files["ipywidgets_state"] = (
                    uri, {**attributes, "body": translated.replace("</script>", "<\\/script>")})


_labels: list[OutputLabels] = []


def _output_labels() -> OutputLabels:
    """:class:`~parmem.book.i18n.OutputLabels`, read once per build process."""
    if not _labels:
        _labels.append(OutputLabels.read(OUTPUT_LABELS))
    return _labels[0]


def _in_api_entry(node: nodes.Node) -> bool:
    """Whether ``node`` is part of an autodoc entry (a docstring, or the field labels Sphinx
    translates itself: "Parameters" is "参数" already)."""
    parent = node.parent
    while parent is not None:
        if isinstance(parent, addnodes.desc):
            return True
        parent = parent.parent
    return False


_catalogs: dict[str, Catalog] = {}


def _catalog(app: Sphinx, docname: str) -> Catalog:
    """The :class:`Catalog` of ``docname``, read once per build process."""
    domain = docname_to_domain(docname, app.config.gettext_compact)
    if domain not in _catalogs:
        files = [Path(app.srcdir, folder, app.config.language, "LC_MESSAGES", domain + ".po")
                 for folder in app.config.locale_dirs]
        _catalogs[domain] = Catalog([f for f in files if f.is_file()])
    return _catalogs[domain]


class ChineseSearch(SearchChinese):
    """Sphinx's Chinese search (jieba), with its record of Latin terms as a set: Sphinx 7.4
    keeps a list that grows with every text it splits and searches it for every word it
    stems, which took 81 of the Chinese build's 256 s (profiled); the index is the same.

    And every word of the book's dictionary (``html_search_options["dict"]``: the glossary's
    terms and their parts, ``parmem.book.i18n.search_words``) is a search term of each text
    that holds it, however jieba cuts the text there. jieba's ``cut_for_search`` adds only the
    two- and three-character words inside a longer word, so 混合精度 inside 混合精度训练 or
    词表并行 inside 词表并行嵌入 was no term of that page; and Sphinx's search tries the
    partial matches of a query only when no page has it as a term. The text is read without
    the spaces between Latin letters and Chinese, so "KV 缓存" holds the dictionary's KV缓存,
    which a reader may type.

    A one-letter word (the k of "Top-k 路由", the α of "α-β 模型") is a term too: Sphinx's
    Chinese search indexes no one-character word, but its query asks for every word, so such a
    query found no page by its text. One-character Chinese words stay out, as before."""

    def init(self, options: dict[str, str]) -> None:
        if JIEBA:
            zh_search.jieba.setLogLevel(30)  # not its "Building prefix dict" lines on stderr
        super().init(options)
        self.latin_terms: set[str] = set()  # type: ignore[assignment]
        path = options.get("dict")
        found = path and Path(path).is_file()
        lines = Path(path).read_text(encoding="utf-8").splitlines() if found else []
        self.book_words = [line.split()[0] for line in lines if line.strip()]

    def split(self, input: str) -> list[str]:  # noqa: A002 (Sphinx's name)
        chinese = list(zh_search.jieba.cut_for_search(input)) if JIEBA else []
        joined = compact(input)  # "KV 缓存" holds the dictionary's KV缓存
        chinese += [word for word in self.book_words if word in joined]
        latin = [term.strip() for term in self.latin1_letters.findall(input)]
        self.latin_terms.update(latin)
        return chinese + latin

    def word_filter(self, stemmed_word: str) -> bool:
        if len(stemmed_word) == 1:
            return stemmed_word.isalpha() and not _CJK.search(stemmed_word) and (
                stemmed_word.lower() not in self.stopwords)
        return super().word_filter(stemmed_word)


def _switch_context(app: Sphinx, pagename: str, templatename, context, doctree) -> None:
    """``lang_switch``: the other edition's copy of this page, relative to this page."""
    up = "../" * pagename.count("/")
    if is_zh(app):
        context["lang_switch"] = {"href": f"{up}../{pagename}.html", "label": "English",
                                  "lang": "en", "title": "Read this page in English"}
    else:
        context["lang_switch"] = {"href": f"{up}{ZH_DIR}/{pagename}.html", "label": "中文",
                                  "lang": "zh-Hans", "title": "阅读本页的中文版"}


def _configure(app: Sphinx, config) -> None:
    config.templates_path = [*config.templates_path, str(Path(__file__).parent / "templates")]
    options = dict(config.html_theme_options or {})
    end = list(options.get("article_header_end") or ["article-header-buttons.html"])
    if "lang-switch.html" not in end:
        options["article_header_end"] = ["lang-switch.html", *end]
    config.html_theme_options = options
    if is_zh(config):
        config.html_search_language = "zh"


def setup(app: Sphinx) -> dict:
    app.add_node(book_subtitle, html=(_visit_subtitle, _depart_subtitle))
    app.add_transform(MarkSubtitle)
    app.add_search_language(ChineseSearch)
    app.add_transform(UseCatalog)
    app.add_transform(FlagUntranslated)
    app.add_transform(TranslateTocCaptions)
    app.add_transform(TranslateOutputs)
    app.connect("config-inited", _configure)
    app.connect("html-page-context", _switch_context)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
