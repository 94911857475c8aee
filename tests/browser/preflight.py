"""What the browser and live tests need from the machine, checked before they run.

The tests in this folder drive Debian's Chromium (``/usr/bin/chromium``, or ``$CHROMIUM``) with
Playwright's Python package, and their screenshots show the chapters' Chinese subtitles, which
need a CJK font. Without one of those they cannot run; rather than skip (exit 0, a green
``make test`` that tested no page), ``make test`` stops at its start with one line that names
what is missing and how to install it, unless the reader opts out with ``make test BROWSER=0``
(then one line says that the browser stages were skipped).

Usage (the Makefile's ``browser-check``)::

    python tests/browser/preflight.py             # exit 1 and one line on stderr if something is missing
    python tests/browser/preflight.py --skipped   # one line: the browser stages are skipped

The tests' fixtures call :func:`missing` too, so ``pytest tests/browser`` fails the same way.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: Debian's Chromium; the tests launch it through Playwright (no browser download needed)
DEFAULT_CHROMIUM = "/usr/bin/chromium"
INSTALL = "apt-get install chromium fonts-wqy-microhei"
OPT_OUT = "make test BROWSER=0"


def chromium_path() -> str:
    return os.environ.get("CHROMIUM", DEFAULT_CHROMIUM)


def has_playwright() -> bool:
    return importlib.util.find_spec("playwright") is not None


def cjk_fonts(fc_list: str = "fc-list") -> list[str] | None:
    """The font families fontconfig knows for Chinese, or None when ``fc-list`` is not there
    (fontconfig itself is missing: then Chromium cannot find a CJK font either)."""
    exe = shutil.which(fc_list)
    if exe is None:
        return None
    done = subprocess.run([exe, ":lang=zh", "family"], capture_output=True, text=True,
                          timeout=60, check=False)
    return [line for line in done.stdout.splitlines() if line.strip()]


def missing(chromium: str, playwright: bool, fonts: list[str] | None) -> list[str]:
    """What is missing, each as a short phrase with its own remedy; empty when all is there."""
    found = []
    if not (Path(chromium).is_file() and os.access(chromium, os.X_OK)):
        found.append(f"Chromium ({chromium} not found; set CHROMIUM=/path/to/chromium if it is "
                     "elsewhere)")
    if not playwright:
        found.append("the playwright package (.venv/bin/pip install -r requirements.txt)")
    if fonts is None:
        found.append("a CJK font (fc-list not found: apt-get install fontconfig)")
    elif not fonts:
        found.append("a CJK font (fc-list :lang=zh lists none)")
    return found


def message(problems: list[str]) -> str:
    """One line: what is missing, how to install it, how to opt out."""
    return (f"browser tests cannot run, missing: {'; '.join(problems)}. "
            f"Install on Debian/Ubuntu: sudo {INSTALL}; or skip the browser stages: {OPT_OUT}")


def check() -> list[str]:
    """:func:`missing` on this machine."""
    return missing(chromium_path(), has_playwright(), cjk_fonts())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skipped", action="store_true",
                        help="the reader opted out (BROWSER=0): say so in one line, check nothing")
    args = parser.parse_args(argv)
    if args.skipped:
        print("browser stages skipped (BROWSER=0): the site in Chromium and the live notebooks "
              "in JupyterLab are not tested")
        return 0
    problems = check()
    if problems:
        print(message(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
