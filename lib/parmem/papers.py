"""Published tables, read from ``data/papers.toml``: the numbers parmem is checked against.

Each table is stored once, with its source (paper, table or figure, section, page), exactly as
printed; the tests and the chapters read it here instead of typing the numbers again::

    from parmem.papers import table
    t1 = table("narayanan2021_table1")           # Narayanan et al. 2021, Table 1
    t1.row(params_billion=145.6)["gpus"]         # 1536
    t1.settings["seq_len"]                       # 2048

Tables: ``rajbhandari2020_figure1`` (ZeRO's per-GPU model states, Ψ = 7.5B, N_d = 64),
``korthikanti2022_table2`` (activation memory per layer, six configurations, as coefficients:
:func:`korthikanti_table2` evaluates a row), ``korthikanti2022_table3`` (the model configurations),
``korthikanti2022_selective_saving`` (§5: the 70% and 65% that selective recomputation saves),
``narayanan2021_table1`` (Megatron-LM's ten weak-scaling runs; :func:`narayanan_gpt` builds the
:class:`~parmem.model.ModelSpec` of a row). A value the file could not check against its source
is ``None`` and the table's ``unchecked`` says which (TOML has no null: the file lists such keys
in a ``null`` array of the table or the row, read back here as ``None``; see :func:`with_nulls`).

:func:`published_runs` reads ``data/published_runs.toml``: published training runs (layout and
measured throughput) that :mod:`parmem.planner.calibration` ranks and fits the planner against.

Standard library only (and the packaged data), so it runs wherever the estimator does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from fractions import Fraction

from ._check import choice, integer
from ._data import load_toml

__all__ = [
    "PublishedTable",
    "table",
    "names",
    "korthikanti_table2",
    "narayanan_gpt",
    "published_runs",
]

_FILE = "papers.toml"
_RUNS = "published_runs.toml"


def with_nulls(value):
    """``value`` (parsed TOML) with every dict's ``null`` list turned back into its keys, each
    ``None`` (a fresh copy). TOML has no null; the data files list the keys that have no value.

    Raises:
        ValueError: if a key is listed in ``null`` and also has a value.
    """
    if isinstance(value, list):
        return [with_nulls(v) for v in value]
    if not isinstance(value, dict):
        return copy.deepcopy(value)
    out = {k: with_nulls(v) for k, v in value.items() if k != "null"}
    for key in value.get("null", ()):
        if key in out:
            raise ValueError(f"key {key!r} is listed in null and has the value {out[key]!r}")
        out[key] = None
    return out


def _load(name: str) -> dict:
    return with_nulls(load_toml(name))


@dataclass(frozen=True)
class PublishedTable:
    """One published table: its ``rows`` (dicts keyed by ``columns``), the ``settings`` common to
    every row, and where it comes from (``source``, ``cite``: its key in references.bib,
    ``page``; ``unchecked``: what the file leaves out)."""

    name: str
    source: str
    cite: str
    rows: tuple[dict, ...]
    columns: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    page: int | None = None
    note: str = ""
    unchecked: str = ""
    checked_against: str = ""

    def column(self, key: str) -> list:
        """The values of column ``key``, one per row, in the table's order."""
        choice("key", key, tuple(self.columns))
        return [r[key] for r in self.rows]

    def row(self, **match) -> dict:
        """The one row whose fields equal ``match`` (e.g. ``row(params_billion=145.6)``)."""
        for key in match:
            choice("key", key, tuple(self.columns))
        found = [r for r in self.rows if all(r[k] == v for k, v in match.items())]
        if len(found) != 1:
            raise ValueError(
                f"{match} must match exactly one row of {self.name}, matches {len(found)}"
            )
        return found[0]


def names() -> list[str]:
    """The names of the published tables, in the file's order."""
    return list(load_toml(_FILE))


def table(name: str) -> PublishedTable:
    """The published table ``name`` (see :func:`names`); a fresh copy, safe to modify."""
    data = load_toml(_FILE)
    entry = with_nulls(data[choice("name", name, tuple(data))])
    order = list(entry.get("columns", ()))
    rows = tuple(_in_order(r, order) for r in entry.pop("rows"))
    return PublishedTable(name=name, rows=rows, **entry)


def _in_order(row: dict, order: list) -> dict:
    """``row`` with its keys in the order of the table's columns (a key ``null`` put last)."""
    return {**{k: row[k] for k in order if k in row}, **row}


def korthikanti_table2(case: str, s: int, b: int, h: int, a: int, t: int = 1) -> Fraction:
    """Activation bytes per transformer layer of row ``case`` of Korthikanti et al. 2022,
    Table 2, as an exact fraction: s·b·h·(c + c_t/t + (a·s/h)·(k + k_t/t)) with the row's
    coefficients from ``data/papers.toml`` (``case``: ``"none"``, ``"tp"``, ``"tp+sp"``,
    ``"tp+selective"``, ``"tp+sp+selective"``, ``"full"``)."""
    for key, v in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t)):
        integer(key, v)
    tab = table("korthikanti2022_table2")
    r = tab.row(case=choice("case", case, tab.column("case")))
    s_, t_ = Fraction(s), Fraction(t)
    attention = Fraction(a) * s_ / h * (r["attention"] + r["attention_over_t"] / t_)
    return s_ * b * h * (r["constant"] + r["constant_over_t"] / t_ + attention)


def published_runs() -> dict[str, dict]:
    """The groups of ``data/published_runs.toml``: published training runs with their layout
    and measured throughput, each group with its source. A group with ``rows_from`` takes its
    rows from that table of ``papers.toml`` (:func:`table`), with the values its ``fill`` list
    checks (matched on ``params_billion``) filled in where the table has ``None``. A fresh copy,
    safe to modify."""
    groups = _load(_RUNS)
    for group in groups.values():
        source = group.pop("rows_from", None)
        if source is None:
            continue
        fills = {f["params_billion"]: f for f in group.pop("fill", [])}
        rows = []
        for row in table(source).rows:
            extra = fills.get(row["params_billion"], {})
            rows.append({k: (extra.get(k, v) if v is None else v) for k, v in row.items()})
        group["rows"] = rows
        group.setdefault("settings", table(source).settings)
    return groups


def narayanan_gpt(row: dict):
    """The :class:`~parmem.model.ModelSpec` of a row of ``narayanan2021_table1``: a GPT
    (Narayanan et al. 2021 §5.1: V = 51,200, s = 2048; GeLU MLP, LayerNorm, biases, learned
    positions, embeddings tied to the LM head as in Megatron-LM), named ``gpt-<params>b``."""
    from .model import ModelSpec

    if row.get("heads") is None:
        raise ValueError(
            f"row {row.get('params_billion')}B has no checked heads (None): "
            "see table('narayanan2021_table1').unchecked"
        )
    settings = table("narayanan2021_table1").settings
    return ModelSpec(
        name=f"gpt-{row['params_billion']}b",
        vocab_size=settings["vocab_size"],
        hidden=row["hidden"],
        layers=row["layers"],
        heads=row["heads"],
        ffn_kind="gelu",
        bias=True,
        norm="layernorm",
        tied_embeddings=True,
        position="learned",
        max_positions=settings["seq_len"],
    )
