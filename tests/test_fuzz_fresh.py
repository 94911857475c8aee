"""A fresh fuzz campaign over every public entry point and the ``parmem`` command (issue 34).

Unlike ``test_fuzz.py`` and ``test_fuzz_cli.py`` (invalid input only), each drawn call mixes
valid values (common ones and extreme but valid ones: a 2**27-token sequence, 2**20 GPUs, the
widest model), NumPy integers (``np.int32``, ``np.int64``, ``np.uint32``, ``np.int16``) in integer
fields, alternative spellings (``4.0`` for 4, ``np.float64``, ``np.bool_``) and invalid values
(a wrong type, out of range, NaN, a string, ``10**400``), and hostile or non-ASCII model names
(newlines, ``$(...)``, backticks, quotes) in ``ModelSpec`` names and ``config.json`` files.

Every call is timed (``time.perf_counter``) and classified:

* **clean**: a result whose numbers are finite and non-negative, Python ``int`` where an integer
  is returned (no NumPy type leaks out), and, for NumPy or alternative inputs, equal to the same
  call with Python values; or a ``ValueError``/``TypeError`` whose message (one line) names the
  argument (an invalid one must be refused; a NumPy integer must be accepted whenever the equal
  ``int`` is; ``4.0`` may be refused by name or accepted with the ``int`` answer);
* **hang**: the call took more than :data:`HANG_S` seconds;
* **dirty**: anything else (another exception type, an invalid value accepted, a wrapped,
  negative or non-finite number, a message that does not name the argument).

A command line is clean when it exits 0 (``--json`` output is strict JSON, no ``Infinity``), 1 (a
plan that found no layout) or 2 with exactly one line on stderr (naming the flag when the flag was
the invalid one), 141 when stdout's reader went away; no traceback ever. A few scripts printed
by ``plan --emit`` for hostile names are checked with ``bash -n`` and run by bash with stub
launchers: no canary file may appear (the quoting itself is tested in
``test_recipe_injection.py``).

The runs are derandomized (the same examples every run; ``PARMEM_FUZZ_SCALE`` in ``helpers.py``
runs more, at random). Each test prints one line of counts (``pytest -s``) and asserts at least
1,000 API calls / 400 command lines, at least 99 % clean and no hang; a failure lists each dirty
cause once with a minimal reproduction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import numbers
import shutil
import subprocess
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from helpers import FUZZ, FUZZ_SCALE
from hypothesis import given, settings
from hypothesis import strategies as st

from parmem import (
    ModelSpec,
    ParallelConfig,
    TrainingSetup,
    engine,
    engines,
    estimate,
    hardware_preset,
    hardware_presets,
    link_preset,
    model_state_bytes,
)
from parmem._check import MAX_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, MAX_WIDTH
from parmem.cli import main
from parmem.comm import collective_bytes, step_comm
from parmem.flops import flops_per_sequence, narayanan_flops, step_flops
from parmem.hardware import link_presets
from parmem.inference import (
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    max_concurrency,
    random_requests,
    serving_layout,
    simulate_kv_cache,
    weight_bytes,
)
from parmem.layout import check_layout, layout
from parmem.pipeline import bubble_ratio, in_flight_profile, in_flight_units, simulate
from parmem.planner import Cluster, evaluate, plan

#: a call slower than this is a hang
HANG_S = 5.0
API_EXAMPLES = 1150 * max(FUZZ_SCALE, 1)  # at least 1,000 calls must run
CLI_EXAMPLES = 460 * max(FUZZ_SCALE, 1)  # at least 400 command lines must run
#: at most this many printed scripts are run by bash (each is a subprocess)
SCRIPT_RUNS = 6


# ---------------------------------------------------------------------------- drawn values
class A(NamedTuple):
    """A drawn argument: the value passed, its kind ("ok": valid; "np": a NumPy integer that
    must act as the equal int; "alt": another spelling, e.g. 4.0, that may be refused by name
    or must act as ``plain``; "bad": invalid, must be refused by name) and the Python value."""

    value: Any
    tag: str
    plain: Any


class F(NamedTuple):
    """A field: strategies of valid values, of NumPy or alternative spellings, of invalid
    values (each drawing an :class:`A`)."""

    ok: Any
    np: Any
    alt: Any
    bad: Any


NP_INTS = (np.int32, np.int64, np.uint32, np.int16)
NAN, INF = math.nan, math.inf


def _fits(kind: Any, v: int) -> bool:
    info = np.iinfo(kind)
    return info.min <= v <= info.max


def Int(common, extreme=(), lo: int = 1, hi: int | None = None, none_ok: bool = False) -> F:
    """An integer field in ``lo..hi``: ``common`` values weighted over the ``extreme`` ones."""
    pool = [*common, *common, *common, *extreme]
    ok = st.sampled_from(pool)
    bad = [lo - 1, lo - 7, -(2**63), True, "8", " 4", b"4", 4.5, NAN, INF, -INF, [4], 10**400,
           np.int64(lo - 1), Fraction(9, 2), complex(4, 0)]
    if not none_ok:
        bad.append(None)
    if hi is not None:
        bad += [hi + 1, 2**64 + hi]
        if hi + 1 < 2**63:
            bad.append(np.int64(hi + 1))
    return F(
        ok.map(lambda v: A(v, "ok", v)),
        ok.flatmap(lambda v: st.sampled_from([k for k in NP_INTS if _fits(k, v)])
                   .map(lambda k: A(k(v), "np", v))),
        ok.filter(lambda v: abs(v) < 2**53).flatmap(
            lambda v: st.sampled_from([float(v), np.float64(v)]).map(lambda x: A(x, "alt", v))),
        st.sampled_from(bad).map(lambda v: A(v, "bad", None)),
    )


def B() -> F:
    """A boolean field."""
    ok = st.booleans()
    return F(ok.map(lambda v: A(v, "ok", v)), ok.map(lambda v: A(v, "ok", v)),
             ok.map(lambda v: A(np.bool_(v), "alt", v)),
             st.sampled_from(["false", "true", "yes", 0, 1, None, 1.0, [True]])
             .map(lambda v: A(v, "bad", None)))


def C(options, bad_extra=()) -> F:
    """A choice among ``options`` (strings)."""
    options = tuple(options)
    ok = st.sampled_from(options)
    bad = [v for v in ["", "NONE", "x", None, 3, ["a"], True, "é", "a\nb", *bad_extra]
           if v not in options]
    bad += [o.upper() + " " for o in options[:2]]
    return F(ok.map(lambda v: A(v, "ok", v)), ok.map(lambda v: A(v, "ok", v)),
             ok.map(lambda v: A(np.str_(v), "alt", v)),
             st.sampled_from(bad).map(lambda v: A(v, "bad", None)))


def R(common, lo: float | None = None, hi: float | None = None) -> F:
    """A real field (values in range listed in ``common``)."""
    ok = st.sampled_from(list(common))
    bad = [NAN, INF, -INF, "0.5", None, True, 10**400, [0.5]]
    if lo is not None:
        bad += [lo - 1.0, lo - 1e-9]
    if hi is not None:
        bad += [hi + 1.0, hi * 2 + 1]
    return F(ok.map(lambda v: A(v, "ok", v)), ok.map(lambda v: A(v, "ok", v)),
             ok.map(lambda v: A(np.float64(v), "alt", v)),
             st.sampled_from(bad).map(lambda v: A(v, "bad", None)))


def Obj(objects: dict, bad=("llama-2-7b", None, {}, 3)) -> F:
    """An object field (a spec, a cluster) chosen by key."""
    ok = st.sampled_from(sorted(objects)).map(lambda k: A(objects[k], "ok", objects[k]))
    return F(ok, ok, ok, st.sampled_from(list(bad)).map(lambda v: A(v, "bad", None)))


#: payloads that create ``CANARY`` when a shell runs them unquoted
PAYLOADS = ["x\ntouch CANARY\n", "$(touch CANARY)", "`touch CANARY`", "'; touch CANARY; '",
            '"; touch CANARY; "', "x\n: > CANARY", "x; touch CANARY #", "x\r\ntouch CANARY",
            "x \\\ntouch CANARY", "x\nEOF\ntouch CANARY\nEOF"]
HOSTILE = st.one_of(
    st.sampled_from(PAYLOADS),
    st.sampled_from(["模型", "Ünïcödé-7b", "\u2028x", "𝔐odel", "a" * 300, "", " ", "\x00x"]),
    st.text(max_size=12),
    st.tuples(st.text(alphabet="abc-é模", max_size=5), st.sampled_from(PAYLOADS))
    .map(lambda t: t[0] + t[1]),
)


def S() -> F:
    """A name (text, hostile or not)."""
    ok = HOSTILE.map(lambda v: A(v, "ok", v))
    return F(ok, ok, ok, st.sampled_from([3, None, b"x", ["x"]]).map(lambda v: A(v, "bad", None)))


# ---------------------------------------------------------------------------- the API entries
TINY = ModelSpec(name="tiny", vocab_size=1000, hidden=64, layers=4, heads=4)
SPECS = {"gpt2": ModelSpec.preset("gpt2"), "llama-2-7b": ModelSpec.preset("llama-2-7b"),
         "mixtral-8x7b": ModelSpec.preset("mixtral-8x7b"), "tiny": TINY}
PLAN_SPECS = {k: SPECS[k] for k in ("gpt2", "llama-2-7b", "tiny")}
GPUS = tuple(hardware_presets())
CLUSTERS = {f"{g}x{n}": Cluster(g, n, 1) for g in ("h100-sxm", "a100-40gb") for n in (1, 2, 4, 8)}
ENGINES = tuple(engines())
#: a GPU: a preset name (a number of bytes is valid too, so no integer is among the bad ones)
GPU = C(GPUS)._replace(bad=st.sampled_from(["b200", "", None, "H100-SXM", 1.5, [80], NAN])
                       .map(lambda v: A(v, "bad", None)))
SEQ = Int([128, 512, 1024, 2048, 4096], [2**20, MAX_SEQ_LEN], 1, MAX_SEQ_LEN)
SMALL_SEQ = Int([64, 128, 512, 1024], [], 1, MAX_SEQ_LEN)


def _par_fields() -> dict:
    return {"dp": Int([1, 2, 4, 8], [MAX_GPUS], 1, MAX_GPUS), "tp": Int([1, 2, 4, 8], [], 1, MAX_GPUS),
            "pp": Int([1, 2, 4], [], 1, MAX_GPUS), "cp": Int([1, 2], [], 1, MAX_GPUS),
            "ep": Int([1, 2, 8], [], 1, MAX_GPUS), "zero": Int([0, 1, 2, 3], [], 0, 3),
            "vpp": Int([1, 2], [], 1, MAX_LAYERS), "sp": B()}


def _setup_fields(seq: F = SEQ) -> dict:
    return {"seq_len": seq, "micro_batch": Int([1, 2, 4], [MAX_BATCH], 1, MAX_BATCH),
            "num_microbatches": Int([1, 2, 4, 8], [MAX_BATCH], 1, MAX_BATCH),
            "recompute": C(("none", "selective", "full")),
            "schedule": C(("1f1b", "gpipe", "interleaved")), "engine": C(ENGINES),
            "precision": C(("fp32", "bf16-mixed", "fp16-mixed", "bf16"))}


PAR_KEYS = ("dp", "tp", "pp", "cp", "ep", "zero", "vpp", "sp")
SETUP_KEYS = ("seq_len", "micro_batch", "num_microbatches", "recompute", "schedule", "engine",
              "precision", "cuda_context", "capacity_factor")


def _split(kw: dict) -> tuple[ParallelConfig, TrainingSetup, dict]:
    par = ParallelConfig(**{k: kw.pop(k) for k in PAR_KEYS if k in kw})
    setup = TrainingSetup(**{k: kw.pop(k) for k in SETUP_KEYS if k in kw})
    return par, setup, kw


def _estimate(spec, **kw):
    par, setup, rest = _split(kw)
    return estimate(spec, par, setup, **rest)


def _step_comm(spec, stage=None, sp_regather=False, **kw):
    par, setup, _ = _split(kw)
    return step_comm(spec, par, setup, stage=stage, sp_regather=sp_regather)


def _layout(spec, layers_per_stage=None, check=False, **kw):
    par, setup, _ = _split(kw)
    if check:
        return check_layout(spec, par, setup, layers_per_stage)
    lay = layout(spec, par, setup, layers_per_stage)
    return (lay.layers_per_stage, lay.world_size, lay.tokens, lay.boundary_bytes,
            lay.comm_buffer_bytes, [s.params for s in lay.stages])


def _plan(spec, gpus_per_node, gpu, global_batch, seq_len, **kw):
    p = plan(spec, Cluster(gpu, gpus_per_node, 1), global_batch, seq_len, **kw)
    return ([(c.parallel, c.setup, c.estimate.stages, c.time, c.tokens_per_s) for c in
             p.candidates], p.stats, p.pareto)


def _evaluate(spec, cluster, mfu, **kw):
    par, setup, _ = _split(kw)
    c = evaluate(spec, cluster, par, setup, mfu=mfu)
    return (c.estimate.stages, c.time, c.tokens_per_s, c.model_flops_per_gpu, c.layers_per_stage)


def _model_spec(**kw):
    spec = ModelSpec(**kw)
    return spec, spec.num_params(), spec.num_params(active=True), spec.param_counts()


HF_BASE = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 256,
           "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 688}


def _hf(**cfg):
    spec = ModelSpec.from_hf_config(cfg)
    return spec, spec.num_params(), spec.param_counts()


def _requests(n, seed, capacity, policy, block_size, max_len):
    reqs = random_requests(n, seed, prompt=(1, 64), output=(1, 64))
    sim = simulate_kv_cache(reqs, capacity, policy, block_size, max_len)
    return (reqs, sim.steps, sim.utilization, sim.waste, sim.mean_running, sim.peak_running,
            sim.throughput, sim.allocated[:50])


def _pipe(schedule, p, m, v, t_fwd, t_bwd):
    r = simulate(schedule, p, m, v, t_fwd, t_bwd)
    return r.step_time, r.bubble_fraction, r.peak_in_flight, r.busy, len(r.events)


def _profile(schedule, p, m, v, stage):
    prof = in_flight_profile(schedule, p, m, v)
    return len(prof), prof[:50], prof[-50:], in_flight_units(schedule, p, m, stage, v)


class Entry(NamedTuple):
    name: str
    call: Any
    fields: dict


ENTRIES = [
    Entry("ModelSpec", _model_spec, {
        "name": S(), "vocab_size": Int([1000, 32000, 50257], [MAX_WIDTH], 1, MAX_WIDTH),
        "hidden": Int([64, 256, 4096], [2**20], 1, MAX_WIDTH),
        "layers": Int([1, 2, 32], [MAX_LAYERS], 1, MAX_LAYERS),
        "heads": Int([1, 4, 32], [], 1, MAX_WIDTH),
        "kv_heads": Int([1, 4], [], 0, MAX_WIDTH, none_ok=True),
        "ffn_hidden": Int([128, 11008], [2**30], 0, MAX_WIDTH, none_ok=True),
        "max_positions": Int([1024, 4096], [MAX_WIDTH], 1, MAX_WIDTH),
        "tied_embeddings": B(), "ffn_kind": C(("gelu", "swiglu"))}),
    Entry("ModelSpec.from_hf_config", _hf, {
        "model_type": C(("llama", "mistral", "qwen2")),
        "vocab_size": Int([1000, 32000], [MAX_WIDTH], 1, MAX_WIDTH),
        "hidden_size": Int([64, 256, 4096], [2**20], 1, MAX_WIDTH),
        "num_hidden_layers": Int([1, 4, 32], [MAX_LAYERS], 1, MAX_LAYERS),
        "num_attention_heads": Int([4, 8, 32], [], 1, MAX_WIDTH),
        "num_key_value_heads": Int([1, 4, 8], [], 1, MAX_WIDTH),
        "intermediate_size": Int([688, 11008], [2**30], 1, MAX_WIDTH),
        "max_position_embeddings": Int([2048, 4096], [MAX_WIDTH], 1, MAX_WIDTH),
        "tie_word_embeddings": B(), "_name_or_path": S()}),
    Entry("ParallelConfig", lambda **kw: (lambda p: (p, p.world_size, p.dp_group))(
        ParallelConfig(**kw)), _par_fields()),
    Entry("TrainingSetup", lambda **kw: TrainingSetup(**kw), {
        **_setup_fields(), "cuda_context": Int([0, 2**30], [2**40], 0, 2**40),
        "capacity_factor": R([1.0, 1.25, 2.0], 1.0, 1e6)}),
    Entry("estimate", _estimate, {"spec": Obj(SPECS), **_par_fields(), **_setup_fields()}),
    Entry("comm.step_comm", _step_comm, {
        "spec": Obj(SPECS), **_par_fields(), **_setup_fields(),
        "stage": Int([0, 1], [], 0, MAX_GPUS, none_ok=True), "sp_regather": B()}),
    Entry("layout.layout", _layout, {
        "spec": Obj(SPECS), **_par_fields(), **_setup_fields(),
        "layers_per_stage": F(*(st.sampled_from([None, (2, 2), (16, 16), (6, 6), (12,)])
                                .map(lambda v: A(v, "ok", v)),) * 3,
                              st.sampled_from([(0, 4), (-1, 5), ("2", "2"), 5, (2.0, 2.0)])
                              .map(lambda v: A(v, "bad", None)))}),
    Entry("layout.check_layout", lambda **kw: _layout(check=True, **kw), {
        "spec": Obj(SPECS), **_par_fields(), **_setup_fields()}),
    Entry("planner.plan", _plan, {
        "spec": Obj(PLAN_SPECS), "gpus_per_node": Int([1, 2, 4, 8], [], 1, MAX_GPUS),
        "gpu": C(GPUS), "global_batch": Int([1, 4, 8, 16], [], 1, MAX_BATCH),
        "seq_len": Int([128, 512, 1024], [], 1, MAX_SEQ_LEN), "top": Int([1, 2, 3], [], 1),
        # search axes: None is every valid value, and there is no upper bound
        "tp": Int([1, 2], [], 1, none_ok=True), "pp": Int([1, 2], [], 1, none_ok=True),
        "zero": Int([0, 1, 3], [], 0, 3), "recompute": C(("none", "full")),
        "mfu": R([0.3, 0.5, 1.0], 0.0, 1.0), "headroom": R([0.0, 0.1], 0.0, 1.0)}),
    Entry("planner.evaluate", _evaluate, {
        "spec": Obj(PLAN_SPECS), "cluster": Obj(CLUSTERS), "mfu": R([0.3, 0.5], 0.0, 1.0),
        **_par_fields(), **_setup_fields(SMALL_SEQ)}),
    Entry("inference.weight_bytes", lambda spec, dtype, group_size, tp: weight_bytes(
        spec, dtype, group_size, tp=tp), {
        "spec": Obj(SPECS), "dtype": C(("fp32", "fp16", "bf16", "int8", "int4")),
        "group_size": Int([32, 128], [MAX_WIDTH], 1, MAX_WIDTH, none_ok=True),
        "tp": Int([1, 2, 4, 8], [], 1, MAX_GPUS)}),
    Entry("inference.kv_cache_bytes", lambda spec, seq_len, batch, dtype, tp: (
        kv_cache_bytes(spec, seq_len, batch, dtype, tp), kv_cache_bytes_per_token(spec, dtype, tp)),
        {"spec": Obj(SPECS), "seq_len": SEQ, "batch": Int([0, 1, 8], [MAX_BATCH], 0, MAX_BATCH),
         "dtype": C(("fp32", "fp16", "bf16", "fp8", "int8")), "tp": Int([1, 2, 8], [], 1, MAX_GPUS)}),
    Entry("inference.max_concurrency", lambda **kw: max_concurrency(**kw), {
        "spec": Obj(SPECS), "seq_len": SEQ, "gpu": GPU, "tp": Int([1, 2, 8], [], 1, MAX_GPUS),
        "utilization": R([0.5, 0.9, 1.0], 0.0, 1.0), "reserved": Int([0, 2**30], [], 0, 2**50)}),
    Entry("inference.serving_layout", lambda spec, gpu, **kw: serving_layout(spec, gpu, **kw), {
        "spec": Obj(SPECS), "gpu": GPU, "tp": Int([1, 2, 8], [], 1, MAX_GPUS),
        "pp": Int([1, 2, 4], [], 1, MAX_GPUS), "ep": Int([1, 2, 8], [], 1, MAX_GPUS),
        "cp": Int([1, 2], [], 1, MAX_GPUS), "dp": Int([1, 4], [MAX_GPUS], 1, MAX_GPUS),
        "weight_dtype": C(("fp16", "bf16", "int8")), "utilization": R([0.9], 0.0, 1.0)}),
    Entry("inference.simulate_kv_cache", _requests, {
        "n": Int([0, 1, 5, 20], [], 0, 2**20), "seed": Int([0, 7], [2**62], 0),
        "capacity": Int([64, 1024, 4096], [2**40], 1, 2**40),
        "policy": C(("paged", "contiguous")), "block_size": Int([1, 16], [], 1, 2**40),
        "max_len": Int([128, 2048], [], 1, 2**40)}),
    Entry("pipeline.simulate", _pipe, {
        "schedule": C(("gpipe", "1f1b", "interleaved")), "p": Int([1, 2, 4], [3000], 1, MAX_GPUS),
        "m": Int([1, 4, 8], [3000], 1, MAX_BATCH), "v": Int([1, 2], [], 1, MAX_LAYERS),
        "t_fwd": R([1.0, 0.5], 0.0), "t_bwd": R([2.0, 1.0], 0.0)}),
    Entry("pipeline.in_flight_profile", _profile, {
        "schedule": C(("gpipe", "1f1b", "interleaved")), "p": Int([1, 2, 8], [MAX_GPUS], 1, MAX_GPUS),
        "m": Int([1, 8, 16], [MAX_BATCH], 1, MAX_BATCH), "v": Int([1, 2], [MAX_LAYERS], 1, MAX_LAYERS),
        "stage": Int([0, 3], [], 0)}),
    Entry("pipeline.bubble_ratio", lambda p, m, v: bubble_ratio(p, m, v), {
        "p": Int([1, 4], [MAX_GPUS], 1, MAX_GPUS), "m": Int([1, 8], [MAX_BATCH], 1, MAX_BATCH),
        "v": Int([1, 2], [], 1, MAX_LAYERS)}),
    Entry("flops.step_flops", lambda spec, global_batch, seq_len, recompute: (
        step_flops(spec, global_batch, seq_len, recompute), flops_per_sequence(spec, seq_len)), {
        "spec": Obj(SPECS), "global_batch": Int([1, 64], [MAX_BATCH], 1, MAX_BATCH), "seq_len": SEQ,
        "recompute": C(("none", "selective", "full"))}),
    Entry("flops.narayanan_flops", lambda **kw: narayanan_flops(**kw), {
        "batch": Int([1, 512], [MAX_BATCH], 1, MAX_BATCH), "seq_len": SEQ,
        "layers": Int([1, 96], [MAX_LAYERS], 1, MAX_LAYERS),
        "hidden": Int([768, 12288], [MAX_WIDTH], 1, MAX_WIDTH),
        "vocab": Int([51200], [MAX_WIDTH], 1, MAX_WIDTH), "recompute": B()}),
    Entry("states.model_state_bytes", lambda num_params, **kw: model_state_bytes(num_params, **kw), {
        "num_params": Int([0, 124_000_000, 7 * 10**9], [10**15], 0),
        "dp": Int([1, 8, 64], [MAX_GPUS], 1, MAX_GPUS), "zero": Int([0, 1, 2, 3], [], 0, 3),
        "precision": C(("fp32", "bf16-mixed", "fp16-mixed", "bf16")),
        "optimizer": C(("adamw", "adam-8bit", "sgd-momentum", "sgd")), "engine": C(ENGINES)}),
    Entry("engines.engine", lambda engine_: dataclasses.astuple(engine(engine_).defaults),
          {"engine_": C(ENGINES)}),
    Entry("hardware presets", lambda hardware, link: (hardware_preset(hardware),
                                                      link_preset(link)),
          {"hardware": C(GPUS), "link": C(tuple(link_presets()))}),
    Entry("comm.collective_bytes", lambda op, size, n: collective_bytes(op, size, n), {
        "op": C(("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")),
        "size": Int([0, 1, 2**30], [2**50], 0), "n": Int([1, 2, 8], [MAX_GPUS], 1)}),
]

MODES = ["ok", "ok", "np", "np", "np", "alt", "bad", "bad", "bad"]


@st.composite
def api_case(draw):
    """An entry point and its arguments: all valid, or some NumPy integers, or one alternative
    spelling, or one invalid value (and an alternative valid value for that field)."""
    entry = draw(st.sampled_from(ENTRIES))
    mode = draw(st.sampled_from(MODES))
    names = sorted(entry.fields)
    target = draw(st.sampled_from(names))
    args, alt_ok = {}, {}
    for name in names:
        f = entry.fields[name]
        if mode == "np":
            args[name] = draw(f.np if draw(st.booleans()) else f.ok)
        elif name == target and mode in ("alt", "bad"):
            args[name] = draw(getattr(f, mode))
            alt_ok[name] = draw(f.ok)
        else:
            args[name] = draw(f.ok)
    return entry, args, alt_ok


# ---------------------------------------------------------------------------- classification
class Dirty(Exception):
    """A result or an error that is not clean (the message is its cause)."""


BYTES_WORDS = ("bytes", "params", "grads", "optimizer", "activations", "logits", "comm_buffers",
               "cuda_context", "host", "weights", "kv_", "total")


def _leaves(obj: Any, path: str = "", depth: int = 0, out: list | None = None) -> list:
    """(path, number) of every number in ``obj`` (dataclasses, dicts, sequences; at most 100
    items of a sequence from each end, 6 levels deep)."""
    out = [] if out is None else out
    if depth > 6 or obj is None or isinstance(obj, str | bytes):
        return out
    if isinstance(obj, bool | np.bool_):
        out.append((path, obj))
    elif isinstance(obj, numbers.Number | np.number):
        out.append((path, obj))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _leaves(getattr(obj, f.name), f"{path}.{f.name}", depth + 1, out)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _leaves(v, f"{path}[{k!r}]", depth + 1, out)
    elif isinstance(obj, list | tuple):
        items = list(enumerate(obj))
        if len(items) > 200:
            items = items[:100] + items[-100:]
        for i, v in items:
            _leaves(v, f"{path}[{i}]", depth + 1, out)
    return out


def _check_leaves(leaves: list) -> None:
    for path, v in leaves:
        if isinstance(v, np.generic):
            raise Dirty(f"a NumPy {type(v).__name__} leaks into the result ({_shape(path)})")
        if isinstance(v, bool):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise Dirty(f"non-finite {v} in the result ({_shape(path)})")
        if isinstance(v, complex) or v < 0:
            raise Dirty(f"negative number in the result ({_shape(path)})")
        last = path.rsplit(".", 1)[-1]
        if isinstance(v, float) and any(w in last for w in BYTES_WORDS) and "bytes" in last:
            raise Dirty(f"a float where bytes are expected ({_shape(path)})")


def _numbers(leaves: list) -> list:
    """The numbers to compare between two calls (not the wall time a plan reports)."""
    return [v for p, v in leaves if not p.endswith("['seconds']")]


def _shape(path: str) -> str:
    """A path without its indices (a cause, the same for every example)."""
    out, skip = [], False
    for ch in path:
        if ch == "[":
            skip = True
            out.append("[]")
        elif ch == "]":
            skip = False
        elif not skip:
            out.append(ch)
    return "".join(out) or "result"


#: the ModelSpec field each config.json key becomes (a rule between fields names these)
ALIASES = {"hidden_size": "hidden", "num_attention_heads": "heads", "num_key_value_heads":
           "kv_heads", "num_hidden_layers": "layers", "intermediate_size": "ffn_hidden",
           "max_position_embeddings": "max_positions", "engine_": "engine"}


def _names_field(msg: str, names) -> bool:
    names = [*names, *(ALIASES[n] for n in names if n in ALIASES)]
    return any(n.strip("_") in msg for n in names)


def _run(call, kwargs) -> tuple[str, Any, float]:
    """("ok", leaves) or ("error", exception), and the seconds."""
    t0 = time.perf_counter()
    try:
        out = call(**kwargs)
        leaves = _leaves(out)
        kind, value = "ok", leaves
    except Exception as e:  # every exception is classified
        kind, value = "error", e
    return kind, value, time.perf_counter() - t0


def _err_ok(e: BaseException, names) -> str | None:
    """Why an exception is not clean (None when it is)."""
    if not isinstance(e, ValueError | TypeError):
        return f"raises {type(e).__name__}"
    msg = str(e)
    if isinstance(e, ValueError) and "\n" in msg:
        return "a multi-line message"
    if not _names_field(msg, names):
        return "the message does not name the argument"
    return None


def classify_api(entry: Entry, args: dict, alt_ok: dict) -> tuple[str, str | None, float]:
    """("clean" | "hang" | "dirty", the dirty cause, seconds)."""
    kwargs = {k: a.value for k, a in args.items()}
    kind, value, secs = _run(entry.call, kwargs)
    if secs > HANG_S:
        return "hang", f"took {secs:.1f} s", secs
    tags = {a.tag for a in args.values()}
    bad = [k for k, a in args.items() if a.tag == "bad"]
    special = [k for k, a in args.items() if a.tag in ("np", "alt")]
    try:
        if bad:
            if kind == "ok":
                raise Dirty(f"accepted an invalid {bad[0]}")
            why = _err_ok(value, bad)
            if why == "the message does not name the argument":
                # another field's rule may be broken too: then that error is as good
                fixed = {**kwargs, **{k: a.value for k, a in alt_ok.items()}}
                kind2, value2, _ = _run(entry.call, fixed)
                if kind2 == "error" and str(value2) == str(value):
                    why = _err_ok(value, args)
            if why:
                raise Dirty(why)
            return "clean", None, secs
        ref = None
        if special:
            ref = _run(entry.call, {k: a.plain for k, a in args.items()})
        if kind == "error":
            if special and ref[0] == "ok" and ("np" in tags and not (
                    "alt" in tags and _names_field(str(value), [k for k in special
                                                                if args[k].tag == "alt"]))):
                raise Dirty(f"a NumPy integer is refused where the int is accepted "
                            f"({type(value).__name__})")
            if special and ref[0] == "ok":
                alts = [k for k in special if args[k].tag == "alt"]
                why = _err_ok(value, alts)
                if why:
                    raise Dirty(why + " (refused alternative spelling)")
                return "clean", None, secs
            why = _err_ok(value, args)
            if why:
                raise Dirty(why)
            return "clean", None, secs
        _check_leaves(value)
        if special:
            if ref[0] != "ok":
                raise Dirty("accepted NumPy/alternative input that the int refuses")
            _check_leaves(ref[1])
            if _numbers(value) != _numbers(ref[1]):
                diff = next(((p, a, b) for (p, a), (_, b) in zip(value, ref[1], strict=False)
                             if a != b and not p.endswith("seconds']")),
                            ("length", len(value), len(ref[1])))
                raise Dirty(f"NumPy/alternative input gives another number ({_shape(diff[0])})")
        return "clean", None, secs
    except Dirty as d:
        return "dirty", str(d), secs


def _repro(entry: Entry, args: dict) -> str:
    def show(a: A) -> str:
        v = a.value
        if isinstance(v, np.generic):
            return f"np.{type(v).__name__}({v.item()!r})"
        if isinstance(v, ModelSpec):
            return f"ModelSpec.preset({v.name!r})" if v.name != "tiny" else "TINY"
        if isinstance(v, Cluster):
            return f"Cluster({v.hardware.name!r}, {v.gpus_per_node}, {v.nodes})"
        text = repr(v)
        return text if len(text) < 80 else text[:77] + "..."

    return f"{entry.name}({', '.join(f'{k}={show(a)}' for k, a in args.items())})"


def _report(title: str, counts: Counter, dirty: dict) -> str:
    total = sum(counts.values())
    line = (f"{title}: {total} calls: clean {counts['clean']}, hang {counts['hang']}, "
            f"dirty {counts['dirty']} ({counts['clean'] / max(total, 1):.2%} clean)")
    causes = "\n".join(f"  [{len(r)}x] {cause}\n      e.g. {min(r, key=len)}"
                       for cause, r in sorted(dirty.items(), key=lambda kv: -len(kv[1])))
    return line + ("\n" + causes if causes else "")


@pytest.mark.timeout(120)
def test_api_calls_are_clean():
    counts: Counter = Counter()
    dirty: dict[str, list[str]] = {}
    seen: set[str] = set()

    @settings(FUZZ, max_examples=API_EXAMPLES)
    @given(api_case())
    def run(case):
        entry, args, alt_ok = case
        cls, cause, _ = classify_api(entry, args, alt_ok)
        counts[cls] += 1
        seen.add(entry.name)
        if cls != "clean":
            dirty.setdefault(f"{entry.name}: {cause}", []).append(_repro(entry, args))

    run()
    report = _report("fuzz-fresh API", counts, dirty)
    print("\n" + report)
    total = sum(counts.values())
    assert total >= 1000, report
    assert seen == {e.name for e in ENTRIES}, sorted({e.name for e in ENTRIES} - seen)
    assert counts["hang"] == 0, report
    assert counts["clean"] >= 0.99 * total, report


# ---------------------------------------------------------------------------- command lines
class T(NamedTuple):
    """A command-line token: the text and its kind ("ok", "alt" or "bad")."""

    text: str
    tag: str


def TI(common, extreme=(), bad=()) -> dict:
    """Tokens of an integer flag."""
    pool = [str(v) for v in [*common, *common, *extreme]]
    return {"ok": st.sampled_from(pool).map(lambda s: T(s, "ok")),
            "alt": st.sampled_from(pool).flatmap(
                lambda s: st.sampled_from([s + ".0", "+" + s, " " + s, s + " ", "0" + s,
                                           s.replace("0", "\u0660")])).map(lambda s: T(s, "alt")),
            "bad": st.sampled_from(["abc", "", "1.5", "nan", "inf", "-1", "0x10", "9" * 400,
                                    "1e400", "١٢٣x", "4,", *map(str, bad)])
            .map(lambda s: T(s, "bad"))}


def TR(common, bad=()) -> dict:
    """Tokens of a real flag."""
    pool = [str(v) for v in common]
    return {"ok": st.sampled_from(pool).map(lambda s: T(s, "ok")),
            "alt": st.sampled_from(pool).map(lambda s: T(s + "0", "alt")),
            "bad": st.sampled_from(["nan", "inf", "-inf", "abc", "", "1e400", "Infinity",
                                    "-0.5", "1,5", *map(str, bad)]).map(lambda s: T(s, "bad"))}


def TC(options, bad=()) -> dict:
    """Tokens of a choice flag."""
    ok = st.sampled_from(list(options)).map(lambda s: T(s, "ok"))
    return {"ok": ok, "alt": ok,
            "bad": st.sampled_from(["", "x", "NONE", "a b", "é", *bad])
            .filter(lambda s: s not in options).map(lambda s: T(s, "bad"))}


def TL(options, bad=()) -> dict:
    """Tokens of a comma-separated list flag (plan's search axes)."""
    ok = st.lists(st.sampled_from(list(options)), min_size=1, max_size=3, unique=True).map(
        lambda xs: T(",".join(map(str, xs)), "ok"))
    return {"ok": ok, "alt": ok.map(lambda t: T(t.text.replace(",", ", "), "alt")),
            "bad": st.sampled_from(["", ",", "1,,2", "a", "-1", "1;2", "0", "9" * 300, *bad])
            .map(lambda s: T(s, "bad"))}


SWITCH = {"ok": st.just(T("", "ok")), "alt": st.just(T("", "ok")),
          "bad": st.sampled_from(["=yes", "=1", "=", "=false"]).map(lambda s: T(s, "bad"))}
PLAN_MODELS = ("gpt2", "llama-2-7b")
CMD_MODELS = ("gpt2", "llama-2-7b", "mixtral-8x7b", "llama-3-8b")

CLI = {  # command -> (required flags, optional flags): flag -> token strategies by kind
    "estimate": ({"--seq": TI([128, 1024, 4096], [MAX_SEQ_LEN], [MAX_SEQ_LEN + 1])}, {
        "--dp": TI([1, 2, 8], [MAX_GPUS], [MAX_GPUS + 1]), "--tp": TI([1, 2, 4, 8]),
        "--pp": TI([1, 2, 4]), "--cp": TI([1, 2]), "--ep": TI([1, 2, 8]), "--vpp": TI([1, 2]),
        "--zero": TC(("0", "1", "2", "3")), "--sp": SWITCH, "--json": SWITCH,
        "--micro-batch": TI([1, 2], [MAX_BATCH]), "--microbatches": TI([1, 4, 8]),
        "--recompute": TC(("none", "selective", "full")),
        "--schedule": TC(("gpipe", "1f1b", "interleaved")), "--engine": TC(ENGINES),
        "--context-gib": TR([0, 0.5, 1]), "--layers-per-stage": TL((2, 4, 12, 16)),
        "--world-size": TI([1, 8, 16]), "--offload": TC(("none", "optimizer")),
        "--gpus-per-node": TI([8, 4])}),
    "kv": ({"--seq": TI([128, 4096], [MAX_SEQ_LEN], [MAX_SEQ_LEN + 1])}, {
        "--batch": TI([0, 1, 8], [MAX_BATCH]), "--tp": TI([1, 2, 8]),
        "--dtype": TC(("fp32", "fp16", "bf16", "fp8", "int8")), "--json": SWITCH}),
    "serve-memory": ({"--seq": TI([128, 4096], [MAX_SEQ_LEN], [MAX_SEQ_LEN + 1])}, {
        "--batch": TI([0, 1, 8], [MAX_BATCH]), "--tp": TI([1, 2, 8]),
        "--weights": TC(("fp32", "fp16", "bf16", "int8", "int4")),
        "--kv-dtype": TC(("fp16", "fp8")), "--json": SWITCH}),
    "plan": ({"--nodes": TI([1], [], [0, 10**8]), "--global-batch": TI([8, 16, 1], [], [0]),
              "--seq": TI([128, 512, 1024], [], [0]), "--tp": TL((1, 2)), "--pp": TL((1, 2))}, {
        "--gpu": TC(GPUS), "--gpus-per-node": TI([1, 2, 4, 8], [], [0]),
        "--top": TI([1, 3], [], [0]), "--emit": TC(("megatron", "deepspeed", "torchtitan")),
        "--engine": TC(ENGINES), "--json": SWITCH, "--zero": TL((0, 1, 3)),
        "--recompute": TL(("none", "full")), "--no-sp": SWITCH,
        "--mfu": TR([0.3, 0.5]), "--headroom": TR([0.0, 0.1]),
        "--micro-batch": TL((1, 2))}),
}
HF_GPT = {"model_type": "gpt2", "vocab_size": 1000, "n_embd": 64, "n_layer": 2, "n_head": 4,
          "n_positions": 1024}


@st.composite
def cli_case(draw, root: Path):
    """argv, the flags that are invalid (or alternative spellings), the stdout kind and
    whether the model's name is hostile."""
    kind = draw(st.sampled_from(["estimate"] * 4 + ["kv"] * 2 + ["serve-memory"] * 2
                                + ["plan"] * 4 + ["other", "emit"]))
    stdout = draw(st.sampled_from(["text"] * 6 + ["ascii", "broken"]))
    if kind == "emit":  # a recipe for a model whose config.json names it with a hostile string
        name = draw(HOSTILE)
        path = root / f"c{len(list(root.iterdir()))}.json"
        path.write_text(json.dumps({**HF_GPT, "_name_or_path": name}), encoding="utf-8")
        emit = draw(st.sampled_from(["megatron", "deepspeed", "torchtitan"]))
        return (["plan", "--model", str(path), "--nodes", "1", "--global-batch", "8", "--seq",
                 "128", "--tp", "1,2", "--pp", "1", "--emit", emit], [], "text", name)
    if kind == "other":
        argv = draw(st.sampled_from([["models"], ["engines"], ["models", "--json"],
                                     ["engines", "--json"], ["--version"], ["--help"],
                                     ["estimate", "--help"], [], ["--bogus"], ["nope"],
                                     ["plan"], ["models", "extra"]]))
        bad = [] if argv in (["models"], ["engines"], ["models", "--json"], ["engines", "--json"],
                             ["--version"], ["--help"], ["estimate", "--help"]) else ["COMMAND"]
        return argv, bad, stdout, None
    required, optional = CLI[kind]
    mode = draw(st.sampled_from(["ok", "ok", "ok", "alt", "bad", "bad"]))
    flags = dict(required)
    chosen = draw(st.lists(st.sampled_from(sorted(optional)), max_size=3, unique=True))
    flags.update({f: optional[f] for f in chosen})
    target = draw(st.sampled_from(sorted(flags)))
    model_kind = draw(st.sampled_from(["preset"] * 3 + ["hostile", "bad"]))
    name = None
    if model_kind == "preset":
        model = draw(st.sampled_from(PLAN_MODELS if kind == "plan" else CMD_MODELS))
    elif model_kind == "hostile":
        name = draw(HOSTILE)
        path = root / f"c{len(list(root.iterdir()))}.json"
        path.write_text(json.dumps({**HF_GPT, "_name_or_path": name}), encoding="utf-8")
        model = str(path)
    else:
        model = draw(st.sampled_from(["no-such-model", str(root / "absent.json"), "",
                                      str(root / "broken.json"), str(root / "nested.json"),
                                      str(root), "-"]))
    argv, bad = [kind, "--model", model], ["--model"] if model_kind == "bad" else []
    for flag in sorted(flags):
        k = mode if flag == target and mode != "ok" else "ok"
        tok = draw(flags[flag][k])
        if flags[flag] is SWITCH:
            argv.append(flag + tok.text)
        else:
            argv += [flag, tok.text] if not tok.text.startswith("-") else [f"{flag}={tok.text}"]
        if tok.tag == "bad":
            bad.append(flag)
        elif tok.tag == "alt":
            bad.append("~" + flag)  # may be refused by name
    return argv, bad, stdout, name


class _Broken(io.RawIOBase):
    """A stdout whose reader went away: every write is a ``BrokenPipeError``."""

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def run_cli(argv: list[str], stdout: str = "text") -> tuple[int, str, str, float]:
    """main(argv) in-process: exit status, stdout, stderr and seconds."""
    err = io.StringIO()
    if stdout == "ascii":
        raw = io.BytesIO()
        out: Any = io.TextIOWrapper(raw, encoding="ascii", errors="strict")
    elif stdout == "broken":
        out = io.TextIOWrapper(_Broken(), encoding="utf-8")
    else:
        out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # --help, --version
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except BaseException as e:  # classified below
            code = -1
            err.write(f"Traceback: {type(e).__name__}: {e}")
    secs = time.perf_counter() - t0
    if stdout == "ascii":
        out.flush()
        text = raw.getvalue().decode("ascii", errors="replace")
    elif stdout == "broken":
        text = ""
    else:
        text = out.getvalue()
    return code, text, err.getvalue(), secs


def _strict_json(text: str) -> Any:
    def refuse(c: str) -> Any:
        raise ValueError(f"{c} in --json output")

    return json.loads(text, parse_constant=refuse)


def classify_cli(argv: list[str], bad: list[str], stdout: str) -> tuple[str, str | None, str]:
    code, out, err, secs = run_cli(argv, stdout)
    if secs > HANG_S:
        return "hang", f"took {secs:.1f} s", out
    invalid = [f for f in bad if not f.startswith("~")]
    try:
        if "Traceback" in err:
            raise Dirty(f"a traceback ({err.strip().splitlines()[-1][:100]})")
        if code not in (0, 1, 2, 141):
            raise Dirty(f"exit status {code}")
        if stdout == "broken":
            if code not in (141, 2) or (code == 2 and err.count("\n") != 1):
                raise Dirty(f"closed pipe: exit {code}, stderr {err[:80]!r}")
            return "clean", None, out
        if code == 0:
            if invalid:
                raise Dirty(f"exit 0 for an invalid {invalid[0]}")
            if err.strip():
                raise Dirty("exit 0 with text on stderr")
            if not out.strip():
                raise Dirty("exit 0 and no output")
            if "--json" in argv:
                try:
                    _check_leaves(_leaves(_strict_json(out)))
                except ValueError as e:
                    raise Dirty(f"--json output is not strict JSON ({str(e)[:60]})") from None
            return "clean", None, out
        if code == 2:
            lines = err.splitlines()
            if len(lines) != 1:
                raise Dirty(f"{len(lines)} lines on stderr")
            if out.strip() and "--help" not in argv:
                raise Dirty("exit 2 with output on stdout")
            if invalid and invalid != ["COMMAND"]:
                needles = [v for f in bad for v in (f.strip("~"), f.strip("~-"),
                                                      f.strip("~-").replace("-", "_"))]
                needles += ["model", "config", "json"] if "--model" in invalid else []
                if not any(n in lines[0] for n in needles):
                    raise Dirty("the error line does not name the flag")
        return "clean", None, out
    except Dirty as d:
        return "dirty", str(d), out


def _stub_bin(root: Path) -> Path:
    b = root / "bin"
    b.mkdir()
    bash = shutil.which("bash")
    for name in ("torchrun", "deepspeed", "python", "python3"):
        (b / name).write_text(f"#!{bash}\nexit 0\n")
        (b / name).chmod(0o755)
    for name in ("cat", "touch"):  # here-documents need cat; touch keeps the payloads live
        real = shutil.which(name)
        if real:
            (b / name).symlink_to(real)
    return b


def _run_script(script: str, root: Path, i: int) -> str | None:
    """Why the printed script is unsafe (None when it passes ``bash -n`` and creates no
    canary when run with stub launchers)."""
    work = root / f"run{i + 1}"
    work.mkdir()
    path = work / "recipe.sh"
    path.write_text(script, encoding="utf-8")
    bash = shutil.which("bash")
    r = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"bash -n fails: {r.stderr.strip()[:100]}"
    subprocess.run([bash, str(path)], cwd=work, capture_output=True, timeout=30,
                   env={"PATH": str(root / "bin"), "HOME": str(work)})
    if list(work.rglob("*CANARY*")):
        return "the script created the canary file"
    return None


@pytest.mark.timeout(120)
def test_command_lines_are_clean(tmp_path):
    root = tmp_path / "configs"
    root.mkdir()
    (root / "broken.json").write_text('{"n_embd": ')
    (root / "nested.json").write_text("[" * 100_000)
    counts: Counter = Counter()
    dirty: dict[str, list[str]] = {}
    scripts: list[tuple[list[str], str]] = []

    @settings(FUZZ, max_examples=CLI_EXAMPLES)
    @given(cli_case(root))
    def run(case):
        argv, bad, stdout, name = case
        cls, cause, out = classify_cli(argv, bad, stdout)
        counts[cls] += 1
        if cls != "clean":
            cmd = argv[0] if argv else "(none)"
            dirty.setdefault(f"{cmd}: {cause}", []).append(
                f"main({argv!r:.300}) [stdout={stdout}]")
        elif (name is not None and "--emit" in argv and out.strip()
              and len(scripts) < SCRIPT_RUNS and stdout == "text"):
            scripts.append((argv, out))

    run()
    stubs = tmp_path / "scripts"
    stubs.mkdir()
    if shutil.which("bash"):
        _stub_bin(stubs)
        # the control: a name pasted unquoted into a script does create the canary
        assert _run_script("# x\ntouch CANARY\ntorchrun x\n", stubs, -1) is not None
        for i, (argv, script) in enumerate(scripts):
            why = _run_script(script, stubs, i)
            counts["script clean" if why is None else "script injection"] += 1
            if why:
                dirty.setdefault(f"plan --emit: {why}", []).append(f"main({argv!r:.300})")
    calls = counts["clean"] + counts["hang"] + counts["dirty"]
    report = _report("fuzz-fresh CLI", Counter({k: counts[k] for k in ("clean", "hang", "dirty")}),
                     dirty)
    print(f"\n{report.splitlines()[0]}; emitted scripts run: {counts['script clean']} clean, "
          f"{counts['script injection']} injections")
    assert calls >= 400, report
    assert counts["hang"] == 0, report
    assert counts["script injection"] == 0, report
    assert counts["clean"] >= 0.99 * calls, report
