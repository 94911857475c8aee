"""Checks for the book's Chinese edition: its gettext catalogs and its terminology.

The Chinese edition (``_build/html/zh``) is built from the same notebooks as the English one,
with Sphinx's gettext translation: ``scripts/i18n.py extract`` writes every message of the
built English pages (paragraphs, headings, table cells, admonition titles, and the Markdown
that prose cells display, numbers filled in) to ``locales/zh_CN/LC_MESSAGES/<page>.po``, and
the Chinese build replaces each message by its ``msgstr``. Code, figures and computed
outputs come from the one execution cache, so the two editions show the same numbers.

This module reads those catalogs (with Babel, the library Sphinx itself uses) and reports what
would make the Chinese edition wrong or out of date:

* :func:`entry_problems`: a message untranslated or fuzzy; a number, inline code span, math,
  role target or link target of the English that the translation lost or changed (the numbers
  are the build's, so a translation must carry them verbatim);
* :func:`term_problems`: a glossary term translated otherwise than the glossary says, or
  translated two ways (:func:`glossary_terms` reads ``chapters/glossary.md``'s tables).

Messages that exist only in API docstrings (autodoc on ``chapters/api.md``) are not the book's
prose; :func:`is_docstring_only` names them, ``extract`` leaves them out, and the Chinese API
page shows them in English.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Term",
    "Problem",
    "glossary_terms",
    "read_catalogs",
    "entry_problems",
    "term_problems",
    "catalog_problems",
    "needs_translation",
    "is_docstring_only",
    "has_cjk",
    "search_words",
    "number_template",
    "renumber",
    "Translations",
]

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
# inline code, math, roles with their target, and link targets: what a translation must keep
_CODE = re.compile(r"``[^`]+``|`[^`]+`")
_ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\s](?:[^$]*?[^$\s])?\$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# a number ends with a digit ("t = 8, 16": 8 and 16; "4,096": one number); in the English a
# digit glued to letters is a name ("3D", "7B"), in the Chinese it may carry the number ("7B")
_NUMBER_TEXT = r"(?<![\w.])[-−+]?\d(?:[\d,]*\d)?(?:\.\d+)?"
_NUMBER = re.compile(_NUMBER_TEXT + r"(?![\dA-Za-z]|\.\d)")
_NUMBER_ANY = re.compile(_NUMBER_TEXT + r"(?!\d|\.\d)")
# "47 billion", "46.7 and 12.9 billion", "7-billion-parameter": numbers in a scale word
_SCALE = re.compile(
    rf"{_NUMBER_TEXT}(?:\s*(?:,|and|or|to|–)\s*{_NUMBER_TEXT})*(?:\s|-)(billion|million|thousand)\b"
)
#: how Chinese writes a count given in English thousands, millions or billions
_SCALES = {
    "billion": (("亿", 10),),
    "million": (("亿", 0.01), ("万", 100)),
    "thousand": (("万", 0.1),),
}
_WORD = re.compile(r"[A-Za-z]{3,}")


def has_cjk(text: str) -> bool:
    """Whether ``text`` holds a Chinese character."""
    return bool(_CJK.search(text))


def _strip_markup(text: str) -> str:
    """``text`` without roles, inline code and math (what is copied, not translated)."""
    text = _ROLE.sub(" ", text)
    text = _CODE.sub(" ", text)
    return _MATH.sub(" ", text)


def needs_translation(msgid: str) -> bool:
    """Whether a message has words to translate. A table cell of numbers, a formula, a code
    span or a Chinese-only message (the glossary's 中文 column) reads the same in both
    editions; ``scripts/i18n.py extract`` copies such a message to its ``msgstr``."""
    rest = _strip_markup(msgid)
    if "\\" in rest:  # a LaTeX formula (a math block): commands and their arguments are code
        rest = re.sub(r"\\[A-Za-z]+(?:\{[^}]*\})?", " ", rest)
        if not re.search(r"[A-Za-z]{3,} [A-Za-z]{2,}", rest):
            return False
    return bool(_WORD.search(rest)) and not (has_cjk(rest) and not _WORD.search(rest))


def is_docstring_only(locations: Iterable[tuple[str, Any]]) -> bool:
    """Whether every source location of a message is an API docstring (autodoc), which the
    Chinese edition leaves in English."""
    # a docstring's location reads "lib/parmem/x.py:docstring of parmem.x:3", which Babel splits
    # at the spaces: what counts is that no location is a page of the book
    locs = [str(path) for path, _ in locations]
    return bool(locs) and not any(p.endswith((".md", ".ipynb")) for p in locs)


def _role_targets(text: str) -> list[str]:
    """Each role as ``{name}`target```: the target is the text inside ``<...>`` where the role
    has an explicit title (``{doc}`记号 <notation>```), else all of it; a translation may
    retitle a cross-reference but must keep its target."""
    out = []
    for name, body in _ROLE.findall(text):
        inner = re.search(r"<([^>]+)>\s*$", body)
        target = inner.group(1) if inner and name not in ("math", "sup", "sub") else body
        out.append(f"{{{name}}}`{target}`")
    return sorted(out)


def _keeps(msgid: str, msgstr: str) -> list[str]:
    """What of ``msgid`` that must be kept verbatim is missing from ``msgstr``."""
    return _lost_roles(msgid, msgstr) + _lost_verbatim(msgid, msgstr) + _lost_numbers(msgid, msgstr)


def _lost_roles(msgid: str, msgstr: str) -> list[str]:
    missing, dst_roles = [], _role_targets(msgstr)
    for role in _role_targets(msgid):
        if role in dst_roles:
            dst_roles.remove(role)
        else:
            missing.append(f"role {role}")
    return missing


def _lost_verbatim(msgid: str, msgstr: str) -> list[str]:
    """Inline code, math and link targets of ``msgid`` that ``msgstr`` lacks."""
    bare_src, bare_dst = _ROLE.sub(" ", msgid), _ROLE.sub(" ", msgstr)
    missing = [f"code {c}" for c in _CODE.findall(bare_src) if c not in bare_dst]
    missing += [f"math {m}" for m in _MATH.findall(_CODE.sub(" ", bare_src)) if m not in bare_dst]
    return missing + [f"link target {u}" for u in _LINK.findall(msgid) if f"]({u})" not in msgstr]


def _lost_numbers(msgid: str, msgstr: str) -> list[str]:
    """Numbers of ``msgid`` (outside code, math and roles) that ``msgstr`` does not give."""
    plain_src = _strip_markup(msgid).replace("−", "-")
    plain_dst = _strip_markup(msgstr).replace("−", "-")
    have = _NUMBER_ANY.findall(plain_dst)
    scaled = {
        m.start() + n.start(): m.group(1)
        for m in _SCALE.finditer(plain_src)
        for n in _NUMBER_ANY.finditer(m.group(0))
    }
    missing = []
    for match in _NUMBER.finditer(plain_src):
        number, scale = match.group(0), scaled.get(match.start())
        if number in have:
            have.remove(number)
        elif not (scale and _in_chinese_units(number, scale, plain_dst)):
            missing.append(f"number {number}")
    return missing


def _in_chinese_units(number: str, scale: str, text: str) -> bool:
    """Whether ``text`` gives "``number`` billion/million/thousand" in 亿 or 万 (47 billion =
    470 亿), to the digits the English gives."""
    value = float(number.replace(",", ""))
    decimals = len(number.split(".")[1]) if "." in number else 0
    for unit, factor in _SCALES[scale]:
        for m in re.finditer(_NUMBER_TEXT + r"\s*" + unit, text):
            got = float(m.group(0)[: -len(unit)].strip().replace(",", ""))
            if abs(got - value * factor) <= 0.5 * 10**-decimals * factor + 1e-9:
                return True
    return False


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one message of one catalog."""

    domain: str  #: the page, as its catalog's path under ``LC_MESSAGES`` without ``.po``
    msgid: str
    what: str

    def __str__(self) -> str:
        short = self.msgid if len(self.msgid) <= 90 else self.msgid[:87] + "..."
        return f"{self.domain}: {self.what}: {short!r}"


def _punct(c: str) -> bool:
    return unicodedata.category(c)[0] in "PS"


def unclosed_bold(text: str) -> list[int]:
    """The offsets of the ``**`` delimiters of ``text`` (outside code, roles and math) that
    cannot do their job, taken in order as opener, closer, opener...: an opener must be
    left-flanking, a closer right-flanking (CommonMark 0.31, "left-flanking and right-flanking
    delimiter runs", punctuation being Unicode P and S). In Chinese ``**通信缓冲区。**DDP`` the
    closer follows 。 and precedes a letter, so it is not right-flanking: the page pairs the
    asterisks wrongly or shows them."""
    masked, out = _masked(text), []
    runs = [m.start() for m in re.finditer(r"(?<!\*)\*\*(?!\*)", masked)]
    for i, at in enumerate(runs):
        before = masked[at - 1] if at else " "
        after = masked[at + 2] if at + 2 < len(masked) else " "
        if i % 2 == 0:  # opener: left-flanking
            ok = not after.isspace() and (not _punct(after) or before.isspace() or _punct(before))
        else:  # closer: right-flanking
            ok = not before.isspace() and (not _punct(before) or after.isspace() or _punct(after))
        if not ok:
            out.append(at)
    return out


def entry_problems(domain: str, msgid: str, msgstr: str, fuzzy: bool) -> list[Problem]:
    """What is wrong with one message: untranslated, fuzzy, a number, code span, math, role or
    link target of ``msgid`` lost in ``msgstr``, or bold that closes in ``msgid`` but cannot
    in ``msgstr`` (:func:`unclosed_bold`)."""
    if not msgstr.strip():
        return [Problem(domain, msgid, "untranslated")]
    found = [Problem(domain, msgid, "fuzzy")] if fuzzy else []
    found += [Problem(domain, msgid, f"lost {m}") for m in _keeps(msgid, msgstr)]
    if "**" in msgstr and unclosed_bold(msgstr) and not unclosed_bold(msgid):
        found.append(
            Problem(
                domain,
                msgid,
                "bold that does not close (put the punctuation outside the asterisks)",
            )
        )
    return found


def read_catalogs(locale_dir: Path) -> dict[str, Any]:
    """Every ``.po`` under ``locale_dir`` (``locales/zh_CN/LC_MESSAGES``) as a Babel catalog,
    keyed by domain (``chapters/p1_foundations/ch00_memory_anatomy``)."""
    from babel.messages.pofile import read_po

    out: dict[str, Any] = {}
    for path in sorted(Path(locale_dir).rglob("*.po")):
        with path.open("rb") as f:
            out[path.relative_to(locale_dir).with_suffix("").as_posix()] = read_po(f)
    return out


def _entries(catalogs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for domain, catalog in catalogs.items():
        for message in catalog:
            if message.id:
                yield domain, message


def catalog_problems(catalogs: dict[str, Any]) -> list[Problem]:
    """:func:`entry_problems` for every message of every catalog (obsolete ones aside)."""
    out: list[Problem] = []
    for domain, m in _entries(catalogs):
        out += entry_problems(domain, str(m.id), str(m.string or ""), m.fuzzy)
    return out


# -------------------------------------------------------------------------------- terminology
@dataclass(frozen=True)
class Term:
    """A glossary row: the English forms, the abbreviations, and the Chinese forms (the first
    is the book's; the others, "/"-separated in the glossary, are the alternatives readers
    meet elsewhere, which the book itself does not use)."""

    english: tuple[str, ...]
    chinese: tuple[str, ...]
    keep: tuple[str, ...] = field(default=())  #: forms that may stay as written (DP, ZeRO)

    @property
    def canonical(self) -> str:
        return self.chinese[0]

    def chinese_for(self, i: int) -> str:
        """The Chinese form that translates the ``i``-th English form."""
        if len(self.chinese) == len(self.english):
            return self.chinese[i]
        return self.chinese[0]

    @property
    def alternatives(self) -> tuple[str, ...]:
        """Chinese forms that are not the translation of any English form: the other ways
        the term is written elsewhere, which the book does not use."""
        if len(self.chinese) == len(self.english):
            return ()
        return tuple(c for c in self.chinese[1:] if not _WORD.fullmatch(c.replace(" ", "")))


_PAREN = re.compile(r"\s*[（(]([^）)]*)[）)]\s*")


def _split_cell(cell: str) -> tuple[list[str], list[str]]:
    """Forms of one glossary cell and the text inside its parentheses."""
    inner = [x.strip() for p in _PAREN.findall(cell) for x in re.split(r"[、,，]", p)]
    forms = [f.strip() for f in _PAREN.sub(" ", cell).split(" / ") if f.strip()]
    return forms, [x for x in inner if x]


def glossary_terms(markdown: str) -> list[Term]:
    """The terms of the glossary's tables (``| English | 中文 | Meaning |``), longest English
    form first (so that "activation recomputation" is matched before "activations")."""
    terms: list[Term] = []
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("English", "") or set(cells[0]) <= set("-: "):
            continue
        english, en_inner = _split_cell(cells[0])
        chinese, zh_inner = _split_cell(cells[1])
        if not chinese or all(not has_cjk(c) for c in chinese):
            continue  # written as in English (NCCL, FlashAttention): nothing to check
        keep = tuple(x for x in [*en_inner, *zh_inner, *english] if not has_cjk(x))
        keep += tuple(c for c in chinese if not has_cjk(c))
        chinese = [c for c in chinese if has_cjk(c)]
        terms.append(Term(tuple(english), tuple(chinese), keep))
    return sorted(terms, key=lambda t: -max(len(e) for e in t.english))


def _stems(chinese: str) -> tuple[str, ...]:
    """The Chinese form, and without its last character where that is a suffix Chinese drops
    in compounds (嵌入层 → 嵌入表, 激活值 → 激活显存)."""
    if len(chinese) >= 3 and chinese[-1] in "层值":
        return chinese, chinese[:-1]
    return (chinese,)


def _english_pattern(form: str) -> re.Pattern[str]:
    """The English form in running text, any case unless it is written with capitals inside
    (ZeRO is not "zero", Ring Attention not "a ring")."""
    words = [re.escape(w) for w in re.split(r"[\s-]+", form)]
    body = r"[\s-]+".join(words)
    flags = 0 if any(c.isupper() for c in form[1:]) else re.IGNORECASE
    return re.compile(rf"(?<![\w-]){body}(?:s|es)?(?![\w-])", flags)


#: English forms too ambiguous to require their Chinese term: "rank" is also a place in a
#: ranking (the planner ranks layouts)
AMBIGUOUS = frozenset({"rank"})


def _keep_pattern(form: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z]){re.escape(form)}(?![a-z])")


def term_problems(
    catalogs: dict[str, Any], terms: list[Term], skip: Iterable[str] = ("chapters/glossary",)
) -> list[Problem]:
    """Each message whose English names a glossary term (outside code, math and roles) must
    name it in Chinese as the glossary does, or keep the English form or its abbreviation; and
    it must not use one of the term's alternative Chinese forms. ``skip``: domains not checked
    (the glossary lists the alternatives on purpose)."""
    skipped = set(skip)
    out: list[Problem] = []
    for domain, m in _entries(catalogs):
        if domain in skipped or not m.string:
            continue
        src, dst = _strip_markup(str(m.id)), _strip_markup(str(m.string))
        for term in terms:
            for i, form in enumerate(term.english):
                if form in AMBIGUOUS:
                    continue
                pattern = _english_pattern(form)
                if not pattern.search(src):
                    continue
                src = pattern.sub(" ", src)  # a longer term owns its words
                want = term.chinese_for(i)
                if any(w in dst for w in _stems(want)) or any(
                    _keep_pattern(k).search(dst) for k in term.keep
                ):
                    continue
                out.append(Problem(domain, str(m.id), f"term {form!r} is not {want!r}"))
            for alt in term.alternatives:
                if alt in dst and term.canonical not in alt:
                    out.append(
                        Problem(
                            domain,
                            str(m.id),
                            f"term {term.english[0]!r} as {alt!r}, the book "
                            f"writes {term.canonical!r}",
                        )
                    )
    return out


def search_words(terms: list[Term]) -> list[str]:
    """The glossary's Chinese terms, for the Chinese search's word segmentation (jieba's user
    dictionary: one word per line), so that "张量并行" is indexed as a word as well as its parts."""
    words = {c for t in terms for c in t.chinese if " " not in c and not _WORD.search(c)}
    return sorted(w for w in words if has_cjk(w) and len(w) >= 2)


# ------------------------------------------------------------------- numbers that change later
def _masked(text: str) -> str:
    """``text`` with roles, inline code and math blanked out (same length), so that the
    numbers found in it are the prose's own."""
    out = text
    for pattern in (_ROLE, _CODE, _MATH):
        out = pattern.sub(lambda m: "\0" * len(m.group(0)), out)
    return out


def number_template(message: str) -> tuple[str, tuple[str, ...]]:
    """``message`` with each number of its prose replaced by a placeholder, and the numbers.
    Two messages with the same template say the same thing about different numbers: a prose
    cell's message after the computation it quotes changed."""
    masked, parts, numbers, last = _masked(message), [], [], 0
    for m in _NUMBER_ANY.finditer(masked):
        parts.append(message[last : m.start()])
        numbers.append(m.group(0))
        last = m.end()
    parts.append(message[last:])
    return "\ufffc".join(parts), tuple(numbers)


def renumber(msgstr: str, old: tuple[str, ...], new: tuple[str, ...]) -> str | None:
    """The translation ``msgstr`` of a message whose numbers were ``old``, for the same message
    with the numbers ``new``: each number of ``msgstr`` that was one of ``old`` becomes its new
    value. None when that is not well defined: an old number that became two different ones,
    or a changed number the translation does not show as written (in 亿, say)."""
    if len(old) != len(new):
        return None
    mapping: dict[str, str] = {}
    for o, n in zip(old, new, strict=True):
        if mapping.setdefault(o, n) != n:
            return None
    changed = {o for o, n in mapping.items() if o != n}
    masked, out, last, seen = _masked(msgstr), [], 0, set()
    for m in _NUMBER_ANY.finditer(masked):
        if m.group(0) in changed:
            out += [msgstr[last : m.start()], mapping[m.group(0)]]
            last = m.end()
            seen.add(m.group(0))
    if seen != changed:
        return None
    return "".join([*out, msgstr[last:]])


class Translations:
    """The translations of one catalog (``msgid`` → ``msgstr``), which also translate a message
    whose words are those of a translated one but whose numbers changed since: a prose cell's
    message holds the numbers its chapter computed, and some are measured (they differ from
    run to run). The old translation gets the new numbers (:func:`renumber`)."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.exact: dict[str, str] = dict(pairs)
        self.templates: dict[str, list[tuple[tuple[str, ...], str]]] = {}
        for msgid, msgstr in self.exact.items():
            template, numbers = number_template(msgid)
            if numbers:
                self.templates.setdefault(template, []).append((numbers, msgstr))

    @classmethod
    def of(cls, catalog: Any) -> Translations:
        """From a Babel catalog: its translated, not fuzzy messages."""
        return cls((str(m.id), str(m.string)) for m in catalog if m.id and m.string and not m.fuzzy)

    def lookup(self, message: str) -> str | None:
        """The translation of ``message``, renumbered if need be; None if there is none."""
        if message in self.exact:
            return self.exact[message]
        template, numbers = number_template(message)
        for old, msgstr in self.templates.get(template, []):
            found = renumber(msgstr, old, numbers)
            if found is not None:
                return found
        return None
