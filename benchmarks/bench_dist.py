"""Speed of the torch.distributed demos: pool start-up, then each demo, first call and warm.

Goal (issue #4): each demo's own work well under a second, and a chapter's total (pool start
included) <= 10 s at world size 2 on 2 cores. "first" includes importing the torch.distributed
sub-package a demo needs (pipelining, FSDP and DTensor pull in torch._dynamo, about a second
per rank); "warm" is the median of three later calls, the demo's own work.

    python benchmarks/bench_dist.py             # world sizes 2 and 4
    python benchmarks/bench_dist.py 2           # one world size
"""

from __future__ import annotations

import statistics
import sys
import time

from parmem.distributed import DEMOS, Pool

RUNS = [("collectives", {}), ("tp", {}), ("tp-dtensor", {}), ("sp", {}),
        ("pp", {"schedule": "gpipe"}), ("pp", {"schedule": "1f1b"}),
        ("pp", {"schedule": "interleaved"}), ("zero", {}), ("ddp-buckets", {}), ("ep", {}),
        ("ep", {"imbalance": 20.0}), ("anatomy", {})]


def bench(world_size: int) -> list[tuple[str, float, float]]:
    rows = []
    t0 = time.perf_counter()
    with Pool(world_size) as pool:
        rows.append(("pool start", time.perf_counter() - t0, float("nan")))
        for name, kw in RUNS:
            if name not in DEMOS:
                continue
            label = name + "".join(f" {k}={v}" for k, v in kw.items())
            t = time.perf_counter()
            pool.run(DEMOS[name], **kw)
            first = time.perf_counter() - t
            warm = []
            for _ in range(3):
                t = time.perf_counter()
                pool.run(DEMOS[name], **kw)
                warm.append(time.perf_counter() - t)
            rows.append((label, first, statistics.median(warm)))
        t = time.perf_counter()
    rows.append(("pool close", time.perf_counter() - t, float("nan")))
    rows.append(("total (start, first calls, close)",
                 sum(r[1] for r in rows), float("nan")))
    return rows


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in argv] or [2, 4]
    for n in sizes:
        rows = bench(n)
        w = max(len(r[0]) for r in rows)
        print(f"\nworld size {n} (seconds)")
        print(f"{'what':{w}s}  {'first':>7s}  {'warm':>7s}")
        for label, first, warm in rows:
            warm_s = "" if warm != warm else f"{warm:7.3f}"
            print(f"{label:{w}s}  {first:7.3f}  {warm_s:>7s}")


if __name__ == "__main__":
    main(sys.argv[1:])
