"""Speed of the planner: the full search of parmem.plan() for a few model/cluster pairs.

Goal (issue #5): llama-3-70b on 1024 GPUs in <= 0.5 s, and about 150 ms for the widget's
questions (the 16-node row is the widget's default). Each row is the median of 5 fresh plan()
calls (nothing is cached between calls); "families" are the (t, cp, p, d, e) groups searched,
"estimates" the estimate() calls made, "feasible" the non-dominated layouts that fit.
"""

from __future__ import annotations

import statistics
import time

from parmem import Cluster, ModelSpec, plan

CASES = [
    ("llama-3-70b", Cluster("h100-sxm", 8, 128), 1024, 4096, {}),
    ("gpt3-175b", Cluster("h100-sxm", 8, 512), 1536, 2048, {}),
    ("llama-3-70b", Cluster("h100-sxm", 8, 16), 256, 4096, {"flash_attention": True}),
    ("mixtral-8x7b", Cluster("h100-sxm", 8, 8), 256, 4096, {}),
]


def _layout_cache_clear() -> None:
    try:
        from parmem.layout import _cached
    except ImportError:  # a version before parmem.layout
        return
    _cached.cache_clear()


def main(repeat: int = 5) -> None:
    rows = []
    for name, cluster, batch, seq, kw in CASES:
        spec = ModelSpec.preset(name)
        runs, result = [], None
        for _ in range(repeat):
            _layout_cache_clear()  # fresh: no Layout remembered from the previous run
            t0 = time.perf_counter()
            result = plan(spec, cluster, batch, seq, **kw)
            runs.append(time.perf_counter() - t0)
        st = result.stats
        best = result.best.label() if result.best else result.message
        rows.append((name, str(cluster.world_size), f"{batch}x{seq}",
                     f"{statistics.median(runs) * 1e3:.0f}", str(st["families"]),
                     str(st["estimates"]), str(st["feasible"]), best))
    heads = ("model", "GPUs", "batch", "plan() ms", "families", "estimates", "feasible", "best")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(f"parmem planner speed (median of {repeat} fresh plan() calls; goal: 70B on 1024 GPUs "
          "<= 500 ms, widget ~150 ms)")
    print(fmt.format(*heads))
    for r in rows:
        print(fmt.format(*r))


if __name__ == "__main__":
    main()
