"""Build the pure-Python wheel of parmem that the book's calculator and planner pages load into
Pyodide, into ``_assets/py/`` (served at the site root as ``py/``, see ``html_extra_path``).

The wheel is pip's: ``pip wheel --no-deps --no-build-isolation .`` with the build backend that
``pyproject.toml`` names (hatchling: ``lib/parmem`` as ``parmem/``, ``data/`` as
``parmem/data/``, the ``parmem`` console script). Hatchling writes reproducible wheels (sorted
entries, fixed permissions, every file time set to ``SOURCE_DATE_EPOCH``); this script fixes
that epoch, so the same sources and the same hatchling give the same bytes. No build isolation:
hatchling is pinned in requirements.txt and installed in ``.venv``, so the build needs no
network and does not change with whatever hatchling PyPI serves that day.

What pip does not do, and this script does:

* ``_assets/py/manifest.json`` names the wheel and its SHA-256: the page fetches
  ``<wheel>?v=<sha>`` (a new build is never served from a stale cache), and
  ``scripts/pyodide_snapshot.mjs`` records there which wheel its snapshot was made from;
* the folder holds that one wheel only (pip leaves the wheels of other versions beside it);
* a missing hatchling is said in one line, rather than as pip's ``BackendUnavailable``
  traceback.

Usage: python scripts/build_wheel.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "_assets" / "py"
#: the time of every file in the wheel (2020-01-01 00:00:00 UTC), so that builds are byte-identical
SOURCE_DATE_EPOCH = "1577836800"


def build(out: Path = OUT) -> Path:
    """Build the wheel into ``out`` (replacing any other wheel there), write the manifest, and
    return the wheel's path."""
    if importlib.util.find_spec("hatchling") is None:
        raise SystemExit(f"build_wheel: hatchling, the build backend of pyproject.toml, is not "
                         f"installed in {sys.executable}: pip install -r requirements.txt")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp:
        env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH, PIP_NO_INPUT="1")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--wheel-dir", tmp,
             str(ROOT)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"build_wheel: pip wheel failed ({done.returncode}):\n"
                             f"{done.stdout}{done.stderr}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1 or f"-{version}-" not in wheels[0].name:
            raise SystemExit(f"build_wheel: expected one wheel of version {version}, "
                             f"pip made {[w.name for w in wheels]}")
        for old in out.glob("*.whl"):
            old.unlink()
        target = out / wheels[0].name
        shutil.move(wheels[0], target)
    sha = hashlib.sha256(target.read_bytes()).hexdigest()
    manifest = {"wheel": target.name, "sha256": sha, "version": version}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the wheel")
    args = parser.parse_args()
    target = build(args.out.resolve())
    print(f"built {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target} "
          f"({target.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
