"""A launch recipe: what a user pastes to run a planned layout on one engine.

A :class:`Recipe` holds the environment a launch needs (variables to set, and ones that must be
unset), the files to write (a DeepSpeed JSON), the launch command (launcher, program, arguments
as separate tokens, so that a test can hand them to the engine's own parser), the engine version
the recipe targets, and notes on what the engine cannot express and what was emitted instead.
``str(recipe)`` is a shell script.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..inputs import Cluster

__all__ = ["Recipe", "flag_lines", "quote", "torchrun"]


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
        lines = [f"# {self.title}", f"# target: {self.target}"]
        lines += [f"# note: {n}" for n in self.notes]
        for name, value in self.env:
            lines.append(f"unset {name}" if value is None else f"export {name}={quote(value)}")
        for name, text in self.files:
            lines += [f"cat > {name} <<'EOF'", text.rstrip("\n"), "EOF"]
        head = " ".join(quote(x) for x in (*self.launcher, *self.program))
        lines.append(" \\\n  ".join([head, *flag_lines(self.args)]))
        return "\n".join(lines) + "\n"


def flag_lines(args: tuple[str, ...]) -> list[str]:
    """``args`` grouped one option per line: a ``--flag`` with the values that follow it."""
    out: list[list[str]] = []
    for tok in args:
        if (tok.startswith("-") and not _is_number(tok)) or _is_subcommand(tok) or not out:
            out.append([tok])
        else:
            out[-1].append(tok)
    return [" ".join(quote(t) for t in group) for group in out]


def quote(tok: str) -> str:
    """``tok`` quoted for a POSIX shell, except a ``$VARIABLE`` the shell must expand."""
    if re.fullmatch(r"\$[A-Z_][A-Z0-9_]*", tok):
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
