"""parmem.book.web, the Python the calculator and planner pages call (in Pyodide), in CPython:
its numbers are parmem's own, its errors are the library's messages filed under the field they
name, and its URL settings round-trip."""

from __future__ import annotations

import json

import pytest

from parmem import Cluster, ModelSpec, ParallelConfig, TrainingSetup, estimate, plan
from parmem.book import web
from parmem.hardware import hardware_preset
from parmem.planner import Assumptions
from parmem.units import GIB


def test_calculate_is_estimate():
    got = web.calculate({"model": "llama-2-7b", "d": "8", "t": "4", "p": "2", "sp": "1",
                         "zero": "1", "m": "8", "recompute": "selective", "engine": "megatron-core"})
    assert got["ok"]
    ref = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=8, tp=4, pp=2, sp=True, zero=1),
                   TrainingSetup(seq_len=4096, num_microbatches=8, recompute="selective",
                                 engine="megatron-core"))
    assert got["peak_bytes"] == ref.peak_bytes
    assert [s["total"] for s in got["stages"]] == [s.total for s in ref.stages]
    assert [s["activations"] for s in got["stages"]] == [s.activations for s in ref.stages]
    assert got["stages"][0]["gib"]["optimizer"] == f"{ref.stages[0].optimizer / GIB:.2f}"
    # "fits" keeps the planner's 10% headroom free (Assumptions.headroom)
    usable = int(hardware_preset("h100-sxm").memory_bytes * 0.9)
    assert got["usable_bytes"] == usable and got["headroom"] == "10%"
    assert got["usable_gib"] == f"{usable / GIB:.2f}"
    from parmem.bounds import bounds

    high_fits = bounds(ref, "h100-sxm").fits  # the book's rule: both parts (parmem.fit.fits)
    assert got["fits"] == (ref.peak_bytes <= usable and high_fits)
    assert got["text"] == str(ref)
    assert got["svg"].startswith("<svg") and got["svg"].count("<rect") >= 2 * len(ref.stages)
    json.dumps(got)  # JSON-ready


def test_defaults_and_a_model_that_does_not_fit():
    got = web.calculate({"model": "llama-3-70b", "gpu": "a100-40gb"})
    ref = estimate(ModelSpec.preset("llama-3-70b"), ParallelConfig(), TrainingSetup(seq_len=4096))
    assert got["peak_bytes"] == ref.peak_bytes and got["fits"] is False


def test_fits_is_judged_on_the_usable_memory():
    """A layout within the GPU's memory but above its usable 90% does not fit (the planner's
    rule), and the answer says how much is usable."""
    settings = {"model": "llama-2-7b", "gpu": "a100-40gb", "d": "8", "zero": "1",
                "recompute": "full"}
    got = web.calculate(settings)
    memory = hardware_preset("a100-40gb").memory_bytes
    ref = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=8, zero=1),
                   TrainingSetup(seq_len=4096, recompute="full"))
    assert got["ok"] and got["peak_bytes"] == ref.peak_bytes
    assert 0.9 * memory < ref.peak_bytes <= memory
    assert got["fits"] is False
    assert got["usable_bytes"] == Assumptions().usable_bytes(hardware_preset("a100-40gb"))
    assert got["usable_gib"] == "36.00"  # 90% of 40 GiB


@pytest.mark.parametrize("engine,flash,want", [
    ("paper", "auto", False),  # Korthikanti et al. keep the s x s scores
    ("megatron-core", "auto", True),  # Transformer Engine's fused attention by default
    ("megatron-core", "0", False),
    ("paper", "1", True),
])  # fmt: skip
def test_flash_is_auto_or_a_flag(engine, flash, want):
    got = web.calculate({"model": "llama-2-7b", "engine": engine, "flash": flash})
    ref = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(),
                   TrainingSetup(seq_len=4096, engine=engine, flash_attention=want))
    assert got["ok"] and got["peak_bytes"] == ref.peak_bytes
    other = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(),
                     TrainingSetup(seq_len=4096, engine=engine, flash_attention=not want))
    assert other.peak_bytes != ref.peak_bytes  # the setting decides
    bad = web.calculate({"flash": "maybe"})
    assert bad["ok"] is False and "flash='maybe' must be 0 or 1" in bad["errors"]["flash"]


def test_interleaved_schedule_follows_v():
    got = web.calculate({"model": "llama-2-7b", "p": "4", "v": "2", "m": "8"})
    ref = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(pp=4, vpp=2),
                   TrainingSetup(seq_len=4096, num_microbatches=8, schedule="interleaved"))
    assert got["peak_bytes"] == ref.peak_bytes


def test_pasted_hf_config():
    config = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
              "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
              "max_position_embeddings": 4096, "tie_word_embeddings": False}
    got = web.calculate({"config": json.dumps(config), "t": "2"})
    ref = estimate(ModelSpec.from_hf_config(config), ParallelConfig(tp=2), TrainingSetup(seq_len=4096))
    assert got["ok"] and got["peak_bytes"] == ref.peak_bytes


@pytest.mark.parametrize(("settings", "field", "message"), [
    ({"t": "3"}, "t", "tp=3 must divide heads=32"),
    ({"t": "two"}, "t", "t='two' must be a whole number"),
    ({"e": "2"}, "e", "ep=2 must divide dp*cp=1"),
    ({"sp": "1"}, "sp", "sp=True needs tp >= 2"),
    ({"cp": "3"}, "cp", "cp=3 must divide seq_len=4096"),
    ({"seq": "0"}, "seq", "seq_len=0 must be an integer >= 1"),
    ({"v": "2"}, "v", "vpp=2 needs pp >= 2"),
    ({"zero": "4"}, "zero", "zero=4"),
    ({"sp": "maybe"}, "sp", "sp='maybe' must be 0 or 1"),
    ({"model": "llama-9"}, "model", "model='llama-9' must be one of"),
    ({"gpu": "b200"}, "gpu", "gpu='b200' must be one of"),
    ({"config": "{"}, "config", "config is not valid JSON"),
    ({"config": '{"model_type": "llama", "hidden_size": 64.7}'}, "config",
         "config['hidden_size']=64.7"),
    ({"colour": "red"}, "_", "unknown setting(s) ['colour']"),
])
def test_bad_input_names_its_field(settings, field, message):
    got = web.calculate(settings)
    assert got["ok"] is False
    assert list(got["errors"]) == [field]
    assert message in got["errors"][field]


def test_plan_layouts_is_plan_and_emit():
    settings = {"model": "llama-3-8b", "gpu": "h100-sxm", "gpn": "8", "nodes": "2",
                "batch": "128", "seq": "4096", "top": "5", "pick": "2"}
    spec, cluster = ModelSpec.preset("llama-3-8b"), Cluster("h100-sxm", 8, 2)
    got = web.plan_layouts({**settings, "engine": "deepspeed", "emit": "deepspeed"})
    ref = plan(spec, cluster, 128, 4096, top=5, engine="deepspeed")
    assert got["engine"] == "deepspeed"
    assert [c["label"] for c in got["candidates"]] == [c.label() for c in ref.candidates]
    assert [c["peak_bytes"] for c in got["candidates"]] == [c.peak_bytes for c in ref.candidates]
    assert got["recipe"] == ref.emit("deepspeed", 1)
    assert got["world_size"] == 16
    # the chart's front: the listed layouts no other listed one beats on both time and memory
    listed = [(c.step_time, c.peak_bytes) for c in ref.candidates]
    assert got["pareto"] == [
        rank for rank, (t, m) in enumerate(listed, 1)
        if not any(u <= t and n <= m and (u, n) != (t, m) for u, n in listed)
    ]
    # the defaults: Megatron-Core's layouts and its recipe ("auto")
    got = web.plan_layouts(settings)
    ref = plan(spec, cluster, 128, 4096, top=5, engine="megatron-core")
    assert got["engine"] == "megatron-core"
    assert [c["label"] for c in got["candidates"]] == [c.label() for c in ref.candidates]
    assert got["recipe"] == ref.emit("megatron", 1)
    # a recipe only for the engine planned with; the paper profile writes none
    bad = web.plan_layouts({**settings, "emit": "deepspeed"})
    assert bad["ok"] is False
    assert "emit='deepspeed' needs engine='deepspeed'" in bad["errors"]["emit"]
    paper = web.plan_layouts({**settings, "engine": "paper"})
    assert paper["ok"] and paper["candidates"] and paper["recipe"] == ""


def test_plan_without_a_fit_is_an_answer_and_bad_plan_input_is_an_error():
    got = web.plan_layouts({"model": "llama-3-70b", "gpu": "a100-40gb"})
    assert got["ok"] and got["candidates"] == [] and got["message"].startswith("no layout fits")
    assert got["recipe"] == ""
    assert web.plan_layouts({"nodes": "0"})["errors"] == {"nodes": "nodes=0 must be an integer >= 1"}
    assert "pick" in web.plan_layouts({"pick": "11"})["errors"]
    assert "top" in web.plan_layouts({"top": "0"})["errors"]


def test_query_round_trip():
    settings = {"model": "mixtral-8x7b", "e": "8", "d": "8", "zero": "2", "seq": "2048"}
    got = web.calculate(settings)
    assert got["query"] == "model=mixtral-8x7b&d=8&e=8&zero=2&seq=2048"
    assert web.parse_query("?" + got["query"]) == {k: settings[k] for k in
                                                   ("model", "d", "e", "zero", "seq")}
    assert web.calculate(web.parse_query(got["query"]))["peak_bytes"] == got["peak_bytes"]
    assert web.calculate({})["query"] == ""


def test_run_json_and_options():
    opts = json.loads(web.run_json("options", ""))
    assert "llama-2-7b" in opts["models"] and set(opts["calc_fields"]) == set(web.CALC_FIELDS)
    assert set(opts["engines"]) == {"paper", "megatron-core", "deepspeed", "fsdp2", "hf"}
    out = json.loads(web.run_json("calculate", json.dumps({"t": "2"})))
    assert out["ok"] and out["stages"][0]["stage"] == 0
    assert json.loads(web.run_json("calculate", "[1]"))["ok"] is False
    with pytest.raises(ValueError, match="kind='x' must be one of"):
        web.run_json("x", "{}")


def test_every_documented_name_is_a_field():
    doc = web.__doc__
    for name in [*web.CALC_FIELDS, *web.PLAN_FIELDS]:
        assert f"``{name}``" in doc, name


def test_the_band_is_parmem_bounds():
    """Both pages show parmem.bounds' three numbers for the fullest GPU (the planner's for the
    picked layout); the calculator's verdict stays the book's rule."""
    from parmem.bounds import bounds

    settings = {"model": "llama-2-7b", "d": "8", "zero": "1", "recompute": "full"}
    got = web.calculate(settings)
    ref = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=8, zero=1),
                   TrainingSetup(seq_len=4096, recompute="full"))
    want = bounds(ref, "h100-sxm")
    b = got["band"]
    assert (b["allocated"], b["reserved"], b["high"]) == (want.allocated, want.reserved, want.high)
    assert b["headroom"] == want.headroom and b["fits"] is want.fits
    assert b["gib"]["high"] == f"{want.high / GIB:.2f}"
    planned = web.plan_layouts({"model": "llama-3-8b", "pick": "2"})
    cand = plan(ModelSpec.preset("llama-3-8b"), Cluster("h100-sxm", 8, 1), 64, 4096,
                engine="megatron-core").candidates[1]
    assert planned["band"]["high"] == bounds(cand.estimate, "h100-sxm").high


def test_solve_finds_the_longest_sequence_and_the_largest_micro_batch():
    from parmem.fit import max_micro_batch, max_seq_len

    base = {"model": "llama-3-8b", "d": "8", "zero": "1", "engine": "megatron-core"}
    par = ParallelConfig(dp=8, zero=1)
    setup = TrainingSetup(seq_len=4096, engine="megatron-core")
    spec = ModelSpec.preset("llama-3-8b")
    seq = web.calculate({**base, "solve": "seq"})["solve"]
    assert seq["value"] == max_seq_len(spec, par, setup, "h100-sxm").value
    b = web.calculate({**base, "solve": "b"})["solve"]
    assert b["value"] == max_micro_batch(spec, par, setup, "h100-sxm").value
    assert web.calculate(base)["solve"] is None
    bad = web.calculate({**base, "solve": "gpus"})
    assert not bad["ok"] and "solve" in bad["errors"]


def test_a_model_the_engine_cannot_build_gets_a_reason_not_a_recipe():
    got = web.plan_layouts({"model": "llama-4-scout", "nodes": "4", "engine": "megatron-core",
                            "top": "1"})
    assert got["ok"] and got["candidates"]
    assert got["recipe"].startswith("# no recipe: a Megatron-LM recipe cannot express")
    assert "shared_experts" in got["recipe"]


# ------------------------------------------------------------------- the serving mode
def test_serve_page_is_startup_and_emit_command():
    from parmem.serving import emit_command, startup

    got = web.serve_page({"mode": "serve", "model": "llama-3-70b", "tp": "2"})
    assert got["ok"]
    ref = startup(ModelSpec.preset("llama-3-70b"), "h100-sxm", engine="vllm", tp=2)
    assert got["kv"] == ref.kv and got["kv_gib"] == f"{ref.kv / GIB:.2f}"
    parts = {r["term"]: r["bytes"] for r in got["rows"]}
    assert parts == {"weights": ref.weights, "activation": ref.activation,
                     "non_torch": ref.non_torch, "kv": ref.kv}
    assert [r["gib"] for r in got["rows"]] == [f"{v / GIB:.2f}" for v in parts.values()]
    assert (got["tokens"], got["blocks"], got["longest"]) == (ref.tokens, ref.blocks, ref.longest)
    assert (got["budget"], got["total"]) == (ref.budget, ref.total)
    assert got["starts"] is ref.starts and got["verdict"] == ref.verdict
    assert got["concurrency"] == f"{ref.concurrency:.2f}"
    # the CLI's command: max_model_len always given, the rest only where set
    assert got["command"] == emit_command("vllm", "llama-3-70b", tp=2,
                                          max_model_len=ref.max_model_len)
    assert got["command"].startswith("vllm serve llama-3-70b --tensor-parallel-size 2")
    # the bar draws every part, with the GPU's memory (dashed) and the budget (dotted) marked
    svg = got["svg"]
    assert svg.startswith("<svg") and "startup memory of the busiest GPU" in svg
    for term, value in parts.items():
        assert f'data-term="{term}" data-bytes="{value}"' in svg
    assert f'data-bytes="{ref.total}"' in svg
    assert f'data-bytes="{ref.budget}" data-mark="engine budget"' in svg
    assert got["query"] == "mode=serve&model=llama-3-70b&tp=2"
    json.dumps(got)  # JSON-ready


def test_serve_page_passes_every_setting():
    from parmem.serving import emit_command, startup

    settings = {"model": "llama-3-8b", "gpu": "h200", "engine": "sglang", "util": "0.85",
                "quant": "fp8", "kv": "fp8", "len": "4096", "seqs": "64", "tokens": "2048"}
    got = web.serve_page(settings)
    kw = {"quantization": "fp8", "kv_cache_dtype": "fp8", "utilization": 0.85,
          "max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
    ref = startup(ModelSpec.preset("llama-3-8b"), "h200", engine="sglang", **kw)
    assert got["ok"] and got["kv"] == ref.kv and got["tokens"] == ref.tokens
    assert got["command"] == emit_command("sglang", "llama-3-8b", **kw)
    # and back from the address it writes
    again = web.serve_page(web.parse_query(got["query"]))
    assert again["kv"] == ref.kv and again["query"] == got["query"]
    # vLLM's defaults when left at auto; fp16 weights are priced at 2 bytes, fp32 at 4
    fp32 = web.serve_page({"dtype": "fp32"})
    assert fp32["kv"] == startup(ModelSpec.preset("llama-3-8b"), "h100-sxm", dtype="fp32").kv
    assert web.serve_page({})["query"] == "mode=serve"


def test_an_engine_that_does_not_start_says_so():
    got = web.serve_page({"model": "llama-3-70b"})  # 131 GiB of bf16 weights on one H100
    assert got["ok"] and got["starts"] is False and got["kv"] < 0
    assert got["verdict"].startswith("does not start: no memory for the KV cache")
    assert 'data-term="kv"' not in got["svg"]  # nothing drawn for a negative cache
    # trtllm-serve takes no quantisation flag: the numbers, and the reason for no command
    trt = web.serve_page({"engine": "trtllm", "quant": "fp8"})
    assert trt["ok"] and trt["command"].startswith("# no command: engine='trtllm'")


@pytest.mark.parametrize(("settings", "field", "message"), [
    ({"tp": "3"}, "tp", "tp=3 must divide heads=32"),
    ({"tp": "two"}, "tp", "tp='two' must be a whole number"),
    ({"pp": "100"}, "pp", "pp=100 must be an integer in 1..32"),
    ({"engine": "tgi"}, "engine", "engine='tgi' must be one of vllm, sglang, trtllm"),
    ({"util": "1.5"}, "util", "utilization=1.5 must be <= 1"),
    ({"util": "most"}, "util", "util='most' must be a number or auto"),
    ({"quant": "int3"}, "quant", "quant='int3' must be one of"),
    ({"quant": "mxfp4"}, "quant", "vLLM quantises only MoE experts in MXFP4"),
    ({"kv": "int4"}, "kv", "kv='int4' must be one of"),
    ({"dtype": "fp8"}, "dtype", "dtype='fp8' must be one of"),
    ({"len": "0"}, "len", "max_model_len=0 must be an integer >= 1"),
    ({"seqs": "0"}, "seqs", "max_num_seqs=0 must be an integer >= 1"),
    ({"tokens": "many"}, "tokens", "tokens='many' must be a whole number"),
    ({"model": "llama-9"}, "model", "model='llama-9' must be one of"),
    ({"gpu": "b200"}, "gpu", "gpu='b200' must be one of"),
    ({"mode": "train"}, "mode", "mode='train' must be one of serve"),
    ({"t": "2"}, "_", "unknown setting(s) ['t']"),
])  # fmt: skip
def test_bad_serving_input_names_its_field(settings, field, message):
    got = web.serve_page(settings)
    assert got["ok"] is False
    assert list(got["errors"]) == [field]
    assert message in got["errors"][field]
    assert "\n" not in got["errors"][field]  # one line


def test_serve_through_run_json_and_options():
    opts = json.loads(web.run_json("options", ""))
    assert set(opts["serve_fields"]) == set(web.SERVE_FIELDS)
    assert opts["serve"]["engines"] == ["vllm", "sglang", "trtllm"]
    out = json.loads(web.run_json("serve", json.dumps({"mode": "serve", "tp": "2"})))
    assert out["ok"] and out["mode"] == "serve" and out["query"] == "mode=serve&tp=2"
    for name in web.SERVE_FIELDS:
        assert f"``{name}``" in web.__doc__, name
