"""How the cost model's defaults (parmem.planner.Assumptions: mfu, mfu_half_width,
mfu_half_hidden, tp_overlap, dp_overlap, pp_overlap) were fitted to the published runs: a
coordinate search over a grid, from the current defaults, minimising
parmem.planner.calibration.loss. Not part of `make bench` (a few minutes on one core):

    PYTHONPATH=lib python benchmarks/fit_published.py [rounds]
"""

from __future__ import annotations

import dataclasses
import sys

from parmem.planner import Assumptions
from parmem.planner.calibration import comparison, loss

GRID = {
    "mfu": [0.56, 0.6, 0.62, 0.64, 0.66, 0.7],
    "mfu_half_width": [0, 50, 100, 150, 200, 300],
    "mfu_half_hidden": [0, 500, 1000, 1500, 2000],
    "tp_overlap": [0.0, 0.25, 0.5, 0.75, 1.0],
    "dp_overlap": [0.0, 0.05, 0.1, 0.2, 0.4],
    "pp_overlap": [0.0, 0.25, 0.5, 0.75],
}


def main(rounds: int = 2) -> None:
    a = Assumptions()
    best = {k: getattr(a, k) for k in GRID}
    best_loss = loss(comparison(**best))
    print(f"defaults: loss {best_loss:.4f} {best}")
    for _ in range(rounds):
        for name, values in GRID.items():
            for v in values:
                trial = dict(best, **{name: v})
                value = loss(comparison(**trial))
                if value < best_loss - 1e-9:
                    best_loss, best = value, trial
                    print(f"  {name} = {v}: loss {value:.4f}", flush=True)
    print(f"fitted: loss {best_loss:.4f} {best}")
    print({f.name: f.default for f in dataclasses.fields(Assumptions) if f.name in GRID})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
