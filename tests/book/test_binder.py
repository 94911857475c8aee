"""Binder (and Colab) can run every chapter: each third-party package a chapter needs, directly
or through the parmem modules it imports and the pool targets it runs, is pinned in
``binder/requirements.txt`` at the version ``requirements.txt`` pins (review of issue 33: Binder
could not run chapter 22, whose torchtitan demo runs on the pool's ranks).

The chapters' code cells are parsed (``import`` statements and ``"module:function"`` targets
of ``pool.run``); parmem's own modules are followed through every import they make, lazy ones
inside functions included, since the ranks import them when the demo runs; each top-level
module is mapped to its distribution with :func:`importlib.metadata.packages_distributions`.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from functools import cache
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "lib"
TARGET = re.compile(r"""["'](parmem(?:\.\w+)+):\w+["']""")
#: imported only under ``if TYPE_CHECKING`` or for a GPU path the chapters do not take
NOT_NEEDED = {"triton"}


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        if m:
            out[re.sub(r"\[.*\]", "", m.group(1)).lower().replace("_", "-")] = m.group(2)
    return out


def _imports(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with IPython magics: drop those lines
        tree = ast.parse("\n".join(x for x in source.splitlines() if not x.lstrip().startswith("%")))
    return _imports_of(tree)


def _imports_of(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _module_file(name: str) -> Path | None:
    base = LIB / name.replace(".", "/")
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


@cache
def _module_deps(name: str) -> frozenset[str]:
    """What parmem module ``name`` (and the packages above it) imports, relative imports
    resolved; parsed once."""
    out: set[str] = set()
    parts = name.split(".")
    for i in range(len(parts), 0, -1):  # the module and its packages
        pkg = ".".join(parts[:i])
        f = _module_file(pkg)
        if f is None:
            continue
        tree = ast.parse(f.read_text())
        out |= _imports_of(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".") if f.name == "__init__.py" else pkg.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                out.add(".".join(base + ([node.module] if node.module else [])))
    return frozenset(out)


@cache
def _needed() -> dict[str, frozenset[str]]:
    """Top-level third-party module -> the chapters that need it."""
    need: dict[str, set[str]] = {}
    for nb_path in sorted((ROOT / "chapters").rglob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        todo = set().union(*(_imports(c) for c in code))
        todo |= {m for c in code for m in TARGET.findall(c)}
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            top = name.split(".")[0]
            if top == "parmem":
                todo |= _module_deps(name) - seen
            elif top not in sys.stdlib_module_names:
                need.setdefault(top, set()).add(nb_path.stem)
    return {k: frozenset(v) for k, v in need.items()}


def test_binder_pins_what_every_chapter_needs():
    pins, binder = _pins(ROOT / "requirements.txt"), _pins(ROOT / "binder" / "requirements.txt")
    dists = md.packages_distributions()
    missing, wrong = [], []
    for module, chapters in sorted(_needed().items()):
        if module in NOT_NEEDED or module == "IPython":
            continue
        for dist in dists.get(module, [module]):
            d = dist.lower().replace("_", "-")
            if d not in pins:
                continue  # a dependency of a pinned package, installed with it
            if d not in binder:
                missing.append(f"{d} (for {', '.join(sorted(chapters))})")
            elif binder[d].split("+")[0] != pins[d].split("+")[0]:
                wrong.append(f"{d}: binder {binder[d]}, requirements.txt {pins[d]}")
    assert not missing and not wrong, "binder/requirements.txt lacks " + "; ".join(missing + wrong)


def test_the_check_sees_a_demo_run_on_the_ranks():
    """The torchtitan demo of chapter 22 is a pool target string, not an import: it counts."""
    need = _needed()
    assert "ch22_engines" in need.get("torchtitan", set())
    assert "ch23_finetune" in need.get("peft", set())
