"""The chapters stage's plugin (``tests/book/nbval_chapters.py``) on two small notebooks run by
nbval as ``make notebooks`` runs the chapters: the notebook it stores is the executed one (a
paragraph's number updated in place by a later cell, the figure, execution counts), under the key
the build looks up, and a chapter that fails a check fails the run, named, and is not stored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# a 1x1 grey PNG: a figure without matplotlib
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="

GOOD = [
    "from parmem.book.prose import prose, record",
    'prose(r"""The answer is {glue:text}`t_answer:.1f` GiB.""")',  # shown before its value
    'record("t_answer", 42)\nprint("recorded")',
    "import base64\nfrom IPython.display import Image, display\n"
    f'display(Image(data=base64.b64decode("{PNG}"), format="png"))',
]
BAD = [  # a paragraph whose value is never recorded, and no figure
    "from parmem.book.prose import prose, record",
    'prose(r"""The answer is {glue:text}`t_missing:.1f` GiB.""")',
    'record("t_other", 1)',
]


def _write(path: Path, sources: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter")]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)


def test_nbval_run_checks_and_stores_the_executed_notebook(tmp_path):
    pytest.importorskip("nbval")
    from jupyter_cache import get_cache

    _write(tmp_path / "good.ipynb", GOOD)
    _write(tmp_path / "bad.ipynb", BAD)
    # the repository's conftest.py, as the chapters stage loads it (it registers the plugin)
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('root_conftest', {str(ROOT / 'conftest.py')!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "globals().update({k: v for k, v in vars(module).items() if k.startswith('pytest_')})\n"
    )
    cache = tmp_path / "cache"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nb-cache", str(cache), "-p", "no:xdist",
         "-p", "no:cacheprovider", "-q", "-rA", "good.ipynb", "bad.ipynb"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert failed == ["FAILED bad.ipynb::checks - Failed: bad.ipynb:"], out  # named
    assert "never glued: 'The answer is … GiB.'" in out, out
    assert "no figure among the outputs" in out, out

    db = get_cache(str(cache))
    with pytest.raises(KeyError):  # a chapter that fails a check is not stored
        db.match_cache_notebook(nbformat.read(tmp_path / "bad.ipynb", as_version=4))
    # the key myst-nb looks up: the source notebook, without outputs
    record = db.match_cache_notebook(nbformat.read(tmp_path / "good.ipynb", as_version=4))
    nb = db.get_cache_bundle(record.pk).nb
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2, 3, 4]
    assert [o.data["text/markdown"] for o in code[1].outputs] == ["The answer is 42.0 GiB."]
    assert [(o.output_type, o.get("text")) for o in code[2].outputs] == [("stream", "recorded\n")]
    assert [o.data["image/png"].strip() for o in code[3].outputs] == [PNG]
    assert nb.metadata.language_info["name"] == "python"
