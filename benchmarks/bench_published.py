"""The planner against published runs (issue 15): for every run of data/published_runs.toml,
its rank among the plans of its search, its modelled step time against the best plan's, and its
modelled against its published TFLOP/s per GPU (parmem.planner.calibration).

Targets: a layout its authors chose ranks in the top 3 and within 5% of the best modelled step
time; modelled TFLOP/s within 10% of the published ones. Rows marked * miss one of them.
"""

from __future__ import annotations

import time

from parmem.planner.calibration import GAP, TOLERANCE, TOP, comparison, comparison_rows


def main() -> None:
    t0 = time.perf_counter()
    results = comparison()
    seconds = time.perf_counter() - t0
    rows = comparison_rows(results)
    heads = ("", "run", "role", "published layout", "rank", "vs best", "TFLOP/s modelled",
             "TFLOP/s published", "error", "planner's best")
    table = []
    for r, row in zip(results, rows, strict=True):
        miss = abs(r.error) > TOLERANCE or (
            r.run.role == "chosen" and (r.rank > TOP or r.gap > GAP))
        table.append(["*" if miss else ""] + [str(row[h]) for h in heads[1:]])
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(heads)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(f"parmem planner vs {len(results)} published runs ({seconds:.1f} s; targets: chosen "
          f"layouts in the top {TOP} and within {GAP:.0%} of the best, TFLOP/s within "
          f"{TOLERANCE:.0%})")
    print(fmt.format(*heads))
    for t in table:
        print(fmt.format(*t))
    chosen = [r for r in results if r.run.role == "chosen"]
    print(f"chosen layouts in the top {TOP}: {sum(r.rank <= TOP for r in chosen)}/{len(chosen)}; "
          f"within {GAP:.0%} of the best: {sum(r.gap <= GAP for r in chosen)}/{len(chosen)}; "
          f"TFLOP/s within {TOLERANCE:.0%}: "
          f"{sum(abs(r.error) <= TOLERANCE for r in results)}/{len(results)}")


if __name__ == "__main__":
    main()
