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


def test_load_yaml_lookup_order(tmp_path, monkeypatch):
    first, second = tmp_path / "pkg", tmp_path / "repo"
    first.mkdir()
    second.mkdir()
    (second / "t.yaml").write_text("where: repo\n")
    monkeypatch.setattr(data, "DATA_DIRS", (first, second))
    data.load_yaml.cache_clear()
    try:
        assert data.load_yaml("t.yaml") == {"where": "repo"}
        (first / "t.yaml").write_text("where: package\n")
        assert data.load_yaml("t.yaml") == {"where": "repo"}  # cached
        data.load_yaml.cache_clear()
        assert data.load_yaml("t.yaml") == {"where": "package"}  # package dir wins
        with pytest.raises(ValueError, match="data file 'missing.yaml' not found"):
            data.load_yaml("missing.yaml")
    finally:
        data.load_yaml.cache_clear()


def test_data_path_rejects_paths():
    with pytest.raises(ValueError, match="must be a plain file name"):
        data.data_path("../pyproject.toml")
    assert data.data_path("hardware.toml").name == "hardware.toml"
    assert data.load_toml("hardware.toml") is data.load_toml("hardware.toml")
