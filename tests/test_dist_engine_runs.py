"""parmem.distributed.engine_runs.datasets_stub: torchtitan is imported without Hugging Face ``datasets``
(a second of CPU per rank for data loaders a one-step run never builds), and the real package is
importable again afterwards."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("datasets")


def _run(code: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=300).stdout.split()


def test_datasets_is_a_placeholder_inside_and_the_real_package_after():
    out = _run(
        "import sys\n"
        "from parmem.distributed.engine_runs import datasets_stub\n"
        "with datasets_stub():\n"
        "    import datasets\n"
        "    from datasets.distributed import split_dataset_by_node\n"
        "    print(hasattr(datasets, '__file__'), 'pandas' in sys.modules)\n"
        "print('datasets' in sys.modules)\n"
        "import datasets\n"
        "print(hasattr(datasets, 'load_dataset') and hasattr(datasets, '__file__'))\n")
    assert out == ["False", "False", "False", "True"]


def test_an_imported_datasets_is_left_alone():
    out = _run(
        "import datasets\n"
        "from parmem.distributed.engine_runs import datasets_stub\n"
        "with datasets_stub():\n"
        "    import datasets as inside\n"
        "print(inside is datasets)\n")
    assert out == ["True"]
