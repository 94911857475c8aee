"""data/papers.toml: the published tables are whole, agree with themselves, with the model presets
and with the arithmetic their own columns imply (a check against transcription errors), and
parmem.papers reads them with helpful errors."""

import pytest

from parmem import ModelSpec
from parmem.hardware import hardware_preset
from parmem.papers import korthikanti_table2, names, narayanan_gpt, table


def test_every_table_names_its_source_and_describes_its_columns():
    assert set(names()) == {"rajbhandari2020_figure1", "korthikanti2022_table2",
                            "korthikanti2022_table3", "korthikanti2022_selective_saving",
                            "narayanan2021_table1"}
    bib = open("references.bib", encoding="utf-8").read()
    for name in names():
        tab = table(name)
        assert tab.source and f"{{{tab.cite}," in bib, name
        for row in tab.rows:
            assert set(row) == set(tab.columns), (name, row)


def test_zero_figure1_is_the_16_bytes_per_parameter_rule_rounded():
    # Rajbhandari et al. 2020 §5: (2 + 2 + K)Ψ, 4Ψ + KΨ/d, 2Ψ + (2 + K)Ψ/d, (4 + K)Ψ/d
    fig = table("rajbhandari2020_figure1")
    psi, d, k = fig.settings["params"], fig.settings["dp"], fig.settings["K"]
    by_hand = [(4 + k) * psi, 4 * psi + k * psi / d, 2 * psi + (2 + k) * psi / d,
               (4 + k) * psi / d]
    assert [round(x / 1e9, 1) for x in by_hand] == fig.column("gb")  # GB = 1e9 bytes


def test_table2_rows_evaluate_to_the_formulas_as_printed():
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert korthikanti_table2("none", s, b, h, a) == sbh * (34 + 80)  # 5as/h = 80 (§4.1)
    assert korthikanti_table2("tp", s, b, h, a, t) == sbh * (10 + 3 + 10)
    assert korthikanti_table2("tp+sp", s, b, h, a, t) == sbh * (34 + 80) / 8
    assert korthikanti_table2("tp+selective", s, b, h, a, t) == sbh * 13
    assert korthikanti_table2("tp+sp+selective", s, b, h, a, t) == sbh * 34 / 8
    assert korthikanti_table2("full", s, b, h, a, t) == 2 * sbh
    with pytest.raises(ValueError, match=r"case='tp\+cp' must be one of"):
        korthikanti_table2("tp+cp", s, b, h, a, t)
    with pytest.raises(ValueError, match="t=0"):
        korthikanti_table2("tp", s, b, h, a, 0)


def test_table3_shapes_are_the_presets():
    for row in table("korthikanti2022_table3").rows:
        spec = ModelSpec.preset(row["preset"])
        assert (spec.heads, spec.hidden, spec.layers) == (row["heads"], row["hidden"],
                                                          row["layers"]), row["model"]
        assert spec.layers % row["p"] == 0 and spec.heads % row["t"] == 0


def test_narayanan_table1_columns_agree_with_each_other():
    t1 = table("narayanan2021_table1")
    assert len(t1.rows) == 10
    # the percentages are of the A100's dense 16-bit peak, 312 teraFLOP/s
    peak = hardware_preset(t1.settings["hardware"]).peak_flops_bf16 / 1e12
    for r in t1.rows:
        name = f"{r['params_billion']}B"
        assert r["gpus"] % r["model_parallel"] == 0, name
        d = r["gpus"] // r["model_parallel"]
        assert r["batch"] % d == 0, name
        if r["t"] is not None:
            assert r["t"] * r["p"] == r["model_parallel"], name
        assert round(100 * r["tflops_per_gpu"] / peak) == r["percent_of_peak"], name
        # the per-GPU figure is rounded to 1 teraFLOP/s: the aggregate is within half of that
        assert abs(r["tflops_per_gpu"] * r["gpus"] / 1000 - r["aggregate_pflops"]) <= \
            0.5 * r["gpus"] / 1000 + 0.05, name
        # the parameter count follows from V, h, L and s whatever the number of heads
        spec = ModelSpec(name="g", vocab_size=t1.settings["vocab_size"], hidden=r["hidden"],
                         layers=r["layers"], heads=1, ffn_kind="gelu", bias=True,
                         tied_embeddings=True, position="learned",
                         max_positions=t1.settings["seq_len"])
        assert round(spec.num_params() / 1e9, 1) == r["params_billion"], name


def test_narayanan_gpt_builds_the_rows_with_checked_heads():
    t1 = table("narayanan2021_table1")
    spec = narayanan_gpt(t1.row(params_billion=145.6))
    assert (spec.name, spec.heads, spec.hidden, spec.layers, spec.vocab_size,
            spec.max_positions) == ("gpt-145.6b", 96, 12288, 80, 51200, 2048)
    with pytest.raises(ValueError, match="1.7B has no checked heads"):
        narayanan_gpt(t1.row(params_billion=1.7))


def test_bad_names_rows_and_columns_are_refused():
    with pytest.raises(ValueError, match="name='table9' must be one of"):
        table("table9")
    t1 = table("narayanan2021_table1")
    with pytest.raises(ValueError, match="must match exactly one row"):
        t1.row(tflops_per_gpu=163)
    with pytest.raises(ValueError, match="key='flops' must be one of"):
        t1.column("flops")
    # a copy: changing it does not change the next reader's table
    t1.rows[0]["gpus"] = 0
    assert table("narayanan2021_table1").rows[0]["gpus"] == 32


def test_null_lists_read_back_as_none():
    from parmem.papers import with_nulls

    assert with_nulls({"a": 1, "null": ["b"], "rows": [{"x": 2, "null": ["y"]}]}) == {
        "a": 1, "b": None, "rows": [{"x": 2, "y": None}]}
    assert table("narayanan2021_table1").page is None
    assert table("narayanan2021_table1").row(params_billion=3.6)["heads"] is None
    with pytest.raises(ValueError, match="key 'a' is listed in null and has the value 1"):
        with_nulls({"a": 1, "null": ["a"]})
