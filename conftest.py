"""Repository-wide pytest setup, mainly for running the chapters as tests.

`make notebooks` runs ``pytest --nbval-lax`` over every chapter of ``_toc.yml`` (one kernel per
notebook, each code cell a test item; ``-n 2 --dist loadfile`` keeps a notebook on one worker).
This file

* sets the environment the notebooks' kernels and the ranks they start inherit (each
  pytest-xdist worker imports it too, before starting any kernel): two ranks for the
  ``torch.distributed`` demos, a headless matplotlib (the kernels themselves start without it,
  see below), one BLAS thread per process;
* registers, whenever nbval runs, the plugin ``tests/book/nbval_chapters.py``: the build's
  per-cell timeout, the kernel's inline figures, the checks of each chapter (an output, a figure,
  no pending number) and the store of each executed chapter into the build's execution cache
  (``--nb-cache DIR``; ``none`` stores nothing);
* adds up each notebook's seconds (kernel start, every cell, shutdown, the checks) from the test
  reports (nbval reports one cell each; an item may say how many cells it counts for with a
  ``cells`` user property). Under pytest-xdist the reports reach the controller through
  ``pytest_runtest_logreport``, so the table printed by ``pytest_terminal_summary`` covers every
  worker. With ``PARMEM_NB_TIMES`` set to a path, the table is also written there (``make test``
  prints it again at the end).
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

ROOT = Path(__file__).resolve().parent


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--nb-cache", default=None, metavar="DIR",
        help="execution cache the chapters run by nbval are stored in (default: the build's, "
             "_build/.jupyter_cache; 'none': store nothing)",
    )
    parser.addoption(
        "--nb-pool", default="shared", choices=("shared", "own"),
        help="'shared' (default): the chapters' kernels relay their torch.distributed Pool to "
             "one pool of ranks per test worker (parmem.distributed.PoolServer); 'own': each chapter "
             "starts its own ranks, as the book's build does",
    )


def pytest_configure(config) -> None:
    if getattr(config.option, "nbval_lax", False) or getattr(config.option, "nbval", False):
        import importlib.util

        path = ROOT / "tests" / "book" / "nbval_chapters.py"
        spec = importlib.util.spec_from_file_location("nbval_chapters", path)
        plugin = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plugin)
        config.pluginmanager.register(plugin, "nbval_chapters")


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
