"""Build the book: the English site, the Chinese edition, or the message catalogs' templates.

    python scripts/build_book.py [--lang en|zh] [--builder html|gettext] [-W] [-n] [--all]

* ``--lang en`` (default): the site in ``_build/html``, as ``jupyter-book build .`` builds it.
* ``--lang zh``: the Chinese edition in ``_build/html/zh``: the same sources, the same
  execution cache (nothing is executed again), with ``language = "zh_CN"`` and the catalogs of
  ``locales/zh_CN/LC_MESSAGES`` (one per page). Built in ``_build/zh/html`` (its doctrees in
  ``_build/zh/.doctrees``), then hard-linked into the site.
* ``--builder gettext``: the ``.pot`` templates of every page in ``_build/gettext`` (one per
  page); ``scripts/i18n.py extract`` runs this, then updates the catalogs.

Jupyter Book 1.x turns ``_config.yml`` into Sphinx's configuration; this calls the same
function its command line does (``jupyter_book.sphinx.build_sphinx``), with the settings of the
edition added. Exit status: Sphinx's (1 on a warning under ``-W``).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
LOCALES = "locales"
ZH_OUT = BUILD / "zh" / "html"  # then linked into the site as _build/html/zh (publish_zh)
ZH = "zh_CN"

# The Chinese edition's settings; everything else is the English edition's (_config.yml).
ZH_SETTINGS = {
    "language": ZH,
    "locale_dirs": [f"{LOCALES}/"],
    "gettext_compact": False,  # one catalog per page
    "html_title": "并行策略与 GPU 显存",
    "html_search_language": "zh",
}


# nbformat imports jsonschema, which (4.25+) imports rfc3987-syntax when it is installed (as
# jupyter-events' jsonschema[format-nongpl] installs it); that module builds about 40 Earley
# parsers on import: 2 s of CPU per build, for the "iri" format checks, which nothing in a build
# uses (nbformat validates without format checks). Without it, jsonschema leaves those two
# formats unchecked.
sys.modules.setdefault("rfc3987_syntax", None)


def write_search_dict() -> Path:
    """The glossary's Chinese terms, the parts of them the Chinese edition uses on their own,
    and ``SEARCH_EXTRA`` as jieba's user dictionary (the Chinese search's words; ``search_words``
    of ``parmem.book.i18n``)."""
    sys.path.insert(0, str(ROOT / "lib"))
    from parmem.book.i18n import glossary_terms, read_catalogs, search_words

    terms = glossary_terms((ROOT / "chapters" / "glossary.md").read_text(encoding="utf-8"))
    catalogs = read_catalogs(ROOT / LOCALES / ZH / "LC_MESSAGES")
    texts = [str(m.string) for c in catalogs.values() for m in c if m.id and m.string]
    path = BUILD / "zh-search-words.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{word} 1000\n" for word in search_words(terms, texts))
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def build(lang: str, builder: str, strict: bool, nitpick: bool, fresh: bool, quiet: bool) -> int:
    from jupyter_book.sphinx import build_sphinx

    overrides: dict[str, object] = {
        "external_toc_path": str(ROOT / "_toc.yml"),
        "latex_individualpages": False,
        "gettext_compact": False,
        # one execution cache for every build (myst-nb's default is next to each output folder)
        "nb_execution_cache_path": str(BUILD / ".jupyter_cache"),
    }
    if nitpick:
        overrides["nitpicky"] = True
    if builder == "gettext":
        out, doctrees = BUILD / "gettext", BUILD / ".doctrees-gettext"
    elif lang == "zh":
        overrides.update(ZH_SETTINGS)
        overrides["html_search_options"] = {"dict": str(write_search_dict())}
        out, doctrees = ZH_OUT, BUILD / "zh" / ".doctrees"
    else:
        out, doctrees = BUILD / "html", BUILD / ".doctrees"
    result = build_sphinx(
        ROOT, out, noconfig=True, path_config=ROOT / "_config.yml", confoverrides=overrides,
        doctreedir=doctrees, builder=builder, warningiserror=strict, keep_going=strict,
        freshenv=fresh, quiet=quiet,
    )
    if isinstance(result, Exception):
        print(f"build failed: {result}", file=sys.stderr)
        return 1
    if result == 0 and builder == "html":
        refresh_static(out)
    if result == 0 and builder == "html" and lang == "zh":
        out = publish_zh()
    if result == 0 and builder == "html":
        print(f"Site ({lang}): {(out / 'index.html').relative_to(ROOT)}")
    return int(result)


def refresh_static(out: Path) -> None:
    """Sphinx 7.4 does not overwrite a static file already in the output (and copies none when
    no page is out of date): an edited ``_static`` stylesheet or script would stay stale until
    a clean build. Copy the book's own ones that differ."""
    import filecmp
    import shutil

    for own in (ROOT / "_static").iterdir():
        dest = out / "_static" / own.name
        if own.is_file() and not (dest.is_file() and filecmp.cmp(own, dest, shallow=False)):
            dest.unlink(missing_ok=True)  # a hard link into the other edition: replace, not edit
            shutil.copy2(own, dest)


def publish_zh() -> Path:
    """Link the Chinese build into the English site, as its ``zh/`` folder (hard links: no
    copy). It is built in ``_build/zh/html``, not in place, because myst-nb keeps its executed
    notebooks next to the output folder, which would put them inside the site."""
    import os
    import shutil

    site = BUILD / "html" / "zh"
    if site.is_symlink() or site.is_file():
        site.unlink()
    elif site.exists():
        shutil.rmtree(site)
    shutil.copytree(ZH_OUT, site, copy_function=os.link)
    return site


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lang", choices=("en", "zh"), default="en")
    parser.add_argument("--builder", choices=("html", "gettext"), default="html")
    parser.add_argument("-W", dest="strict", action="store_true", help="warnings are errors "
                        "(the build goes on and reports them all)")
    parser.add_argument("-n", dest="nitpick", action="store_true", help="nit-picky references")
    parser.add_argument("--all", dest="fresh", action="store_true", help="re-read every page")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    # Sphinx keeps every page's doctree and the API page's imports (PyTorch among them) alive:
    # with Python's default thresholds the cyclic garbage collector walks that whole heap some 25
    # times per build, 35-45% of the build's CPU (measured: 14 of 40 s in English, 26 of 65 s
    # in Chinese). Collecting the young generation after 50,000 allocations instead of 700
    # leaves the output unchanged and costs some 150-220 MB more memory at the peak.
    gc.set_threshold(50_000, 50, 100)
    return build(args.lang, args.builder, args.strict, args.nitpick, args.fresh, args.quiet)


if __name__ == "__main__":
    sys.exit(main())
