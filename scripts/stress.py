"""Run the pool and distributed tests several times while busy loops load every core.

    python scripts/stress.py [--runs 5] [--load N] [--max-seconds S] [-- PYTEST ARGS...]

``make stress`` runs this. The tests must hold on a starved machine: each of them waits for the
state it needs (a pipe, a file, a process state) with a deadline, never for a fixed delay, so
contention makes them slower, never red. Default: ``tests/test_dist_launcher.py`` (the pool's
start, failures, interrupts and their attribution) and the demos' tests, ``tests/test_dist_*.py``,
under ``pytest -n 2``, with one busy loop per core (``--load``, default ``os.cpu_count()``).

The busy loops are separate processes that spin at the same priority as the tests; each stops by
itself after ``--max-seconds`` or as soon as this script is gone (it checks its parent), so
nothing keeps loading the machine after an interrupted run. Prints one line per run and a
summary; exit status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: one busy loop: spin until the deadline passes or the parent is gone
SPIN = """
import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
n = 0
while time.monotonic() < end:
    n += 1
    if n % 100000 == 0 and os.getppid() != parent:
        break
"""

DEFAULT_TESTS = ["tests/test_dist_launcher.py", "tests/test_dist_pool_faults.py",
                 "tests/test_dist_pool_safety.py",
                 "tests/test_dist_anatomy.py",
                 "tests/test_dist_collectives.py", "tests/test_dist_dp.py",
                 "tests/test_dist_pp.py", "tests/test_dist_tp.py", "tests/test_dist_zero.py"]


def busy_loops(n: int, seconds: float) -> list[subprocess.Popen]:
    """Start ``n`` busy loops, each for at most ``seconds``."""
    return [subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid()), str(seconds)])
            for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="how many runs (default 5)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2,
                        help="busy loops to start (default: one per core)")
    parser.add_argument("--max-seconds", type=float, default=3600.0,
                        help="the busy loops stop after this many seconds whatever happens")
    parser.add_argument("--stop-on-failure", action="store_true")
    parser.add_argument("pytest_args", nargs="*",
                        help="after --: arguments for pytest (default: the dist tests, -n 2)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs={args.runs} must be at least 1")
    if args.load < 0:
        parser.error(f"--load={args.load} must be 0 or more")
    pytest_args = args.pytest_args or [*DEFAULT_TESTS, "-n", "2"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    print(f"stress: {args.runs} runs of `pytest {' '.join(pytest_args)}` beside {args.load} "
          f"busy loops on {os.cpu_count()} cores", flush=True)
    loops = busy_loops(args.load, args.max_seconds)
    results: list[tuple[int, float]] = []
    start = time.monotonic()
    try:
        for i in range(1, args.runs + 1):
            t0 = time.monotonic()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            seconds = time.monotonic() - t0
            results.append((proc.returncode, seconds))
            tail = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            print(f"  run {i}: {'green' if proc.returncode == 0 else 'RED'} in {seconds:.0f} s "
                  f"(load {load:.1f}): {tail}", flush=True)
            if proc.returncode != 0:
                print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n", flush=True)
                if args.stop_on_failure:
                    break
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait(10)
    green = sum(rc == 0 for rc, _ in results)
    print(f"stress: {green} of {len(results)} runs green in {time.monotonic() - start:.0f} s",
          flush=True)
    return 0 if green == len(results) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
