"""Locate and load the data files shipped with ``parmem`` (TOML, read with the standard library).

A wheel ships the repository's ``data/`` folder as ``parmem/data/`` (see the
``force-include`` entry in ``pyproject.toml``); an editable install or a source
checkout has it two levels above this module, at the repository root.
:func:`load_toml` looks in that order and caches what it parsed. Every data file is TOML, read
with the standard library's ``tomllib``, so that parmem needs nothing else (it runs in Pyodide,
in the book's calculator page).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent

#: Folders searched, in order: next to the package (wheel), then the repository root.
DATA_DIRS: tuple[Path, ...] = (_HERE / "data", _HERE.parent.parent / "data")


def data_path(name: str) -> Path:
    """Return the path of data file ``name`` (e.g. ``"hardware.toml"``).

    Raises:
        ValueError: if ``name`` is not a plain file name or no folder holds it.
    """
    if not name or Path(name).name != name:
        raise ValueError(f"name={name!r} must be a plain file name such as 'hardware.toml'")
    for folder in DATA_DIRS:
        candidate = folder / name
        if candidate.is_file():
            return candidate
    searched = ", ".join(str(d) for d in DATA_DIRS)
    raise ValueError(f"data file {name!r} not found; searched: {searched}")


@lru_cache(maxsize=32)
def load_toml(name: str) -> Any:
    """Parse data file ``name`` with the standard library's ``tomllib`` (cached: do not mutate
    the result).

    Raises:
        ValueError: if the file is missing or is not valid TOML (the message names the file).
    """
    import tomllib

    try:
        with data_path(name).open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"data file {name!r} is not valid TOML: {e}") from None
