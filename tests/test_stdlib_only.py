"""parmem's estimator, presets, planner and CLI need the Python standard library alone (they run
in Pyodide in the book's calculator and planner pages, where there is no PyYAML, numpy or torch).

The check is honest: a fresh ``python -I`` (no site-packages, no user site, no PYTHONPATH) with
only ``lib/`` on ``sys.path`` and a ``sys.meta_path`` finder that refuses yaml, numpy, torch,
matplotlib and ipywidgets runs the library; its numbers are compared with this process's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parmem import Cluster, ModelSpec, ParallelConfig, TrainingSetup, estimate, plan

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"
BLOCKED = ("yaml", "numpy", "torch", "matplotlib", "ipywidgets")

SCRIPT = r"""
import contextlib, io, json, sys
BLOCKED = set(sys.argv[2].split(","))

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: parmem must not need it")
        return None

sys.meta_path.insert(0, Refuse())
sys.path.insert(0, sys.argv[1])
for name in BLOCKED:  # the finder works: none of them can be imported
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} could be imported")

from parmem import Cluster, ModelSpec, ParallelConfig, TrainingSetup, estimate, plan, presets
from parmem.book import web
from parmem.cli import main
import parmem._data

est = estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(dp=8, tp=4, pp=2, sp=True, zero=1),
               TrainingSetup(seq_len=4096, num_microbatches=8, recompute="selective",
                             engine="megatron-core"))
p = plan(ModelSpec.preset("llama-3-8b"), Cluster("h100-sxm", 8, 1), 64, 4096,
         engine="megatron-core")
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["estimate", "--model", "mixtral-8x7b", "--ep", "8", "--dp", "8", "--zero", "2",
               "--seq", "2048", "--json"])
calc = json.loads(web.run_json("calculate", json.dumps({"model": "gpt3-175b", "t": "8", "p": "8", "seq": "2048",
                                                       "d": "2", "m": "8"})))
print(json.dumps({
    "data": str(parmem._data.data_path("models.toml")),
    "calc": calc["peak_bytes"],
    "presets": len(presets()),
    "stages": [s.total for s in est.stages],
    "plan": [c.label() for c in p.candidates[:5]],
    "recipe": p.emit(),
    "cli_rc": rc,
    "cli": json.loads(out.getvalue())["peak_bytes"],
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
}))
"""


def _wheel(tmp_path: Path) -> Path:
    """The wheel the book serves (scripts/build_wheel.py), unpacked as Pyodide unpacks it."""
    import importlib.util
    import zipfile

    spec = importlib.util.spec_from_file_location("build_wheel", ROOT / "scripts" / "build_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wheel = module.build(tmp_path / "dist")
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


@pytest.mark.parametrize("where", ["source", "wheel"])
def test_estimate_preset_plan_and_cli_run_on_the_standard_library_alone(where, tmp_path):
    path = LIB if where == "source" else _wheel(tmp_path)
    done = subprocess.run(
        [sys.executable, "-I", "-c", SCRIPT, str(path), ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["loaded"] == []
    if where == "wheel":  # the wheel's own copy of the data, not the repository's
        assert got["data"] == str(path / "parmem" / "data" / "models.toml")
    assert got["calc"] == estimate(
        ModelSpec.preset("gpt3-175b"), ParallelConfig(dp=2, tp=8, pp=8),
        TrainingSetup(seq_len=2048, num_microbatches=8),
    ).peak_bytes

    from parmem import presets

    assert got["presets"] == len(presets())
    est = estimate(
        ModelSpec.preset("llama-2-7b"),
        ParallelConfig(dp=8, tp=4, pp=2, sp=True, zero=1),
        TrainingSetup(seq_len=4096, num_microbatches=8, recompute="selective",
                      engine="megatron-core"),
    )
    assert got["stages"] == [s.total for s in est.stages]
    ref = plan(ModelSpec.preset("llama-3-8b"), Cluster("h100-sxm", 8, 1), 64, 4096,
               engine="megatron-core")
    assert got["plan"] == [c.label() for c in ref.candidates[:5]] and got["plan"]
    assert got["recipe"] == ref.emit("megatron") and "# target: Megatron-LM" in got["recipe"]
    assert got["cli_rc"] == 0
    assert got["cli"] == estimate(
        ModelSpec.preset("mixtral-8x7b"), ParallelConfig(dp=8, ep=8, zero=2),
        TrainingSetup(seq_len=2048),
    ).peak_bytes
