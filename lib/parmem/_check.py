"""Argument validation shared by every public entry point.

Every check raises ``ValueError`` (or ``TypeError`` for a value of the wrong type) whose message
names the field and the rule, e.g. ``tp=3 must divide heads=32`` or
``seq_len='4k' must be an integer >= 1``. Booleans are booleans (the string ``'false'`` is not
``False``), integers are integers (``True`` is not 1, ``4.0`` is not 4), numbers are finite.

The commands (``parmem`` and ``python -m parmem.distributed``) share :class:`OneLineParser`: a bad
command line is one line and exit status 2, like every other bad input.

Work that grows with a size has an upper bound here, one home for each: :data:`MAX_GPUS`,
:data:`MAX_SEQ_LEN`, :data:`MAX_BATCH`, :data:`MAX_LAYERS` and :data:`MAX_WIDTH`. They are far
above any real job and keep every call fast (and every float finite).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn, TypeVar

__all__ = [
    "integer",
    "boolean",
    "number",
    "choice",
    "instance",
    "cdiv",
    "MAX_GPUS",
    "MAX_SEQ_LEN",
    "MAX_BATCH",
    "MAX_LAYERS",
    "MAX_WIDTH",
    "UsageError",
    "OneLineParser",
    "one_line",
    "quiet_broken_pipe",
    "plain",
    "normalised_cache",
    "OutputError",
    "write_out",
    "flush_out",
    "write_err",
    "finite_json",
    "strict_json",
    "discard_stdout",
    "escaping_streams",
    "run_guarded",
    "short",
]

T = TypeVar("T")

#: GPUs of a cluster, and each parallel size (d, t, p, e, cp): 2**20, about a million
MAX_GPUS = 2**20
#: tokens of a sequence: 2**27, about 134 million
MAX_SEQ_LEN = 2**27
#: sequences of a batch (a micro-batch, a step's global batch, micro-batches per step): 2**20
MAX_BATCH = 2**20
#: transformer layers of a model: 2**14 = 16,384
MAX_LAYERS = 2**14
#: every other size of a model (vocabulary, widths, heads, experts, positions): 2**31 - 1
MAX_WIDTH = 2**31 - 1


def integer(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` if it is an integer (an ``int`` or a NumPy integer, not a bool) within
    ``[minimum, maximum]``, as an ``int``."""
    if type(value) is int and value >= minimum and (maximum is None or value <= maximum):
        return value  # the common case, without the ABC checks below
    n = int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
    if n is None or n < minimum or (maximum is not None and n > maximum):
        low = maximum is None or (n is not None and n < minimum)
        rule = f">= {minimum}" if low else f"in {minimum}..{maximum}"
        raise ValueError(f"{name}={_show(value)} must be an integer {rule}")
    return n


def plain(value: Any) -> Any:
    """``value`` as a Python number when it is one of another type (a NumPy integer becomes an
    ``int``, a NumPy float a ``float``; bools stay bools), else unchanged: what the library keys
    its caches on and computes with, so that a NumPy ``int32`` never wraps a product and an equal
    Python value never meets a result computed from one."""
    if type(value) in (int, float, bool, str) or value is None:
        return value
    if isinstance(value, bool | numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return value


def normalised_cache(maxsize: int = 128) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """``functools.lru_cache`` whose arguments pass through :func:`plain` first: the cache is
    keyed on, and the function computes with, Python numbers only."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def call(*args: Any, **kw: Any) -> T:
            return cached(*map(plain, args), **{k: plain(v) for k, v in kw.items()})

        call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        call.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return call

    return wrap


def boolean(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (strings and numbers are refused)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={_show(value)} must be True or False")
    return value


def number(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``value`` as a float if it is a finite real number (not a bool) within the given bounds."""
    try:
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        finite = real and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"{name}={_show(value)} must be a finite number")
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise ValueError(f"{name}={_show(value)} must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and (value > hi or (hi_open and value == hi)):
        raise ValueError(f"{name}={_show(value)} must be {'<' if hi_open else '<='} {hi}")
    return float(value)


def choice(name: str, value: Any, options: Iterable[T]) -> T:
    """``value`` if it is one of ``options``; the message lists them."""
    opts = tuple(options)
    try:
        known = not isinstance(value, bool) and value in opts
    except TypeError:  # an unhashable value against a dict's keys
        known = False
    if not known:
        raise ValueError(f"{name}={_show(value)} must be one of {', '.join(map(repr, opts))}")
    return value  # type: ignore[no-any-return]


def instance(name: str, value: Any, kind: type[T], hint: str = "") -> T:
    """``value`` if it is a ``kind``; else a ``ValueError`` naming ``name``, the type wanted and
    the type given (``hint``, e.g. ``"ModelSpec.preset(name)"``, says how to make one)."""
    if not isinstance(value, kind):
        how = f" ({hint})" if hint else ""
        raise ValueError(
            f"{name} must be a {kind.__name__}{how}, got {type(value).__name__} {_show(value)}"
        )
    return value


def _show(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 400-digit integer, a deeply nested list)."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails, or an int too long for str()
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for integers (a shard of a flat buffer of ``a`` values over ``b`` ranks)."""
    return -(-a // b)


# ---------------------------------------------------------------------------- command lines
class UsageError(SystemExit):
    """A command line that was refused: a ``SystemExit`` with status 2 (as argparse's own errors)
    whose message, ``str(error)``, is the one line to print."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


class OneLineParser(argparse.ArgumentParser):
    """argparse, except that an error is one line (the message and a hint to ``--help``) instead
    of a usage block, raised as :class:`UsageError` (``main`` prints it)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')")


def one_line(text: object) -> str:
    """``text`` on one line: its lines joined with "; "."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def quiet_broken_pipe() -> int:
    """After stdout's reader went away (``... | head``): point stdout at /dev/null so that the
    interpreter's last flush is silent; the exit status of a tool killed by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (a test's capture)
        pass
    return 141


# ---------------------------------------------------------------------------- command output
def short(e: object, limit: int = 300) -> str:
    """An error's text on one line, at most ``limit`` characters (a long path is cut)."""
    text = one_line(e)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OutputError(Exception):
    """Writing to stdout failed for a reason other than a reader that went away (a descriptor
    open for reading only, a full disk): ``main`` prints one line and exits with status 2."""


def write_out(text: object) -> None:
    """Print ``text`` to stdout; a failed write is an :class:`OutputError` (a closed pipe stays
    a ``BrokenPipeError``)."""
    try:
        print(text)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OutputError(f"cannot write to stdout: {e}") from None


def flush_out() -> None:
    """Flush stdout, as :func:`write_out` reports a failure."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OutputError(f"cannot write to stdout: {e}") from None


def write_err(text: object) -> None:
    """One line to stderr, or nothing when stderr is closed (``print(file=None)`` would write
    to stdout)."""
    if sys.stderr is not None:
        try:
            print(text, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass


def finite_json(obj: object) -> object:
    """``obj`` with every non-finite float (inf, nan) replaced by ``None``: JSON (RFC 8259 §6)
    has no Infinity or NaN, so ``--json`` writes ``null`` there."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def strict_json(
    obj: object, indent: int = 2, default: Callable[[object], object] | None = None
) -> str:
    """``obj`` as strict JSON: non-finite floats as ``null`` (``allow_nan=False`` makes sure
    that no ``Infinity`` is left)."""
    return json.dumps(finite_json(obj), indent=indent, allow_nan=False, default=default)


def discard_stdout() -> None:
    """Point stdout at /dev/null and drop what is buffered for it, so that the interpreter's
    last flush at exit writes nothing and reports nothing ("Exception ignored ...")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):  # no stdout, or not a file (a test's capture)
        pass


@contextlib.contextmanager
def escaping_streams() -> Iterator[None]:
    """While running a command: stdout and stderr write the characters their encoding lacks as
    backslash escapes (under ``PYTHONIOENCODING=ascii`` a model named 模型 prints as
    ``\\u6a21\\u578b``, not a ``UnicodeEncodeError``); their error handlers are restored after."""
    saved: list[tuple[io.TextIOWrapper, str]] = []
    for s in (sys.stdout, sys.stderr):
        if isinstance(s, io.TextIOWrapper):
            try:
                errors = s.errors or "strict"
                s.reconfigure(errors="backslashreplace")
                saved.append((s, errors))
            except (ValueError, OSError):  # a closed stream
                pass
    try:
        yield
    finally:
        for s, errors in saved:
            try:
                s.reconfigure(errors=errors)
            except (ValueError, OSError):
                pass


def run_guarded(prog: str, body: Callable[[], int]) -> int:
    """Run ``body`` as a command: the exit status, and every failure as one line on stderr.

    Status 2 and ``prog: error: ...`` for a refused command line, a ``ValueError``,
    ``TypeError`` or ``OSError``, and for stdout closed
    (``>&-``) or not writable; 141 and nothing printed when stdout's reader went away
    (``... | head``); 130 on Ctrl-C. ``--help`` and ``--version`` still raise ``SystemExit``
    (argparse's way), after stdout is flushed."""
    if sys.stdout is None:
        write_err(f"{prog}: error: stdout is closed (started with '>&-'?): nothing can be written")
        return 2
    with escaping_streams():
        try:
            status = body()
            flush_out()
            return status
        except BrokenPipeError:
            return quiet_broken_pipe()
        except OutputError as e:
            discard_stdout()
            write_err(f"{prog}: error: {one_line(e)}")
        except UsageError as e:
            write_err(e)
        except SystemExit:  # --help, --version: argparse printed and exits; flush here first
            try:
                flush_out()
            except BrokenPipeError:
                raise SystemExit(quiet_broken_pipe()) from None
            except OutputError as e:
                discard_stdout()
                write_err(f"{prog}: error: {one_line(e)}")
                raise SystemExit(2) from None
            raise
        except (ValueError, TypeError, OSError) as e:
            write_err(f"{prog}: error: {short(e, 2000)}")
        except KeyboardInterrupt:
            write_err(f"{prog}: interrupted")
            return 130
    return 2
