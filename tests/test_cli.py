"""The parmem command (estimate, kv, models, plan): output, JSON, and one-line errors with exit
status 2."""

import json
import os
import subprocess
import sys

import pytest

from parmem import Cluster, ModelSpec, ParallelConfig, TrainingSetup, estimate, plan
from parmem.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "parmem.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_estimate_table(capsys):
    assert main(["estimate", "--model", "llama-2-7b", "--tp", "4", "--pp", "2", "--dp", "8",
                 "--zero", "1", "--seq", "4096", "--micro-batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "GiB per GPU" in out and "peak: stage" in out


def test_loss_chunks_reach_the_estimate_and_are_refused_by_name(capsys):
    """--loss-chunks is TrainingSetup.loss_chunks: absent, the engine's for the model (torchtitan
    chunks its own Llama 3 models' loss); 0, the whole micro-batch; an engine that cannot chunk
    is the one-line error, exit 2."""
    args = ["estimate", "--model", "llama-3-8b", "--dp", "8", "--zero", "3", "--seq", "8192",
            "--engine", "fsdp2", "--json"]  # fmt: skip
    for extra, chunks in (([], None), (["--loss-chunks", "0"], 0), (["--loss-chunks", "4"], 4)):
        assert main([*args, *extra]) == 0
        got = json.loads(capsys.readouterr().out)
        ref = estimate(ModelSpec.preset("llama-3-8b"), ParallelConfig(dp=8, zero=3),
                       TrainingSetup(seq_len=8192, engine="fsdp2", loss_chunks=chunks))
        assert got["peak_bytes"] == ref.peak_bytes
    mc = ["estimate", "--model", "llama-3-8b", "--dp", "8", "--seq", "8192", "--engine",
          "megatron-core", "--loss-chunks", "4"]  # fmt: skip
    assert main(mc) == 2
    err = capsys.readouterr().err
    assert "loss_chunks=4" in err and len(err.strip().splitlines()) == 1


def test_estimate_json_matches_the_library(capsys):
    main(["estimate", "--model", "llama-2-7b", "--tp", "2", "--pp", "2", "--seq", "2048",
          "--microbatches", "4", "--json"])
    got = json.loads(capsys.readouterr().out)
    ref = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(tp=2, pp=2),
                   TrainingSetup(seq_len=2048, num_microbatches=4))
    assert got["peak_bytes"] == ref.peak_bytes
    assert [s["total"] for s in got["stages"]] == [s.total for s in ref.stages]


def test_zbv_takes_its_two_chunks_unless_told_otherwise(capsys):
    """ZB-V runs two chunks per rank in a V: --schedule zbv alone is --vpp 2; another --vpp is
    the one-line error that says what ZB-V needs."""
    args = ["estimate", "--model", "llama-3-8b", "--pp", "4", "--seq", "2048", "--microbatches",
            "8", "--schedule", "zbv", "--engine", "fsdp2", "--json"]  # fmt: skip
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    ref = estimate(ModelSpec.preset("llama-3-8b"), ParallelConfig(pp=4, vpp=2),
                   TrainingSetup(seq_len=2048, num_microbatches=8, schedule="zbv",
                                 engine="fsdp2"))  # fmt: skip
    assert got["peak_bytes"] == ref.peak_bytes
    assert main([*args, "--vpp", "3"]) == 2
    assert "vpp=2" in capsys.readouterr().err


def test_kv(capsys):
    assert main(["kv", "--model", "llama-3-70b", "--seq", "8192", "--batch", "16", "--tp", "8",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes"] == 16 * 8192 * 2 * 80 * 1 * 128 * 2


def test_models_lists_presets(capsys):
    main(["models"])
    assert "mixtral-8x7b" in capsys.readouterr().out


def test_model_from_config_path(tmp_path, capsys):
    cfg = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12,
           "n_head": 12, "n_positions": 1024}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["estimate", "--model", str(tmp_path / "config.json"), "--seq", "1024",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stages"][0]["num_params"] == 124_439_808


@pytest.mark.parametrize("args,msg", [
    (["estimate", "--model", "llama-2-7b", "--tp", "3", "--seq", "4096"],
     "tp=3 must divide heads=32"),
    (["estimate", "--model", "llama-2-7b", "--pp", "48", "--seq", "4096"], "pp=48 > layers=32"),
    (["estimate", "--model", "nope", "--seq", "4096"], "unknown model preset 'nope'"),
    (["estimate", "--model", "llama-2-7b", "--seq", "0"], "argument --seq: 0 must be an integer"),
    (["kv", "--model", "/no/such/config.json", "--seq", "10"], "no such file"),
])
def test_errors_are_one_line_and_exit_2(args, msg):
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr


def test_parmem_does_not_import_torch():
    code = "import sys, parmem; parmem.estimate(parmem.ModelSpec.preset('gpt2')); " \
           "print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False"


# ---------------------------------------------------------------------------- plan
def test_cli_plan(capsys):
    args = ["plan", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--nodes", "2",
            "--global-batch", "64", "--seq", "4096", "--top", "3"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "best: " in out and out.count("\n") > 5
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["candidates"]) == 3
    assert data["engine"] == "paper"  # no --emit: the papers' profile
    assert main([*args, "--emit", "deepspeed"]) == 0
    out = capsys.readouterr().out  # a recipe: the target version, the JSON, the launch
    assert "# target: DeepSpeed 0.19.8" in out and '"train_batch_size": 64' in out
    # --emit plans with that engine's profile: the recipe of the DeepSpeed plan's best layout
    spec, cluster = ModelSpec.preset("llama-2-7b"), Cluster("a100-80gb", 8, 2)
    assert plan(spec, cluster, 64, 4096, top=3, engine="deepspeed").emit() in out
    assert main([*args, "--emit", "megatron", "--zero", "1", "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "--use-distributed-optimizer" in out and "--recompute-granularity full" in out
    assert main([*args, "--emit", "megatron"]) == 0
    out = capsys.readouterr().out
    assert plan(spec, cluster, 64, 4096, top=3, engine="megatron-core").emit() in out
    assert main([*args, "--engine", "fsdp2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"] == "fsdp2"


def test_cli_plan_emit_for_another_engine_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "parmem.cli", "plan", "--model", "llama-2-7b",
                        "--gpu", "a100-80gb", "--nodes", "1", "--global-batch", "8", "--seq",
                        "4096", "--engine", "paper", "--emit", "megatron"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "engine='megatron'" in r.stderr and "plan with engine='megatron-core'" in r.stderr


def test_cli_plan_tp_comm_overlap_reaches_the_recipe(capsys):
    args = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--nodes", "1",
            "--global-batch", "64", "--seq", "4096", "--tp", "4", "--emit"]
    assert main([*args, "megatron", "--tp-comm-overlap"]) == 0
    assert "--tp-comm-overlap" in capsys.readouterr().out
    assert main([*args, "megatron"]) == 0
    assert "--tp-comm-overlap" not in capsys.readouterr().out
    assert main([*args, "torchtitan", "--zero", "3", "--tp-comm-overlap"]) == 0
    assert "--compile.enable_async_tensor_parallel" in capsys.readouterr().out
    assert main([*args[:-3], "--emit", "deepspeed", "--tp-comm-overlap"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no switch" in err


def test_cli_plan_no_fit_exits_1(capsys):
    assert main(["plan", "--model", "llama-3-70b", "--gpu", "a100-40gb", "--nodes", "1",
                 "--global-batch", "64", "--seq", "4096"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("parmem: no layout fits: smallest peak is") and err.count("\n") == 1


def test_cli_plan_errors_are_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "parmem.cli", "plan", "--model", "llama-2-7b",
                        "--gpu", "b200", "--nodes", "1", "--global-batch", "8", "--seq", "4096"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "gpu='b200'" in r.stderr


# ---------------------------------------------------------------------------- errors, pipes, presets
@pytest.mark.parametrize("args, flag", [
    (["serve-memory", "--model", "llama-2-7b", "--seq", "10", "--tp", "0"], "--tp"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--context-gib", "inf"],
     "--context-gib"),
    (["estimate", "--model", "llama-2-7b", "--seq", "9" * 400], "--seq"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--tp", "x"], "--tp"),
    (["estimate", "--model", "llama-2-7b"], "--seq"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--zero", "4"], "--zero"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--layers-per-stage", "a"],
     "--layers-per-stage"),
    (["plan", "--model", "llama-2-7b", "--nodes", str(10**8), "--global-batch", "8", "--seq",
      "4096"], "--nodes"),
    (["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq", "4096",
      "--mfu", "nan"], "--mfu"),
    (["kv", "--model", "llama-2-7b", "--seq", "10", "--dtype", "fp64"], "--dtype"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--bogus"], "--bogus"),
    (["nope"], "nope"),
    ([], "COMMAND"),
])
def test_argument_errors_are_one_line_naming_the_flag_exit_2(args, flag, capsys):
    """argparse's usage block is replaced by one line and a hint to --help."""
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and flag in lines[0] and "--help" in lines[0], captured.err
    assert captured.out == ""


@pytest.mark.parametrize("cfg, key", [
    ({"hidden_size": [64]}, "hidden_size"), ({"hidden_size": 64.7}, "hidden_size"),
    ({"num_hidden_layers": "abc"}, "num_hidden_layers"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
])
def test_bad_config_values_are_one_line_naming_the_key(tmp_path, capsys, cfg, key):
    base = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps({**base, **cfg}))
    assert main(["kv", "--model", str(tmp_path / "config.json"), "--seq", "10"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"config[{key!r}]" in lines[0]


@pytest.mark.parametrize("text", ["[" * 100_000, '{"hidden_size": Infinity}', '{"a": NaN}'])
def test_hostile_config_files_are_one_line(tmp_path, capsys, text):
    (tmp_path / "config.json").write_text(text)
    assert main(["kv", "--model", str(tmp_path), "--seq", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("parmem: error: ")


def test_a_preset_wins_over_a_folder_of_the_same_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama-2-7b").mkdir()  # no config.json in it
    assert main(["kv", "--model", "llama-2-7b", "--seq", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "llama-2-7b"
    # a path is a path: ./name, or a name ending in .json
    assert main(["kv", "--model", "./llama-2-7b", "--seq", "10"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["kv", "--model", "llama-2-7b.json", "--seq", "10"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_folder_that_is_not_a_preset_is_read(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodel").mkdir()
    cfg = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12,
           "n_head": 12, "n_positions": 1024}
    (tmp_path / "mymodel" / "config.json").write_text(json.dumps(cfg))
    assert main(["kv", "--model", "mymodel", "--seq", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "mymodel"


def test_version(capsys):
    from parmem import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"parmem {__version__}"


def test_output_into_a_closed_pipe_ends_quietly():
    """``parmem plan ... | head -1`` used to end in a BrokenPipeError traceback."""
    cmd = [sys.executable, "-m", "parmem.cli", "plan", "--model", "llama-2-7b", "--nodes", "16",
           "--global-batch", "512", "--seq", "4096", "--top", "1000", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.readline()  # read one line, as head -1 does, then close the pipe
        proc.stdout.close()
        err = proc.stderr.read()
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert first.strip() == b"{"
    assert err == b"" and code == 141


def test_the_console_script():
    import shutil

    exe = shutil.which("parmem", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("the parmem console script is not installed next to this Python")
    r = subprocess.run([exe, "estimate", "--model", "llama-2-7b", "--seq", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--seq" in r.stderr
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("parmem ")


# ---------------------------------------------------------------------------- issue 20 presets
def test_cli_estimate_new_preset(capsys):
    assert main(["estimate", "--model", "deepseek-v3", "--tp", "8", "--pp", "8", "--ep", "8",
                 "--dp", "8", "--zero", "1", "--seq", "4096", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    ref = estimate(ModelSpec.preset("deepseek-v3"), ParallelConfig(tp=8, pp=8, ep=8, dp=8, zero=1),
                   TrainingSetup(seq_len=4096))
    assert [s["num_params"] for s in got["stages"]] == [s.num_params for s in ref.stages]
    n = [s["num_params"] for s in got["stages"]]  # layers 8, 8, 8, 8, 8, 7, 7, 7
    assert n[0] != n[1] and n[7] > n[6]  # 3 dense layers + embedding; LM head + MTP module


def test_cli_plan_new_preset_and_config(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(pytest.importorskip("transformers").GptOssConfig().to_json_string())
    for model in ("qwen3-235b-a22b", str(path)):
        code = main(["plan", "--model", model, "--gpu", "h100-sxm", "--nodes", "4",
                     "--global-batch", "64", "--seq", "4096", "--top", "2", "--json"])
        assert code in (0, 1)
        capsys.readouterr()


def test_cli_plan_takes_the_kernel_scales(capsys):
    """--mfu-hopper-scale and friends reach parmem.planner.Assumptions: the JSON's best step time
    is the library's with the same assumption."""
    args = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--nodes", "1",
            "--global-batch", "64", "--seq", "4096", "--top", "1", "--engine", "megatron-core",
            "--json"]
    spec, cluster = ModelSpec.preset("llama-3-8b"), Cluster("h100-sxm", 8, 1)
    for flag, name in (("--mfu-hopper-scale", "mfu_hopper_scale"),
                       ("--attention-efficiency", "attention_efficiency")):
        assert main([*args, flag, "0.5"]) == 0
        got = json.loads(capsys.readouterr().out)["candidates"][0]["step_time_s"]
        ref = plan(spec, cluster, 64, 4096, top=1, engine="megatron-core", **{name: 0.5})
        assert got == pytest.approx(ref.best.step_time)
        assert got > plan(spec, cluster, 64, 4096, top=1, engine="megatron-core").best.step_time
    assert main([*args, "--mfu-ampere-scale", "2.5"]) == 2
