"""``parmem measure`` (parmem.measure_model, parmem.distributed.measure_step): a reader's model shrunk
to a CPU step, run with Transformers' own layers on gloo ranks, measured beside the estimate.

Every expected number is derived here from the shapes:

* the shrunk Llama-2-7B (width /32: h = 128, one head of head_dim 128, f = 11008 // 32 = 344,
  V = 256, untied) has 4·h·(a·d) + 3·h·f + 2·h = 197,888 parameters per layer (q, k, v, o; gate,
  up, down; two RMSNorm weights: 9 tensors) and 2·V·h + h = 65,664 outside the layers
  (embedding, LM head, final norm: 3 tensors);
* the tiny Qwen3 config.json (tests/fixtures/measure_qwen3: h 128, 4 heads and 2 key/value heads
  of 48, f 320, V 640, tied) has h·192 + 2·h·96 + 192·h + 2·48 + 3·h·f + 2·h = 196,960 per layer
  (11 tensors: the q/k norms too) and V·h + h = 82,048 outside (2 tensors);
* DDP with the hf profile: bf16 weights and gradients (2 bytes each), AdamW's two moments in the
  weights' dtype (4 bytes), plus a 4-byte step counter per tensor (named); FSDP2: fp32 shards
  over the ranks, 4/d + 4/d + 8/d bytes per parameter, the same counters;
* one Llama layer on CPU in bf16 with SDPA keeps, per token: the fp32 copy of each RMSNorm input
  (4h, twice), its bf16 normalised output (2h, twice), the QKV and FC1 inputs (2h each), q, k,
  v and the projection input (2·a·d, 2·2·kv·d, 2·a·d), the fp32 log-sum-exp (4a), four
  f-wide SwiGLU tensors (8f) and two fp32 rstd (8); once per micro-batch: the rotary cos and
  sin (2 x 2·s·d), the int64 ids (8 per token), the final norm's fp32 input, normalised output
  and rstd (4h + 2h + 4), the LM-head input (2h), the shifted int64 labels (8 per token), the
  0-d fp32 loss weight (4) and the fp32 logits (4V per token).

Test time: the readers and the shrink rule take well under a second (no torch); each worker
run on the session pool a few seconds; the one CLI subprocess about ten.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from helpers import WORLD_SIZE as N

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.bounds import bounds
from parmem.cli import main
from parmem.measure_model import (
    CATEGORIES,
    beside_estimate,
    compare,
    expected,
    model_config,
    preset_config,
    read_log,
    read_snapshot,
    report,
    scaling,
    shrink,
    step_args,
)

FIX = Path(__file__).parent / "fixtures"
QWEN3 = FIX / "measure_qwen3" / "config.json"
MIB = 2**20

# the shrunk Llama-2-7B of the distributed tests: width /32, V 256
LH, LA, LD, LF, LV = 128, 1, 128, 11008 // 32, 256
L_LAYER = 4 * LH * (LA * LD) + 3 * LH * LF + 2 * LH
L_FIXED = 2 * LV * LH + LH
# the tiny Qwen3 config.json
QH, QF, QV = 128, 320, 640
Q_LAYER = QH * 192 + 2 * QH * 96 + 192 * QH + 2 * 48 + 3 * QH * QF + 2 * QH
Q_FIXED = QV * QH + QH


def _llama_shrink():
    return shrink(preset_config(ModelSpec.preset("llama-2-7b")), width_factor=32, vocab=LV,
                  name="llama-2-7b")  # fmt: skip


# ---------------------------------------------------------------------------- the shrink rule
def test_the_shrink_keeps_head_dim_and_the_gqa_ratio():
    sh = shrink(preset_config(ModelSpec.preset("llama-3-8b")))  # 32 heads, 8 kv heads, d 128
    s = sh.spec_at(2)
    assert sh.width_factor == 8  # the divisors of gcd(32, 8) = 8: 4096/4 > 256, 4096/8 = 512
    assert (s.hidden, s.heads, s.kv_heads, s.head_dim) == (512, 4, 1, 128)
    assert s.ffn_hidden == 14336 // 8 and s.vocab_size == 1024 and sh.depths == (2, 3)
    assert s.family == "llama" and s.num_params() == (
        2 * 1024 * 512 + 512 + 2 * (512 * 512 + 2 * 512 * 128 + 512 * 512 + 3 * 512 * 1792 + 1024)
    )


def test_the_shrunk_llama_counts_the_hand_derived_parameters():
    sh = _llama_shrink()
    for layers in sh.depths:
        assert sh.spec_at(layers).num_params() == L_FIXED + layers * L_LAYER


def test_a_config_json_is_shrunk_under_its_own_key_names():
    spec = ModelSpec.from_hf_config(QWEN3)
    sh = shrink(model_config(spec, str(QWEN3)), width_factor=2, layers=3)
    cfg = sh.config_at(4)
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (64, 2, 1)
    assert (cfg["head_dim"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (48, 160, 4)
    assert cfg["bos_token_id"] is None and cfg["eos_token_id"] is None  # past the vocabulary
    assert sh.depths == (3, 4) and sh.spec_at(4).qk_norm


def test_a_width_factor_that_splits_a_head_group_is_refused():
    cfg = preset_config(ModelSpec.preset("llama-3-8b"))
    with pytest.raises(ValueError, match=r"--width-factor 16 must divide .* allowed: 1, 2, 4, 8"):
        shrink(cfg, width_factor=16)


def test_a_preset_transformers_cannot_build_as_one_family_is_refused_by_field():
    with pytest.raises(ValueError, match="preset 'deepseek-v3'.*config.json"):
        preset_config(ModelSpec.preset("deepseek-v3"))


def test_layouts_a_cpu_step_does_not_run_are_refused_by_flag(capsys):
    for flags, word in ((["--tp", "2"], "--tp 2"), (["--recompute", "full"], "--recompute"),
                        (["--zero", "3"], "--engine hf --zero 3"),
                        (["--engine", "fsdp2", "--zero", "3", "--precision", "fp32"], "--precision")):  # fmt: skip
        assert main(["measure", "--model", "llama-2-7b", *flags]) == 2
        err = capsys.readouterr().err
        assert word in err and len(err.strip().splitlines()) == 1


def test_device_cuda_is_refused_without_a_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["measure", "--model", "llama-2-7b", "--device", "cuda"]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_sdpa_with_attention_dropout_on_cpu_is_refused():
    sh = shrink(preset_config(ModelSpec.preset("gpt2")), width_factor=12)  # dropout 0.1
    with pytest.raises(ValueError, match="--no-flash"):
        step_args(sh, ParallelConfig(dp=2), TrainingSetup(seq_len=16, engine="hf"))


def test_the_cpu_kernels_difference_of_gpt2_with_dropout():
    """GPT-2 (width /12: h 64, one head; dropout 0.1, eager attention), s 32, b 1, bf16: on CPU a
    dropout mask is bf16 (2 bytes, 1 on CUDA) and LayerNorm's mean and rstd are bf16 (2 bytes
    each, fp32 on CUDA). Per layer and token: the attention-probability mask (a·s elements), the
    two residual dropout masks (h each), two norms' statistics (4 values): a·s + 2h - 4·2; once:
    the embedding dropout mask (h per token) and the final norm's statistics (2 values, -2 each)."""
    sh = shrink(preset_config(ModelSpec.preset("gpt2")), width_factor=12)
    par, setup = ParallelConfig(dp=2), TrainingSetup(seq_len=32, engine="hf", flash_attention=False)
    tok, h, a, s = 32, 64, 1, 32
    for layers in sh.depths:
        exp = expected(sh.spec_at(layers), par, setup, 10)
        want = layers * tok * (a * s + 2 * h - 8) + tok * h - 4 * tok
        assert dict(exp["saved"][1]) == {"cpu-kernels": want, "shifted-labels-padding": 8}
        assert dict(expected(sh.spec_at(layers), par, setup, 10, "cuda")["saved"][1]) == {
            "shifted-labels-padding": 8}  # fmt: skip
        assert exp["optimizer"][1] == (("adamw-step-counters", 40),)


# ---------------------------------------------------------------------------- readers
def test_megatron_memory_lines():
    # Megatron-LM megatron/training/utils.py report_memory: "[Rank {r}] (after {it} iterations)
    # memory (MB) | allocated: ... | max allocated: ... | reserved: ... | max reserved: ..."
    lines = read_log((FIX / "megatron_memory.log").read_text())
    assert [(x.engine, x.rank, x.step) for x in lines] == [("megatron", 0, 10), ("megatron", 8, 10)]
    assert lines[0].allocated == round(30720.50 * MIB)
    assert lines[0].max_allocated == round(41984.25 * MIB)
    assert lines[1].max_reserved == 648 * MIB
    assert lines[1].allocated == round(542.3623046875 * MIB)


def test_torchtitan_memory_lines():
    # torchtitan components/metrics.py: "memory: {max_reserved_gib:5.2f}GiB({pct:.2f}%)" (with
    # terminal colours); trainer.py: "CUDA memory usage for model: {gib:.2f}GiB({pct:.2f}%)"
    lines = read_log((FIX / "torchtitan_memory.log").read_text())
    assert [(x.engine, x.step) for x in lines] == [("torchtitan", None), ("torchtitan", 1),
                                                   ("torchtitan", 10)]  # fmt: skip
    assert [x.max_reserved for x in lines] == [round(3.91 * 2**30), round(41.27 * 2**30),
                                               45 * 2**30]  # fmt: skip


def test_a_log_without_memory_lines_is_refused():
    with pytest.raises(ValueError, match="no memory line"):
        read_log("iteration 1 | lm loss: 10.0\n")


def _snapshot() -> dict:
    """A torch.cuda.memory._snapshot() by hand (torch/cuda/memory.py: segments of blocks, one
    trace per device): three allocations of 1,000,000, 500,000 and 300,000 requested bytes, the
    last freed, then the second freed (its block awaiting free): 1,800,000 bytes at the peak,
    1,000,000 at the end."""
    blocks = [
        {"address": 0, "size": 1048576, "requested_size": 1000000, "state": "active_allocated"},
        {"address": 1048576, "size": 524288, "requested_size": 500000,
         "state": "active_awaiting_free"},
        {"address": 1572864, "size": 524288, "requested_size": 0, "state": "inactive"},
    ]  # fmt: skip
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 2097152},
        {"action": "alloc", "addr": 0, "size": 1000000},
        {"action": "alloc", "addr": 1048576, "size": 500000},
        {"action": "alloc", "addr": 1572864, "size": 300000},
        {"action": "free_requested", "addr": 1572864, "size": 300000},
        {"action": "free_completed", "addr": 1572864, "size": 300000},
        {"action": "free_requested", "addr": 1048576, "size": 500000},
    ]
    seg = {"device": 0, "address": 0, "total_size": 2097152, "allocated_size": 1048576,
           "active_size": 1572864, "stream": 0, "segment_type": "large", "blocks": blocks}  # fmt: skip
    return {"segments": [seg], "device_traces": [trace]}


def test_a_snapshot_reads_allocated_reserved_and_the_trace_peak():
    (r,) = read_snapshot(pickle.dumps(_snapshot()))
    assert (r.device, r.allocated, r.allocated_blocks, r.reserved) == (0, 1000000, 1048576, 2097152)
    assert r.peak == 1800000 and r.trace_events == 7
    no_trace = dict(_snapshot(), device_traces=[[]])
    assert read_snapshot(pickle.dumps(no_trace))[0].peak is None


def test_a_pickle_naming_a_class_is_refused():
    with pytest.raises(ValueError, match="not a torch.cuda.memory._snapshot"):
        read_snapshot(pickle.dumps({"segments": [Path("x")]}))


def test_readings_beside_the_estimate_of_their_stage():
    spec, par = ModelSpec.preset("llama-2-7b"), ParallelConfig(tp=4, pp=2, dp=2)
    est = estimate(spec, par, TrainingSetup(seq_len=4096, num_microbatches=8,
                                            engine="megatron-core"))  # fmt: skip
    rows = beside_estimate(est, read_log((FIX / "megatron_memory.log").read_text()))
    by = {(r["who"], r["what"]): r for r in rows}
    s0, s1 = est.stages
    r0 = by[("rank 0 after 10 iterations", "allocated")]
    assert r0["stage"] == 0 and r0["parmem"] == s0.params + s0.grads + s0.optimizer
    r8 = by[("rank 8 after 10 iterations", "max allocated")]  # 8 // (t·d = 8): stage 1
    assert r8["stage"] == 1 and r8["parmem"] == s1.total - s1.cuda_context
    assert r8["difference"] == r8["reading"] - r8["parmem"]


def test_cli_log_and_snapshot(tmp_path, capsys):
    assert main(["measure", "--model", "llama-2-7b", "--tp", "4", "--pp", "2", "--dp", "2",
                 "--seq", "4096", "--engine", "megatron-core",
                 "--log", str(FIX / "megatron_memory.log")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "rank 8 after 10 iterations: max allocated" in out
    snap = tmp_path / "snap.pickle"
    snap.write_bytes(pickle.dumps(_snapshot()))
    assert main(["measure", "--model", "llama-2-7b", "--seq", "4096", "--snapshot", str(snap),
                 "--gpu", "h100-sxm", "--json"]) == 0  # fmt: skip
    got = json.loads(capsys.readouterr().out)
    assert {r["what"] for r in got["rows"]} == {"allocated", "peak (trace)", "reserved"}
    est = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=2),
                   TrainingSetup(seq_len=4096, engine="hf"))  # fmt: skip
    by = {r["what"]: r for r in got["rows"]}
    assert by["reserved"]["parmem"] == bounds(est, "h100-sxm").stages[0].reserved
    assert by["peak (trace)"]["reading"] == 1800000
    assert by["peak (trace)"]["parmem"] == est.stages[0].total - est.stages[0].cuda_context
    assert main(["measure", "--model", "llama-2-7b", "--log", str(snap)]) == 2  # no --seq
    assert "--seq is required" in capsys.readouterr().err


# ---------------------------------------------------------------------------- real steps
def _llama_saved(layers: int, s: int, b: int) -> int:
    t = s * b
    layer = t * (4 * LH + 2 * LH + 2 * LH + 2 * LA * LD + 4 * LD + 4 * LA + 2 * LA * LD + 4 * LH
                 + 2 * LH + 2 * LH + 8 * LF + 8)  # fmt: skip
    fixed = 2 * 2 * s * LD + 8 * t + t * (4 * LH + 2 * LH + 4) + 2 * LH * t + 8 * t + 4 + 4 * LV * t
    return layers * layer + fixed


@pytest.fixture(scope="module")
def llama_runs(pool):
    sh = _llama_shrink()
    out = {}
    for mode, par, setup in (
        ("ddp", ParallelConfig(dp=N), TrainingSetup(seq_len=16, micro_batch=2, engine="hf")),
        ("fsdp2", ParallelConfig(dp=N, zero=3),
         TrainingSetup(seq_len=16, micro_batch=2, engine="fsdp2")),
    ):  # fmt: skip
        res = pool.run("parmem.distributed.measure_step:step", **step_args(sh, par, setup))
        out[mode] = (sh, par, setup, res)
    return out


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_a_real_step_equals_the_estimate_plus_the_named_differences(llama_runs, mode):
    sh, par, setup, res = llama_runs[mode]
    for i, layers in enumerate(sh.depths):
        n, tensors = L_FIXED + layers * L_LAYER, 3 + 9 * layers
        state = {"params": 2 * n, "grads": 2 * n, "optimizer": 4 * n} if mode == "ddp" else {
            "params": 4 * n // N, "grads": 4 * n // N, "optimizer": 8 * n // N}
        for rank in res:
            r = rank[i]
            assert (r["num_params"], r["param_tensors"]) == (n, tensors)
            assert r["params"] == state["params"] and r["grads"] == state["grads"]
            assert r["optimizer"] == state["optimizer"] + 4 * tensors  # AdamW's step counters
            assert r["saved"] == _llama_saved(layers, 16, 2)
        rows = compare(sh.spec_at(layers), par, setup, [rank[i] for rank in res])
        for rank_rows in rows:
            got = {x.category: x for x in rank_rows}
            assert [x.unexplained for x in rank_rows] == [0] * len(CATEGORIES)
            assert got["optimizer"].named == (("adamw-step-counters", 4 * tensors),)
            assert got["saved"].named == ()  # b = 2; Llama's layers keep the same on CPU
            assert got["params"].estimate == state["params"]


@pytest.mark.dist
def test_the_gpu_checks_timed_steps_run_the_fsdp2_model_they_say(pool):
    """parmem.distributed.time_step.timed (scripts/gpu_check.py's worker), on the CPU ranks: the
    model Transformers builds from the config has the parameters parmem counts, FSDP2 shards
    it over the ranks, and every rank times the steps it was asked for (after the warm-up); no
    GPU, no peak. Its times mean nothing here: the GPU check records them."""
    sh = _llama_shrink()
    spec, cfg = sh.spec_at(2), sh.config_at(2)
    res = pool.run("parmem.distributed.time_step:timed", cfg=cfg, seq_len=16, micro_batch=2,
                   steps=2, warmup=1)  # fmt: skip
    assert len(res) == N
    for r in res:
        assert r["num_params"] == spec.num_params() and r["peak"] is None
        assert len(r["step_s"]) == 2 and all(t > 0 for t in r["step_s"])
    # on a GPU it runs AdamW fused, as torchtitan's optimizer does by default
    from torchtitan.components.optimizer.optimizer import OptimizersContainer

    assert OptimizersContainer.Config().implementation == "fused"


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_the_depth_scaling_extrapolates_to_the_direct_estimate(llama_runs, mode):
    sh, par, setup, res = llama_runs[mode]
    sc = scaling(sh, par, setup, (res[0][0], res[0][1]))
    per_param = {"ddp": (2, 2, 4), "fsdp2": (4 / N, 4 / N, 8 / N)}[mode]
    for c, bytes_per in zip(("params", "grads", "optimizer"), per_param, strict=True):
        assert sc.per_layer[c] == bytes_per * L_LAYER + (36 if c == "optimizer" else 0)
    assert sc.per_layer["saved"] == _llama_saved(1, 16, 2) - _llama_saved(0, 16, 2)
    assert sc.per_layer == sc.profile_per_layer  # the profile's per-layer table, + 9 counters
    spec_full = sh.spec_at(32)
    for c in CATEGORIES:  # measured at 2 and 3 layers, extrapolated to 32 == estimated at 32
        est, named = sc.direct[c]
        assert sc.extrapolated[c] == est + named
    est32 = estimate(spec_full, par, setup).stages[0]
    assert sc.direct["params"][0] == est32.params
    assert sc.extrapolated["saved"] == _llama_saved(32, 16, 2)


@pytest.mark.dist
def test_the_report_names_every_difference(llama_runs):
    sh, par, setup, res = llama_runs["ddp"]
    rep = report(sh, par, setup, res)
    assert all(d["ranks_equal"] for d in rep["depths"])
    assert rep["scaling"]["extrapolated"]["params"] == 2 * (L_FIXED + 32 * L_LAYER)
    bad = [[dict(r, num_params=r["num_params"] + 1) for r in rank] for rank in res]
    with pytest.raises(ValueError, match="the spec does not describe what ran"):
        report(sh, par, setup, bad)


@pytest.mark.dist
def test_parmem_measure_on_a_config_json(pool, monkeypatch, capsys):
    """The command end to end, in this process, on the session's ranks (the command's own
    Pool(world_size=--dp) is the session pool: starting ranks is the slow part, not the test)."""
    import contextlib

    import parmem.distributed

    @contextlib.contextmanager
    def session_pool(world_size, backend="gloo"):
        assert (world_size, backend) == (pool.world_size, "gloo")
        yield pool

    monkeypatch.setattr(parmem.distributed, "Pool", session_pool)
    assert main(["measure", "--model", str(QWEN3), "--seq-len", "16", "--dp", str(N),
                 "--json"]) == 0  # fmt: skip
    rep = json.loads(capsys.readouterr().out)
    assert rep["family"] == "qwen3" and rep["width_factor"] == 1
    for d in rep["depths"]:
        n, tensors = Q_FIXED + d["layers"] * Q_LAYER, 2 + 11 * d["layers"]
        assert (d["num_params"], d["param_tensors"]) == (n, tensors)
        for rank_rows in d["rows"]:
            got = {r["category"]: r for r in rank_rows}
            assert all(r["unexplained"] == 0 for r in rank_rows)
            assert got["params"]["measured"] == 2 * n
            assert got["optimizer"]["named"] == {"adamw-step-counters": 4 * tensors}
            # micro-batch 1: the padded (1, s + 1) int64 labels, one int64 more than s·b
            assert got["saved"]["named"] == {"shifted-labels-padding": 8}
    sc = rep["scaling"]
    assert sc["per_layer"]["params"] == 2 * Q_LAYER and sc["full_layers"] == 6
    assert sc["extrapolated"]["params"] == 2 * (Q_FIXED + 6 * Q_LAYER)


# the tiny Gemma 2 config.json (tests/fixtures/measure_gemma2), width /2: h 128, 2 heads and one
# key/value head of 64, f 256, V 512 tied; four RMSNorm weights per layer; every 2nd layer global
GEMMA2 = FIX / "measure_gemma2" / "config.json"
GH, GF, GV = 128, 256, 512
G_LAYER = GH * 128 + 2 * GH * 64 + 128 * GH + 3 * GH * GF + 4 * GH
G_FIXED = GV * GH + GH


@pytest.mark.dist
def test_a_patterned_mqa_model_scales_per_period_and_names_the_repeat_kv_view(pool):
    """Gemma 2 runs eager attention only (the profile refuses SDPA for it); the shrink leaves one
    key/value head, so at micro-batch 1 repeat_kv and matmul keep key and value as views of one
    head: 2 tensors x 2 bytes x (a - 1) x head_dim x s = 4,096 bytes per layer fewer than the
    table's repeated ones (named repeat-kv-view). Layers alternate local and global: the depths
    are 2 and 4 and the increment is per 2 layers."""
    spec = ModelSpec.from_hf_config(GEMMA2)
    sh = shrink(model_config(spec, str(GEMMA2)), width_factor=2)
    par = ParallelConfig(dp=N)
    setup = TrainingSetup(seq_len=16, engine="hf", flash_attention=False)
    res = pool.run("parmem.distributed.measure_step:step", **step_args(sh, par, setup))
    assert sh.depths == (2, 4) and sh.period == 2
    for i, layers in enumerate(sh.depths):
        assert res[0][i]["num_params"] == G_FIXED + layers * G_LAYER
        for rank_rows in compare(sh.spec_at(layers), par, setup, [rank[i] for rank in res]):
            got = {x.category: x for x in rank_rows}
            assert [x.unexplained for x in rank_rows] == [0] * len(CATEGORIES)
            assert dict(got["saved"].named) == {"shifted-labels-padding": 8,
                                                "repeat-kv-view": -layers * 2 * 2 * 64 * 16}  # fmt: skip
    sc = scaling(sh, par, setup, (res[0][0], res[0][1]))
    assert sc.per_layer["params"] == 2 * 2 * G_LAYER  # per period of 2 layers, 2 bytes each
    assert sc.per_layer == sc.profile_per_layer
    assert all(sc.extrapolated[c] == sum(sc.direct[c]) for c in CATEGORIES)
    assert sc.extrapolated["params"] == 2 * (G_FIXED + 8 * G_LAYER)
