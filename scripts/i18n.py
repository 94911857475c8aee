"""The Chinese edition's message catalogs: extract them from the book, and check them.

    python scripts/i18n.py extract          # after changing the English: update the catalogs
    python scripts/i18n.py check [PO ...]   # what a translator must still do (exit 1 if any)
    python scripts/i18n.py status           # messages and translated ones, per page
    python scripts/i18n.py dump PO > f.json  # a catalog's messages as JSON, to translate
    python scripts/i18n.py load PO f.json    # and back into the catalog (fuzzy flags cleared)

``extract`` builds the ``.pot`` templates of every page (``scripts/build_book.py --builder
gettext --all``: from the execution cache, so a prose cell's message holds its computed numbers;
every page is read again, since a library change moves a chapter's numbers without changing its
notebook: run ``make notebooks`` first, which refreshes the cache),
leaves out the messages that exist only in API docstrings (the Chinese API page shows them in
English), and updates ``locales/zh_CN/LC_MESSAGES/<page>.po`` with sphinx-intl: a new message
arrives untranslated, a changed one fuzzy, and either fails ``check``, the Chinese build
(``-W``) and ``tests/book/test_i18n.py`` until it is translated. A message with nothing to
translate (numbers, a formula, code, Chinese already) gets its own text as translation.

``check`` reports, per message: untranslated, fuzzy, a number / code span / math / role or
link target of the English lost in the Chinese, a glossary term translated otherwise than
``chapters/glossary.md`` says (parmem.book.i18n).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

from parmem.book import i18n  # noqa: E402

LOCALE_DIR = ROOT / "locales" / "zh_CN" / "LC_MESSAGES"
POT_DIR = ROOT / "_build" / "gettext"
BOOK_POT_DIR = ROOT / "_build" / "gettext-book"
GLOSSARY = ROOT / "chapters" / "glossary.md"


def _read(path: Path):
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        return read_po(f)


def _write(path: Path, catalog) -> None:
    from babel.messages.pofile import write_po

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=0, ignore_obsolete=True, omit_header=False)


def extract() -> int:
    # --all: every page read again, so a message holds the numbers its notebook computes now
    # (Sphinx re-reads only changed sources, and a library change moves a chapter's numbers
    # without changing its notebook)
    rc = subprocess.call([sys.executable, str(ROOT / "scripts" / "build_book.py"),
                          "--builder", "gettext", "--quiet", "--all"])
    if rc:
        return rc
    for pot in sorted(POT_DIR.rglob("*.pot")):
        catalog = _read(pot)
        for message in list(catalog):
            if message.id and i18n.is_docstring_only(message.locations):
                del catalog[message.id]
        _write(BOOK_POT_DIR / pot.relative_to(POT_DIR), catalog)
    before = {d: i18n.Translations.of(c) for d, c in i18n.read_catalogs(LOCALE_DIR).items()}
    rc = subprocess.call([sys.executable, "-m", "sphinx_intl", "update", "-p", str(BOOK_POT_DIR),
                          "-d", str(LOCALE_DIR.parent.parent), "-l", "zh_CN", "-w", "0"])
    if rc:
        return rc
    for po in sorted(LOCALE_DIR.rglob("*.po")):
        if not (BOOK_POT_DIR / po.relative_to(LOCALE_DIR)).with_suffix(".pot").is_file():
            po.unlink()  # the page is gone
            continue
        catalog = _read(po)
        domain = po.relative_to(LOCALE_DIR).with_suffix("").as_posix()
        for message in catalog:
            _renumber(message, before.get(domain, i18n.Translations(())))
            if message.id and (not message.string or message.fuzzy) and not (
                i18n.needs_translation(str(message.id))
            ):
                message.string = message.id  # nothing to translate (a fuzzy match's guess)
                message.flags.discard("fuzzy")
        _write(po, catalog)
    return status()


def _renumber(message, old: i18n.Translations) -> None:
    """A message that changed only in the numbers it quotes (a measured value, a corrected
    estimate) keeps its translation, with the new numbers: the words are the same. (The
    Chinese build does the same for a number that changes later: booki18n.Catalog.)"""
    if not message.id or (message.string and not message.fuzzy):
        return
    renumbered = old.lookup(str(message.id))
    if renumbered is not None:
        message.string = renumbered
        message.flags.discard("fuzzy")


def status() -> int:
    catalogs = i18n.read_catalogs(LOCALE_DIR)
    total = done = 0
    for domain, catalog in catalogs.items():
        n = sum(1 for m in catalog if m.id)
        ok = sum(1 for m in catalog if m.id and m.string and not m.fuzzy)
        total, done = total + n, done + ok
        print(f"  {domain:55s} {ok:4d} / {n:4d}")
    print(f"  {'all':55s} {done:4d} / {total:4d}")
    return 0


def check(paths: list[str]) -> int:
    catalogs = i18n.read_catalogs(LOCALE_DIR)
    if paths:
        wanted = {Path(p).resolve().relative_to(LOCALE_DIR).with_suffix("").as_posix()
                  for p in paths}
        catalogs = {d: c for d, c in catalogs.items() if d in wanted}
    terms = i18n.glossary_terms(GLOSSARY.read_text(encoding="utf-8"))
    problems = i18n.catalog_problems(catalogs) + i18n.term_problems(catalogs, terms)
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s) in {len(catalogs)} catalog(s)", file=sys.stderr)
    return 1 if problems else 0


def dump(po: str) -> int:
    import json

    catalog = _read(Path(po))
    rows = [{"id": str(m.id), "str": str(m.string or ""), "fuzzy": m.fuzzy}
            for m in catalog if m.id]
    json.dump(rows, sys.stdout, ensure_ascii=False, indent=1)
    print()
    return 0


def load(po: str, rows_path: str) -> int:
    """Set the ``msgstr`` of each message the JSON file lists (by ``id``) to its ``str``; an
    entry whose ``str`` is set is no longer fuzzy. A listed id the catalog lacks is an error."""
    import json

    path = Path(po)
    catalog = _read(path)
    rows = json.loads(Path(rows_path).read_text(encoding="utf-8"))
    unknown = [r["id"] for r in rows if r["id"] not in catalog]
    if unknown:
        print(f"{len(unknown)} id(s) not in {po}, first: {unknown[0][:80]!r}", file=sys.stderr)
        return 1
    for row in rows:
        message = catalog[row["id"]]
        if row.get("str"):
            message.string = row["str"]
            message.flags.discard("fuzzy")
    _write(path, catalog)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("extract")
    sub.add_parser("status")
    p = sub.add_parser("check")
    p.add_argument("po", nargs="*")
    p = sub.add_parser("dump")
    p.add_argument("po")
    p = sub.add_parser("load")
    p.add_argument("po")
    p.add_argument("json")
    args = parser.parse_args(argv)
    if args.command == "dump":
        return dump(args.po)
    if args.command == "load":
        return load(args.po, args.json)
    if args.command == "extract":
        return extract()
    if args.command == "status":
        return status()
    return check(args.po)


if __name__ == "__main__":
    sys.exit(main())
