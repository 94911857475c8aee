"""Record Megatron-LM's command-line options and its argument-validation rules at one commit.

    python scripts/record_megatron_args.py /path/to/Megatron-LM \
        [--megatron-deepspeed /path/to/Megatron-DeepSpeed] [--out tests/fixtures]

Megatron-LM is not pip-installable, so the tests cannot import it. This script builds its
argument parser (``megatron.training.arguments.add_megatron_arguments``: the hand-written
options and those generated from its config dataclasses) from a checkout, a work tree or a bare
git repository (exported with ``git archive``), and writes
``tests/fixtures/megatron_lm_args.json``: the commit hash and date, every option (flags, dest,
nargs, type, choices, default) and every ``assert`` of ``validate_args`` (condition, message,
line). ``tests/test_recipes.py`` rebuilds the parser from the file, parses every Megatron-LM
recipe the planner emits, and applies the validation rules it relies on, each tied to a message
recorded here, so a rule that no longer exists at the recorded commit fails the test.

Importing Megatron-LM needs PyTorch; packages it imports that exist only on GPU machines
(``triton``) are replaced by empty placeholders while it is imported, and Python 3.11 gets
``typing.override`` from ``typing_extensions``. Nothing is executed beyond building the parser.

With ``--megatron-deepspeed`` it also writes ``megatron_deepspeed_args.json``: the options of
Megatron-DeepSpeed's ``megatron/arguments.py`` (read from the source, no import) and the ones
DeepSpeed's ``add_config_arguments`` adds (from the installed DeepSpeed).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import enum
import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
import types
import typing
from pathlib import Path

GPU_ONLY = ("triton",)


def git(repo: Path, *args: str) -> str:
    """``git -C repo args`` (stdout, stripped)."""
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def source_tree(repo: Path, paths: tuple[str, ...], tmp: Path) -> Path:
    """A directory with ``paths`` of the checkout: the work tree itself, or (bare repository)
    those paths of HEAD exported with ``git archive``."""
    if all((repo / p).exists() for p in paths):
        return repo
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "HEAD", *paths], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp


class _Placeholder:
    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # a decorator: leave the function as it is
        return _Placeholder()

    def __getattr__(self, name: str) -> object:
        return _Placeholder()


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Placeholder,), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Placeholder modules for the GPU-only packages (only when they are not installed)."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in GPU_ONLY:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        pass


@contextlib.contextmanager
def gpu_placeholders():
    """Import with placeholders for missing GPU-only packages; PyTorch's own optional imports
    of them are made first, while they are still missing."""
    import importlib.util

    missing = [m for m in GPU_ONLY if importlib.util.find_spec(m) is None]
    if missing:
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
        import torch.utils.flop_counter  # noqa: F401
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    finder = _Finder()
    if missing:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def _jsonable(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return repr(value)


def option_record(action: argparse.Action) -> dict[str, object]:
    """One parser action as JSON: its flags, dest, whether it takes a value, nargs, type,
    choices, const and default."""
    takes_value = action.nargs != 0
    kind = type(action).__name__
    return {
        "flags": list(action.option_strings),
        "dest": action.dest,
        "action": kind,
        "takes_value": takes_value,
        "nargs": action.nargs if isinstance(action.nargs, int | str) else None,
        "type": getattr(action.type, "__name__", None) if action.type else None,
        "choices": None if action.choices is None else [_jsonable(c) for c in action.choices],
        "const": _jsonable(action.const),
        "default": _jsonable(action.default),
    }


def validation_rules(source: str, function: str) -> list[dict[str, object]]:
    """Every ``assert`` of ``function`` in ``source``: condition, message, line."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    rules = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            rules.append(
                {
                    "line": node.lineno,
                    "test": ast.unparse(node.test),
                    "message": ast.unparse(node.msg) if node.msg is not None else "",
                }
            )
    return sorted(rules, key=lambda r: r["line"])  # type: ignore[arg-type, return-value]


def record_megatron_lm(repo: Path) -> dict[str, object]:
    """Megatron-LM's options and ``validate_args`` rules at the checkout's HEAD."""
    with tempfile.TemporaryDirectory() as tmp:
        root = source_tree(repo, ("megatron",), Path(tmp))
        sys.path.insert(0, str(root))
        try:
            with gpu_placeholders():
                from megatron.training.arguments import add_megatron_arguments
            parser = add_megatron_arguments(
                argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
            )
            source = (root / "megatron/training/arguments.py").read_text()
        finally:
            sys.path.remove(str(root))
    options = [option_record(a) for a in parser._actions if a.option_strings]
    return {
        "source": "https://github.com/NVIDIA/Megatron-LM",
        "commit": git(repo, "rev-parse", "HEAD"),
        "date": git(repo, "log", "-1", "--format=%cI", "HEAD"),
        "parser": "megatron.training.arguments.add_megatron_arguments",
        "options": options,
        "rules_from": "megatron/training/arguments.py: validate_args",
        "rules": validation_rules(source, "validate_args"),
    }


def _ast_options(source: str) -> list[dict[str, object]]:
    """``add_argument`` calls with literal flags in ``source`` (no import)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if not flags or not all(isinstance(f, str) and f.startswith("-") for f in flags):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = kw["action"].value if isinstance(kw.get("action"), ast.Constant) else "store"
        nargs = kw["nargs"].value if isinstance(kw.get("nargs"), ast.Constant) else None
        typ = ast.unparse(kw["type"]) if "type" in kw else None
        choices = None
        if isinstance(kw.get("choices"), ast.List | ast.Tuple):
            choices = [ast.literal_eval(e) for e in kw["choices"].elts]  # type: ignore[union-attr]
        takes = action not in ("store_true", "store_false", "store_const", "count")
        dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else None
        out.append(
            {
                "flags": flags,
                "dest": dest or flags[-1].lstrip("-").replace("-", "_"),
                "action": action,
                "takes_value": takes,
                "nargs": nargs,
                "type": typ,
                "choices": choices,
                "const": None,
                "default": None,
            }
        )
    return out


def record_megatron_deepspeed(repo: Path) -> dict[str, object]:
    """Megatron-DeepSpeed's options (its ``megatron/arguments.py``, read as source) and the
    ones the installed DeepSpeed's ``add_config_arguments`` adds."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    with tempfile.TemporaryDirectory() as tmp:
        root = source_tree(repo, ("megatron/arguments.py",), Path(tmp))
        options = _ast_options((root / "megatron/arguments.py").read_text())
    ds = deepspeed.add_config_arguments(argparse.ArgumentParser())
    options += [option_record(a) for a in ds._actions if a.option_strings and a.dest != "help"]
    return {
        "source": "https://github.com/deepspeedai/Megatron-DeepSpeed",
        "commit": git(repo, "rev-parse", "HEAD"),
        "date": git(repo, "log", "-1", "--format=%cI", "HEAD"),
        "parser": "megatron/arguments.py add_argument calls (source) + "
        f"deepspeed {deepspeed.__version__} add_config_arguments",
        "options": options,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("megatron_lm", type=Path, help="Megatron-LM checkout (work tree or bare)")
    ap.add_argument("--megatron-deepspeed", type=Path, help="Megatron-DeepSpeed checkout")
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    records = {"megatron_lm_args.json": record_megatron_lm(args.megatron_lm)}
    if args.megatron_deepspeed:
        records["megatron_deepspeed_args.json"] = record_megatron_deepspeed(args.megatron_deepspeed)
    for name, rec in records.items():
        path = args.out / name
        path.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        print(f"{path}: {len(rec['options'])} options at {rec['commit'][:10]}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
