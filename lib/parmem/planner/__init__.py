"""The planner: which d·t·p·cp·e, ZeRO stage, micro-batch, recompute, SP and v for my model and
my cluster?

:func:`plan` enumerates every valid layout of a :class:`Cluster`, keeps those whose
:func:`~parmem.estimate.estimate` peak fits the GPU less a headroom, ranks them by a modelled step
time, and returns a :class:`Plan`: the ranked :class:`Candidate` list, the reason every rejected
family failed, the Pareto front of memory against time, and the winner as a launch recipe for
Megatron-LM, DeepSpeed and torchtitan (:meth:`Plan.recipe`, :meth:`Plan.emit`).

The package, from the bottom up:

* :mod:`parmem.planner.inputs`: the :class:`Cluster` and the :class:`Assumptions`;
* :mod:`parmem.planner.cost`: the step-time model (:class:`StepTime`; every formula and its
  source is in that module's docstring);
* :mod:`parmem.planner.emit`: a layout as a Megatron-LM, DeepSpeed or torchtitan launch recipe,
  one module per engine, each checked by that engine's own code in the tests;
* :mod:`parmem.planner.result`: :class:`Candidate` and :class:`Plan` and their tables;
* :mod:`parmem.planner.families`: the request checked and the families of layouts enumerated;
* :mod:`parmem.planner.search`: :func:`plan` (validate, enumerate the families, search each,
  rank with ties of 1% going to the simpler layout, the Pareto front: :func:`pareto_front`),
  :func:`evaluate` and :func:`step_times` (one layout's step time as a function of the
  assumptions, for fits over a grid of them);
* :mod:`parmem.planner.calibration`: the published runs of ``data/published_runs.toml`` ranked
  and modelled; the defaults of :class:`Assumptions` are fitted to them.

Answers and errors
------------------
A request no layout can satisfy is an answer, not an error: :func:`plan` returns a
:class:`Plan` without candidates whose ``message`` names the layout that came closest ("no layout
fits: smallest peak is 133.2 GiB with t=8, p=1, ZeRO-0, SP, full recompute, micro-batch 1; needs
GPUs of ≥ 148.0 GiB or more nodes ..." for Llama-3-70B on eight 40 GB A100s), so the CLI and the
widget can show it. Invalid arguments (a non-integer batch, an unknown GPU, a global batch no
data-parallel size divides, an unknown assumption) raise ``ValueError`` naming the argument.

Sources: Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21) §2.2, §3, §5.1, eq. (3), Table 1; Korthikanti et al. 2022 §4–6;
Rajbhandari et al. 2020 (ZeRO) §7; DeepSpeed's rule that pipeline parallelism does not combine
with ZeRO-2/3 (``deepspeed.runtime.pipe.engine``).
"""

from .cost import StepTime
from .emit import ENGINES
from .inputs import Assumptions, Cluster
from .result import Candidate, Plan
from .search import evaluate, pareto_front, plan, step_times

__all__ = [
    "Assumptions",
    "Candidate",
    "Cluster",
    "Plan",
    "StepTime",
    "evaluate",
    "pareto_front",
    "plan",
    "step_times",
    "ENGINES",
]
