"""Units: bytes are integers everywhere; these convert them for display only.

GiB = 2**30 bytes, MiB = 2**20, KiB = 2**10 (the binary units; the book says "GiB" and means
this). A GPU sold as "80 GB" holds 80·10**9 bytes (or a little less), 74.5 GiB; its usable
capacity comes from :mod:`parmem.hardware`, never from a rounded label.
"""

from __future__ import annotations

__all__ = ["KIB", "MIB", "GIB", "to_gib", "gib", "mib", "fmt_bytes"]

KIB = 2**10
MIB = 2**20
GIB = 2**30


def to_gib(n: int | float) -> float:
    """Bytes as a number of GiB (2**30 bytes)."""
    return n / GIB


def gib(n: int | float, digits: int = 2) -> str:
    """Bytes as GiB text (2**30), with thousands separators: ``gib(3 * 2**30) == "3.00"``."""
    return f"{n / GIB:,.{digits}f}"


def mib(n: int | float, digits: int = 1) -> str:
    """Bytes as MiB text (2**20)."""
    return f"{n / MIB:,.{digits}f}"


def fmt_bytes(n: int) -> str:
    """Exact bytes with thousands separators."""
    return f"{n:,}"
