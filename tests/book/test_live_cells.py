"""The chapters read live as on the site (issue 16): checks of what scripts/live_notebooks.py
writes, so that a chapter edited by hand cannot drift from it.

* Every chapter starts with the setup cell (removed from the site) that installs parmem in
  Colab from ``repository.url`` of ``_config.yml``, the one place the address is written; the
  README's install line uses the same address.
* No Markdown cell quotes a glued number (``{glue:text}``): JupyterLab cannot show it, so the
  number would exist only on the site. Such text is a prose cell, hidden on the site.
* No citation shows a bare BibTeX key live: a Markdown cell that cites would (JupyterLab,
  Binder and Colab have no bibliography), so the script makes it a prose cell, and what every
  prose cell displays in a reader's kernel (JupyterLab's, and Colab's plain Markdown) names
  authors and years, never a key.
* Running the script changes nothing (the citation table ``data/citations.toml`` included).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("live_notebooks", ROOT / "scripts" / "live_notebooks.py")
live = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(live)
CHAPTERS = live.chapters()


def test_there_are_chapters():
    assert len(CHAPTERS) >= 20


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_cell_installs_parmem_from_the_config_address_in_colab(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    url = live.repository_url()
    assert first.cell_type == "code", f"{path.name}: the first cell must be the setup cell"
    assert "remove-cell" in first.metadata.get("tags", []), f"{path.name}: setup cell on the site"
    assert '"google.colab" in sys.modules' in first.source
    assert f'%pip install --quiet "parmem @ git+{url}"' in first.source, (
        f"{path.name}: the Colab install does not use _config.yml's repository.url ({url}); "
        "run python scripts/live_notebooks.py"
    )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_number_only_on_the_site(path):
    nb = nbformat.read(path, as_version=4)
    raw = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and live.GLUE in c.source]
    assert not raw, (
        f"{path.name}: Markdown cells {raw} quote glued numbers, which JupyterLab cannot show; "
        "run python scripts/live_notebooks.py"
    )


def _live_texts(nb) -> list[tuple[int, str]]:
    """(index, text) of what each Markdown and prose cell shows in this kernel."""
    P = importlib.import_module("parmem.book.prose")  # the module (parmem.book.prose is the function)
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            out.append((i, cell.source))  # shown as written: a role shows its key
            continue
        call = live.PROSE_CALL.match(cell.source)
        if cell.cell_type == "code" and call:
            out.append((i, P._bundle(call.group(1))["text/markdown"]))
    return out


@pytest.mark.parametrize("colab", [False, True], ids=["jupyterlab", "colab"])
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_citation_shows_a_bare_key_live(path, colab, monkeypatch):
    from parmem.book.prose import citations

    monkeypatch.setenv("JPY_SESSION_NAME", str(path))  # a kernel JupyterLab started
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", sys)  # what in_colab() looks for
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    keys = set(citations())
    shown = _live_texts(nbformat.read(path, as_version=4))
    bare = [(i, key) for i, text in shown for key in keys if key in text]
    bare += [(i, "{cite") for i, text in shown if "{cite" in text]
    assert not bare, (
        f"{path.name}: cells show bare citation keys live: {bare}; "
        "run python scripts/live_notebooks.py"
    )


def test_readme_install_line_uses_the_config_address():
    readme = (ROOT / "README.md").read_text()
    assert f"git+{live.repository_url()}" in readme


def test_script_is_idempotent(monkeypatch, capsys):
    """The script's own ``--check`` (its ``main``, in this process: a second Python that imports
    nbformat again would only add seconds) finds no chapter it would change."""
    monkeypatch.setattr(sys, "argv", ["live_notebooks.py", "--check"])
    code = live.main()
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
