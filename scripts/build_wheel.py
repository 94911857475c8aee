"""Build the pure-Python wheel of parmem that the book's calculator and planner pages load into
Pyodide, into ``_assets/py/`` (served at the site root as ``py/``, see ``html_extra_path``).

The wheel is what ``pip wheel .`` makes of ``pyproject.toml`` (hatchling: ``lib/parmem`` as
``parmem/``, ``data/`` as ``parmem/data/``, the ``parmem`` console script) written here with the
standard library's ``zipfile``, so that it builds offline and without a build backend installed;
file times are fixed, so the same sources give the same bytes. ``_assets/py/manifest.json``
names the wheel and its SHA-256 (the page fetches ``<wheel>?v=<sha>``, so a new build is never
served from a stale cache).

Usage: python scripts/build_wheel.py [--out DIR]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "_assets" / "py"
EPOCH = (2020, 1, 1, 0, 0, 0)  # zip times: reproducible bytes


def sources() -> list[tuple[str, bytes]]:
    """(path in the wheel, bytes) of every file the wheel holds, sorted."""
    files = []
    for path in sorted((ROOT / "lib" / "parmem").rglob("*.py")):
        if "__pycache__" not in path.parts:
            files.append((path.relative_to(ROOT / "lib").as_posix(), path.read_bytes()))
    for path in sorted((ROOT / "data").iterdir()):
        if path.is_file() and not path.name.startswith("."):
            files.append((f"parmem/data/{path.name}", path.read_bytes()))
    return files


def metadata(project: dict) -> tuple[str, str, str]:
    """METADATA, WHEEL and entry_points.txt for ``project`` (pyproject's [project])."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
        f"Requires-Python: {project['requires-python']}",
        f"License: {project['license']['text']}",
    ]
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    wheel = "Wheel-Version: 1.0\nGenerator: parmem scripts/build_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    scripts = "".join(f"{k} = {v}\n" for k, v in project.get("scripts", {}).items())
    return "\n".join(lines) + "\n", wheel, f"[console_scripts]\n{scripts}"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(out: Path = OUT) -> Path:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    info = f"{name}-{version}.dist-info"
    meta, wheel_txt, entry = metadata(project)
    files = sources() + [
        (f"{info}/METADATA", meta.encode()),
        (f"{info}/WHEEL", wheel_txt.encode()),
        (f"{info}/entry_points.txt", entry.encode()),
    ]
    record = [_record_line(n, d) for n, d in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    target = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for arcname, data in files:
            item = zipfile.ZipInfo(arcname, EPOCH)
            item.compress_type = zipfile.ZIP_DEFLATED
            item.external_attr = 0o644 << 16
            zf.writestr(item, data)
    sha = hashlib.sha256(target.read_bytes()).hexdigest()
    manifest = {"wheel": target.name, "sha256": sha, "version": version}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the wheel")
    args = parser.parse_args()
    target = build(args.out)
    print(f"built {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target} "
          f"({target.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
