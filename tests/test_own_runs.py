"""``parmem calibrate``'s fit (:mod:`parmem.planner.own_runs`): what a fit to the reader's own runs
must do, checked by relations derived by hand rather than by numbers the code printed."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from parmem.cli import main
from parmem.config import ParallelConfig, TrainingSetup
from parmem.model import ModelSpec
from parmem.planner import Cluster, evaluate
from parmem.planner.heldout import MeasuredRun
from parmem.planner.inputs import Assumptions
from parmem.planner.logs import read_log_file
from parmem.planner.own_runs import OwnRun, calibrate, run_from_log, runs_from_toml


def _run(name, gpus=1, d=1, t=1, step=None, mfu=0.6, measured_factor=1.0, **setup):
    spec = ModelSpec.preset("llama-2-7b")
    cluster = Cluster("h100-sxm", min(gpus, 8), max(gpus // 8, 1))
    par = ParallelConfig(dp=d, tp=t, sp=t > 1)
    su = TrainingSetup(seq_len=4096, micro_batch=1, num_microbatches=8, engine="megatron-core",
                       flash_attention=True, dropout=False, **setup)  # fmt: skip
    if step is None:
        step = evaluate(spec, cluster, par, su, mfu=mfu).step_time * measured_factor
    return OwnRun(name, MeasuredRun(name, "own", "own", spec, cluster, par, su, step))


def test_one_gpu_step_time_is_inverse_in_mfu_so_the_fit_divides_it():
    """On one GPU the modelled step is compute and recompute only, both FLOPs over
    (peak x busy fraction), and the busy fraction is linear in mfu (busy_fraction's formula): a
    run measured at twice the step modelled at mfu 0.6 fits mfu 0.3."""
    run = _run("one", mfu=0.6, measured_factor=2.0)
    cal = calibrate([run], fit=("mfu",))
    assert cal.fitted["mfu"] == pytest.approx(0.3, abs=1e-3)
    assert abs(cal.errors("after")[0]) < 1e-3
    assert cal.held_out == (None,) and math.isnan(cal.mean_error("held_out"))
    # from the default mfu, 0.64: modelled T(0.6) x 0.6/0.64 against 2 x T(0.6) measured
    assert cal.errors("before")[0] == pytest.approx(0.6 / (0.64 * 2) - 1, rel=1e-6)
    assert "--mfu 0.300" in cal.flags()


def test_an_assumption_the_runs_do_not_depend_on_is_reported_and_kept():
    """Without data parallelism no gradient is reduced: dp_overlap_on cannot be fitted."""
    cal = calibrate([_run("one", measured_factor=1.5), _run("two", measured_factor=1.4)],
                    fit=("mfu", "dp_overlap_on"))  # fmt: skip
    assert cal.undetermined == ("dp_overlap_on",)
    default = Assumptions().dp_overlap_on
    assert cal.fitted["dp_overlap_on"] == default  # the default, kept
    assert "dp_overlap_on" not in cal.flags() and "dp_overlap_on" not in {
        k for k, v in cal.options.items() if v != default
    }
    assert "not determined" in str(cal)


def test_a_link_only_one_run_crosses_is_not_determined_by_it():
    """Three one-node runs and one on two nodes: only the latter's time moves with the network
    (its gradient all-reduce crosses nodes), so inter_node_scale would fit that run alone,
    exactly: it is reported as not determined and kept at 1, while mfu is fitted to all four."""
    runs = [_run(f"one-{i}", gpus=8, d=8, measured_factor=f) for i, f in enumerate((1.2, 1.3, 1.25))]
    runs.append(_run("two", gpus=16, d=16, measured_factor=3.0))
    cal = calibrate(runs, fit=("mfu", "inter_node_scale"))
    assert cal.undetermined == ("inter_node_scale",)
    assert cal.fitted["inter_node_scale"] == 1.0
    assert "inter_node_scale" not in cal.flags()
    # two runs across nodes determine it
    runs.append(_run("two-b", gpus=16, d=16, measured_factor=2.5))
    assert calibrate(runs, fit=("mfu", "inter_node_scale")).undetermined == ()


def test_leaving_a_run_out_predicts_it_with_the_others_fit():
    """Three one-GPU runs measured at 1.5x the step at mfu 0.6, and one at 3x: fitted to the
    three alike, the odd one is predicted 50 % too fast (1.5/3 - 1); each of the three, predicted
    from the other three (two alike and the odd one), lies between."""
    runs = [_run(f"r{i}", measured_factor=1.5) for i in range(3)]
    runs.append(_run("odd", measured_factor=3.0))
    cal = calibrate(runs, fit=("mfu",))
    held = cal.errors("held_out")
    assert held[3] == pytest.approx(1.5 / 3.0 - 1, abs=2e-3)
    # the median-like minimum of the mean |error| sits at the majority's value
    assert cal.fitted["mfu"] == pytest.approx(0.6 / 1.5, abs=2e-3)
    assert all(abs(h) < 1e-2 for h in held[:3])


def test_a_run_fixed_assumption_holds_whatever_is_fitted():
    """A run that did not overlap its gradient reduction keeps the non-overlapping value."""
    base = _run("dp", gpus=8, d=8, measured_factor=1.0)
    fixed = replace(base, fixed={"dp_overlap_on": 0.0})
    a = calibrate([fixed, replace(fixed, name="again")], fit=("mfu", "dp_overlap_on"))
    assert a.undetermined == ("dp_overlap_on",)  # fixed for every run: nothing to fit


def test_bad_requests_name_the_field():
    run = _run("one")
    with pytest.raises(ValueError, match="fit: 'headroom' cannot be fitted"):
        calibrate([run], fit=("headroom",))
    with pytest.raises(ValueError, match="2 assumptions cannot be determined by 1 run;"):
        calibrate([run], fit=("mfu", "tp_overlap"))
    with pytest.raises(ValueError, match="runs: give at least one"):
        calibrate([], fit=("mfu",))
    with pytest.raises(ValueError, match="unknown option 'mfuu'"):
        calibrate([run], fit=("mfu",), mfuu=0.3)


def test_runs_in_the_measured_runs_schema(tmp_path):
    """A reader's file in data/measured_runs.toml's schema: a row's tokens per second per GPU
    become the step time tokens-of-a-batch / (GPUs x that): 64 x 8192 / (64 x 2904) s."""
    f = tmp_path / "mine.toml"
    f.write_text(
        '[my_cluster]\ngpu = "a100-80gb"\ngpus_per_node = 8\nprofile = "fsdp2"\n'
        'rows = [{model = "llama-3-8b", gpus = 64, zero = 3, batch = 64, seq_len = 8192, '
        'micro_batch = 1, recompute = "selective", tokens_per_s_per_gpu = 2904}]\n'
    )
    (r,) = runs_from_toml(f)
    assert r.run.step_time == pytest.approx(64 * 8192 / (64 * 2904))
    assert r.run.cluster.world_size == 64 and r.run.parallel.dp == 64
    assert r.run.setup.engine == "fsdp2"
    f.write_text('[x]\nrows = [{model = "llama-3-8b", gpus = 8, batch = 8, seq_len = 4096}]\n')
    with pytest.raises(ValueError, match="no gpu in the row or its group"):
        runs_from_toml(f)
    # nothing is assumed for a reader's row: the engine, the recomputation, the micro-batch
    good = ('gpu = "h100-sxm"\nprofile = "fsdp2"\nrows = [{model = "llama-3-8b", gpus = 8, '
            'batch = 8, seq_len = 4096, micro_batch = 1, tokens_per_s_per_gpu = 9000')
    for bad, message in ((good.replace('profile = "fsdp2"\n', ""), "no profile in the group"),
                         (good + ', recompute = "block"', "recompute = 'block'"),
                         (good.replace("micro_batch = 1, ", ""), "no micro_batch"),
                         (good.replace("tokens_per_s_per_gpu = 9000", "mfu = 0.4"),
                          "a utilisation only")):  # fmt: skip
        f.write_text("[x]\n" + bad + "}]\n")
        with pytest.raises(ValueError, match=message):
            runs_from_toml(f)
    f.write_text("not toml [")
    with pytest.raises(ValueError, match="not TOML"):
        runs_from_toml(f)


# ------------------------------------------------------------------- from a training log
HAND = Path(__file__).parent / "fixtures" / "logs" / "megatron_hand_written_llama2_7b.log"


def test_a_megatron_log_gives_the_layout_and_the_median_step():
    """The hand-written log's arguments: 8 GPUs, t = 2 (so d = 4), the distributed optimizer
    (ZeRO-1), sequence parallelism, selective recomputation, b = 1 of a 64-sequence batch at
    4,096 tokens (m = 64 / (4 x 1) = 16); steps after the warm-up: 4.1, 4.0, 3.9 s (median
    4.0); no overlapped gradient reduction, so that run keeps the non-overlapping value."""
    log = read_log_file(HAND)
    r = run_from_log(log, ModelSpec.preset("llama-2-7b"), "h100-sxm")
    p, s = r.run.parallel, r.run.setup
    assert (p.tp, p.pp, p.dp, p.cp, p.ep, p.zero, p.sp) == (2, 1, 4, 1, 1, 1, True)
    assert (s.micro_batch, s.num_microbatches, s.seq_len, s.recompute) == (1, 16, 4096, "selective")
    assert s.engine == "megatron-core" and r.run.cluster.world_size == 8
    assert r.run.step_time == pytest.approx(4.0)
    assert r.fixed == {"dp_overlap_on": "dp_overlap"}  # whatever dp_overlap is, given or fitted


def test_a_log_of_another_model_or_a_contradicting_flag_is_refused():
    log = read_log_file(HAND)
    with pytest.raises(ValueError, match="num_layers = 32 is not the model's"):
        run_from_log(log, ModelSpec.preset("llama-2-13b"), "h100-sxm")
    with pytest.raises(ValueError, match="the log says t = 2, the flags 4"):
        run_from_log(log, ModelSpec.preset("llama-2-7b"), "h100-sxm", t=4)
    with pytest.raises(ValueError, match="world_size is 8"):
        run_from_log(log, ModelSpec.preset("llama-2-7b"), "h100-sxm", nodes=2)
    fp8 = replace(log, settings={**log.settings, "fp8": "hybrid"})
    with pytest.raises(ValueError, match="FP8 GEMMs are not modelled"):
        run_from_log(fp8, ModelSpec.preset("llama-2-7b"), "h100-sxm")


def test_a_torchtitan_log_gives_its_mesh_and_takes_its_tokens_per_second():
    """torchtitan prints its device mesh (the PR 3393 log: FSDP over dp_shard = 2 GPUs) but
    not, in this excerpt, its batch: the flags give those, and the micro-batch is never assumed.
    Its tps (tokens per second per GPU) makes the step G x s / (GPUs x tps)."""
    log = read_log_file(Path(HAND).parent / "torchtitan_3393_rank0.log")
    spec = ModelSpec.preset("llama-3-8b")
    with pytest.raises(ValueError, match="world_size is 2, --nodes x --gpus-per-node 8"):
        run_from_log(log, spec, "h100-sxm", nodes=1, G=8, s=2048, b=1)
    with pytest.raises(ValueError, match="give --micro-batch"):
        run_from_log(log, spec, "h100-sxm", G=8, s=2048)
    r = run_from_log(log, spec, "h100-sxm", G=8, s=2048, b=4)
    assert r.run.cluster.world_size == 2 and r.run.parallel.dp == 2
    assert r.run.setup.engine == "fsdp2" and r.run.parallel.zero == 3
    assert (r.run.setup.micro_batch, r.run.setup.num_microbatches) == (4, 1)  # 8 = 2 x 4 x 1
    assert r.run.step_time == pytest.approx(8 * 2048 / (2 * log.tokens_per_s_per_gpu))
    hsdp = replace(log, settings={**log.settings, "dp_replicate": 2})
    with pytest.raises(ValueError, match="dp_replicate = 2 \\(HSDP\\) is not modelled"):
        run_from_log(hsdp, spec, "h100-sxm", G=8, s=2048, b=1)


def test_the_link_factor_fits_a_network_bound_run():
    """A run whose modelled step is all network (ZeRO-3 over 16 nodes, a tiny batch) measured
    at half the modelled time fits a faster inter-node link, and the plan uses it."""
    spec = ModelSpec.preset("llama-2-7b")
    cluster = Cluster("h100-sxm", 8, 16)
    par = ParallelConfig(dp=16, tp=8, zero=3)  # one rank of each ZeRO group a node: one port
    su = TrainingSetup(seq_len=512, micro_batch=1, num_microbatches=1, engine="fsdp2",
                       flash_attention=True, dropout=False)  # fmt: skip
    t = evaluate(spec, cluster, par, su).step_time
    run = OwnRun("net", MeasuredRun("net", "own", "own", spec, cluster, par, su, t / 2))
    cal = calibrate([run], fit=("inter_node_scale",))
    assert cal.fitted["inter_node_scale"] > 1.5 and abs(cal.errors("after")[0]) < 0.02
    faster = cal.cluster(cluster).hardware.inter_node.bandwidth
    assert faster == pytest.approx(cluster.hardware.inter_node.bandwidth
                                   * cal.fitted["inter_node_scale"])  # fmt: skip
    assert "inter_node bandwidth x" in str(cal) and "--inter-node" not in cal.flags()


# --------------------------------------------------------------------------------- the CLI
def test_cli_calibrate_prints_the_fit_and_plans_with_it(capsys):
    assert main(["calibrate", str(HAND), "--model", "llama-2-7b", "--gpu", "h100-sxm",
                 "--plan", "--top", "2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "fitted: mfu = " in out and "plan with: parmem plan ... --mfu " in out
    assert "no run can be left out" in out
    assert "timed with dp_overlap (the non-overlapping engines' value)" in out
    assert "8 x H100" in out or "1 x 8" in out  # the re-plan of the run's cluster


@pytest.mark.parametrize("argv, message", [
    (["calibrate"], "give at least one training log"),
    (["calibrate", str(HAND), "--gpu", "h100-sxm"], "--model is required"),
    (["calibrate", str(HAND), "--model", "llama-2-7b"], "--gpu is required"),
    (["calibrate", str(HAND), "--model", "llama-2-13b", "--gpu", "h100-sxm"], "num_layers"),
    (["calibrate", str(HAND), "--model", "llama-2-7b", "--gpu", "h100-sxm", "--fit", "headroom"],
     "--fit 'headroom'"),
    (["calibrate", "/nonexistent.log", "--model", "llama-2-7b", "--gpu", "h100-sxm"],
     "/nonexistent.log"),
])  # fmt: skip
def test_cli_calibrate_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_cli_calibrate_reads_runs_files_and_writes_json(tmp_path, capsys):
    """Two runs in data/measured_runs.toml's schema, one fitted value: the JSON carries the fit,
    each run's three step times and the leave-one-out errors (each run from the other)."""
    import json

    f = tmp_path / "mine.toml"
    f.write_text(
        '[cluster]\ngpu = "a100-80gb"\ngpus_per_node = 8\nprofile = "fsdp2"\nrows = [\n'
        '  {model = "llama-3-8b", gpus = 8, zero = 3, batch = 16, seq_len = 4096, '
        'micro_batch = 1, tokens_per_s_per_gpu = 3000},\n'
        '  {model = "llama-3-8b", gpus = 8, zero = 3, batch = 32, seq_len = 4096, '
        'micro_batch = 1, tokens_per_s_per_gpu = 3100},\n]\n'
    )
    assert main(["calibrate", "--runs", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["fitted"]) == {"mfu"} and len(out["runs"]) == 2
    # the step time of the first row: 16 x 4096 tokens / (8 GPUs x 3000 tokens/s)
    assert out["runs"][0]["measured_s"] == pytest.approx(16 * 4096 / (8 * 3000))
    assert all(r["held_out_s"] is not None for r in out["runs"])
    assert main(["calibrate", "--runs", str(tmp_path / "none.toml")]) == 2
    assert "none.toml" in capsys.readouterr().err


def test_a_run_without_overlap_follows_the_given_dp_overlap():
    """The hand-written Megatron log did not overlap its gradient reduction: its modelled step
    follows --dp-overlap (given or fitted), not dp_overlap_on; the printed plan flags carry every
    assumption the fit started from, so `parmem plan` reproduces what was calibrated."""
    log = read_log_file(HAND)
    r = run_from_log(log, ModelSpec.preset("llama-2-7b"), "h100-sxm")
    a = calibrate([r], fit=("mfu",), dp_overlap=0.0)
    b = calibrate([r], fit=("mfu",), dp_overlap=1.0)
    assert a.before[0] > b.before[0]  # less hidden, a longer step
    c = calibrate([r], fit=("mfu",), tp_overlap=0.5)
    assert "--tp-overlap 0.500" in c.flags() and "--mfu " in c.flags()


def test_an_fp32_run_and_a_megatron_log_silent_on_overlap():
    """Megatron-LM's bf16 and fp16 both False is an fp32 run (BF16 rates only: refused); a log
    without overlap_grad_reduce ran without it (the flag is off by default)."""
    log = read_log_file(HAND)
    spec = ModelSpec.preset("llama-2-7b")
    fp32 = replace(log, settings={**log.settings, "bf16": False})
    with pytest.raises(ValueError, match="an fp32 run"):
        run_from_log(fp32, spec, "h100-sxm")
    silent = replace(log, settings={k: v for k, v in log.settings.items()
                                    if k != "overlap_grad_reduce"})  # fmt: skip
    r = run_from_log(silent, spec, "h100-sxm")
    assert r.fixed == {"dp_overlap_on": "dp_overlap"}
    assert any("does not print overlap_grad_reduce" in n for n in r.notes)
    on = replace(log, settings={**log.settings, "overlap_grad_reduce": True})
    assert run_from_log(on, spec, "h100-sxm").fixed == {}


def test_the_megatron_arguments_read_are_megatron_lms():
    """Every argument calibrate reads from a Megatron-LM log is an option of Megatron-LM's own
    parser (tests/fixtures/megatron_lm_args.json, recorded from it by
    scripts/record_megatron_args.py), but for the two validate_args sets (world_size,
    virtual_pipeline_model_parallel_size); and the parser's defaults are what the calibration
    assumes of a log: no overlapped gradient reduction, no distributed optimizer, no sequence
    parallelism unless given, recomputation one of the kinds modelled."""
    import inspect
    import json
    import re

    from parmem.planner import own_runs

    src = "".join(inspect.getsource(f) for f in (own_runs.megatron_layout,
                                                 own_runs._check_megatron_model))  # fmt: skip
    read = set(re.findall(r'settings(?:\.get\(|\[)"(\w+)"', src))
    read |= set(re.findall(r'"(\w+)": "\w+",', src))  # the layout table's keys
    read |= set(own_runs._MEGATRON_MODEL)
    parser = json.loads((Path(__file__).parent / "fixtures" / "megatron_lm_args.json")
                        .read_text())["options"]  # fmt: skip
    options = {o["dest"]: o for o in parser}
    assert {"tensor_model_parallel_size", "overlap_grad_reduce", "num_layers"} <= read
    assert read - set(options) == {"world_size", "virtual_pipeline_model_parallel_size"}
    for name in ("overlap_grad_reduce", "use_distributed_optimizer", "sequence_parallel", "bf16"):
        assert options[name]["default"] is False and options[name]["action"] == "_StoreTrueAction"
    assert set(options["recompute_granularity"]["choices"]) == {"selective", "full"}
    assert options["recompute_granularity"]["default"] is None  # what megatron_layout calls none


@pytest.mark.parametrize("mesh", [
    {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1, "ep": 1},  # the PR 3393 log's
    {"pp": 2, "dp_replicate": 1, "dp_shard": 4, "cp": 2, "tp": 2, "ep": 4},
])  # fmt: skip
def test_the_world_of_a_torchtitan_mesh_is_torchtitans(mesh):
    """titan_layout's world (every mesh dimension but ep, which torchtitan carves out of
    dp_shard x cp) is the world size torchtitan's own ParallelDims accepts, and only it."""
    pytest.importorskip("torchtitan")
    from torchtitan.distributed import ParallelDims

    from parmem.planner.own_runs import titan_layout

    world = titan_layout(mesh)["world"]
    ParallelDims(**mesh, world_size=world)  # validated on construction
    with pytest.raises(AssertionError, match="Invalid parallel dims"):
        ParallelDims(**mesh, world_size=world * 2)


def test_a_calibration_study_recovers_a_cluster_whose_runs_follow_the_model():
    """Four layouts of one cluster whose "measured" times are the model's own at mfu = 0.5 (a
    cluster whose one unknown is its kernel efficiency): fitted to the other runs, or to any
    single one, every run is predicted to the rounding of the fit, while the defaults (mfu
    0.64) are off by the efficiency's ratio; a cluster of one run is left out."""
    from parmem.planner.own_runs import calibration_study, cluster_tables

    runs = cluster_tables()[("torchtitan_asynctp_h100_202506", "h100-sxm")]
    true = [OwnRun(r.name, replace(r.run, step_time=_model_time_at(r, mfu=0.5))) for r in runs]
    lone = cluster_tables()[("nemo_automodel_h100", "h100-sxm")]
    (s,) = calibration_study({("synthetic", "h100-sxm"): true, ("one", "h100-sxm"): lone})
    assert (s.group, s.runs) == ("synthetic", 4)
    assert s.others[1] < 2e-3 and s.one[1] < 2e-3
    assert s.defaults[0] > 0.05


def _model_time_at(r: OwnRun, **kw: float) -> float:
    m = r.run
    return evaluate(m.spec, m.cluster, m.parallel, m.setup, **kw).step_time


def test_a_fit_across_models_says_so():
    """Runs of several models fit one efficiency for all of them: the answer says which models
    and to fit to runs of the model that will be planned; runs of one model say nothing."""
    from parmem.planner.own_runs import group_runs

    mixed = calibrate(group_runs("flagperf_megatron", gpu="h100-sxm"), fit=("mfu",))
    assert "these runs are of 2 models (llama-3-70b-flagperf, llama-3-8b-flagperf)" in str(mixed)
    one = calibrate(group_runs("flagperf_megatron", gpu="a100-80gb"), fit=("mfu",))
    assert "these runs are of" not in str(one)
    assert mixed.to_dict()["models"] == ["llama-3-70b-flagperf", "llama-3-8b-flagperf"]
