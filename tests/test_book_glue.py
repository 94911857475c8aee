"""parmem.book.glue displays exactly what myst-nb's glue displays (the book's build reads it back
with myst-nb), without importing myst-nb's glue module in the kernel (it imports nbformat and,
through jsonschema, compiles rfc3987-syntax's grammars: about a second of CPU per chapter)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("myst_nb")
pytest.importorskip("IPython")


def _published(glue_fn, values):
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    got = []

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, **kwargs):
            got.append((data, metadata))

    shell = InteractiveShell.instance()
    saved, shell.display_pub = shell.display_pub, Publisher()
    try:
        for i, value in enumerate(values):
            glue_fn(f"name{i}", value, display=False)
            glue_fn(f"name{i}", value, display=True)
    finally:
        shell.display_pub = saved
    return got


def test_glue_publishes_what_myst_nb_glue_publishes():
    from myst_nb import glue as myst_glue

    from parmem.book import glue

    values = [1.5, 3, "text", [1, 2], {"a": 1}, 2.0**40]
    ours = _published(glue, values)
    assert ours == _published(myst_glue, values)
    assert len(ours) == 2 * len(values)
    assert all(k.startswith("application/papermill.record/") for k in ours[0][0])


def test_glue_does_not_import_nbformat():
    code = ("import sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
            "InteractiveShell.instance()\nfrom parmem.book import glue\nglue('x', 1.0)\n"
            "print('nbformat' in sys.modules, 'jsonschema' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out[-2:] == ["False", "False"]
