"""tests/browser/preflight.py: what `make test` says, and whether it fails, when the browser
tests cannot run. A unit test (not marked ``browser``): it needs no browser and runs in the
unit stage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import preflight
import pytest

SCRIPT = Path(preflight.__file__)


@pytest.fixture
def fake_chromium(tmp_path):
    exe = tmp_path / "chromium"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return str(exe)


def test_nothing_missing(fake_chromium):
    assert preflight.missing(fake_chromium, True, ["WenQuanYi Micro Hei"]) == []


def test_each_missing_requirement_is_named(tmp_path, fake_chromium):
    absent = str(tmp_path / "no-chromium")
    problems = preflight.missing(absent, True, ["WenQuanYi Micro Hei"])
    assert len(problems) == 1 and problems[0].startswith("Chromium") and absent in problems[0]
    problems = preflight.missing(fake_chromium, False, ["WenQuanYi Micro Hei"])
    assert len(problems) == 1 and "playwright" in problems[0]
    problems = preflight.missing(fake_chromium, True, [])
    assert len(problems) == 1 and "CJK font" in problems[0]
    problems = preflight.missing(fake_chromium, True, None)
    assert len(problems) == 1 and "fontconfig" in problems[0]
    assert len(preflight.missing(absent, False, None)) == 3


def test_a_file_that_cannot_be_executed_is_not_chromium(tmp_path):
    plain = tmp_path / "chromium"
    plain.write_text("")
    plain.chmod(0o644)
    assert preflight.missing(str(plain), True, ["x"])[0].startswith("Chromium")


def test_the_message_is_one_line_with_the_install_command_and_the_opt_out(tmp_path):
    line = preflight.message(preflight.missing(str(tmp_path / "none"), False, []))
    assert "\n" not in line
    assert "apt-get install chromium fonts-wqy-microhei" in line
    assert "make test BROWSER=0" in line
    assert "Chromium" in line and "playwright" in line and "CJK font" in line


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **env), check=False)


def test_the_script_fails_in_one_line_when_chromium_is_missing(tmp_path):
    done = _run(CHROMIUM=str(tmp_path / "missing" / "chromium"))
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert str(tmp_path / "missing" / "chromium") in lines[0]
    assert "apt-get install chromium fonts-wqy-microhei" in lines[0]


def test_the_script_says_in_one_line_that_the_stages_were_skipped(tmp_path):
    done = _run("--skipped", CHROMIUM=str(tmp_path / "missing"))
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 1 and "skipped" in done.stdout
    assert done.stderr == ""


def test_cjk_fonts_without_fc_list_is_unknown():
    assert preflight.cjk_fonts("no-such-fc-list-program") is None
