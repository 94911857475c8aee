"""Argument validation shared by every public entry point.

Every check raises ``ValueError`` (or ``TypeError`` for a value of the wrong type) whose message
names the field and the rule, e.g. ``tp=3 must divide heads=32`` or
``seq_len='4k' must be an integer >= 1``. Booleans are booleans (the string ``'false'`` is not
``False``), integers are integers (``True`` is not 1, ``4.0`` is not 4), numbers are finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["integer", "boolean", "number", "choice", "cdiv"]

T = TypeVar("T")


def integer(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` if it is an ``int`` (not a bool) within ``[minimum, maximum]``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        rule = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"{name}={value!r} must be an integer {rule}")
    return value


def boolean(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (strings and numbers are refused)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")
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
    """``value`` as a float if it is a finite real number within the given bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise ValueError(f"{name}={value!r} must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and (value > hi or (hi_open and value == hi)):
        raise ValueError(f"{name}={value!r} must be {'<' if hi_open else '<='} {hi}")
    return float(value)


def choice(name: str, value: Any, options: Iterable[T]) -> T:
    """``value`` if it is one of ``options``; the message lists them."""
    opts = tuple(options)
    if isinstance(value, bool) or value not in opts:
        raise ValueError(f"{name}={value!r} must be one of {', '.join(map(repr, opts))}")
    return value  # type: ignore[no-any-return]


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for integers (a shard of a flat buffer of ``a`` values over ``b`` ranks)."""
    return -(-a // b)
