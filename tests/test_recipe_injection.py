"""No string in an emitted recipe runs as a command (issue 34): a model name with a newline,
``$(...)``, backticks or quotes (as a ``config.json``'s ``_name_or_path`` can hold) stays in its
comment line; every token, environment value, file name and file content of a
:class:`~parmem.planner.emit.recipe.Recipe` is quoted (or refused with ``ValueError`` naming the
field). Each script passes ``bash -n`` and is then run by bash in an empty directory with ``PATH``
holding only stubs of the launchers (which record their arguments) and the few utilities the
payloads and the here-documents use: no canary file appears, the launcher gets exactly
``recipe.command``, and each written file holds exactly the recipe's content. A control shows that
every payload does create the canary when pasted into a shell line unquoted."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from parmem import Cluster, ModelSpec, plan
from parmem.planner.emit import Recipe

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")

#: Generous: each script takes milliseconds; the limit only keeps a hang from stalling the run.
TIMEOUT = 30

#: Hostile names: each tries to create ``CANARY`` (with ``touch`` or a redirection, a builtin).
PAYLOADS = [
    "x\ntouch CANARY\n",
    "x\n: > CANARY",
    "$(touch CANARY)",
    "`touch CANARY`",
    "'; touch CANARY; '",
    '"; touch CANARY; "',
    "x\r\ntouch CANARY",
    "x \\\ntouch CANARY",
    "x\nEOF\ntouch CANARY\nEOF",
    "x\x0b\x0c\ntouch CANARY #",
    "x; echo pwned > CANARY",
    "x\u2028\x85\ntouch CANARY",
]

#: Engine profile -> the launcher the recipe calls.
ENGINES = {"megatron-core": "torchrun", "deepspeed": "deepspeed", "fsdp2": "torchrun"}


def _bin(root: Path) -> Path:
    """A directory of stubs: the launchers record their arguments (NUL-separated) in
    ``argv.<name>`` and exit 0; ``cat`` and ``touch`` are the real ones (the here-documents
    need ``cat``; ``touch`` keeps the payloads live)."""
    b = root / "bin"
    b.mkdir()
    for name in ("torchrun", "deepspeed", "python", "python3"):
        stub = b / name
        stub.write_text(f"#!{BASH}\nprintf '%s\\0' \"$@\" > argv.{name}\nexit 0\n")
        stub.chmod(0o755)
    for name in ("cat", "touch"):
        real = shutil.which(name)
        assert real is not None, name
        (b / name).symlink_to(real)
    return b


def _run(script: str, root: Path, name: str) -> Path:
    """Check ``script`` with ``bash -n``, then run it in a fresh directory ``root/name`` with
    ``PATH`` = the stubs only (and ``NODE_RANK=3``); returns that directory."""
    assert BASH is not None
    work = root / name
    work.mkdir()
    path = work / "recipe.sh"
    path.write_text(script)
    env = {"PATH": str(root / "bin"), "HOME": str(work), "LC_ALL": "C", "NODE_RANK": "3"}
    syntax = subprocess.run(
        [BASH, "-n", str(path)], capture_output=True, text=True, timeout=TIMEOUT, env=env
    )
    assert syntax.returncode == 0, syntax.stderr
    ran = subprocess.run(
        [BASH, str(path)], cwd=work, capture_output=True, text=True, timeout=TIMEOUT, env=env
    )
    assert ran.returncode == 0, ran.stderr
    return work


def _argv(work: Path, launcher: str) -> list[str]:
    data = (work / f"argv.{launcher}").read_bytes()
    assert data.endswith(b"\0")
    return data[:-1].decode().split("\0")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    r = tmp_path_factory.mktemp("inject")
    _bin(r)
    return r


@cache
def _spec(name: str) -> ModelSpec | None:
    """Llama-2-7B named ``name``, or ``None`` where ModelSpec refuses the name (which must then
    be a ``ValueError`` naming ``name``)."""
    try:
        return dataclasses.replace(ModelSpec.preset("llama-2-7b"), name=name)
    except ValueError as e:
        assert str(e).startswith("name="), e
        return None


@cache
def _plan(engine: str, spec: ModelSpec):
    pl = plan(spec, Cluster("h100-sxm", 8, 1), 64, 4096, top=1, engine=engine)
    assert pl.best is not None, pl.message
    return pl


def test_payloads_are_live(root):
    """Control: each payload creates the canary when pasted into a shell line without quoting
    (bare, inside '...' or "...", or after ``#``), so its absence below means the quoting
    stopped it."""
    for i, payload in enumerate(PAYLOADS):
        script = "".join(f"echo {q}{payload}{q}\n" for q in ("", "'", '"'))
        script += f"# {payload}\n"
        work = root / f"live{i}"
        work.mkdir()
        (work / "s.sh").write_text(script)
        env = {"PATH": str(root / "bin")}
        subprocess.run([BASH, "s.sh"], cwd=work, capture_output=True, timeout=TIMEOUT, env=env)
        assert (work / "CANARY").exists(), repr(payload)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_hostile_model_names_do_not_run(engine, root):
    """Every payload as the model name, under each engine's recipe: the script parses, runs to its
    launch with exactly ``recipe.command``, writes its files intact, and creates no canary."""
    for i, payload in enumerate(PAYLOADS):
        spec = _spec(payload)
        if spec is None:
            continue
        pl = _plan(engine, spec)
        recipe = pl.recipe()
        script = pl.emit()
        assert payload.splitlines()[0] in script  # the name is in the recipe (its title)
        lines = script.splitlines()
        comments = [ln for ln in lines if ln.startswith("#")]
        # title, target, one line per note: each stays one comment line
        assert len(comments) == 2 + len(recipe.notes), script
        assert all(not ln.startswith("#") for ln in lines[len(comments) :]), script
        work = _run(script, root, f"{engine}{i}")
        assert not (work / "CANARY").exists(), (engine, payload, script)
        launcher = ENGINES[engine]
        assert recipe.command[0] == launcher
        assert _argv(work, launcher) == recipe.command[1:]
        for name, text in recipe.files:
            assert (work / name).read_text() == text


def test_comment_escapes():
    """A title with line breaks is one comment line, the breaks written as escapes."""
    r = Recipe("e", "t", "a\nb\r\x00c\u2028d\\", ("torchrun",), ("p.py",), ())
    first = str(r).splitlines()[0]
    assert first == "# a\\nb\\r\\x00c\\u2028d\\"


def test_every_field_quoted(root):
    """Hostile strings in every field of a Recipe: tokens, environment values, a file name and
    a file content with lines equal to the usual here-document delimiters."""
    bad = "$(touch CANARY)`touch CANARY`'\"\n; touch CANARY #"
    content = f"EOF\nEOF_1\n{bad}\n$HOME `touch CANARY`\nEOF_2 \n"
    name = bad.replace("\n", " ")  # a file name holds no control character (refused below)
    r = Recipe(
        engine="e",
        target=bad,
        title=bad,
        launcher=("torchrun", "--nproc-per-node", bad),
        program=(bad, "-m"),
        args=("--flag", bad, "activation_checkpoint:none", bad, "-1", "$NODE_RANK", "$HOME"),
        env=(("SAFE_VAR", bad), ("GONE", None)),
        files=((f"cfg {name}.json", content), ("plain.json", "{}\n")),
        notes=(bad, "two\nlines"),
    )
    script = str(r)
    work = _run(script, root, "fields")
    assert not (work / "CANARY").exists(), script
    # $NODE_RANK is left for the shell to expand (3 in _run), $HOME is quoted like any token
    expected = [*r.command[1:]]
    expected[expected.index("$NODE_RANK")] = "3"
    assert _argv(work, "torchrun") == expected
    assert (work / f"cfg {name}.json").read_text() == content
    assert (work / "plain.json").read_text() == "{}\n"
    assert "<<'EOF_2'" in script  # EOF, EOF_1 are lines of the content; "EOF_2 " is not EOF_2


def test_env_value_reaches_the_launcher(root):
    """An exported hostile value arrives verbatim in the launcher's environment."""
    bad = "a'b\"c$(touch CANARY)\n`x`"
    b = root / "envbin"
    b.mkdir()
    stub = b / "torchrun"
    stub.write_text(f"#!{BASH}\nprintf '%s' \"$SAFE_VAR\" > value\n")
    stub.chmod(0o755)
    r = Recipe("e", "t", "t", ("torchrun",), ("p.py",), (), env=(("SAFE_VAR", bad),))
    work = root / "env"
    work.mkdir()
    (work / "r.sh").write_text(str(r))
    env = {"PATH": str(b)}
    out = subprocess.run(
        [BASH, "r.sh"], cwd=work, capture_output=True, text=True, timeout=TIMEOUT, env=env
    )
    assert out.returncode == 0, out.stderr
    assert (work / "value").read_text() == bad
    assert not (work / "CANARY").exists()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"env": (("A B", "1"),)}, "env[0] name"),
        ({"env": (("X=$(touch C)", None),)}, "env[0] name"),
        ({"env": (("", "1"),)}, "env[0] name"),
        ({"env": (("OK", "a\x00b"),)}, "env[0] value"),
        ({"files": (("a\nb", "{}"),)}, "files[0] name"),
        ({"files": (("", "{}"),)}, "files[0] name"),
        ({"files": (("ok", "a\x00"),)}, "files[0] content"),
        ({"args": ("--x", "a\x00b")}, "args[1]"),
        ({"program": (1,)}, "program[0]"),
        ({"notes": (None,)}, "notes[0]"),
    ],
)
def test_refused_fields(kwargs, field):
    """What no shell word can carry (a NUL byte), a variable name that is not one, a file name
    with a control character, or a non-string: ``ValueError`` naming the field."""
    base = {
        "engine": "e", "target": "t", "title": "t",
        "launcher": ("torchrun",), "program": ("p.py",), "args": (),
    }  # fmt: skip
    with pytest.raises(ValueError, match="^" + re.escape(field)):
        Recipe(**{**base, **kwargs})


def test_hf_id_is_not_an_option():
    """torchtitan's ``--hf_model`` takes a Hugging Face id from the spec's source only when it
    is one (not starting with ``-``): otherwise the placeholder, and a note to set it."""
    from parmem.planner.emit.torchtitan import model_config

    spec = ModelSpec.preset("llama-2-7b")
    args, _ = model_config(spec)
    assert args[args.index("--hf_model") + 1] == "meta-llama/Llama-2-7b-hf"
    for source in ("Hugging Face --evil/x", "Hugging Face -x/y", "Hugging Face .x/y"):
        args, notes = model_config(dataclasses.replace(spec, source=source))
        assert args[args.index("--hf_model") + 1] == "YOUR/HF-MODEL-ID", source
        assert any("set --hf_model" in n for n in notes)


def test_cli_emit_from_hostile_config(root, tmp_path, capsys):
    """The reported path: ``plan --model config.json --emit`` with a ``_name_or_path`` holding a
    newline and a command substitution writes a script that runs no payload."""
    import json

    from parmem.cli import main

    cfg = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12,
           "n_head": 12, "n_positions": 1024,
           "_name_or_path": "gpt2\ntouch CANARY\n$(touch CANARY)`touch CANARY`"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for i, emit in enumerate(("megatron", "deepspeed", "torchtitan")):
        args = ["plan", "--model", str(tmp_path / "config.json"), "--gpu", "h100-sxm",
                "--gpus-per-node", "8", "--nodes", "1", "--global-batch", "64", "--seq", "1024",
                "--emit", emit]  # fmt: skip
        assert main(args) == 0
        script = capsys.readouterr().out
        assert "gpt2\\ntouch CANARY\\n$(touch CANARY)" in script.splitlines()[0]
        work = _run(script, root, f"cli{i}")
        assert not (work / "CANARY").exists(), script
