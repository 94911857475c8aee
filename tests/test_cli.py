"""The parmem command (estimate, kv, models, plan): output, JSON, and one-line errors with exit
status 2."""

import json
import subprocess
import sys

import pytest

from parmem import ModelSpec, ParallelConfig, TrainingSetup, estimate
from parmem.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "parmem.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_estimate_table(capsys):
    assert main(["estimate", "--model", "llama-2-7b", "--tp", "4", "--pp", "2", "--dp", "8",
                 "--zero", "1", "--seq", "4096", "--micro-batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "GiB per GPU" in out and "peak: stage" in out


def test_estimate_json_matches_the_library(capsys):
    main(["estimate", "--model", "llama-2-7b", "--tp", "2", "--pp", "2", "--seq", "2048",
          "--microbatches", "4", "--json"])
    got = json.loads(capsys.readouterr().out)
    ref = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(tp=2, pp=2),
                   TrainingSetup(seq_len=2048, num_microbatches=4))
    assert got["peak_bytes"] == ref.peak_bytes
    assert [s["total"] for s in got["stages"]] == [s.total for s in ref.stages]


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
    (["estimate", "--model", "llama-2-7b", "--seq", "0"], "seq_len=0"),
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
    assert main([*args, "--emit", "deepspeed"]) == 0
    out = capsys.readouterr().out  # a recipe: the target version, the JSON, the launch
    assert "# target: DeepSpeed 0.19.8" in out and '"train_batch_size": 64' in out
    assert main([*args, "--emit", "megatron", "--zero", "1", "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "--use-distributed-optimizer" in out and "--recompute-granularity full" in out


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
