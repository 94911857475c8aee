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

The computed outputs are not messages: the tables of :class:`parmem.book.tables.Table` and the
controls of :mod:`parmem.book.widgets` come from the one English execution, labels included.
Their labels (a table's caption, column headers and note, a control's description) have their
own small catalog, ``output_labels_zh.toml`` beside this module (:class:`OutputLabels`), which
the Chinese build applies to the cached outputs (``_ext/booki18n.py``); :func:`output_labels`
lists the labels of an executed chapter, so a test can check that the catalog has them all.
Figures are PNG images, drawn once in English: their titles, axis labels and legends stay so.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
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
    "sub_terms",
    "compact",
    "SEARCH_EXTRA",
    "number_template",
    "renumber",
    "number_units",
    "renumber_in_order",
    "Translations",
    "OUTPUT_LABELS",
    "OutputLabels",
    "output_labels",
    "needs_label",
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


#: Words of the Chinese edition that readers search for although no glossary row names them
#: (the review of issue 33): each goes into the Chinese search's dictionary with the glossary's
#: terms. "KV Cache" and "KV 缓存" are not here: a dictionary word cannot hold a space (jieba
#: cuts the text at spaces), and Sphinx's search splits a query at spaces too, so a search for
#: "KV 缓存" asks for the pages that have both "KV" and "缓存", and one for "KV Cache" for
#: those with "KV" and "cache"; "KV缓存", without the space, is the dictionary's (see
#: :func:`search_words`).
SEARCH_EXTRA = ("在途", "规划器", "气泡率", "单卡显存")

# a sub-term does not start or end with a conjunction, nor end with a negation (显存不)
_JOINERS = frozenset("与和及或的")


def _segments(word: str) -> list[str]:
    """``word`` cut by jieba's own dictionary (no HMM guesses, no user words)."""
    import jieba  # type: ignore[import-untyped]  # no stubs; the Chinese build installs it

    global _TOKENIZER
    if _TOKENIZER is None:
        jieba.setLogLevel(30)  # not its "Building prefix dict" lines on stderr
        _TOKENIZER = jieba.Tokenizer()
    return list(_TOKENIZER.cut(word, HMM=False))


_TOKENIZER: Any = None


def sub_terms(word: str, known: Iterable[str], text: str) -> list[str]:
    """The parts of the term ``word`` that the book also uses on their own: each beginning or
    end of ``word`` on a boundary of its jieba words (激活 | 重 | 计算 gives 激活重 and 重计算;
    混合 | 精度 | 训练 gives 混合精度 and 精度训练), at least two characters, Chinese, not one of
    jieba's own words (those it finds already), not single characters only (一阶 of 一阶矩 is
    as much a part of 第一阶段) and not starting or ending with a conjunction, that occurs in
    ``text`` outside the ``known`` words that contain it (重计算 outside 激活重计算,
    选择性重计算 and 完全重计算). Searching for such a part must find the pages that use it
    only inside the longer term too: Sphinx's search looks for a query's partial matches only
    when no page has it as a word of its own (``performTermsSearch`` of its
    ``searchtools.js``)."""
    cuts = _segments(word)
    ends = [sum(len(c) for c in cuts[:i]) for i in range(1, len(cuts))]
    out = []
    for part, pieces in [
        *[(word[:e], cuts[:i]) for i, e in enumerate(ends, 1)],
        *[(word[e:], cuts[i:]) for i, e in enumerate(ends, 1)],
    ]:
        if len(part) < 2 or not has_cjk(part) or (len(pieces) == 1 and _TOKENIZER.FREQ.get(part)):
            continue
        if all(len(p) == 1 for p in pieces):  # 一阶 of 一阶矩: as much in 第一阶段
            continue
        if part[0] in _JOINERS or part[-1] in _JOINERS | {"不"}:
            continue
        rest = text
        for longer in sorted((k for k in known if part in k and k != part), key=len, reverse=True):
            rest = rest.replace(longer, "\0")
        if part in rest:
            out.append(part)
    return out


_SCRIPT_GAP = re.compile(
    r"(?<=[A-Za-z0-9]) +(?=[\u3400-\u9fff])|(?<=[\u3400-\u9fff]) +(?=[A-Za-z0-9])"
)


def compact(text: str) -> str:
    """``text`` without the spaces between Latin letters or digits and Chinese ("KV 缓存" →
    "KV缓存"), the form a reader may type."""
    return _SCRIPT_GAP.sub("", text)


def search_words(terms: list[Term], texts: Iterable[str] = ()) -> list[str]:
    """The Chinese search's dictionary (jieba's user dictionary, one word per line): the
    glossary's Chinese terms, so that "张量并行" is indexed as a word as well as its parts; the
    :func:`sub_terms` of each that the Chinese edition's ``texts`` (its catalogs' translations)
    use on their own (重计算 of 激活重计算, 混合精度 of 混合精度训练); :data:`SEARCH_EXTRA`;
    and the glossary's terms written with Latin letters and a space ("KV 缓存", "3D 并行") in
    their :func:`compact` form: Sphinx's search takes "KV缓存" as one word, which only a
    dictionary word can give it ("KV 缓存" it takes as two, KV and 缓存)."""
    words = {c for t in terms for c in t.chinese if " " not in c and not _WORD.search(c)}
    words = {w for w in words if has_cjk(w) and len(w) >= 2} | set(SEARCH_EXTRA)
    mixed = {compact(c) for t in terms for c in t.chinese if " " in c}
    words |= {w for w in mixed if has_cjk(w) and re.fullmatch(r"\w+", w)}
    text = "\n".join(texts)
    if text:
        words |= {part for w in sorted(words) for part in sub_terms(w, words, text)}
    return sorted(words)


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


# a unit both editions write after a number as it is: what tells apart two equal numbers that
# measure different things ("34% ... 34 ms")
_UNIT = re.compile(r"\s?(%|[KMGT]i?B\b|ms\b|µs\b|s\b|×)")


def number_units(message: str) -> tuple[str, ...]:
    """The unit written right after each number of :func:`number_template` (``%``, ``ms``,
    ``GiB``, ...; ``""`` for none)."""
    masked = _masked(message)
    out = []
    for m in _NUMBER_ANY.finditer(masked):
        u = _UNIT.match(masked, m.end())
        out.append(u.group(1) if u else "")
    return tuple(out)


def renumber(
    msgstr: str, old: tuple[str, ...], new: tuple[str, ...], units: tuple[str, ...] | None = None
) -> str | None:
    """The translation ``msgstr`` of a message whose numbers were ``old``, for the same message
    with the numbers ``new``: each number of ``msgstr`` that was one of ``old`` becomes its new
    value. An old number that became two different ones is told apart by the unit written after
    each (``units``, :func:`number_units` of the English: "34%" and "34 ms"), found after it in
    the translation too. None when that is not well defined: such a number without units that
    tell its values apart, or a changed number the translation does not show as written (in 亿,
    say)."""
    if len(old) != len(new) or (units is not None and len(units) != len(old)):
        return None
    values: dict[str, set[str]] = {}
    for o, n in zip(old, new, strict=True):
        values.setdefault(o, set()).add(n)
    split = {o for o, v in values.items() if len(v) > 1}
    if split and units is None:
        return None
    mapping: dict[Any, str] = {}
    for i, (o, n) in enumerate(zip(old, new, strict=True)):
        slot: Any = (o, units[i]) if o in split and units is not None else o
        if mapping.setdefault(slot, n) != n:
            return None
    changed = {k for k, n in mapping.items() if (k[0] if isinstance(k, tuple) else k) != n}
    masked, out, last, seen = _masked(msgstr), [], 0, set()
    for m in _NUMBER_ANY.finditer(masked):
        key: Any = m.group(0)
        if key in split:
            u = _UNIT.match(masked, m.end())
            key = (key, u.group(1) if u else "")
        if key in changed:
            out += [msgstr[last : m.start()], mapping[key]]
            last = m.end()
            seen.add(key)
    if seen != changed:
        return None
    return "".join([*out, msgstr[last:]])


def renumber_in_order(msgstr: str, old: tuple[str, ...], new: tuple[str, ...]) -> str | None:
    """Like :func:`renumber`, for a short label whose translation gives each number of the
    English as often as the English does (``old``): the k-th time a number appears in
    ``msgstr`` it becomes the value of its k-th appearance in the English now (``new``). Equal
    numbers are taken to keep their order in the translation. None when a number of ``old``
    does not appear in ``msgstr`` as often as in ``old``."""
    if len(old) != len(new):
        return None
    queues: dict[str, list[str]] = {}
    for o, n in zip(old, new, strict=True):
        queues.setdefault(o, []).append(n)
    masked = _masked(msgstr)
    found = [m for m in _NUMBER_ANY.finditer(masked) if m.group(0) in queues]
    if any(sum(m.group(0) == o for m in found) != len(q) for o, q in queues.items()):
        return None
    out, last = [], 0
    for m in found:
        out += [msgstr[last : m.start()], queues[m.group(0)].pop(0)]
        last = m.end()
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
            # the same template: the same words, so the same unit after each number
            found = renumber(msgstr, old, numbers, number_units(message))
            if found is not None:
                return found
        return None


# ------------------------------------------------------------- the labels of computed outputs
#: The Chinese of the labels that the chapters' computed outputs show (TOML): ``keep`` lists
#: those that read the same in both editions (names, code, abbreviations), ``[zh]`` translates
#: the others (a table's caption, column headers and note, a control's description),
#: ``[cells]`` the whole cells of a table body that read otherwise (``yes``, ``no``) and
#: ``[options]`` the options of a control (a memory term). A label with numbers is matched with
#: new numbers too (:meth:`OutputLabels.lookup`).
OUTPUT_LABELS = Path(__file__).with_name("output_labels_zh.toml")

# the labels of a table output: what parmem.book.tables.Table._repr_html_ writes (the caption,
# each header, the note, a cell) and the paragraphs around Estimate._repr_html_'s table
_TABLE_PART = re.compile(
    r"<caption>(?P<caption>.*?)</caption>|<th>(?P<header>.*?)</th>"
    r"|<p><small>(?P<note>.*?)</small></p>|<p>(?P<paragraph>.*?)</p>"
    r'|<td style="text-align:right">(?P<cell>[^<]*)</td>',
    re.S,
)
_CODE_ONLY = re.compile(r"\s*<code>[^<]*</code>\s*")


def _table_output(text: str) -> bool:
    """Whether an HTML output is a table of the library's (:class:`parmem.book.tables.Table`,
    :class:`parmem.estimate.Estimate`): one that starts with its table or a ``<div>`` and holds
    one."""
    return text.startswith("<table>") or (text.startswith("<div>") and "<table>" in text)


def _label(m: re.Match[str]) -> tuple[str, str] | None:
    """(kind, text) of a label found by ``_TABLE_PART``: text unescaped, except a paragraph's,
    which is its HTML (``2<sup>30</sup>``); None for a cell and a paragraph that is code."""
    kind = m.lastgroup or ""
    if kind == "cell" or (kind == "paragraph" and _CODE_ONLY.fullmatch(m.group(kind))):
        return None
    return kind, m.group(kind) if kind == "paragraph" else html.unescape(m.group(kind))


# units are not words to translate: "S (MiB)" reads the same in Chinese
_UNITS = re.compile(r"(?<![A-Za-z])(?:[KMGT]iB|GB|TFLOP)(?![A-Za-z])")


def needs_label(text: str) -> bool:
    """Whether a label of a computed output has words to translate (:func:`needs_translation`,
    units such as GiB aside): "sent per GPU (MiB)" has, "S (MiB)", "Ψ/t (B)" and "4K" have not."""
    return needs_translation(_UNITS.sub(" ", text))


class OutputLabels:
    """The Chinese of the labels of the chapters' computed outputs (:data:`OUTPUT_LABELS`).

    The chapters run once, in English, and both editions render that one execution; the
    Chinese build rewrites the labels of its outputs with this catalog: a label is translated
    when its whole text is an entry (or an entry with other numbers), and left as it is
    otherwise."""

    def __init__(
        self,
        labels: Mapping[str, str],
        cells: Mapping[str, str] | None = None,
        keep: Iterable[str] = (),
        options: Mapping[str, str] | None = None,
    ) -> None:
        self.keep = frozenset(keep)
        self.labels = Translations(labels.items())
        self.cells: dict[str, str] = dict(cells or {})
        self.options: dict[str, str] = dict(options or {})

    @classmethod
    def read(cls, path: Path | None = None) -> OutputLabels:
        """The catalog in ``path`` (TOML: ``keep``, ``[zh]``, ``[cells]``, ``[options]``), by
        default the book's (:data:`OUTPUT_LABELS`)."""
        import tomllib

        data = tomllib.loads(Path(path or OUTPUT_LABELS).read_text(encoding="utf-8"))
        return cls(
            data.get("zh", {}), data.get("cells", {}), data.get("keep", ()), data.get("options")
        )

    def lookup(self, label: str) -> str | None:
        """The Chinese of ``label``: itself if it is kept, None if the catalog lacks it.

        A label whose numbers differ from an entry's is renumbered (:func:`renumber`), or, where
        one number of the entry became two ("rank 0 of 2 (b=2)" run on 4 ranks: "rank 0 of 4
        (b=2)"), by :func:`renumber_in_order`."""
        if label in self.keep:
            return label
        found = self.labels.lookup(label)
        if found is not None:
            return found
        template, numbers = number_template(label)
        for old, msgstr in self.labels.templates.get(template, []):
            found = renumber_in_order(msgstr, old, numbers)
            if found is not None:
                return found
        return None

    def table_html(self, text: str) -> str:
        """A table as :class:`parmem.book.tables.Table` writes it (``<table><caption>...``) or
        :class:`parmem.estimate.Estimate` (``<div>...<table>``), with its caption, headers,
        note and paragraphs translated (a paragraph as HTML: an entry may hold ``<sup>``), and
        each cell that is one of the ``[cells]`` words; any other HTML is returned as it is."""
        if not _table_output(text):
            return text

        def one(m: re.Match[str]) -> str:
            kind, inner = m.lastgroup or "", m.group(m.lastgroup or 0)
            if kind == "cell":
                found = self.cells.get(html.unescape(inner))
            else:
                label = _label(m)
                found = self.lookup(label[1]) if label else None
            if found is None:
                return m.group(0)
            new = found if kind == "paragraph" else html.escape(found)
            start, end = m.span(kind)
            return m.group(0)[: start - m.start()] + new + m.group(0)[end - m.start() :]

        return _TABLE_PART.sub(one, text)

    def widget_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of a notebook's widget state (``application/vnd.jupyter.widget-state+json``:
        ``{"state": {model id: {"state": {...}}}}``) with each control's description translated,
        and each option label that is one of the ``[options]``."""
        import copy

        out = copy.deepcopy(dict(state))
        for model in out.get("state", {}).values():
            fields = model.get("state", {})
            description = fields.get("description")
            if description:
                fields["description"] = self.lookup(description) or description
            if "_options_labels" in fields:
                fields["_options_labels"] = [
                    self.options.get(o, o) for o in fields["_options_labels"]
                ]
        return out


#: the mime type of a notebook's widget state (ipywidgets' "embed" format)
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def output_labels(notebook: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The labels an executed notebook's outputs show, as (kind, text): each ``caption``,
    ``header``, ``note`` and ``paragraph`` of a table output (:meth:`OutputLabels.table_html`),
    and each ``control`` description of its saved widget state. Only those that
    :func:`needs_label`."""
    found: list[tuple[str, str]] = []
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            text = output.get("data", {}).get("text/html", "")
            text = "".join(text) if isinstance(text, list) else text
            if _table_output(text):
                found += [x for x in map(_label, _TABLE_PART.finditer(text)) if x]
    widgets = notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {})
    for model in widgets.get("state", {}).values():
        description = model.get("state", {}).get("description")
        if description:
            found.append(("control", description))
    return [(kind, text) for kind, text in found if needs_label(text)]
