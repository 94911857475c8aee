"""Property-based fuzzing of every public entry point with invalid input (issue 21).

Hypothesis draws an entry point (the library's constructors and functions, the planner, the rank
pool's arguments, the widgets), one of its arguments and a value that breaks that argument's
rule: a wrong type, a string for a boolean (``'false'``), a float for an integer (``64.7``,
``4.0``), NaN or infinity, a number out of range, an integer of hundreds of digits, a name that
is not known. Every call must end in a ``ValueError`` or ``TypeError`` whose message names the
argument. None may end in another exception (a traceback), be accepted silently, or hang: the
runs are derandomized (the same examples on every run, so CI is reproducible) and counted, at
least 400 calls per run. The command lines are fuzzed in ``test_fuzz_cli.py``; the inputs the
issue lists are checked one by one at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers import FUZZ, FUZZ_SCALE
from hypothesis import given, settings
from hypothesis import strategies as st

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem._check import MAX_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, MAX_WIDTH
from parmem.config import GRAD_DTYPES, OFFLOADS, OPTIMIZERS
from parmem.engines import engines
from parmem.hardware import (
    Hardware,
    Link,
    hardware_preset,
    hardware_presets,
    link_preset,
    link_presets,
)
from parmem.inference import (
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    max_concurrency,
    random_requests,
    simulate_kv_cache,
    weight_bytes,
)
from parmem.planner import Cluster, evaluate, plan

API_EXAMPLES = 600 * max(FUZZ_SCALE, 1)  # at least 400 must run


# ---------------------------------------------------------------------------- invalid values
HUGE = st.sampled_from([10**400, -(10**400), 2**64, 10**30])
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
TEXT = st.one_of(st.sampled_from(["false", "true", "no", "0", "1", "", "4k", "abc", "nan", "1e3",
                                  " 8", "inf"]),
                 st.text(max_size=8))
CONTAINERS = st.one_of(st.just([64]), st.just({}), st.just({"a": 1}), st.just((1, 2)),
                       st.lists(st.integers(0, 8), max_size=3))
BOOLS = st.booleans()


def bad_int(lo: int = 1, hi: int | None = None, none_ok: bool = False) -> st.SearchStrategy:
    """Values that are not an integer in lo..hi."""
    out = [BOOLS, NON_FINITE, TEXT, CONTAINERS,
           st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)),
           st.integers(-4, 64).map(float),  # 4.0 is not 4
           st.integers(max_value=lo - 1), HUGE.filter(lambda x: x < lo or hi is not None)]
    if hi is not None:
        out.append(st.integers(min_value=hi + 1))
    if not none_ok:
        out.append(st.none())
    return st.one_of(out)


def bad_bool(none_ok: bool = False) -> st.SearchStrategy:
    """Values that are not True or False (strings such as 'false' above all)."""
    out = [TEXT, st.integers(-2, 3), st.floats(allow_nan=True), CONTAINERS]
    if not none_ok:
        out.append(st.none())
    return st.one_of(out)


def bad_number(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
               hi_open: bool = False) -> st.SearchStrategy:
    """Values that are not a finite number in the range."""
    out = [NON_FINITE, TEXT, BOOLS, CONTAINERS, st.none(), st.just(10**400)]
    if lo is not None:
        out.append(st.floats(max_value=lo, exclude_max=not lo_open, allow_nan=False,
                             allow_infinity=False))
    if hi is not None:
        out.append(st.floats(min_value=hi, exclude_min=not hi_open, allow_nan=False,
                             allow_infinity=False))
    return st.one_of(out)


def bad_choice(options, none_ok: bool = False) -> st.SearchStrategy:
    """Values that are not one of ``options`` (``True`` is not the option ``1``)."""
    out = [TEXT, st.integers(-3, 99), BOOLS, CONTAINERS, NON_FINITE]
    if not none_ok:
        out.append(st.none())
    return st.one_of(out).filter(
        lambda v: not any(type(v) is type(o) and v == o for o in options))


def bad_type(*valid: type) -> st.SearchStrategy:
    """Values of none of the ``valid`` types."""
    return st.one_of(TEXT, st.integers(), NON_FINITE, CONTAINERS, BOOLS, st.none()).filter(
        lambda v: not isinstance(v, valid))


def bad_axis(kind: type, allowed=None) -> st.SearchStrategy:
    """Values that are neither one allowed ``kind`` value nor a non-empty sequence of them."""
    if kind is int:
        element = bad_int(1 if allowed is None else 0, None if allowed is None else 3)
    else:
        element = bad_choice(allowed or ())
    element = element.filter(lambda v: not isinstance(v, list | tuple))  # [2] is a valid axis
    return st.one_of(st.just(()), st.just([]), element.filter(lambda v: v is not None),
                     st.lists(element, min_size=1, max_size=3),
                     st.tuples(st.just(1 if kind is int else (allowed or ("x",))[0]), element))


# ---------------------------------------------------------------------------- entry points
GPUS = tuple(hardware_presets())
LINKS = tuple(link_presets())
SPEC = ModelSpec.preset("llama-2-7b")
CLUSTER = Cluster("h100-sxm", 8, 1)
DP8, SETUP = ParallelConfig(dp=8), TrainingSetup(seq_len=4096)
SMALL = dict(name="t", vocab_size=1000, hidden=64, layers=2, heads=4)
HF_LLAMA = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 256,
            "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 688}
HF_GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4,
           "n_positions": 128}


@dataclass
class Entry:
    """A public callable, its valid keyword arguments and, for each argument that the fuzzer
    breaks, a strategy of invalid values and the text its error must contain."""

    name: str
    call: Any
    base: dict
    fields: dict  # argument -> (strategy, needle or None: the argument's name)
    done: list = field(default_factory=list)


def _plan_fields() -> dict:
    f = {"global_batch": bad_int(1, MAX_BATCH), "seq_len": bad_int(1, MAX_SEQ_LEN),
         "top": bad_int(1), "uneven_pp": bad_bool(),
         "precision": bad_choice(("fp32", "bf16-mixed", "fp16-mixed", "bf16")),
         "optimizer": bad_choice(("adamw", "adam-8bit", "sgd-momentum", "sgd")),
         "flash_attention": bad_bool(none_ok=True), "dropout": bad_bool(none_ok=True),
         "engine": bad_choice(tuple(engines())),
         "capacity_factor": bad_number(1.0, 1e6), "cuda_context": bad_int(0, 2**40),
         "mfu": bad_number(0.0, 1.0, lo_open=True), "headroom": bad_number(0.0, 1.0, hi_open=True),
         "tp_overlap": bad_number(0.0, 1.0), "dp_overlap": bad_number(0.0, 1.0),
         "pp_overlap": bad_number(0.0, 1.0), "cp_overlap": bad_number(0.0, 1.0),
         "ep_overlap": bad_number(0.0, 1.0), "dp_bucket_params": bad_int(1, 2**40),
         "tp": bad_axis(int), "pp": bad_axis(int), "cp": bad_axis(int), "micro_batch": bad_axis(int),
         "vpp": bad_axis(int), "zero": bad_axis(int, (0, 1, 2, 3)),
         "sp": bad_axis(bool, (False, True)), "recompute": bad_axis(str, ("none", "selective", "full")),
         "spec": bad_type(ModelSpec), "cluster": bad_type(Cluster)}
    return {k: (v, None) for k, v in f.items()}


def _plan_call(spec=SPEC, cluster=CLUSTER, global_batch=8, seq_len=4096, **kw):
    return plan(spec, cluster, global_batch, seq_len, **kw)


SMALL_PLAN = _plan_call(top=2)
#: a plan sized for Megatron-Core: the engine whose recipe Plan.emit writes (engine=None, the
#: plan's own, is valid)
MEGATRON_PLAN = _plan_call(top=2, engine="megatron-core")


def _presets():
    from parmem import presets

    return presets()


def _widget(name):
    def call(**kw):
        from parmem.book import widgets

        return getattr(widgets, name)(**kw)

    return call


ENTRIES = [
    Entry("ModelSpec", ModelSpec, SMALL, {
        "vocab_size": (bad_int(1, MAX_WIDTH), None), "hidden": (bad_int(1, MAX_WIDTH), None),
        "layers": (bad_int(1, MAX_LAYERS), None), "heads": (bad_int(1, MAX_WIDTH), None),
        "kv_heads": (bad_int(0, MAX_WIDTH, none_ok=True), None),
        "head_dim": (bad_int(0, MAX_WIDTH, none_ok=True), None),
        "ffn_hidden": (bad_int(0, MAX_WIDTH, none_ok=True), None),
        "max_positions": (bad_int(1, MAX_WIDTH), None),
        "num_experts": (bad_int(0, MAX_WIDTH), None), "top_k": (bad_int(0, MAX_WIDTH), None),
        "shared_experts": (bad_int(0, MAX_WIDTH), None),
        "ffn_kind": (bad_choice(("gelu", "swiglu")), None),
        "norm": (bad_choice(("layernorm", "rmsnorm")), None),
        "position": (bad_choice(("learned", "rotary")), None),
        "bias": (bad_bool(), None), "qkv_bias": (bad_bool(), None),
        "tied_embeddings": (bad_bool(), None), "name": (bad_type(str), None),
        "source": (bad_type(str), None)}),
    Entry("ModelSpec.preset", ModelSpec.preset, {"name": "gpt2"},
          {"name": (st.one_of(bad_type(str), TEXT.filter(lambda s: s.lower() != "gpt2")
                              .filter(lambda s: s.lower() not in _presets())), "preset")}),
    Entry("from_hf_config (llama)", lambda **cfg: ModelSpec.from_hf_config(cfg), HF_LLAMA, {
        **{k: (bad_int(1, MAX_WIDTH), repr(k)) for k in
           ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size")},
        "num_hidden_layers": (bad_int(1, MAX_LAYERS), "'num_hidden_layers'"),
        **{k: (bad_int(0, MAX_WIDTH, none_ok=True), repr(k)) for k in
           ("num_key_value_heads", "head_dim", "max_position_embeddings")},
        **{k: (bad_bool(none_ok=True), repr(k)) for k in
           ("tie_word_embeddings", "attention_bias", "mlp_bias")},
        "model_type": (bad_type(str, type(None)), "'model_type'"),
        "_name_or_path": (bad_type(str, type(None)), "'_name_or_path'")}),
    Entry("from_hf_config (gpt2)", lambda **cfg: ModelSpec.from_hf_config(cfg), HF_GPT2, {
        **{k: (bad_int(1, MAX_WIDTH), repr(k)) for k in ("vocab_size", "n_embd", "n_head")},
        "n_layer": (bad_int(1, MAX_LAYERS), "'n_layer'"),
        "n_inner": (bad_int(0, MAX_WIDTH, none_ok=True), "'n_inner'"),
        "tie_word_embeddings": (bad_bool(none_ok=True), "'tie_word_embeddings'")}),
    Entry("ParallelConfig", ParallelConfig, {}, {
        **{k: (bad_int(1, MAX_GPUS), None) for k in ("dp", "tp", "pp", "ep", "cp")},
        "vpp": (bad_int(1, MAX_LAYERS), None), "zero": (bad_int(0, 3), None),
        "sp": (bad_bool(), None)}),
    Entry("TrainingSetup", TrainingSetup, {"seq_len": 4096}, {
        "seq_len": (bad_int(1, MAX_SEQ_LEN), None),
        "micro_batch": (bad_int(1, MAX_BATCH), None),
        "num_microbatches": (bad_int(1, MAX_BATCH), None),
        "cuda_context": (bad_int(0, 2**40), None),
        "precision": (bad_choice(("fp32", "bf16-mixed", "fp16-mixed", "bf16")), None),
        "optimizer": (bad_choice(tuple(OPTIMIZERS)), None),
        "engine": (bad_choice(tuple(engines())), None),
        "grad_dtype": (bad_choice(tuple(GRAD_DTYPES), none_ok=True), None),
        "offload": (bad_choice(tuple(OFFLOADS)), None),
        "master_weights": (bad_bool(none_ok=True), None),
        "recompute": (bad_choice(("none", "selective", "full")), None),
        "schedule": (bad_choice(("gpipe", "1f1b", "interleaved")), None),
        "grad_buckets": (bad_choice(("view", "copy"), none_ok=True), None),
        "flash_attention": (bad_bool(none_ok=True), None),
        "dropout": (bad_bool(none_ok=True), None),
        "capacity_factor": (bad_number(1.0, 1e6), None)}),
    Entry("estimate", lambda spec=SPEC, parallel=None, setup=None, **kw:
          estimate(spec, parallel, setup, **kw),
          {"parallel": ParallelConfig(pp=2)}, {
              "spec": (bad_type(ModelSpec), None),
              "parallel": (bad_type(ParallelConfig, type(None)), None),
              "setup": (bad_type(TrainingSetup, type(None)), None),
              "layers_per_stage": (st.one_of(
                  bad_type(list, tuple, type(None)).filter(lambda v: not isinstance(v, dict)),
                  st.lists(bad_int(1, None), min_size=2, max_size=2),
                  st.lists(st.integers(1, 40), max_size=4).filter(lambda v: v != [16, 16])
                  .filter(lambda v: not (len(v) == 2 and sum(v) == 32))), "layers_per_stage"),
              "world_size": (bad_int(1, None, none_ok=True), None)}),
    Entry("kv_cache_bytes", lambda spec=SPEC, seq_len=4096, **kw: kv_cache_bytes(spec, seq_len, **kw),
          {}, {"spec": (bad_type(ModelSpec), None), "seq_len": (bad_int(0, MAX_SEQ_LEN), None),
               "batch": (bad_int(0, MAX_BATCH), None),
               "dtype": (bad_choice(("fp32", "fp16", "bf16", "fp8", "int8")), None),
               "tp": (bad_int(1), None)}),
    Entry("kv_cache_bytes_per_token", lambda spec=SPEC, **kw: kv_cache_bytes_per_token(spec, **kw),
          {}, {"spec": (bad_type(ModelSpec), None),
               "dtype": (bad_choice(("fp32", "fp16", "bf16", "fp8", "int8")), None),
               "tp": (bad_int(1), None)}),
    Entry("weight_bytes", lambda spec=SPEC, **kw: weight_bytes(spec, **kw), {"dtype": "int4"}, {
        "spec": (bad_type(ModelSpec), None),
        "dtype": (bad_choice(("fp32", "fp16", "bf16", "int8", "int4")), None),
        "group_size": (bad_int(1, MAX_WIDTH, none_ok=True), None),
        "zero_point": (bad_bool(none_ok=True), None), "tp": (bad_int(1), None)}),
    Entry("max_concurrency", lambda spec=SPEC, seq_len=4096, gpu="h100-sxm", **kw:
          max_concurrency(spec, seq_len, gpu, **kw), {}, {
              "spec": (bad_type(ModelSpec), None), "seq_len": (bad_int(1, MAX_SEQ_LEN), None),
              "gpu": (st.one_of(bad_int(1, 2**50).filter(lambda v: not isinstance(v, str)),
                                TEXT.filter(lambda s: s not in GPUS)), None),
              "utilization": (bad_number(0.0, 1.0, lo_open=True), None),
              "reserved": (bad_int(0, 2**50), None)}),
    Entry("random_requests", random_requests, {"n": 4}, {
        "n": (bad_int(0, 2**20), None), "seed": (bad_int(0, None), None),
        "prompt": (st.one_of(bad_type(tuple, list), st.tuples(bad_int(1, MAX_SEQ_LEN), st.just(8)),
                             st.tuples(st.just(8), st.integers(1, 7))), "prompt"),
        "rate": (bad_number(0.0, None, lo_open=True).filter(lambda v: v is not None), None)}),
    Entry("simulate_kv_cache", simulate_kv_cache, {"requests": [], "capacity": 4096}, {
        "requests": (st.one_of(bad_type(list, tuple).filter(lambda v: not isinstance(v, dict)),
                               st.lists(bad_type(), min_size=1, max_size=2)), "requests"),
        "capacity": (bad_int(1, 2**40), None), "block_size": (bad_int(1, 2**40), None),
        "max_len": (bad_int(1, 2**40), None),
        "policy": (bad_choice(("paged", "contiguous")), None)}),
    Entry("Cluster", Cluster, {}, {
        "gpu": (st.one_of(TEXT.filter(lambda s: s not in GPUS), bad_type(str, Hardware)), None),
        "gpus_per_node": (bad_int(1, MAX_GPUS), None), "nodes": (bad_int(1, MAX_GPUS), None)}),
    Entry("plan", _plan_call, {"top": 2}, _plan_fields()),
    Entry("Plan.emit", MEGATRON_PLAN.emit, {"engine": "megatron"}, {
        "engine": (bad_choice(("megatron", "deepspeed", "torchtitan"), none_ok=True), None),
        "candidate": (st.one_of(st.integers(max_value=-1), st.integers(min_value=2), BOOLS, TEXT,
                                NON_FINITE, st.just(1.0)), None)}),
    Entry("evaluate", lambda spec=SPEC, cluster=CLUSTER, parallel=DP8, setup=SETUP, **kw:
          evaluate(spec, cluster, parallel, setup, **kw), {}, {"spec": (bad_type(ModelSpec), None), "cluster": (bad_type(Cluster), None),
               "parallel": (bad_type(ParallelConfig), None),
               "setup": (bad_type(TrainingSetup), None),
               "mfu": (bad_number(0.0, 1.0, lo_open=True), None)}),
    Entry("hardware_preset", hardware_preset, {"name": "h100-sxm"}, {
        "name": (st.one_of(bad_type(str), TEXT.filter(lambda s: s not in GPUS)),
                 "unknown hardware")}),
    Entry("link_preset", link_preset, {"name": "nvlink4"}, {
        "name": (st.one_of(bad_type(str), TEXT.filter(lambda s: s not in LINKS)),
                 "unknown link")}),
    Entry("Link", Link, {"name": "x", "bandwidth": 1e9, "latency": 1e-6}, {
        "bandwidth": (bad_number(0.0, None, lo_open=True), None),
        "latency": (bad_number(0.0, None), None)}),
    Entry("Pool", lambda **kw: _pool()(**kw), {"world_size": 2}, {
        "world_size": (bad_int(1, 64, none_ok=True), None),
        "backend": (bad_choice(("gloo", "nccl")), None),
        "pg_timeout": (bad_number(0.0, 86_400.0, lo_open=True), None),
        "start_timeout": (bad_number(0.0, 86_400.0, lo_open=True), None)}),
    Entry("Pool.run", lambda target="parmem.distributed.checks:ping", **kw: _pool()(2).run(target, **kw),
          {}, {"timeout": (bad_number(0.0, 86_400.0, lo_open=True), None),
               "seed": (bad_int(0, 2**63 - 1), None),
               "target": (st.one_of(bad_type(str), TEXT, st.just("no.such:fn"),
                                    st.just("parmem.distributed.checks:nope")), "target"),
               "bogus": (st.integers(), "bogus")}),
    Entry("explore_estimate", _widget("explore_estimate"), {"static": False}, {
        "gpu_gib": (bad_number(0.0, 2**20, lo_open=True), None),
        "tp": (bad_choice((1, 2, 4, 8, 16)), None),
        "dp": (bad_choice((1, 2, 4, 8, 16, 32, 64, 128)), None),
        "zero": (bad_int(0, 3), None), "model": (bad_choice(_presets()), None),
        "seq_len": (bad_choice((512, 1024, 2048, 4096, 8192, 16384, 32768)), None),
        "recompute": (bad_choice(("none", "selective", "full")), None),
        "sp": (bad_bool(), None), "flash": (bad_bool(), None),
        "num_microbatches": (bad_int(1, MAX_BATCH), None), "static": (bad_bool(), None)}),
    Entry("explore_plan", _widget("explore_plan"), {"static": False}, {
        "rank": (bad_int(1, 8), None), "top": (bad_int(1, 100), None),
        "gpus_per_node": (bad_int(1, MAX_GPUS), None), "gpu": (bad_choice(GPUS), None)}),
    Entry("explore_allocator", _widget("explore_allocator"), {"static": False}, {
        "jitter": (bad_number(0.0, 0.5), None), "steps": (bad_int(1, 8), None)}),
    Entry("explore_serving", _widget("explore_serving"), {"static": False}, {
        "utilization": (bad_number(0.0, 1.0, lo_open=True), None),
        "batch": (bad_choice((1, 4, 8, 16, 32, 64, 128, 256)), None)}),
]


def _pool():
    from parmem.distributed import Pool

    return Pool


def _check_api_error(entry: Entry, arg: str, value: Any, needle: str | None) -> None:
    kwargs = {**entry.base, arg: value}
    try:
        entry.call(**kwargs)
    except (ValueError, TypeError) as e:
        msg = str(e)
        want = needle or arg
        assert want in msg, f"{entry.name}({arg}={value!r:.80}): message does not name " \
                            f"{want!r}: {msg[:300]}"
        assert "\n" not in msg or isinstance(e, TypeError), msg[:300]
    else:
        pytest.fail(f"{entry.name}({arg}={value!r:.80}) was accepted")


@st.composite
def api_case(draw):
    entry = draw(st.sampled_from(ENTRIES))
    arg = draw(st.sampled_from(sorted(entry.fields)))
    strategy, needle = entry.fields[arg]
    return entry, arg, draw(strategy), needle


def test_invalid_api_inputs_raise_an_error_naming_the_argument():
    calls = []

    @settings(FUZZ, max_examples=API_EXAMPLES)
    @given(api_case())
    def run(case):
        entry, arg, value, needle = case
        calls.append((entry.name, arg))
        _check_api_error(entry, arg, value, needle)

    run()
    assert len(calls) >= 400, len(calls)
    assert len({name for name, _ in calls}) == len(ENTRIES)  # every entry point was tried


# ---------------------------------------------------------------------------- the issue's cases
def _plan(**kw):
    return plan(SPEC, CLUSTER, 8, 4096, top=2, **kw)


HF = {**HF_LLAMA}
ISSUE_CASES = [  # (call, error type, text the message must contain)
    (lambda: TrainingSetup(seq_len=4096, flash_attention="false"), "flash_attention='false'"),
    (lambda: TrainingSetup(seq_len=4096, dropout="false"), "dropout='false'"),
    (lambda: SPEC.with_(bias="false"), "bias='false'"),
    (lambda: SPEC.with_(tied_embeddings="no"), "tied_embeddings='no'"),
    (lambda: _plan(flash_attention="false"), "flash_attention='false'"),
    (lambda: _plan(mfu=math.nan), "mfu=nan"),
    (lambda: _plan(tp_overlap=math.nan), "tp_overlap=nan"),
    (lambda: estimate(SPEC, {"dp": 2}, TrainingSetup(seq_len=4096)), "parallel must be"),
    (lambda: kv_cache_bytes("llama-2-7b", 4096), "spec must be a ModelSpec"),
    (lambda: TrainingSetup(seq_len=4096, capacity_factor=math.inf), "capacity_factor=inf"),
    (lambda: estimate(SPEC, ParallelConfig(pp=2), layers_per_stage=5), "layers_per_stage=5"),
    (lambda: MEGATRON_PLAN.emit("megatron", 99), "candidate=99"),
    (lambda: MEGATRON_PLAN.emit(None, 99), "candidate=99"),
    (lambda: SMALL_PLAN.emit("megatron"), "engine='megatron': this plan was sized"),
    (lambda: _pool()(2, pg_timeout="5"), "pg_timeout='5'"),
    (lambda: _pool()(2, start_timeout=math.nan), "start_timeout=nan"),
    (lambda: _pool()(world_size=10**6), "world_size=1000000"),
    (lambda: Cluster("h100-sxm", 8, 12_500_000), "nodes=12500000"),  # 10**8 GPUs
    (lambda: TrainingSetup(seq_len=10**400), "seq_len="),
    *[(lambda v=v: ModelSpec.from_hf_config({**HF, "hidden_size": v}), "config['hidden_size']")
      for v in (math.inf, "abc", [64], math.nan, 64.7, 10**400, -64, True)],
    (lambda: ModelSpec.from_hf_config({**HF, "tie_word_embeddings": "false"}),
     "config['tie_word_embeddings']='false'"),
    # widgets: no TraitError or IndexError, no GPU of 0 or -80 GiB
    (lambda: _widget("explore_estimate")(gpu_gib=0, static=False), "gpu_gib=0"),
    (lambda: _widget("explore_estimate")(gpu_gib=-80, static=False), "gpu_gib=-80"),
    (lambda: _widget("explore_estimate")(tp=3, static=False), "tp=3 must be one of"),
    (lambda: _widget("explore_plan")(rank=9, static=False), "rank=9"),
    (lambda: _widget("explore_schedules")(schedules=("zigzag",), static=False), "schedules[0]"),
]


@pytest.mark.parametrize("call, needle", ISSUE_CASES)
def test_the_inputs_issue_21_found(call, needle):
    with pytest.raises(ValueError) as info:
        call()
    assert needle in str(info.value)


def test_a_search_beyond_the_budget_is_refused_with_a_message(monkeypatch):
    from parmem.planner import search

    monkeypatch.setattr(search, "MAX_SEARCH_WORK", 50)
    with pytest.raises(ValueError, match="the search is too large: .* narrow it"):
        plan(SPEC, Cluster("h100-sxm", 8, 4), 64, 4096)
