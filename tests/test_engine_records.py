"""The recorded engine runs (``data/engine_runs/*.json``, written by ``make engines``) held against
the estimate: every measured category of every rank equals :func:`parmem.estimate` for the same
model, layout and setup, plus the differences the record names (each computed by
:data:`parmem.engine_records.DIFFERENCES`). No engine runs here; the engines' own tests
(``tests/test_engine_records_<engine>.py``) check each record's facts against numbers derived
by hand from its shapes."""

from __future__ import annotations

import json

import pytest

from parmem.engine_records import (
    CATEGORIES,
    DIFFERENCES,
    RECORDS_DIR,
    compare_record,
    load_records,
    record_rows,
)
from parmem.model import ModelSpec

RECORDS = load_records()
IDS = [f"{r['engine']}:{r['case']}:rank{r['rank']}" for r in RECORDS]

#: the issue's floor: at least this many rows over at least this many engines
MIN_ROWS, MIN_ENGINES = 20, 4


def test_the_records_cover_the_engines():
    rows = record_rows()
    engines = {r.engine for r in rows}
    assert len(rows) >= MIN_ROWS, f"{len(rows)} rows recorded"
    assert len(engines) >= MIN_ENGINES, f"engines recorded: {sorted(engines)}"


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_every_row_is_the_estimate_or_a_named_difference(rec):
    bad = [
        f"{r.category}: measured {r.measured:,} B, estimate {r.estimate:,} B"
        f" + named {list(r.named)} = {r.modelled:,} B (off by {r.measured - r.modelled:+,})"
        for r in compare_record(rec)
        if not r.equal
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_a_record_says_what_it_ran(rec):
    for key in ("case", "engine", "versions", "date", "world_size", "rank", "model",
                "parallel", "setup", "measured"):
        assert key in rec, key
    assert rec["setup"].get("engine") == rec["engine"]
    assert rec["versions"].get("torch", "absent") != "absent"
    assert 0 <= rec["rank"] < rec["world_size"]
    ModelSpec(**rec["model"])  # a valid spec


def test_the_comparison_refuses_what_it_does_not_know():
    rec = {"case": "x", "engine": "fsdp2", "rank": 0, "stage": 0,
           "model": ModelSpec.preset("llama-2-7b").to_dict(), "parallel": {"dp": 2, "zero": 3},
           "setup": {"engine": "fsdp2", "seq_len": 128}, "measured": {"weights": 1}}
    with pytest.raises(ValueError, match="category 'weights'"):
        compare_record(rec)
    rec["measured"] = {"params": 1}
    rec["named"] = {"params": ["cosmic-rays"]}
    with pytest.raises(ValueError, match="difference 'cosmic-rays'"):
        compare_record(rec)


def test_a_wrong_record_fails(tmp_path):
    """The comparison can fail: one byte added to a measured parameter count is caught."""
    spec = ModelSpec.preset("llama-2-7b")
    rec = {"case": "x", "engine": "fsdp2", "rank": 0, "stage": 0, "model": spec.to_dict(),
           "parallel": {"dp": 2, "zero": 3}, "setup": {"engine": "fsdp2", "seq_len": 128}}
    est = compare_record({**rec, "measured": {"params": 0}})[0].estimate
    (tmp_path / "x.json").write_text(json.dumps({"records": [
        {**rec, "measured": {"params": est}}, {**rec, "rank": 1, "measured": {"params": est + 1}}
    ]}))
    assert [r.equal for r in record_rows(tmp_path)] == [True, False]


def test_differences_and_categories_are_documented():
    assert RECORDS_DIR.name == "engine_runs"
    for name, d in DIFFERENCES.items():
        assert d.doc and isinstance(d.gpu, bool), name
    assert set(CATEGORIES) >= {"params", "grads", "optimizer", "saved"}
