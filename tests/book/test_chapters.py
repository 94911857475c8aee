"""Every chapter is a test: it runs top to bottom without an error, and what it printed is what
the site shows.

Each chapter is executed exactly as the book's build executes it (``scripts/execute_notebooks.py``:
jupyter-cache's executor, the notebook's folder as working directory, the per-cell timeout of
``_config.yml``, errors not allowed), and the executed notebook is stored in the build's
execution cache (``_build/.jupyter_cache``). The book stage of ``make test`` then finds every
chapter cached and only renders it: each chapter runs once, and the numbers a reader sees are
the ones this test produced (the "shared execution" of the test budget).

A failure names the cell and shows its traceback. The seconds of each chapter go to the table
printed at the end (see the root ``conftest.py``). Run one chapter with
``pytest tests/book/test_chapters.py -k ch05``; ``pytest --nbval-lax chapters/...`` still works
for a cell-by-cell run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.chapters


def _executor():
    spec = importlib.util.spec_from_file_location(
        "execute_notebooks", ROOT / "scripts" / "execute_notebooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXECUTOR = _executor()
CHAPTERS = EXECUTOR.toc_notebooks()


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_runs(path, record_property, monkeypatch):
    # the kernel must use its own inline backend, as in the build (conftest.py sets Agg for
    # the processes pytest starts), or the figures would not be among the outputs
    monkeypatch.delenv("MPLBACKEND", raising=False)
    _, nb, seconds, error = EXECUTOR.execute(str(path), EXECUTOR.cell_timeout())
    record_property("notebook", str(path.relative_to(ROOT)))
    record_property("cells", sum(c.cell_type == "code" for c in nb.cells))
    assert error is None, f"{path.relative_to(ROOT)} failed after {seconds:.1f} s:\n{error}"
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "no output at all"
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "no figure among the outputs (every chapter draws at least one)"
    # every prose cell got its numbers: no value is still pending (a glue call missing or
    # misnamed would leave the text short of a number live and on the site)
    from parmem.book.prose import PENDING, names

    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.startswith('prose(r"""') and names(cell.source):
            shown = "".join(o.get("data", {}).get("text/markdown", "") for o in cell.outputs)
            assert shown and shown.count(PENDING) == cell.source.count(PENDING), (
                f"cell {i}: a quoted number was never glued: {shown[:300]!r}"
            )
    # what ran is what the site shows: store it for the book stage
    EXECUTOR.store(nb, path, seconds)
