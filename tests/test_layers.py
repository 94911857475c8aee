"""The library's layers: each module imports only from the layers below it, and never another
module's private (underscore) name.

The layers, bottom to top (DESIGN.md, "one home per formula, layers one way"); modules on the
same layer may not import each other either, so that a formula cannot drift into a sibling:

    units, _check, _data                  units, validation, packaged data
    table, hfconfig                       the parameter table's rows; reading config.json
    sharding, hardware, engines           the parameter table; GPUs and links; engine profiles
    model                                 ModelSpec
    config, papers, lora, quant           ParallelConfig, TrainingSetup, vocabularies; published
                                          tables; LoRA's adapters; bitsandbytes' stored bytes
    states, pipeline, activations,        model states; schedules; saved activations;
    kvcache                               the KV cache per token and layer
    layout, finetune_acts                 the Layout: groups, stage walk, boundaries, engine rules;
                                          fine-tuning's saved tensors
    comm, flops                           communication; FLOPs
    estimate, inference                   the estimator; serving memory (and its traffic)
    allocator, traces, analyses,          the allocator simulator and its traces; studies;
    engine_analyses,                      one job under each engine profile;
    serving, serving_latency,             serving engines' startup memory; the roofline of
                                          serving (TTFT, TPOT);
    reference                             the torch side
    bounds, serving_log, engine_records,  allocated, reserved and the high bound; serving logs;
    measure                               recorded engine runs and their named differences; the
                                          torch side's meters (measure uses traces' recorder)
    fit, measure_model, engine_losses     the inverse queries (what fits); a reader's model measured;
                                          each engine's own loss, measured
    planner                               search and cost model
    book, distributed                     glue, tables, plots, widgets; the demos
    cli                                   the command line

Imports inside ``if TYPE_CHECKING:`` blocks are type annotations only and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parent.parent / "lib" / "parmem"

LAYERS: list[set[str]] = [
    {"units", "_check", "_data"},
    {"table", "hfconfig"},
    {"sharding", "hardware", "engines"},
    {"model"},
    {"config", "papers", "lora", "quant"},
    {"states", "pipeline", "activations", "kvcache"},
    {"layout", "finetune_acts"},
    {"comm", "flops"},
    {"estimate", "inference"},
    {"allocator", "traces", "analyses", "engine_analyses", "reference",
     "finetune_analyses", "serving", "serving_latency"},
    {"bounds", "serving_log", "engine_records", "measure"},
    {"fit", "measure_model", "engine_losses"},
    {"planner"},
    {"book", "distributed", "plots", "widgets", "tables"},
    {"cli"},
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}
# the package's own __init__ re-exports the public API: it may import from any layer
EXEMPT = {"__init__", "__main__"}


def _modules() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path) -> tuple[str, ...]:
    rel = path.relative_to(LIB.parent).with_suffix("")
    parts = rel.parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _top(parts: tuple[str, ...]) -> str | None:
    """The layer key of module ``parmem.a.b``: its first component below ``parmem``."""
    return parts[1] if len(parts) > 1 else None


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(path: Path):
    """(target module parts, imported names, line) for every parmem import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    here = _dotted(path)
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = base + tuple((node.module or "").split(".")) if node.module else base
            else:
                target = tuple((node.module or "").split("."))
            if target[0] != "parmem":
                continue
            names = [a.name for a in node.names]
            # "from parmem.x import y" where y is a submodule: the target is parmem.x.y
            yield target, names, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = tuple(alias.name.split("."))
                if parts[0] == "parmem":
                    yield parts, [], node.lineno


def _is_module(parts: tuple[str, ...]) -> bool:
    p = LIB.parent.joinpath(*parts)
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def test_every_module_has_a_layer():
    missing = sorted({_top(_dotted(p)) for p in _modules()} - set(LEVEL) - EXEMPT - {None})
    assert not missing, f"modules without a layer in tests/test_layers.py: {missing}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(LIB)))
def test_imports_go_down_and_stay_public(path):
    here = _dotted(path)
    mine = _top(here)
    if path.stem in EXEMPT and len(here) == 1:
        return  # parmem/__init__.py
    problems = []
    for target, names, line in _imports(path):
        top = _top(target)
        if top is None:
            # "from parmem import x": x is a module or a name re-exported by parmem/__init__
            for n in names:
                t = ("parmem", n)
                if _is_module(t):
                    top = n
                    if LEVEL.get(n, -1) > LEVEL.get(mine, -1):
                        problems.append(f"line {line}: imports higher layer parmem.{n}")
            continue
        same_package = top == mine
        if not same_package and LEVEL.get(top, 99) >= LEVEL.get(mine, -1):
            kind = "same layer" if LEVEL.get(top) == LEVEL.get(mine) else "a higher layer"
            problems.append(f"line {line}: imports {'.'.join(target)} ({kind})")
        target_is_other_module = target != here
        for n in names:
            if n.startswith("_") and target_is_other_module and not _is_module(target + (n,)):
                problems.append(f"line {line}: imports private name {n} from "
                                f"{'.'.join(target)}")
    assert not problems, f"{path.relative_to(LIB)}:\n" + "\n".join(problems)


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    # the rule itself must be able to fail: a fake low-layer module importing the estimator
    fake = LIB / "units.py"
    tree_text = fake.read_text(encoding="utf-8") + "\nfrom .estimate import estimate\n"
    bad = tmp_path / "parmem" / "units.py"
    bad.parent.mkdir()
    bad.write_text(tree_text, encoding="utf-8")
    monkeypatch.setattr(__import__(__name__), "LIB", tmp_path / "parmem")
    with pytest.raises(AssertionError, match="imports parmem.estimate"):
        test_imports_go_down_and_stay_public(bad)
