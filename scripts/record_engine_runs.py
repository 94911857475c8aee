"""Run each engine's own training step on CPU gloo ranks and record what every rank held.

    python scripts/record_engine_runs.py [--engine deepspeed ...] [--case NAME ...] [--world-size 2]

Each engine has a runner module, ``parmem.distributed.runs_<engine>`` (``-`` read as ``_``), with
``CASES``: case name -> (world size, keyword arguments) and a pool worker ``record(case, **kw)``
that returns this rank's record (:mod:`parmem.engine_records` describes the fields). The script
starts one :class:`parmem.distributed.Pool` per world size, runs every case, adds the date and
the versions of torch and the engine's packages, and writes ``data/engine_runs/<engine>.json``
(cases left out with ``--case`` keep their records). ``make engines`` runs it for every engine;
``tests/test_engine_records.py`` holds the records against the estimate in ``make test``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

from parmem.distributed import Pool  # noqa: E402
from parmem.engine_records import RECORDS_DIR  # noqa: E402

#: engine profile -> the distributions whose versions a record carries
PACKAGES = {
    "deepspeed": ("torch", "deepspeed", "transformers"),
    "megatron-core": ("torch", "megatron-core"),
    "fsdp2": ("torch", "torchtitan"),
    "hf": ("torch", "transformers", "accelerate"),
}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def run_engine(engine: str, only: list[str] | None, timeout: float) -> None:
    mod = importlib.import_module(f"parmem.distributed.runs_{engine.replace('-', '_')}")
    out = RECORDS_DIR / f"{engine}.json"
    old = json.loads(out.read_text()) if out.is_file() else {"records": []}
    keep = [r for r in old["records"] if only and r["case"] not in only]
    versions = {d: _version(d) for d in PACKAGES[engine]}
    today = datetime.date.today().isoformat()
    by_size: dict[int, list[str]] = {}
    for case, (world, _) in mod.CASES.items():
        if not only or case in only:
            by_size.setdefault(world, []).append(case)
    new = []
    for world, cases in sorted(by_size.items()):
        with Pool(world_size=world, pg_timeout=timeout) as pool:
            for case in cases:
                t0 = time.perf_counter()
                kw = mod.CASES[case][1]
                ranks = pool.run(f"{mod.__name__}:record", case=case, timeout=timeout, **kw)
                for rec in ranks:
                    rec.update(case=case, engine=mod.ENGINE, versions=versions, date=today,
                               world_size=world, device="cpu")
                new.extend(ranks)
                print(f"{engine}: {case} on {world} ranks, {time.perf_counter() - t0:.1f} s")
    records = sorted(keep + new, key=lambda r: (list(mod.CASES).index(r["case"])
                                                 if r["case"] in mod.CASES else 1e9, r["rank"]))
    RECORDS_DIR.mkdir(parents=True, exist_ok=True)
    body = {"engine": mod.ENGINE, "script": "scripts/record_engine_runs.py", "records": records}
    out.write_text(json.dumps(body, indent=1, sort_keys=False) + "\n")
    print(f"wrote {out.relative_to(ROOT)}: {len(records)} records")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", action="append", choices=sorted(PACKAGES))
    ap.add_argument("--case", action="append")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    for engine in args.engine or sorted(PACKAGES):
        run_engine(engine, args.case, args.timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
