"""Which fitted assumptions a plan's ranking depends on, and where it changes (issue 29).

The planner's step time rests on assumptions fitted to published runs
(:class:`~parmem.planner.Assumptions`): the kernels' efficiency and how much communication hides
behind computation. :func:`sensitivity` moves each fitted assumption away from the value the
plan used, one at a time, re-times the plan's listed layouts with
:func:`~parmem.planner.evaluate` (their memory does not depend on these assumptions), ranks them
as the planner does (:func:`~parmem.planner.search.rank_candidates`: fastest first, the simplest
among those within 1 %) and reports, on each side, the value at which another listed layout
comes first, and which one. A change the grid does not see (the winner changing and changing back between two grid
points) is missed; between grid points the value is found by bisection to ``tol`` of the range.
Layouts the plan did not list (below its ``top``) are not re-timed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engines import engine
from .result import Candidate, Plan
from .search import evaluate, rank_candidates

__all__ = ["Flip", "FITTED", "SENSITIVITY_POOL", "sensitivity", "format_sensitivity"]

#: how many of the fastest layouts ``parmem plan --sensitivity`` re-times (a plan with this
#: ``top``): a layout outside them cannot become the winner in :func:`sensitivity`
SENSITIVITY_POOL = 50

#: The fitted assumptions and the range each is moved over (lower, upper bound). ``dp_overlap``
#: applies to the paper profile, ``dp_overlap_on`` to engines that overlap DP collectives;
#: ``mfu_ampere_scale`` and ``mfu_hopper_scale`` to an engine profile on a GPU of that generation,
#: ``mfu_half_tokens`` to an engine profile.
FITTED: dict[str, tuple[float, float]] = {
    "mfu": (0.2, 1.0),
    "mfu_ampere_scale": (0.5, 2.0),
    "mfu_hopper_scale": (0.5, 2.0),
    "mfu_half_width": (0.0, 1000.0),
    "mfu_half_hidden": (0.0, 10000.0),
    "mfu_half_tokens": (0.0, 16384.0),
    "tp_overlap": (0.0, 1.0),
    "dp_overlap": (0.0, 1.0),
    "dp_overlap_on": (0.0, 1.0),
    "pp_overlap": (0.0, 1.0),
}
_INTEGER = {"mfu_half_width", "mfu_half_hidden", "mfu_half_tokens"}


@dataclass(frozen=True)
class Flip:
    """One assumption of a plan: the value the plan used; the nearest values below and above it
    at which another listed layout becomes the fastest (``None``: none up to the bound), and
    those layouts' labels."""

    name: str
    value: float
    below: float | None
    below_winner: str | None
    above: float | None
    above_winner: str | None

    @property
    def margin(self) -> float | None:
        """The smallest move of the assumption that changes the winner, as a fraction of the
        value used (of 1 when that value is 0); ``None`` when no move within the range does."""
        moves = [abs(x - self.value) for x in (self.below, self.above) if x is not None]
        if not moves:
            return None
        return min(moves) / (abs(self.value) or 1.0)


def _winner(plan: Plan, name: str, x: float) -> Candidate:
    kw: dict[str, Any] = {**_used(plan), name: round(x) if name in _INTEGER else x}
    timed = [
        evaluate(
            plan.spec, plan.cluster, c.parallel, c.setup, layers_per_stage=c.layers_per_stage, **kw
        )  # fmt: skip
        for c in plan.candidates
    ]
    return rank_candidates(timed)[0]  # the planner's own order (its 1 % tie rule included)


def _used(plan: Plan) -> dict[str, Any]:
    a = plan.assumptions
    return {f: getattr(a, f) for f in FITTED} | {
        f: getattr(a, f) for f in ("headroom", "dp_bucket_params", "cp_overlap", "ep_overlap")
    }


def _edge(
    plan: Plan, name: str, start: float, bound: float, grid: int, tol: float
) -> tuple[float | None, str | None]:
    """The first value from ``start`` towards ``bound`` at which the winner changes, and the
    new winner's label, or (None, None)."""
    base = _winner(plan, name, start).label()
    prev = start
    for i in range(1, grid + 1):
        x = start + (bound - start) * i / grid
        w = _winner(plan, name, x)
        if w.label() != base:
            lo, hi, span = prev, x, abs(bound - start)
            while abs(hi - lo) > tol * max(span, 1e-12):
                mid = (lo + hi) / 2
                m = _winner(plan, name, mid)
                if m.label() == base:
                    lo = mid
                else:
                    hi, w = mid, m
            return (round(hi) if name in _INTEGER else hi), w.label()
        prev = x
    return None, None


def sensitivity(
    plan: Plan, names: tuple[str, ...] | None = None, grid: int = 8, tol: float = 0.005
) -> list[Flip]:
    """One :class:`Flip` per fitted assumption the plan's engine and GPU use (``names``: those
    only): where, moving it alone, the fastest of the plan's listed layouts changes. Raises
    ``ValueError`` for a plan without layouts or an unknown name."""
    if plan.best is None:
        raise ValueError(f"plan: nothing fits ({plan.message}), so no ranking to test")
    if names is None:
        defaults = engine(plan.engine).defaults
        papers = defaults.timing == "papers"
        gen = "" if papers else plan.cluster.hardware.generation
        unused = {"dp_overlap" if defaults.dp_overlap else "dp_overlap_on"}
        unused |= {f"mfu_{g}_scale" for g in ("ampere", "hopper") if g != gen}
        if papers:
            unused.add("mfu_half_tokens")  # engine profiles only
        names = tuple(n for n in FITTED if n not in unused)
    out = []
    for name in names:
        if name not in FITTED:
            raise ValueError(f"names: {name!r} is not a fitted assumption ({', '.join(FITTED)})")
        lo, hi = FITTED[name]
        value = float(getattr(plan.assumptions, name))
        below = _edge(plan, name, value, lo, grid, tol) if value > lo else (None, None)
        above = _edge(plan, name, value, hi, grid, tol) if value < hi else (None, None)
        out.append(Flip(name, value, *below, *above))
    return out


def format_sensitivity(flips: list[Flip], pool: int) -> str:
    """The flips as a text table, with one line saying how many layouts were re-timed."""

    def fmt(x: float | None) -> str:
        return "-" if x is None else (f"{x:.0f}" if abs(x) >= 10 else f"{x:.3g}")

    rows = [("assumption", "used", "winner changes below", "to", "above", "to")]
    for f in flips:
        rows.append((f.name, fmt(f.value), fmt(f.below), f.below_winner or "-", fmt(f.above),
                     f.above_winner or "-"))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    head = (
        f"What the ranking depends on (each fitted assumption moved alone; the {pool} "
        "fastest layouts re-timed):"
    )
    return "\n".join([head, *lines])
