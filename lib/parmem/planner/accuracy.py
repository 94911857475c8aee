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
    engines: tuple[str, ...]
    gpus: tuple[str, ...]
    precisions: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class StepTimeAccuracy:
    """The held-out fit's answer: on ``runs`` measured runs of ``organisations`` organisations,
    each organisation's runs predicted by the grid's best point on the others' runs, the mean and
    worst absolute error of the step time (fractions), and the same at the grid's best point on
    every run (in sample: ``fitted``, which the defaults of
    :class:`~parmem.planner.Assumptions` are); ``date`` of the fit; what the runs cover: their
    engine profiles, GPU presets and precisions."""

    date: str
    runs: int
    organisations: int
    held_out_mean: float
    held_out_worst: float
    in_sample_mean: float
    in_sample_worst: float
    fitted: dict[str, float]
    engines: tuple[str, ...]
    gpus: tuple[str, ...]
    precisions: tuple[str, ...]

    def line(self) -> str:
        """One line for a plan's text."""
        return (
            f"step time, held out: off by {self.held_out_mean:.1%} on average, "
            f"{self.held_out_worst:.1%} at worst, on {self.runs} measured runs of "
            f"{self.organisations} organisations, each predicted by a fit to the others "
            f"({self.date}; book chapter 18); `parmem calibrate` fits your cluster's runs"
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
    for k in ("engines", "gpus", "precisions"):
        fields[k] = tuple(fields[k])
    return StepTimeAccuracy(**fields)
