"""Property-based fuzzing of the command lines with invalid input (issue 21): ``parmem`` in-process
(``parmem.cli.main(argv)``, stderr and the exit status captured) and, for the exit path itself,
the console script and ``python -m parmem.distributed`` as real processes.

Hypothesis draws a command and breaks one thing: a flag's value (not a number, out of range,
NaN, hundreds of digits), a name that is not a choice, a model that is no preset or a hostile
config.json (deep nesting, ``Infinity``, ``[64]``, ``"false"``, binary), a missing or unknown
flag, an unknown command, or flags that are valid alone and not together. Every invocation must
end in exactly one line on stderr that names the flag, nothing on stdout, and exit status 2.
The runs are derandomized and counted: at least 150 invocations per run (``PARMEM_FUZZ_SCALE``
in ``helpers.py``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys

import pytest
from helpers import FUZZ, FUZZ_SCALE
from hypothesis import given, settings
from hypothesis import strategies as st

from parmem import presets
from parmem._check import MAX_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN
from parmem.cli import main

CLI_EXAMPLES = 200 * max(FUZZ_SCALE, 1)  # at least 150 must run


# ---------------------------------------------------------------------------- the command line
BASE = {
    "estimate": ["estimate", "--model", "llama-2-7b", "--seq", "4096"],
    "kv": ["kv", "--model", "llama-2-7b", "--seq", "4096"],
    "serve-memory": ["serve-memory", "--model", "llama-2-7b", "--seq", "4096"],
    "plan": ["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq",
             "4096"],
}
INT_FLAGS = {  # flag -> (commands, lo, hi)
    "--dp": (("estimate",), 1, MAX_GPUS), "--tp": (("estimate", "kv", "serve-memory"), 1, MAX_GPUS),
    "--pp": (("estimate",), 1, MAX_GPUS), "--ep": (("estimate",), 1, MAX_GPUS),
    "--cp": (("estimate",), 1, MAX_GPUS), "--vpp": (("estimate",), 1, MAX_LAYERS),
    "--zero": (("estimate",), 0, 3), "--micro-batch": (("estimate",), 1, MAX_BATCH),
    "--microbatches": (("estimate",), 1, MAX_BATCH), "--world-size": (("estimate",), 1, MAX_GPUS),
    "--seq": (("estimate", "plan"), 1, MAX_SEQ_LEN), "--batch": (("kv", "serve-memory"), 0, MAX_BATCH),
    "--nodes": (("plan",), 1, MAX_GPUS), "--gpus-per-node": (("plan",), 1, MAX_GPUS),
    "--global-batch": (("plan",), 1, MAX_BATCH), "--top": (("plan",), 1, 10**6),
}
FLOAT_FLAGS = {"--context-gib": (("estimate",), 0, 1024), "--mfu": (("plan",), 0, 1),
               "--headroom": (("plan",), 0, 1), "--tp-overlap": (("plan",), 0, 1),
               "--dp-overlap": (("plan",), 0, 1), "--pp-overlap": (("plan",), 0, 1)}
CHOICE_FLAGS = {"--precision": ("estimate", "plan"), "--optimizer": ("estimate", "plan"),
                "--recompute": ("estimate", "plan"), "--schedule": ("estimate",),
                "--grad-buckets": ("estimate",), "--dtype": ("kv",), "--weights": ("serve-memory",),
                "--kv-dtype": ("serve-memory",), "--emit": ("plan",), "--gpu": ("plan",)}
LIST_FLAGS = ("--tp", "--pp", "--cp", "--ep", "--zero", "--micro-batch", "--vpp",
              "--layers-per-stage")
INT_TOKENS = st.one_of(st.sampled_from(["abc", "", "1.5", "inf", "nan", "-inf", "1e400", "9" * 400,
                                        "9" * 5000, "0x10", "1,2", "four", "2.0", "true"]),
                       st.text(alphabet="abcxyz.,_", min_size=1, max_size=6))
FLOAT_TOKENS = st.sampled_from(["nan", "inf", "-inf", "abc", "", "1e400", "1,5", "NaN", "Infinity",
                                "0x1p3", "--"])
# cross-field rules the library checks (valid flags, invalid together) and what the line names
CROSS = [
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--tp", "3"], "tp=3"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--pp", "48"], "pp=48"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--sp"], "sp=True"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--vpp", "2"], "vpp=2"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--ep", "2"], "ep=2"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--cp", "3"], "cp=3"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--world-size", "3"], "world size"),
    (["estimate", "--model", "llama-2-7b", "--seq", "4096", "--pp", "2", "--layers-per-stage",
      "10,10"], "layers_per_stage"),
    (["estimate", "--model", "gpt2", "--seq", "4096"], "seq_len=4096"),
    (["kv", "--model", "llama-2-7b", "--seq", "10", "--tp", "3"], "tp=3"),
    (["serve-memory", "--model", "llama-2-7b", "--seq", "10", "--tp", "64"], "tp=64"),
    (["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq", "4096",
      "--gpu", "b200"], "gpu='b200'"),
    (["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq", "4096",
      "--mfu", "0"], "mfu"),
    (["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq", "4096",
      "--headroom", "1"], "headroom"),
    (["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq", "4096",
      "--recompute", "some"], "recompute"),
    (["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq", "4096",
      "--zero", "5"], "zero"),
    (["plan", "--model", "llama-2-7b", "--nodes", "1", "--global-batch", "8", "--seq", "4096",
      "--tp", "0"], "tp=0"),
]


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


@st.composite
def cli_case(draw, configs: dict):
    kind = draw(st.sampled_from(["int", "int-range", "float", "choice", "list", "model", "config",
                                 "missing", "unknown", "no-value", "command", "cross"]))
    cmd = draw(st.sampled_from(sorted(BASE)))
    base = BASE[cmd]
    if kind in ("int", "int-range"):
        flag = draw(st.sampled_from(sorted(f for f, (cmds, *_) in INT_FLAGS.items() if cmd in cmds)
                                    or ["--seq"]))
        cmds, lo, hi = INT_FLAGS.get(flag, (("kv",), 0, MAX_SEQ_LEN))
        if kind == "int":
            token = draw(INT_TOKENS)
        else:
            token = str(draw(st.one_of(st.integers(max_value=lo - 1),
                                       st.integers(min_value=hi + 1, max_value=10**50))))
        return _replace(base, flag, token), flag
    if kind == "float":
        flag = draw(st.sampled_from(sorted(FLOAT_FLAGS)))
        cmd = FLOAT_FLAGS[flag][0][0]
        token = draw(st.one_of(FLOAT_TOKENS, st.floats(min_value=1.5, max_value=1e300).map(str),
                               st.floats(max_value=-0.5, min_value=-1e300).map(str)))
        if flag == "--context-gib" and token not in ("nan",) and _finite(token):
            token = str(float(token) + 2000 if float(token) > 0 else float(token))
        return _replace(BASE[cmd], flag, token), flag
    if kind == "choice":
        flag = draw(st.sampled_from(sorted(CHOICE_FLAGS)))
        cmd = draw(st.sampled_from(CHOICE_FLAGS[flag]))
        token = draw(st.text(alphabet="qwz-_09", min_size=1, max_size=6))
        return _replace(BASE[cmd], flag, token), flag.lstrip("-")
    if kind == "list":
        flag = draw(st.sampled_from(LIST_FLAGS))
        cmd = "estimate" if flag == "--layers-per-stage" else "plan"
        token = draw(st.sampled_from(["a", "1,,2", "1.5", ",", "1;2", "x,1", "-1", "2,-3",
                                      str(MAX_GPUS + 1), "9" * 400]))
        return _replace(BASE[cmd], flag, token), flag.lstrip("-").replace("-", "_")[:5]
    if kind == "model":
        token = draw(st.one_of(st.text(alphabet="abcxyz-", min_size=1, max_size=10)
                               .filter(lambda s: s not in presets() and not s.startswith("-")),
                               st.sampled_from(["/no/such/config.json", "nope.json", "./nope"])))
        return _replace(base, "--model", token), "--model"
    if kind == "config":
        path = draw(st.sampled_from(sorted(configs)))
        return _replace(base, "--model", path), configs[path]
    if kind == "missing":
        required = [a for a in base if a.startswith("--")]
        flag = draw(st.sampled_from(required))
        i = base.index(flag)
        return base[:i] + base[i + 2:], flag
    if kind == "unknown":
        flag = "--" + draw(st.text(alphabet="bogusxyz", min_size=3, max_size=8))
        return [*base, flag], flag
    if kind == "no-value":
        flag = draw(st.sampled_from(sorted(f for f, (cmds, *_) in INT_FLAGS.items()
                                           if cmd in cmds)))
        return [*base, flag], flag
    if kind == "command":
        name = draw(st.text(alphabet="abcdefgz-", min_size=1, max_size=10).filter(
            lambda s: s not in ("models", "estimate", "kv", "serve-memory", "plan", "engines")
            and not s.startswith("-")))
        return [name], "COMMAND"
    return draw(st.sampled_from(CROSS))


def _finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


HIDDEN = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "intermediate_size": 128}


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict:
    """Hostile config.json files: path -> what the error line must name."""
    root = tmp_path_factory.mktemp("configs")
    files = {
        "deep.json": ("[" * 200_000, "nested too deeply"),
        "inf.json": (json.dumps({**HIDDEN, "hidden_size": "@"}).replace('"@"', "Infinity"),
                     "'hidden_size'"),
        "nan.json": (json.dumps({**HIDDEN, "vocab_size": "@"}).replace('"@"', "NaN"),
                     "'vocab_size'"),
        "list.json": (json.dumps({**HIDDEN, "hidden_size": [64]}), "'hidden_size'"),
        "float.json": (json.dumps({**HIDDEN, "hidden_size": 64.7}), "'hidden_size'"),
        "string.json": (json.dumps({**HIDDEN, "num_hidden_layers": "abc"}), "'num_hidden_layers'"),
        "bool.json": (json.dumps({**HIDDEN, "tie_word_embeddings": "false"}),
                      "'tie_word_embeddings'"),
        "huge.json": (json.dumps({**HIDDEN, "hidden_size": 10**400}), "'hidden_size'"),
        "missing.json": (json.dumps({"model_type": "llama"}), "missing"),
        "array.json": ("[1, 2]", "JSON object"),
        "broken.json": ('{"hidden_size": ', "not valid JSON"),
        "empty.json": ("", "not valid JSON"),
    }
    out = {}
    for name, (text, needle) in files.items():
        (root / name).write_text(text)
        out[str(root / name)] = needle
    (root / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    out[str(root / "binary.json")] = "UTF-8"
    return out


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_invalid_command_lines_end_in_one_line_naming_the_flag_and_exit_2(configs):
    calls = []

    @settings(FUZZ, max_examples=CLI_EXAMPLES)
    @given(cli_case(configs))
    def run(case):
        argv, needle = case
        calls.append(argv)
        code, out, err = _run_cli(argv)
        lines = err.splitlines()
        assert code == 2, f"{argv!r:.300}: exit {code}, stderr {err[:300]!r}"
        assert len(lines) == 1 and "Traceback" not in err, f"{argv!r:.300}: {err[:500]!r}"
        assert needle in lines[0], f"{argv!r:.300}: {needle!r} not in {lines[0]!r:.300}"
        assert out == "", f"{argv!r:.300}: printed {out[:200]!r}"

    run()
    assert len(calls) >= 150, len(calls)


# ---------------------------------------------------------------------------- real processes
@pytest.mark.parametrize("argv, needle", [
    (["-m", "parmem.cli", "serve-memory", "--model", "llama-2-7b", "--seq", "10", "--tp", "0"],
     "--tp"),
    (["-m", "parmem.cli", "estimate", "--model", "llama-2-7b", "--seq", "9" * 400], "--seq"),
    (["-m", "parmem.cli", "plan", "--model", "llama-2-7b", "--nodes", str(10**8),
      "--global-batch", "8", "--seq", "4096"], "--nodes"),
    (["-m", "parmem.distributed", "nope"], "demo='nope'"),
    (["-m", "parmem.distributed", "--world-size", "0"], "--world-size"),
])
def test_real_processes_exit_2_with_one_line(argv, needle):
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr[-500:]
