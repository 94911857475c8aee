"""The docstrings' reStructuredText, checked the way the book's ``-W -n`` build reads it, in a
second rather than in the book stage's minute and a half.

Two mistakes have failed that build more than once:

* ``:data:`NAME``` naming a constant that has no ``#:`` doc comment. Sphinx's autodoc documents a
  module-level constant only when it has one (``sphinx.pycode.ModuleAnalyzer.find_attr_docs``,
  which is what this test asks), so the reference has no target and ``-n`` warns;
* a word between bars, which reStructuredText reads as a substitution reference that nothing
  defines ("Undefined substitution referenced").
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

sphinx_pycode = pytest.importorskip("sphinx.pycode")

LIB = Path(__file__).resolve().parent.parent / "lib"
DATA_REF = re.compile(r":data:`~?([A-Za-z_][\w.]*)`")
# the other Python roles; a target may be written ``title <target>``
PY_REF = re.compile(r":(?:py:)?(func|class|meth|mod|attr|exc|obj):`(?:[^`<]*<)?~?\.?([A-Za-z_][\w.]*)>?`")
# |name| with no space inside the bars and none of them doubled ("||", a table's "| a | b |")
SUBSTITUTION = re.compile(r"(?<![|\w`])\|(?=[^\s|])([^|\n`]*[^\s|`])\|(?![|\w])")


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted((LIB / "parmem").rglob("*.py")):
        parts = path.relative_to(LIB).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] != "__main__":  # not on the API page
            out.append((".".join(parts), path))
    return out


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each docstring and each ``#:`` doc comment in ``path``."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((getattr(node, "lineno", 1), doc))
    for i, line in enumerate(source.splitlines(), 1):
        if line.lstrip().startswith("#:"):
            out.append((i, line.lstrip()[2:]))
    return out


_DOCUMENTED: dict[str, set[str]] = {}


def _documented(module: str) -> set[str]:
    """Names of ``module`` that carry a doc comment or a docstring after their assignment."""
    if module not in _DOCUMENTED:
        attrs = sphinx_pycode.ModuleAnalyzer.for_module(module).find_attr_docs()
        _DOCUMENTED[module] = {name for (scope, name) in attrs if scope == ""}
    return _DOCUMENTED[module]


def _resolve(target: str, here: str) -> tuple[str, str] | None:
    """(module, name) that ``target`` names when written in module ``here``: the current module
    first, then the dotted path as imported (a package's re-export counts where it is defined)."""
    candidates = [f"{here}.{target}", target]
    for dotted in candidates:
        mod_name, _, name = dotted.rpartition(".")
        if not mod_name:
            continue
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        if hasattr(mod, name):
            for m in [mod_name] + [
                v.__name__
                for v in vars(mod).values()
                if getattr(v, "__name__", "").startswith("parmem") and hasattr(v, "__file__")
            ]:
                if name in _documented(m):
                    return m, name
            return mod_name, name
    return None


MODULES = _modules()


def test_the_library_has_docstrings_to_check():
    found = sum(len(DATA_REF.findall(t)) for _, p in MODULES for _, t in _texts(p))
    assert len(MODULES) > 50 and found > 20


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_data_references_have_a_documented_target(module, path):
    bad = []
    for line, text in _texts(path):
        for target in DATA_REF.findall(text):
            hit = _resolve(target, module)
            if hit is None:
                bad.append(f"line {line}: :data:`{target}` names nothing importable")
            elif hit[1] not in _documented(hit[0]):
                bad.append(
                    f"line {line}: :data:`{target}` -> {hit[0]}.{hit[1]} has no #: doc comment, "
                    "so the book's -n build finds no target; document it or write ``NAME``"
                )
    assert not bad, "\n".join(bad)


def _importable(target: str, here: str) -> bool:
    """Whether ``target`` names an object, as the book's extension looks it up: relative to the
    module, its package, or as a dotted path; a method or attribute through its class."""
    pkg = here.rpartition(".")[0]
    for dotted in (f"{here}.{target}", f"{pkg}.{target}" if pkg else "", target):
        parts = dotted.split(".") if dotted else []
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for name in parts[i:]:
                    obj = getattr(obj, name)
            except AttributeError:
                break
            return True
    return False


#: targets outside parmem that the book's nitpick_ignore_regex lets through (_config.yml)
FOREIGN = re.compile(r"^(?!parmem\b)[A-Za-z_]\w*\.")


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_python_references_name_something(module, path):
    """A dotted ``:func:``, ``:class:``, ``:meth:``, ``:mod:``... with no object behind it fails the
    book's ``-n`` build (a name that moved, a function never re-exported). Bare names resolve
    against the enclosing class or the ignore list, which Sphinx decides; they are not checked."""
    bad = [
        f"line {line}: :{role}:`{target}` names nothing importable from {module}"
        for line, text in _texts(path)
        for role, target in PY_REF.findall(text)
        if "." in target and not FOREIGN.match(target) and not _importable(target, module)
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_word_between_bars(module, path):
    bad = [
        f"line {line}: |{m}| reads as an undefined substitution; write ``|{m}|`` or abs({m})"
        for line, text in _texts(path)
        for m in SUBSTITUTION.findall(text)
    ]
    assert not bad, "\n".join(bad)


def test_the_checks_catch_the_two_mistakes():
    """The two patterns find what failed the build before (an undocumented ENGINES; |error|)."""
    assert DATA_REF.findall("at the bytes of :data:`ENGINES` (vLLM)") == ["ENGINES"]
    assert "ENGINES" not in _documented("parmem.serving")
    assert SUBSTITUTION.findall("mean |error| of the rows") == ["error"]
    assert SUBSTITUTION.findall("a table | a | b |, or ``|x|``, or a || b") == []
    assert PY_REF.findall("with the device from :func:`parmem.distributed.device`.") == [
        ("func", "parmem.distributed.device")
    ]
    assert not _importable("parmem.distributed.device", "parmem.distributed.measure_step")
    assert _importable("parmem.distributed.launcher.device", "parmem.distributed.measure_step")
