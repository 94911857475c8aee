"""How far the planner's step time is from measured runs it was not fitted to, as a plan says it.

:func:`parmem.planner.heldout.grid_fit` fits the engine profiles' kernel scales and micro-batch
cost (the defaults of :class:`~parmem.planner.Assumptions`) on every point of
:data:`~parmem.planner.heldout.FIT_GRID`, once with each organisation of
``data/measured_runs.toml`` left out, and scores the fit on the organisation it never saw.
Computing that takes seconds, so a plan does not: ``data/step_time_accuracy.toml`` keeps its
answer (what :func:`parmem.planner.heldout.measure_accuracy` returns, written by
``benchmarks/heldout_runs.py --write``), and ``tests/test_heldout_runs.py`` computes it again and
fails when the file no longer says what the runs and the model give. :class:`Plan
<parmem.planner.Plan>` prints it under an engine profile's best layout and puts it in its JSON
(``step_time_accuracy``); the ``paper`` profile is fitted to the published runs of 2021 instead
(:mod:`parmem.planner.calibration`), which these numbers do not describe.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, TypedDict, cast

from .._data import load_toml

__all__ = ["StepTimeAccuracy", "AccuracyDict", "step_time_accuracy", "ACCURACY_FILE"]

#: the data file that keeps the held-out fit's answer
ACCURACY_FILE = "step_time_accuracy.toml"


class AccuracyDict(TypedDict):
    """:meth:`StepTimeAccuracy.to_dict`."""

    date: str
    runs: int
    organisations: int
    held_out_mean: float
    held_out_worst: float
    in_sample_mean: float
    in_sample_worst: float
    fitted: dict[str, float]
    by_engine: dict[str, dict[str, float]]
    gpus: tuple[str, ...]
    precisions: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class StepTimeAccuracy:
    """The held-out fit's answer: on ``runs`` measured runs of ``organisations`` organisations,
    each organisation's runs predicted by the grid's best point on the others' runs, the mean and
    worst absolute error of the step time (fractions), and the same at the grid's best point on
    every run (in sample: ``fitted``, which the defaults of
    :class:`~parmem.planner.Assumptions` are); ``date`` of the fit; ``by_engine``: the same
    held-out errors over the runs of each engine profile (``runs``, ``held_out_mean``,
    ``held_out_worst``); what the runs cover: their GPU presets and precisions."""

    date: str
    runs: int
    organisations: int
    held_out_mean: float
    held_out_worst: float
    in_sample_mean: float
    in_sample_worst: float
    fitted: dict[str, float]
    by_engine: dict[str, dict[str, float]]
    gpus: tuple[str, ...]
    precisions: tuple[str, ...]

    @property
    def engines(self) -> tuple[str, ...]:
        """The engine profiles of the measured runs."""
        return tuple(self.by_engine)

    def line(self, engine: str | None = None) -> str:
        """One line for a plan's text: the held-out error of ``engine``'s measured runs where
        it has some, beside every run's."""
        e = self.by_engine.get(engine or "")
        every = (f"off by {self.held_out_mean:.1%} on average, {self.held_out_worst:.1%} at "
                 f"worst, on {self.runs} measured runs of {self.organisations} organisations")  # fmt: skip
        head = (
            f"step time under {engine}, held out: off by {e['held_out_mean']:.1%} on average, "
            f"{e['held_out_worst']:.1%} at worst, on its {e['runs']:.0f} measured runs (every "
            f"engine: {every})"
            if e
            else f"step time, held out: {every}"
        )
        return (
            f"{head}, each organisation's predicted by a fit to the others ({self.date}; book "
            "chapter 18); `parmem calibrate` fits your cluster's runs"
        )

    def to_dict(self) -> AccuracyDict:
        """The fields as JSON-ready values, with where they come from."""
        source = f"data/{ACCURACY_FILE} (parmem.planner.heldout.measure_accuracy)"
        return cast(AccuracyDict, {**asdict(self), "source": source})


@cache
def step_time_accuracy() -> StepTimeAccuracy:
    """The held-out fit's answer as ``data/step_time_accuracy.toml`` keeps it."""
    raw: dict[str, Any] = load_toml(ACCURACY_FILE)
    fields = {k: raw[k] for k in StepTimeAccuracy.__dataclass_fields__}
    for k in ("gpus", "precisions"):
        fields[k] = tuple(fields[k])
    return StepTimeAccuracy(**fields)
