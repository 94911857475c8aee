"""Repository-wide pytest setup, mainly for running the chapters as tests.

`make notebooks` runs ``pytest tests/book/test_chapters.py -n 2`` (one test per chapter, executed
as the book's build executes it; ``pytest --nbval-lax chapters`` runs them cell by cell). This file

* sets the environment the notebooks' kernels inherit (each pytest-xdist worker imports it too,
  before starting any kernel): two ranks for the ``torch.distributed`` demos, a headless
  matplotlib, one BLAS thread per process;
* adds up each notebook's seconds (kernel start, every cell, shutdown) from the test reports
  (a chapter test reports its notebook and cell count as user properties; nbval one cell each).
  Under pytest-xdist the reports reach the controller through ``pytest_runtest_logreport``, so
  the table printed by ``pytest_terminal_summary`` covers every worker. With ``PARMEM_NB_TIMES``
  set to a path, the table is also written there (``make test`` prints it again at the end).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("PARMEM_WORLD_SIZE", "2")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")

#: a chapter should run in this many seconds (issue 3); slower ones are flagged, not failed
CHAPTER_BUDGET_S = 20.0

_seconds: dict[str, float] = defaultdict(float)
_cells: dict[str, int] = defaultdict(int)
_failed: set[str] = set()


def pytest_runtest_logreport(report) -> None:
    props = dict(report.user_properties)
    path = props.get("notebook") or report.nodeid.split("::", 1)[0]
    if not path.endswith(".ipynb"):
        return
    _seconds[path] += report.duration
    if report.when == "call":
        _cells[path] += props.get("cells", 1)
    if report.failed:
        _failed.add(path)


def notebook_table() -> list[str]:
    """One row per notebook, grouped by part (the folder), with subtotals and a total."""
    by_part: dict[str, list[str]] = defaultdict(list)
    for path in _seconds:
        by_part[str(Path(path).parent)].append(path)
    width = max(24, 2 + max(len(Path(p).name) for p in _seconds))
    lines = [f"  {'notebook':<{width}}  cells  seconds"]
    for part in sorted(by_part):
        lines.append(f"  {part}/")
        for path in sorted(by_part[part]):
            flags = []
            if _seconds[path] > CHAPTER_BUDGET_S:
                flags.append(f"over {CHAPTER_BUDGET_S:.0f} s")
            if path in _failed:
                flags.append("FAILED")
            note = f"  <- {', '.join(flags)}" if flags else ""
            lines.append(f"    {Path(path).name:<{width - 2}}  {_cells[path]:5d}  "
                         f"{_seconds[path]:7.1f}{note}")
        if len(by_part) > 1:
            subtotal = sum(_seconds[p] for p in by_part[part])
            lines.append(f"    {'(part)':<{width - 2}}         {subtotal:7.1f}")
    total = sum(_seconds.values())
    lines.append(f"  {'total (sum over workers)':<{width}}  {sum(_cells.values()):5d}  {total:7.1f}")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if hasattr(config, "workerinput") or not _seconds:
        return  # an xdist worker, or no notebook ran
    lines = notebook_table()
    terminalreporter.write_sep("=", "seconds per notebook")
    for line in lines:
        terminalreporter.write_line(line)
    target = os.environ.get("PARMEM_NB_TIMES")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text("\n".join(lines) + "\n")
