"""Record the command-line flags of the serving engines' launchers, read from their source.

    python scripts/record_serving_args.py --vllm /path/to/vllm --sglang /path/to/sglang \
        [--trtllm /path/to/TensorRT-LLM] [--commit trtllm=<sha>] [--note trtllm=<text>] \
        [--out data/serving_args.toml]

What: for ``vllm serve``, ``python -m sglang.launch_server`` and ``trtllm-serve`` it lists every
flag the launcher's parser accepts (with its other spellings, whether it takes a value, and its
``choices`` where the source states them) and writes ``data/serving_args.toml``: per engine the
repository, the commit or version read, the date recorded and ``flags``. Each path may be a git
work tree, a bare git repository (files are read with ``git show HEAD:<path>``) or an unpacked
source tree (an sdist, or a wheel's Python files; version and commit then come from the
package's ``_version.py``). An engine left out keeps the section already in the output file.

Why: vLLM does not install on a CPU machine without a CUDA build of PyTorch, SGLang and
TensorRT-LLM pull in GPU-only packages as well, so the tests cannot import the engines to build
their parsers. They check the launch commands parmem emits against this fixture instead, which
is recorded from the source of one commit and says which.

How, without importing anything (``ast`` only):

- vLLM: ``make_arg_parser`` (entrypoints/openai/cli_args.py) adds a few flags by hand, then
  ``FrontendArgs.add_cli_args`` and ``AsyncEngineArgs.add_cli_args``. ``FrontendArgs`` turns
  every dataclass field into ``--<field-name-with-hyphens>``; ``EngineArgs.add_cli_args``
  (engine/arg_utils.py) names each flag itself and takes its keyword arguments from
  ``get_kwargs(<Config class>)["<field>"]``, which derives them from the field's type hint as
  ``_compute_kwargs`` does: a ``bool`` field becomes ``argparse.BooleanOptionalAction`` (so
  ``--no-<flag>`` exists too), a ``Literal[...]`` field gets ``choices`` (sorted, plus ``"None"``
  when the hint allows ``None``), unless the hint also allows ``str``, in which case the values
  are only a ``metavar`` (recorded here as ``suggested``, not enforced). The script follows the
  same rules on the type hints, resolving aliases (``CacheDType``, ``ModelDType``) and base
  classes through the modules' imports, as the modules bind them at run time. ``vllm serve``
  adds ``--grpc`` in entrypoints/cli/serve.py. ``--quantization`` is a plain string to the
  parser (its hint names ``QuantizationMethods`` only under ``TYPE_CHECKING``); the values
  ``ModelConfig`` accepts afterwards, those of that ``Literal``, are recorded as
  ``valid_values``. (vLLM's parser also accepts ``--foo_bar`` for ``--foo-bar``; flags that
  plugins or ``current_platform.pre_register_and_update`` add at run time are not seen.)
- SGLang: every ``parser.add_argument`` of ``ServerArgs.add_cli_args`` (srt/server_args.py);
  ``choices`` given as a list, or as a module-level list such as ``QUANTIZATION_CHOICES``, are
  resolved; choices computed at run time (``list(X.keys())``) are recorded as ``choices_from``.
- TensorRT-LLM: the ``click`` options of the ``serve`` command (tensorrt_llm/commands/serve.py),
  including options added by a decorator function of the same package
  (``common_llm_options``); ``click.Choice([...])`` and ``ChoiceWithAlias([...], {...})`` give
  ``choices`` (and ``choice_aliases``); ``is_flag=True`` options take no value.

Each entry of ``flags`` is keyed by one spelling: ``aliases`` lists the argument's other
spellings (each also a key, with ``alias_of``), ``takes_value = false`` marks a switch,
``negates`` a ``--no-`` spelling and ``valid_values`` what the engine checks after parsing. The
run fails if a flag that parmem emits (``REQUIRED``) is missing, so a change of the engines'
parser layout is noticed rather than recorded silently.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "data" / "serving_args.toml"

REPOSITORIES = {
    "vllm": "vllm-project/vllm",
    "sglang": "sgl-project/sglang",
    "trtllm": "NVIDIA/TensorRT-LLM",
}
COMMANDS = {
    "vllm": "vllm serve",
    "sglang": "python -m sglang.launch_server",
    "trtllm": "trtllm-serve serve",
}
PACKAGES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}

# flags that parmem's launch commands use: recording fails if one is missing
REQUIRED = {
    "vllm": [
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--kv-cache-dtype",
        "--quantization",
        "--dtype",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--enable-expert-parallel",
        "--data-parallel-size",
        "--enforce-eager",
        "--block-size",
    ],
    "sglang": [
        "--tp-size",
        "--mem-fraction-static",
        "--context-length",
        "--kv-cache-dtype",
        "--quantization",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--dp-size",
        "--ep-size",
    ],
    "trtllm": [
        "--tp_size",
        "--pp_size",
        "--ep_size",
        "--max_seq_len",
        "--kv_cache_free_gpu_memory_fraction",
        "--max_batch_size",
        "--max_num_tokens",
    ],
}
# flags whose choices must have been resolved (a fixture without them would test nothing)
REQUIRED_CHOICES = {"vllm": ["--kv-cache-dtype", "--dtype"], "sglang": ["--kv-cache-dtype"]}

BUILTIN_TYPES = {"bool", "str", "int", "float", "dict", "list", "tuple", "set", "bytes"}
WRAPPERS = {"Annotated", "SkipValidation", "ClassVar", "Final", "InitVar", "Required"}
CONTAINERS = {"list", "List", "tuple", "Tuple", "set", "Set", "Sequence", "Iterable"}
MAPPINGS = {"dict", "Dict", "Mapping"}


# ---------------------------------------------------------------- reading a source tree


def _run_git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _is_git(root: Path) -> bool:
    """A git work tree whose top is ``root``, or a bare repository at ``root`` (a directory
    merely inside some other repository does not count)."""
    if (root / ".git").exists():
        return True
    try:
        bare = _run_git(root, "rev-parse", "--is-bare-repository") == "true"
        git_dir = Path(_run_git(root, "rev-parse", "--absolute-git-dir"))
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False
    return bare and git_dir.resolve() == root.resolve()


class Source:
    """The files of one engine's source: a directory, or ``HEAD`` of a git repository."""

    def __init__(self, root: Path) -> None:
        if not root.exists():
            raise SystemExit(f"no such source tree: {root}")
        self.root = root
        self.git = _is_git(root)
        self._cache: dict[str, str | None] = {}

    def read(self, rel: str) -> str | None:
        """The text of ``rel`` (a path inside the tree), or None if it is not there."""
        if rel not in self._cache:
            path = self.root / rel
            if path.is_file():
                self._cache[rel] = path.read_text(encoding="utf-8")
            elif self.git:
                try:
                    self._cache[rel] = _run_git(self.root, "show", f"HEAD:{rel}")
                except subprocess.CalledProcessError:
                    self._cache[rel] = None
            else:
                self._cache[rel] = None
        return self._cache[rel]

    def require(self, rel: str) -> str:
        text = self.read(rel)
        if text is None:
            raise SystemExit(f"{self.root}: {rel} not found; has the layout changed?")
        return text

    def provenance(self, package: str) -> dict[str, str]:
        """Commit and date (git), or version and commit from ``<package>/_version.py``."""
        if self.git:
            return {
                "commit": _run_git(self.root, "rev-parse", "HEAD"),
                "commit_date": _run_git(self.root, "log", "-1", "--format=%cs", "HEAD"),
            }
        out: dict[str, str] = {}
        text = self.read(f"{package}/_version.py")
        if text is None:
            return out
        for node in ast.parse(text).body:
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Constant):
                continue
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            value = node.value.value
            if "__version__" in names and isinstance(value, str):
                out["version"] = value
            if "__commit_id__" in names and isinstance(value, str) and value:
                # setuptools-scm writes the short hash with a leading "g"
                out["commit"] = value[1:] if re.fullmatch(r"g[0-9a-f]{7,40}", value) else value
        return out


# ---------------------------------------------------------------- modules and names


@dataclass
class Module:
    name: str
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level name -> class/def/value
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local -> (module, name)
    star_imports: list[str] = field(default_factory=list)  # ``from x import *``


class Modules:
    """Parsed modules of one source tree, loaded on demand by dotted name."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._cache: dict[str, Module | None] = {}

    def load(self, dotted: str) -> Module | None:
        if dotted not in self._cache:
            base = dotted.replace(".", "/")
            text = self.source.read(f"{base}.py") or self.source.read(f"{base}/__init__.py")
            self._cache[dotted] = None if text is None else self._index(dotted, text)
        return self._cache[dotted]

    def _index(self, dotted: str, text: str) -> Module:
        mod = Module(dotted, ast.parse(text))
        is_package = self.source.read(dotted.replace(".", "/") + "/__init__.py") is not None
        package = dotted if is_package else dotted.rpartition(".")[0]
        for node in _runtime_statements(mod.tree.body):
            if isinstance(node, ast.ClassDef | ast.FunctionDef):
                mod.defs[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        mod.defs[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.value is not None:
                    mod.defs[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                origin = _absolute(package, node.module, node.level)
                for alias in node.names:
                    if alias.name == "*":
                        mod.star_imports.append(origin)
                    else:
                        mod.imports[alias.asname or alias.name] = (origin, alias.name)
        return mod

    def resolve(self, mod: Module, name: str, depth: int = 0) -> tuple[Module, ast.AST] | None:
        """The definition ``name`` refers to in ``mod``, following ``from x import name``."""
        if depth > 8:
            return None
        if name in mod.defs:
            return mod, mod.defs[name]
        if name in mod.imports:
            origin, original = mod.imports[name]
            target = self.load(origin)
            if target is None:  # ``from pkg import submodule``
                return None
            return self.resolve(target, original, depth + 1)
        for origin in mod.star_imports:
            target = self.load(origin)
            found = None if target is None else self.resolve(target, name, depth + 1)
            if found is not None:
                return found
        return None


def _runtime_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The module-level statements as they run: ``if TYPE_CHECKING:`` blocks give way to their
    ``else`` (vLLM annotates ``quantization: QuantizationMethods | str | None`` but binds
    ``QuantizationMethods = Any`` at run time, so the parser gets no choices); the bodies of
    other ``if`` and ``try`` statements are included, later bindings winning."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            if _base_name(node.test) == "TYPE_CHECKING":
                out += _runtime_statements(node.orelse)
            else:
                out += _runtime_statements(node.body) + _runtime_statements(node.orelse)
        elif isinstance(node, ast.Try):
            out += _runtime_statements(node.body)
        else:
            out.append(node)
    return out


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*base, module] if module else base)


def _base_name(node: ast.AST) -> str:
    return ast.unparse(node).split(".")[-1]


# ---------------------------------------------------------------- type hints (vLLM)


@dataclass
class Hints:
    """What a type hint allows, in the terms of vLLM's ``_compute_kwargs``."""

    types: set[str] = field(default_factory=set)  # builtin type names, "none"
    literals: list[object] = field(default_factory=list)
    element_literals: list[object] = field(default_factory=list)  # Literal inside list[...]
    dataclass: bool = False
    unresolved: list[str] = field(default_factory=list)


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if _base_name(target) in {"dataclass", "config"}:
            return True
    return False


def hints_of(modules: Modules, mod: Module, node: ast.AST, out: Hints, depth: int = 0) -> Hints:
    """Flatten an annotation into ``out``: unions, ``Optional``, wrappers and aliases."""
    if depth > 12:
        out.unresolved.append(ast.unparse(node))
        return out
    if isinstance(node, ast.Constant):
        if node.value is None:
            out.types.add("none")
        elif isinstance(node.value, str):  # a string annotation
            hints_of(modules, mod, ast.parse(node.value, mode="eval").body, out, depth + 1)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        hints_of(modules, mod, node.left, out, depth + 1)
        hints_of(modules, mod, node.right, out, depth + 1)
        return out
    if isinstance(node, ast.Subscript):
        return _subscript_hints(modules, mod, node, out, depth)
    if isinstance(node, ast.Name):
        if node.id == "None":
            out.types.add("none")
        elif node.id in BUILTIN_TYPES:
            out.types.add(node.id)
        else:
            found = modules.resolve(mod, node.id)
            if found is None:
                out.unresolved.append(node.id)
            elif isinstance(found[1], ast.ClassDef):
                out.dataclass = out.dataclass or _is_dataclass(found[1])
            elif not isinstance(found[1], ast.FunctionDef):  # a type alias
                hints_of(modules, found[0], found[1], out, depth + 1)
        return out
    out.unresolved.append(ast.unparse(node))  # e.g. torch.dtype
    return out


def _subscript_hints(modules: Modules, mod: Module, node: ast.Subscript, out: Hints, depth: int):
    base = _base_name(node.value)
    args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    if base == "Literal":
        for arg in args:
            try:
                out.literals.append(ast.literal_eval(arg))
            except ValueError:  # a nested Literal alias: Literal["auto", RunnerType]
                inner = hints_of(modules, mod, arg, Hints(), depth + 1)
                out.literals.extend(inner.literals)
                if not inner.literals:
                    out.unresolved.append(ast.unparse(arg))
    elif base == "Optional":
        hints_of(modules, mod, args[0], out, depth + 1)
        out.types.add("none")
    elif base == "Union":
        for arg in args:
            hints_of(modules, mod, arg, out, depth + 1)
    elif base in WRAPPERS:
        hints_of(modules, mod, args[0], out, depth + 1)
    elif base in CONTAINERS:
        out.types.add("list" if base in {"List", "Sequence", "Iterable"} else base.lower())
        inner = Hints()
        for arg in args:
            hints_of(modules, mod, arg, inner, depth + 1)
        out.element_literals.extend(inner.literals)
    elif base in MAPPINGS:
        out.types.add("dict")
    else:
        out.unresolved.append(ast.unparse(node))
    return out


def _sorted_values(values: list[object]) -> list[object]:
    try:
        return sorted(set(values))  # type: ignore[type-var]
    except TypeError:
        return list(dict.fromkeys(values))


def vllm_field_spec(hints: Hints) -> dict[str, object]:
    """The argparse behaviour vLLM's ``_compute_kwargs`` gives a field with these hints."""
    if hints.dataclass:
        return {}  # parsed as JSON
    if "bool" in hints.types:
        return {"takes_value": False, "negatable": True}  # BooleanOptionalAction
    values = hints.literals or hints.element_literals
    if not values:
        return {}
    options = _sorted_values(values)
    if "str" in hints.types:
        return {"suggested": options}  # a metavar only: any string is accepted
    if "none" in hints.types:
        options = [*options, "None"]
    return {"choices": options}


def _field_annotation(
    modules: Modules, mod: Module, cls: ast.ClassDef, name: str, depth: int = 0
) -> tuple[Module, ast.expr] | None:
    for node in cls.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            return mod, node.annotation
    if depth > 8:
        return None
    for base in cls.bases:
        found = modules.resolve(mod, _base_name(base))
        if found is not None and isinstance(found[1], ast.ClassDef):
            hit = _field_annotation(modules, found[0], found[1], name, depth + 1)
            if hit is not None:
                return hit
    return None


def _dataclass_fields(modules: Modules, mod: Module, cls: ast.ClassDef) -> list[tuple]:
    """(module, name, annotation) of a dataclass's fields, base classes' first."""
    fields: dict[str, tuple] = {}
    for base in cls.bases:
        found = modules.resolve(mod, _base_name(base))
        if found is not None and isinstance(found[1], ast.ClassDef):
            for entry in _dataclass_fields(modules, found[0], found[1]):
                fields[entry[1]] = entry
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if name.startswith("_") or _base_name(node.annotation).startswith("ClassVar"):
                continue
            fields[name] = (mod, name, node.annotation)
    return list(fields.values())


# ---------------------------------------------------------------- flag records


class Flags:
    """The flags of one launcher: ``{spelling: record}``."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, object]] = {}
        self.positionals: list[str] = []

    def add(self, spellings: list[str], spec: dict[str, object]) -> None:
        if not spellings:
            return
        primary, others = spellings[0], spellings[1:]
        record: dict[str, object] = {}
        if others:
            record["aliases"] = others
        negatable = bool(spec.get("negatable"))
        for key in ("choices", "suggested", "choices_from", "choice_aliases"):
            if spec.get(key):
                record[key] = spec[key]
        if spec.get("takes_value") is False:
            record["takes_value"] = False
        self.table[primary] = record
        for other in others:
            self.table[other] = {"alias_of": primary}
        if negatable:
            for spelling in spellings:
                if spelling.startswith("--"):
                    self.table["--no-" + spelling[2:]] = {"takes_value": False, "negates": primary}


def _option_strings(call: ast.Call) -> list[str]:
    return [
        a.value
        for a in call.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
    ]


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _action_spec(call: ast.Call, modules: Modules | None = None, mod: Module | None = None):
    """``action=`` of an argparse call: switches take no value; BooleanOptionalAction adds
    ``--no-``; an action class of the module whose ``__init__`` defaults ``nargs=0`` (SGLang's
    ``DeprecatedAction``) is a switch too."""
    action = _keyword(call, "action")
    if action is None:
        return {}
    text = ast.unparse(action)
    if text.endswith("BooleanOptionalAction"):
        return {"takes_value": False, "negatable": True}
    if isinstance(action, ast.Name) and modules is not None and mod is not None:
        found = modules.resolve(mod, action.id)
        if found is not None and isinstance(found[1], ast.ClassDef):
            return {"takes_value": False} if _nargs_default_zero(found[1]) else {}
    if isinstance(action, ast.Constant) and action.value in {
        "store_true",
        "store_false",
        "store_const",
        "count",
        "help",
        "version",
    }:
        return {"takes_value": False}
    return {}


def _nargs_default_zero(cls: ast.ClassDef) -> bool:
    init = _find_def(cls, "__init__")
    if init is None:
        return False
    args = init.args
    positional = args.posonlyargs + args.args
    pairs = list(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d]
    return any(a.arg == "nargs" and isinstance(d, ast.Constant) and d.value == 0 for a, d in pairs)


def _add_arguments(function: ast.AST):
    """The ``X.add_argument(...)`` calls inside a function, in source order."""
    calls = [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_argument"
    ]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _find_def(tree: ast.AST, name: str, cls: str | None = None) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if cls is not None and isinstance(node, ast.ClassDef) and node.name == cls:
            return _find_def(node, name)
        if cls is None and isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


# ---------------------------------------------------------------- choices of a literal list


def static_list(modules: Modules | None, mod: Module | None, node: ast.AST, local: dict, depth=0):
    """The values of a list expression, or None when they are computed at run time: a literal,
    a module-level list (with its module-level ``.append``/``.extend``), ``a + b``,
    ``list(x)``/``sorted(x)``."""
    if depth > 8:
        return None
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        values: list[object] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):  # [*OTHER_CHOICES, "x"]
                inner = static_list(modules, mod, element.value, local, depth + 1)
                if inner is None:
                    return None
                values.extend(inner)
                continue
            value = _static_constant(modules, mod, element)
            if value is _UNKNOWN:
                return None
            values.append(value)
        # a set's order is not kept by argparse (it iterates the set): record it sorted
        return _sorted_values(values) if isinstance(node, ast.Set) else values
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = static_list(modules, mod, node.left, local, depth + 1)
        right = static_list(modules, mod, node.right, local, depth + 1)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
        if node.func.id in {"list", "sorted", "tuple"}:
            values = static_list(modules, mod, node.args[0], local, depth + 1)
            if values is not None and node.func.id == "sorted":
                values = _sorted_values(values)
            return values
    if isinstance(node, ast.Name):
        if node.id in local:
            return static_list(modules, mod, local[node.id], {}, depth + 1)
        if modules is not None and mod is not None:
            found = modules.resolve(mod, node.id)
            if found is not None and not isinstance(found[1], ast.ClassDef | ast.FunctionDef):
                values = static_list(modules, found[0], found[1], {}, depth + 1)
                if values is not None:
                    values = values + _module_level_additions(found[0], node.id)
                return values
    return None


_UNKNOWN = object()


def _static_constant(modules: Modules | None, mod: Module | None, node: ast.AST) -> object:
    """A literal, or a name bound to one at module level (``LORA_TARGET_ALL_MODULES``)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Name) and modules is not None and mod is not None:
        found = modules.resolve(mod, node.id)
        if found is not None and isinstance(found[1], ast.Constant):
            return found[1].value
    return _UNKNOWN


def _module_level_additions(mod: Module, name: str) -> list[object]:
    added: list[object] = []
    for node in mod.tree.body:
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if not (isinstance(func, ast.Attribute) and ast.unparse(func.value) == name):
            continue
        try:
            if func.attr == "append" and len(node.value.args) == 1:
                added.append(ast.literal_eval(node.value.args[0]))
            elif func.attr == "extend" and len(node.value.args) == 1:
                added.extend(ast.literal_eval(node.value.args[0]))
        except ValueError:
            continue
    return added


def _local_assignments(function: ast.AST) -> dict[str, ast.expr]:
    local: dict[str, ast.expr] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    local[target.id] = node.value
    return local


def _choices_spec(modules, mod, expr: ast.expr | None, local: dict) -> dict[str, object]:
    if expr is None:
        return {}
    values = static_list(modules, mod, expr, local)
    if values is None:
        return {"choices_from": ast.unparse(expr)}
    return {"choices": values}


# ---------------------------------------------------------------- vLLM


class VllmReader:
    def __init__(self, source: Source) -> None:
        self.modules = Modules(source)
        self.flags = Flags()

    def module(self, dotted: str) -> Module:
        mod = self.modules.load(dotted)
        if mod is None:
            raise SystemExit(f"vLLM: module {dotted} not found; has the layout changed?")
        return mod

    def read(self) -> Flags:
        cli = self.module("vllm.entrypoints.openai.cli_args")
        make = _find_def(cli.tree, "make_arg_parser")
        if make is None:
            raise SystemExit("vLLM: make_arg_parser not found in entrypoints/openai/cli_args.py")
        called = {
            ast.unparse(n.func.value)
            for n in ast.walk(make)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "add_cli_args"
        }
        for call in _add_arguments(make):
            self.plain_argument(call)
        for name in sorted(called):
            found = self.modules.resolve(cli, name)
            if found is None or not isinstance(found[1], ast.ClassDef):
                raise SystemExit(f"vLLM: cannot find the class {name} of make_arg_parser")
            self.class_arguments(found[0], found[1])
        self.quantization_methods()
        serve = self.module("vllm.entrypoints.cli.serve")
        init = _find_def(serve.tree, "subparser_init")
        if init is not None:
            for call in _add_arguments(init):
                self.plain_argument(call)
        return self.flags

    def quantization_methods(self) -> None:
        """``--quantization`` is a plain string to the parser; ``ModelConfig`` then checks it
        against ``QUANTIZATION_METHODS``, the values of the ``QuantizationMethods`` literal
        (plus methods that plugins register): recorded as ``valid_values``."""
        quant = self.module("vllm.model_executor.layers.quantization")
        alias = quant.defs.get("QuantizationMethods")
        record = self.flags.table.get("--quantization")
        if alias is None or record is None:
            raise SystemExit("vLLM: QuantizationMethods or --quantization not found")
        values = hints_of(self.modules, quant, alias, Hints()).literals
        if not values:
            raise SystemExit("vLLM: QuantizationMethods is no longer a Literal")
        record["valid_values"] = values

    def plain_argument(self, call: ast.Call) -> None:
        spellings = _option_strings(call)
        if not spellings:
            first = call.args[0] if call.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self.flags.positionals.append(first.value)
            return
        spec = _action_spec(call)
        choices = _keyword(call, "choices")
        if choices is not None:
            spec.update(_choices_spec(None, None, choices, {}))
        self.flags.add(spellings, spec)

    def _method(self, mod: Module, cls: ast.ClassDef, name: str, depth: int = 0):
        """(module, method) of ``cls.name``, looked up in the base classes too."""
        method = _find_def(cls, name)
        if method is not None or depth > 8:
            return (mod, method) if method is not None else None
        for base in cls.bases:
            found = self.modules.resolve(mod, _base_name(base))
            if found is not None and isinstance(found[1], ast.ClassDef):
                hit = self._method(found[0], found[1], name, depth + 1)
                if hit is not None:
                    return hit
        return None

    def class_arguments(self, mod: Module, cls: ast.ClassDef) -> None:
        """``X.add_cli_args``: explicit ``add_argument`` calls (EngineArgs), or one flag per
        dataclass field of ``X`` (FrontendArgs inherits the method from BaseFrontendArgs); a
        call to ``Y.add_cli_args`` inside is followed."""
        hit = self._method(mod, cls, "add_cli_args")
        if hit is None:
            raise SystemExit(f"vLLM: {cls.name}.add_cli_args not found")
        method_mod, method = hit
        for node in ast.walk(method):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_cli_args"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id not in {"cls", "super"}
            ):
                found = self.modules.resolve(method_mod, node.func.value.id)
                if found is not None and isinstance(found[1], ast.ClassDef):
                    self.class_arguments(found[0], found[1])
        if any(_kebab_loop(n) for n in ast.walk(method)):
            for fmod, name, annotation in _dataclass_fields(self.modules, mod, cls):
                spec = vllm_field_spec(hints_of(self.modules, fmod, annotation, Hints()))
                self.flags.add(["--" + name.replace("_", "-")], spec)
            return
        self.engine_arguments(method_mod, method)

    def engine_arguments(self, mod: Module, method: ast.FunctionDef) -> None:
        configs: dict[str, str] = {}  # "cache_kwargs" -> "CacheConfig"
        local = _local_assignments(method)
        for name, value in local.items():
            if (
                isinstance(value, ast.Call)
                and _base_name(value.func) == "get_kwargs"
                and value.args
                and isinstance(value.args[0], ast.Name)
            ):
                configs[name] = value.args[0].id
        extended = _extended_choices(method)
        for call in _add_arguments(method):
            spellings = _option_strings(call)
            if not spellings:
                continue
            spec: dict[str, object] = {}
            for kw in call.keywords:
                if kw.arg is None:
                    spec.update(self.field_kwargs(mod, kw.value, configs, local))
                    key = _field_key(kw.value, local)
                    if key in extended:  # the recorded list would be incomplete
                        spec["choices_from"] = f"{spec.pop('choices', None)} + {extended[key]}"
            spec.update(_action_spec(call))
            choices = _keyword(call, "choices")
            if choices is not None:
                spec.update(_choices_spec(self.modules, mod, choices, local))
            self.flags.add(spellings, spec)

    def field_kwargs(self, mod: Module, node: ast.expr, configs: dict, local: dict) -> dict:
        """The spec of ``**cache_kwargs["block_size"]`` (also inside ``{**..., "default": x}``
        or through a local name)."""
        if isinstance(node, ast.Dict):
            spec: dict[str, object] = {}
            for key, value in zip(node.keys, node.values, strict=True):
                if key is None:
                    spec.update(self.field_kwargs(mod, value, configs, local))
            return spec
        if isinstance(node, ast.Name) and node.id in local:
            return self.field_kwargs(mod, local[node.id], configs, local)
        if not (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and isinstance(node.slice, ast.Constant)
            and node.value.id in configs
        ):
            return {}
        found = self.modules.resolve(mod, configs[node.value.id])
        if found is None or not isinstance(found[1], ast.ClassDef):
            raise SystemExit(f"vLLM: cannot find the config class {configs[node.value.id]}")
        hit = _field_annotation(self.modules, found[0], found[1], node.slice.value)
        if hit is None:
            raise SystemExit(f"vLLM: {configs[node.value.id]} has no field {node.slice.value}")
        return vllm_field_spec(hints_of(self.modules, hit[0], hit[1], Hints()))


def _field_key(node: ast.expr, local: dict) -> tuple[str, str] | None:
    """``("cache_kwargs", "block_size")`` for ``cache_kwargs["block_size"]`` (also inside
    ``{**...}`` or through a local name)."""
    if isinstance(node, ast.Dict):
        keys = [
            _field_key(v, local) for k, v in zip(node.keys, node.values, strict=True) if k is None
        ]
        return next((k for k in keys if k is not None), None)
    if isinstance(node, ast.Name) and node.id in local:
        return _field_key(local[node.id], local)
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
    ):
        return node.value.id, str(node.slice.value)
    return None


def _extended_choices(method: ast.AST) -> dict[tuple[str, str], str]:
    """``x_kwargs["f"]["choices"] += ...`` (or ``= ...``) inside ``add_cli_args``: the choices
    of that field are extended at run time (vLLM's ``--collect-detailed-traces``)."""
    out: dict[tuple[str, str], str] = {}
    for node in ast.walk(method):
        if isinstance(node, ast.AugAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.slice, ast.Constant)
                    and target.slice.value == "choices"
                ):
                    key = _field_key(target.value, {})
                    if key is not None:
                        out[key] = ast.unparse(node.value)
    return out


def _kebab_loop(node: ast.AST) -> bool:
    """``add_argument(..., f"--{key.replace('_', '-')}", ...)``: one flag per field."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        and any(isinstance(a, ast.JoinedStr) and "replace" in ast.unparse(a) for a in node.args)
    )


# ---------------------------------------------------------------- SGLang


def read_sglang(source: Source) -> Flags:
    modules = Modules(source)
    mod = modules.load("sglang.srt.server_args")
    if mod is None:
        raise SystemExit("SGLang: sglang/srt/server_args.py not found")
    method = _find_def(mod.tree, "add_cli_args", cls="ServerArgs")
    if method is None:
        raise SystemExit("SGLang: ServerArgs.add_cli_args not found")
    local = _local_assignments(method)
    flags = Flags()
    for call in _add_arguments(method):
        spellings = _option_strings(call)
        if not spellings:
            continue
        spec = _action_spec(call, modules, mod)
        spec.update(_choices_spec(modules, mod, _keyword(call, "choices"), local))
        flags.add(spellings, spec)
    return flags


# ---------------------------------------------------------------- TensorRT-LLM (click)


def _click_spec(modules: Modules, mod: Module, call: ast.Call) -> dict[str, object]:
    spec: dict[str, object] = {}
    is_flag = _keyword(call, "is_flag")
    if isinstance(is_flag, ast.Constant) and is_flag.value is True:
        spec["takes_value"] = False
    kind = _keyword(call, "type")
    if isinstance(kind, ast.Call) and _base_name(kind.func) in {"Choice", "ChoiceWithAlias"}:
        if kind.args:
            spec.update(_choices_spec(modules, mod, kind.args[0], {}))
        if len(kind.args) > 1 and isinstance(kind.args[1], ast.Dict):
            try:
                spec["choice_aliases"] = ast.literal_eval(kind.args[1])
            except ValueError:
                pass
    return spec


def _click_spellings(call: ast.Call) -> list[str]:
    spellings: list[str] = []
    for value in _option_strings(call):
        parts = value.split("/") if "/" in value else [value]  # "--x/--no-x"
        spellings.extend(p for p in parts if p.startswith("-"))
    return spellings


def _click_calls(node: ast.AST) -> list[ast.Call]:
    calls = [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in {"option", "argument"}
    ]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def read_trtllm(source: Source) -> Flags:
    modules = Modules(source)
    mod = modules.load("tensorrt_llm.commands.serve")
    if mod is None:
        raise SystemExit("TensorRT-LLM: tensorrt_llm/commands/serve.py not found")
    serve = mod.defs.get("serve")
    if not isinstance(serve, ast.FunctionDef):
        raise SystemExit("TensorRT-LLM: the serve command is not in commands/serve.py")
    flags = Flags()
    for deco in serve.decorator_list:
        calls: list[tuple[Module, ast.Call]] = []
        if isinstance(deco, ast.Call):
            calls = [(mod, c) for c in _click_calls(deco)]
        elif isinstance(deco, ast.Name):  # e.g. @common_llm_options
            found = modules.resolve(mod, deco.id)
            if found is not None and isinstance(found[1], ast.FunctionDef):
                calls = [(found[0], c) for c in _click_calls(found[1])]
        for where, call in calls:
            if call.func.attr == "argument":  # type: ignore[attr-defined]
                first = call.args[0] if call.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    flags.positionals.append(first.value)
                continue
            flags.add(_click_spellings(call), _click_spec(modules, where, call))
    return flags


# ---------------------------------------------------------------- TOML


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = ", ".join(f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }"
    if value is None:
        return json.dumps("None")
    raise TypeError(f"cannot write {value!r} as TOML")


def _stringify(record: dict[str, object]) -> dict[str, object]:
    """Choices as strings (what a command line carries)."""
    out: dict[str, object] = {}
    for key, value in record.items():
        if key in {"choices", "suggested", "valid_values"} and isinstance(value, list):
            out[key] = [v if isinstance(v, str) else str(v) for v in value]
        else:
            out[key] = value
    return out


def toml_document(sections: dict[str, dict[str, object]]) -> str:
    lines = [
        "# Launch flags of the serving engines, recorded from their source by",
        "# scripts/record_serving_args.py (do not edit by hand; re-run it to update).",
        "# flags: spelling -> { aliases, alias_of, takes_value (false: a switch), negates,",
        "#   choices (enforced by the parser), suggested (shown, not enforced),",
        "#   choices_from (computed at run time), choice_aliases, valid_values (checked by the",
        "#   engine after parsing, not by the parser) }",
    ]
    for engine in sorted(sections):
        section = sections[engine]
        lines += ["", f"[{engine}]"]
        for key, value in section.items():
            if key != "flags":
                lines.append(f"{_toml_key(key)} = {toml_value(value)}")
        lines += ["", f"[{engine}.flags]"]
        flags = section.get("flags", {})
        assert isinstance(flags, dict)
        for spelling in sorted(flags, key=lambda s: (s.lstrip("-").lower(), s)):
            lines.append(f"{json.dumps(spelling)} = {toml_value(flags[spelling])}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


READERS = {"vllm": lambda s: VllmReader(s).read(), "sglang": read_sglang, "trtllm": read_trtllm}


def record(engine: str, path: Path, commit: str | None, note: str | None) -> dict[str, object]:
    source = Source(path)
    flags = READERS[engine](source)
    section: dict[str, object] = {
        "command": COMMANDS[engine],
        "repository": REPOSITORIES[engine],
    }
    provenance = source.provenance(PACKAGES[engine])
    if commit:
        provenance["commit"] = commit
    for key in ("version", "commit", "commit_date"):
        if key in provenance:
            section[key] = provenance[key]
    section["recorded"] = datetime.date.today().isoformat()
    section["read_from"] = note or ("git repository" if source.git else "source tree")
    if flags.positionals:
        section["positionals"] = flags.positionals
    section["flags"] = {k: _stringify(v) for k, v in flags.table.items()}
    check(engine, flags.table)
    return section


def check(engine: str, table: dict[str, dict[str, object]]) -> None:
    missing = [f for f in REQUIRED[engine] if f not in table]
    if missing:
        raise SystemExit(f"{engine}: flags not found: {missing}; has the parser changed?")
    for spelling in REQUIRED_CHOICES.get(engine, []):
        record = table[spelling]
        target = table.get(str(record.get("alias_of")), record) if "alias_of" in record else record
        if not target.get("choices"):
            raise SystemExit(f"{engine}: no choices resolved for {spelling}")


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        engine, sep, value = item.partition("=")
        if not sep or engine not in READERS:
            raise SystemExit(f"--{what} takes ENGINE=VALUE with ENGINE one of {list(READERS)}")
        out[engine] = value
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", type=Path, help="vLLM source (checkout or source tree)")
    parser.add_argument("--sglang", type=Path, help="SGLang source")
    parser.add_argument("--trtllm", type=Path, help="TensorRT-LLM source")
    parser.add_argument(
        "--commit", action="append", default=[], help="ENGINE=SHA, when the tree does not say"
    )
    parser.add_argument(
        "--note", action="append", default=[], help="ENGINE=TEXT: where the source came from"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    paths = {e: getattr(args, e) for e in READERS if getattr(args, e) is not None}
    if not paths:
        parser.error("give at least one of --vllm, --sglang, --trtllm")
    commits, notes = _pairs(args.commit, "commit"), _pairs(args.note, "note")
    sections: dict[str, dict[str, object]] = {}
    if args.out.exists():
        sections = tomllib.loads(args.out.read_text(encoding="utf-8"))
    for engine, path in paths.items():
        sections[engine] = record(engine, path, commits.get(engine), notes.get(engine))
        flags = sections[engine]["flags"]
        assert isinstance(flags, dict)
        print(f"{engine}: {len(flags)} flag spellings from {path}")
    args.out.write_text(toml_document(sections), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
