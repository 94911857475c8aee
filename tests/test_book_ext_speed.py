"""The book build's two speed fixes in _ext/bookext.py change what is computed, never what is
found: pybtex's and sphinxcontrib-bibtex's plugin lookups return the same classes from entry
points read once, and MyST's new documents get the same default settings, each its own copy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pybtex_plugin = pytest.importorskip("pybtex.plugin")
bibtex_plugin = pytest.importorskip("sphinxcontrib.bibtex.plugin")
myst_base = pytest.importorskip("myst_parser.mdit_to_docutils.base")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bookext", ROOT / "_ext" / "bookext.py")
bookext = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bookext)

#: what the book's build asks for: its styles (plain, author_year), the backends it renders
#: with, and the defaults pybtex falls back to
PYBTEX = [(group, None) for group in pybtex_plugin._DEFAULT_PLUGINS] + [
    ("pybtex.style.formatting", "plain"), ("pybtex.style.formatting", "alpha"),
    ("pybtex.backends", "plaintext"), ("pybtex.backends", "docutils"),
    ("pybtex.style.labels", "alpha"), ("pybtex.style.names", "lastfirst"),
]  # fmt: skip
BIBTEX = [("sphinxcontrib.bibtex.style.referencing", name)
          for name in ("author_year", "label", "super")]


def _lookups():
    found = [pybtex_plugin.find_plugin(group, name) for group, name in PYBTEX]
    found += [bibtex_plugin.find_plugin(group, name) for group, name in BIBTEX]
    return found


def test_plugin_lookups_find_the_same_classes(monkeypatch):
    # let monkeypatch restore the modules' own lookup afterwards
    monkeypatch.setattr(pybtex_plugin, "entry_points", pybtex_plugin.entry_points)
    monkeypatch.setattr(bibtex_plugin, "entry_points", bibtex_plugin.entry_points)
    original = pybtex_plugin.entry_points
    before = _lookups()
    bookext._read_pybtex_entry_points_once()
    assert pybtex_plugin.entry_points is not original  # the lookups below use the fix
    assert _lookups() == before
    with pytest.raises(pybtex_plugin.PluginNotFound):
        pybtex_plugin.find_plugin("pybtex.style.formatting", "no-such-style")


def test_new_documents_get_the_default_settings_each_their_own(monkeypatch):
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import DependencyList

    original = myst_base.make_document
    monkeypatch.setattr(myst_base, "make_document", original)
    expected = vars(get_default_settings(Parser))
    bookext._build_myst_default_settings_once()
    assert myst_base.make_document is not original
    a, b = myst_base.make_document("a"), myst_base.make_document("b")
    assert a["source"] == "a" and b["source"] == "b"
    assert a.settings is not b.settings
    sa, sb = vars(a.settings), vars(b.settings)
    assert sa.keys() == sb.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, (list, DependencyList)):  # mutable: each document its own, empty
            assert sa[key] is not sb[key], key
            assert list(getattr(sa[key], "list", sa[key])) == [], key
        else:
            assert sa[key] == sb[key] == value, key
    a.settings.tab_width = 3  # a change to one document's settings stays in that document
    a.settings.record_dependencies.add("x.txt")
    c = myst_base.make_document("c")
    assert c.settings.tab_width == expected["tab_width"]
    assert c.settings.record_dependencies.list == []
