"""The command line's hard cases (issue 34): stdout closed, unwritable or piped into a reader
that left; a ``--model`` no file system takes; a config.json whose ``layer_types`` lists lists;
numbers JSON cannot hold; names an ASCII terminal cannot print; demo arguments refused before
any rank starts. Each error is one line on stderr with exit status 2 (a closed pipe: 141 and
nothing at all), never a traceback. Subprocesses run under a timeout."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from parmem._check import strict_json
from parmem.cli import main

TIMEOUT = 60


def run(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "parmem.cli", *args], stderr=subprocess.PIPE, text=True,
        timeout=TIMEOUT, **kw
    )


def one_error_line(err: str, *words: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), err
    return lines[0]


def test_stdout_closed_before_start():
    """``parmem models >&-``: Python starts with sys.stdout None; one line, status 2."""
    r = subprocess.run(
        ["sh", "-c", 'exec "$0" -m parmem.cli models >&-', sys.executable],
        stderr=subprocess.PIPE, text=True, timeout=TIMEOUT,
    )
    assert r.returncode == 2
    one_error_line(r.stderr, "stdout is closed")


def test_stdout_not_writable():
    """stdout open for reading only: every write fails with EBADF, at exit too; one line."""
    with open(os.devnull, "rb") as read_only:
        r = run("models", stdout=read_only)
    assert r.returncode == 2
    one_error_line(r.stderr, "cannot write to stdout", "Bad file descriptor")


@pytest.mark.parametrize("args", [
    ["models", "--json"],
    ["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq", "512",
     "--tp", "1,2", "--pp", "1", "--top", "5"],
])
def test_reader_gone_is_quiet_141(args):
    """A pipe whose reading end is already closed (``... | head`` after head exited): EPIPE on
    the first write or the flush at exit; status 141 as a tool killed by SIGPIPE, and nothing
    on stderr (no "Exception ignored ... BrokenPipeError" at shutdown)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = run(*args, stdout=write_end)
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (141, "")


def test_model_name_too_long_names_the_flag(capsys):
    """300 characters: longer than NAME_MAX (255 on Linux), so the file system refuses it."""
    assert main(["estimate", "--model", "m" * 300, "--seq", "16"]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err, "--model", "too long")
    assert len(line) < 500 and captured.out == ""


def _config(tmp_path, **extra):
    cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 128, **extra}
    (tmp_path / "config.json").write_text(json.dumps(cfg, ensure_ascii=False), "utf-8")
    return str(tmp_path / "config.json")


@pytest.mark.parametrize("entry", [["full_attention"], {"kind": "sliding_attention"}])
def test_layer_types_of_lists_or_dicts_name_the_key(tmp_path, capsys, entry):
    path = _config(tmp_path, model_type="qwen2", sliding_window=8,
                   layer_types=["full_attention", entry])
    assert main(["kv", "--model", path, "--seq", "16"]) == 2
    line = one_error_line(capsys.readouterr().err, "--model", "layer_types")
    assert "[1]" in line and "unhashable" not in line


def test_json_has_null_for_numbers_json_cannot_hold(capsys):
    """An MFU of 1e-320 (a subnormal float, accepted as > 0) times 989e12 FLOP/s is ~1e-305
    FLOP/s; Llama-2-7B's ~1e14 FLOPs per sequence then take ~1e319 s, past the largest float
    (1.8e308): the step time is inf. ``--json`` writes null there, never ``Infinity``."""
    assert main(["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8",
                 "--seq", "512", "--tp", "1", "--pp", "1", "--zero", "1", "--micro-batch", "1",
                 "--recompute", "none", "--mfu", "1e-320", "--json", "--top", "1"]) == 0
    out = capsys.readouterr().out

    def refuse(name):
        raise AssertionError(f"{name} in --json output")

    got = json.loads(out, parse_constant=refuse)
    assert got["candidates"][0]["step_time_s"] is None


def test_json_helper_walks_the_structure():
    obj = {"a": [math.inf, -math.inf, math.nan, 1.5], "b": (2, {"c": math.nan}), "d": "inf"}
    assert json.loads(strict_json(obj)) == {"a": [None, None, None, 1.5], "b": [2, {"c": None}],
                                      "d": "inf"}


def test_non_ascii_name_on_an_ascii_stdout(tmp_path):
    """A model whose name has an accent and CJK characters, printed where the encoding is
    ASCII: escaped (backslashreplace), not a UnicodeEncodeError."""
    folder = tmp_path / "模型"
    folder.mkdir()
    _config(folder, _name_or_path="modèle/模型")
    r = run("kv", "--model", str(folder), "--seq", "16", stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.startswith("mod\\xe8le/\\u6a21\\u578b: KV cache")


DEMO_SCRIPT = r"""
import contextlib, io, json, sys
import parmem.distributed.__main__ as m

class NoPool:
    def __init__(self, *a, **k):
        raise AssertionError("a Pool was created: ranks would start")

m.Pool = NoPool
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = m.main(argv)
    out.append([rc, err.getvalue()])
print(json.dumps(out))
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the demos need torch")
def test_demo_arguments_refused_before_any_rank_starts():
    """``Pool`` is replaced by a class that fails when built: each bad argument must be refused
    by ``python -m parmem.distributed`` before it builds one."""
    cases = [
        (["pp", "schedule=nonsense", "-n", "2"], "schedule="),  # pp knows gpipe, 1f1b, interleaved
        (["tp", "hidden=0", "-n", "2"], "hidden=0"),  # a width of 0
        (["tp", "hidden='wide'", "-n", "2"], "hidden="),  # not an integer
        (["sp", "dropout_p=1.5", "-n", "2"], "dropout_p="),  # not a probability
        (["pp", "delay_ms=(1, -2)", "-n", "2"], "delay_ms="),  # a negative time
        (["tp", "nosuch=1", "-n", "2"], "nosuch"),  # not in the signature
    ]
    r = subprocess.run(
        [sys.executable, "-c", DEMO_SCRIPT, json.dumps([argv for argv, _ in cases])],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr
    for (argv, word), (rc, err) in zip(cases, json.loads(r.stdout), strict=True):
        assert rc == 2, (argv, err)
        one_error_line(err, "python -m parmem.distributed: error:", word)
