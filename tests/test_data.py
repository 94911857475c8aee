"""parmem._data: where the data files are found (the wheel's copy, then the repository's)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import parmem._data as data

REPO = Path(__file__).resolve().parents[1]


def test_wheel_ships_data_as_parmem_data():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert cfg["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]["data"] == (
        "parmem/data"
    )
    assert data.DATA_DIRS[0].parts[-2:] == ("parmem", "data")
    assert data.DATA_DIRS[1] == REPO / "data"


def test_load_toml_lookup_order(tmp_path, monkeypatch):
    first, second = tmp_path / "pkg", tmp_path / "repo"
    first.mkdir()
    second.mkdir()
    (second / "t.toml").write_text('where = "repo"\n')
    monkeypatch.setattr(data, "DATA_DIRS", (first, second))
    data.load_toml.cache_clear()
    try:
        assert data.load_toml("t.toml") == {"where": "repo"}
        (first / "t.toml").write_text('where = "package"\n')
        assert data.load_toml("t.toml") == {"where": "repo"}  # cached
        data.load_toml.cache_clear()
        assert data.load_toml("t.toml") == {"where": "package"}  # package dir wins
        with pytest.raises(ValueError, match="data file 'missing.toml' not found"):
            data.load_toml("missing.toml")
        (first / "bad.toml").write_text("where = \n")
        with pytest.raises(ValueError, match="data file 'bad.toml' is not valid TOML"):
            data.load_toml("bad.toml")
    finally:
        data.load_toml.cache_clear()


def test_every_data_file_is_toml():
    # parmem needs nothing beyond the standard library to read its data (it runs in Pyodide);
    # the recorded engine runs (data/engine_runs/, written by make engines) are JSON, also read
    # by the standard library, and only by the tests and the book
    # as are the GPU checks' outputs (data/gpu_checks/, written by scripts/gpu_check.py)
    records = ("engine_runs", "gpu_checks")
    files = [p for p in (REPO / "data").iterdir() if p.name not in records]
    assert sorted(p.suffix for p in files) == [".toml"] * len(files)
    for folder in records:
        runs = list((REPO / "data" / folder).iterdir())
        assert runs and all(p.suffix == ".json" for p in runs), folder


def test_data_path_rejects_paths():
    with pytest.raises(ValueError, match="must be a plain file name"):
        data.data_path("../pyproject.toml")
    assert data.data_path("hardware.toml").name == "hardware.toml"
    assert data.load_toml("hardware.toml") is data.load_toml("hardware.toml")
