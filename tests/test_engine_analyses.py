"""parmem.engine_analyses.engine_layout and engine_table (chapter 22: same model, four engines), and the
chapter's explorer.

Expected values: the engines' rules as their profiles cite them (FSDP2 shards everything or
nothing; DeepSpeed's pipeline engine stops at ZeRO-1; the Transformers Trainer has no pipeline
and no selective recomputation) and per-parameter byte counts from the engines' documentation
(Megatron-LM's dist_optimizer.md: 6 + 12/d; FSDP2: fp32 weights, gradients and moments).
"""

from __future__ import annotations

import pytest

from parmem import GIB, ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.engine_analyses import engine_layout, engine_table

PAR = ParallelConfig(dp=2, tp=8, pp=4, sp=True, zero=1)
SETUP = TrainingSetup(seq_len=4096, num_microbatches=16, flash_attention=True,
                      recompute="selective")


def test_each_engine_runs_the_nearest_layout_it_can():
    got = {name: engine_layout(name, PAR, SETUP) for name in
           ("paper", "megatron-core", "deepspeed", "fsdp2", "hf")}
    assert got["paper"] == (PAR, TrainingSetup(**{**SETUP.__dict__, "engine": "paper"}))
    assert got["megatron-core"][0] == PAR
    ds_par, ds_run = got["deepspeed"]
    # DeepSpeed trains the Transformers layers: no TP or SP; the 8 TP ranks become d
    assert (ds_par.dp, ds_par.tp, ds_par.pp, ds_par.sp, ds_par.zero) == (16, 1, 4, False, 1)
    assert ds_run.recompute == "full"  # Transformers checkpointing only
    assert got["fsdp2"][0].zero == 3  # ZeRO-1 is not an FSDP2 mode: it shards everything
    hf_par, hf_run = got["hf"]
    # no TP and no pipeline: t = 8 and 4 stages become d
    assert (hf_par.dp, hf_par.tp, hf_par.pp, hf_par.zero) == (64, 1, 1, 0)
    assert hf_par.world_size == PAR.world_size and hf_run.recompute == "full"
    # DeepSpeed with a pipeline cannot go past ZeRO-1
    assert engine_layout("deepspeed", ParallelConfig(dp=2, pp=2, zero=3), SETUP)[0].zero == 1
    # an interleaved schedule without a pipeline falls back to 1F1B
    inter = TrainingSetup(seq_len=1024, num_microbatches=8, schedule="interleaved")
    par, run = engine_layout("hf", ParallelConfig(pp=2, vpp=2, dp=2), inter)
    assert (par.pp, par.vpp, run.schedule) == (1, 1, "1f1b")
    # DeepSpeed's PipelineEngine has no virtual stages: interleaving becomes 1F1B
    par, run = engine_layout("deepspeed", ParallelConfig(pp=2, vpp=2, dp=2), inter)
    assert (par.pp, par.vpp, run.schedule) == (2, 1, "1f1b")


def test_engine_table_rows_are_the_estimates_peaks():
    spec = ModelSpec.preset("llama-2-70b")
    rows = engine_table(spec, PAR, SETUP)
    assert [r["engine"] for r in rows] == ["paper", "megatron-core", "deepspeed", "fsdp2", "hf"]
    psi = {r["engine"]: r["estimate"].peak.num_params for r in rows}
    by = {r["engine"]: r for r in rows}
    for r in rows:
        est = r["estimate"]
        assert r["total"] == est.peak_bytes
        assert r["activations"] == est.peak.activations + est.peak.logits
    # Megatron-LM dist_optimizer.md: bf16 weights (2), fp32 main gradients (4), 12/d sharded
    n = psi["megatron-core"]
    assert by["megatron-core"]["params"] + by["megatron-core"]["grads"] == 6 * n
    assert by["megatron-core"]["optimizer"] == 12 * n // 2
    # FSDP2: fp32 weights, gradients and two fp32 moments, all sharded over d = 2
    n = psi["fsdp2"]
    assert (by["fsdp2"]["params"], by["fsdp2"]["optimizer"]) == (4 * n // 2, 8 * n // 2)
    assert not by["paper"]["changed"] and by["fsdp2"]["changed"] and by["hf"]["changed"]
    assert by["hf"]["host"] == 0 and by["hf"]["total"] > 80 * GIB  # the Trainer alone: no fit


def test_engine_table_names_a_subset():
    spec = ModelSpec.preset("llama-2-7b")
    rows = engine_table(spec, ParallelConfig(dp=8, zero=3), TrainingSetup(seq_len=1024),
                        names=["deepspeed", "fsdp2"])
    assert [r["layout"] for r in rows] == ["d=8, t=1, p=1, ZeRO-3"] * 2
    est = estimate(spec, ParallelConfig(dp=8, zero=3), TrainingSetup(seq_len=1024,
                                                                     engine="fsdp2"))
    assert rows[1]["total"] == est.peak_bytes


def test_explore_engines_builds_and_names_a_bad_argument():
    pytest.importorskip("ipywidgets")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parmem.book.widgets import explore_engines

    box = explore_engines(model="llama-2-7b", dp=8, seq_len=1024, static=False)
    assert box.children
    plt.close("all")
    with pytest.raises(ValueError, match="engine_name='nemo' must be one of"):
        explore_engines(engine_name="nemo", static=False)
    with pytest.raises(ValueError, match="dp=3 must be one of"):
        explore_engines(dp=3, static=False)
