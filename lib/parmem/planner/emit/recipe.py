"""A launch recipe: what a user pastes to run a planned layout on one engine.

A :class:`Recipe` holds the environment a launch needs (variables to set, and ones that must be
unset), the files to write (a DeepSpeed JSON), the launch command (launcher, program, arguments
as separate tokens, so that a test can hand them to the engine's own parser), the engine version
the recipe targets, and notes on what the engine cannot express and what was emitted instead.
``str(recipe)`` is a shell script, safe to run whatever the strings in it (a model name read from
a ``config.json`` included): every token of the command and every value of the environment is
quoted for a POSIX shell (``shlex.quote``; IEEE Std 1003.1-2017, Shell Command Language §2.2.2,
single quotes preserve every character), the title and the notes are one comment line each
(control and line-separator characters written as escapes, so no newline ends a comment), a file
is written by a here-document with a quoted delimiter (no expansion, §2.7.4) that no line of the
file equals, and a variable name, a file name or a token that cannot be written so (a NUL byte,
which no shell string holds) is refused with ``ValueError`` naming the field.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..inputs import Cluster

__all__ = ["SHELL_VARIABLES", "Recipe", "comment", "flag_lines", "quote", "torchrun"]

#: Variables a recipe leaves for the shell to expand (``$NODE_RANK``, ``$MASTER_ADDR`` of
#: :func:`torchrun`): any other token that looks like ``$NAME`` is quoted like every token.
SHELL_VARIABLES = frozenset({"NODE_RANK", "MASTER_ADDR"})
#: Unicode categories written as escapes in a comment: controls (``\n``, ``\r``, NUL, NEL ...),
#: format characters (bidirectional overrides), line and paragraph separators, lone surrogates.
_ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Recipe:
    """One layout as a launch recipe for one engine.

    ``env``: variable → value, or ``None`` for a variable that must be unset; ``files``: (name,
    content) written before the launch; ``launcher`` + ``program`` + ``args`` is the command
    (``args`` are the engine's own arguments, one token per element); ``target``: the engine
    version the recipe is written for and checked against; ``notes``: what the engine cannot
    express exactly and what the recipe does instead."""

    engine: str
    target: str
    title: str
    launcher: tuple[str, ...]
    program: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str | None], ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def command(self) -> list[str]:
        """The whole command line as tokens: launcher, program, arguments."""
        return [*self.launcher, *self.program, *self.args]

    def __post_init__(self) -> None:
        for name in ("engine", "target", "title"):
            _string(name, getattr(self, name))
        for name in ("launcher", "program", "args"):
            for i, tok in enumerate(getattr(self, name)):
                _string(f"{name}[{i}]", tok, nul=False)
        for i, note in enumerate(self.notes):
            _string(f"notes[{i}]", note)
        for i, (var, value) in enumerate(self.env):
            _string(f"env[{i}] name", var)
            if not _VARIABLE.fullmatch(var):
                raise ValueError(
                    f"env[{i}] name={var!r:.60} must be a shell variable name "
                    "(a letter or _, then letters, digits or _)"
                )
            if value is not None:
                _string(f"env[{i}] value ({var})", value, nul=False)
        for i, (name, text) in enumerate(self.files):
            _string(f"files[{i}] name", name, nul=False)
            if not name or any(unicodedata.category(ch) in _ESCAPED for ch in name):
                raise ValueError(
                    f"files[{i}] name={name!r:.60} must be a non-empty file name without "
                    "control characters"
                )
            _string(f"files[{i}] content ({name})", text, nul=False)

    def file(self, name: str) -> str:
        """The content of the file ``name`` the recipe writes."""
        for n, text in self.files:
            if n == name:
                return text
        raise ValueError(f"name={name!r}: the recipe writes {[n for n, _ in self.files]}")

    def environment(self) -> dict[str, str | None]:
        """``env`` as a dict (``None``: must be unset)."""
        return dict(self.env)

    def __str__(self) -> str:
        lines = [comment(self.title), comment(f"target: {self.target}")]
        lines += [comment(f"note: {n}") for n in self.notes]
        for name, value in self.env:
            lines.append(f"unset {name}" if value is None else f"export {name}={quote(value)}")
        for name, text in self.files:
            body = text.rstrip("\n")
            end = _delimiter(body)
            lines += [f"cat > {quote(name, expand=False)} <<'{end}'", body, end]
        head = " ".join(quote(x) for x in (*self.launcher, *self.program))
        lines.append(" \\\n  ".join([head, *flag_lines(self.args)]))
        return "\n".join(lines) + "\n"


def _string(name: str, value: object, *, nul: bool = True) -> None:
    """Refuse a ``value`` that is not a string, or (``nul=False``) that holds a NUL byte, which
    no shell word can carry."""
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r:.60} must be a string")
    if not nul and "\x00" in value:
        raise ValueError(f"{name}={value!r:.60} must not contain a NUL byte")


def comment(text: str) -> str:
    """``text`` as one shell comment line: ``# `` and the text with every control, format,
    line- or paragraph-separator character written as its Python escape (``\\n``, ``\\x00``,
    ``\\u2028``), so that nothing in it ends the comment (a shell comment runs to the next
    newline, POSIX Shell Command Language §2.3 rule 9)."""
    out = "".join(
        ch.encode("unicode_escape", "backslashreplace").decode("ascii")
        if unicodedata.category(ch) in _ESCAPED
        else ch
        for ch in text
    )
    return f"# {out}"


def _delimiter(body: str) -> str:
    """A here-document delimiter (``EOF``, else ``EOF_1``, ``EOF_2``, ...) that no line of
    ``body`` equals: the here-document ends at the first line equal to it (POSIX §2.7.4)."""
    lines = set(body.split("\n"))
    end, k = "EOF", 0
    while end in lines:
        k += 1
        end = f"EOF_{k}"
    return end


def flag_lines(args: tuple[str, ...]) -> list[str]:
    """``args`` grouped one option per line: a ``--flag`` with the values that follow it."""
    out: list[list[str]] = []
    for tok in args:
        if (tok.startswith("-") and not _is_number(tok)) or _is_subcommand(tok) or not out:
            out.append([tok])
        else:
            out[-1].append(tok)
    return [" ".join(quote(t) for t in group) for group in out]


def quote(tok: str, *, expand: bool = True) -> str:
    """``tok`` quoted for a POSIX shell (``shlex.quote``), except (``expand=True``) one of the
    :data:`SHELL_VARIABLES` as ``$NAME``, which the shell must expand."""
    if expand and tok.startswith("$") and tok[1:] in SHELL_VARIABLES:
        return tok
    return shlex.quote(tok)


def _is_subcommand(tok: str) -> bool:
    return re.fullmatch(r"[a-z_]+:[a-z-]+", tok) is not None


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def torchrun(cluster: Cluster) -> tuple[str, ...]:
    """``torchrun`` for ``cluster``: one process per GPU on every node (the rendezvous variables
    are the user's: ``$NODE_RANK``, ``$MASTER_ADDR``)."""
    out = ["torchrun", "--nproc-per-node", str(cluster.gpus_per_node)]
    if cluster.nodes > 1:
        out += [
            "--nnodes",
            str(cluster.nodes),
            "--node-rank",
            "$NODE_RANK",
            "--master-addr",
            "$MASTER_ADDR",
            "--master-port",
            "29500",
        ]
    return tuple(out)
