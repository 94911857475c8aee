"""Peak memory the sources of data/measured_runs.toml printed beside parmem's estimate for the
same layout and engine profile (parmem.planner.heldout.measured_memory). The memory model is
fitted to none of these rows; every expected number below is the source's own.

torchtitan's Llama 3.1 8B rows (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3)
print max_memory_reserved at FSDP over 8 and 128 H100s, b = 2, s = 8,192, selective (op)
recomputation: 82.4 and 67.0 GiB eager. Before the engine profiles counted the loss's
transient (12 bytes per logit at the unfused cross-entropy's backward, measured with
torchtitan's own loss: tests/test_measure.py), parmem's reserved bound for them was 59.9 and
44.9 GiB, 27 % and 33 % short. FlagPerf's Megatron rows (nvidia-smi, Megatron-Core 0.6 with
Transformer Engine against the profile's 0.16.1) are listed, not asserted: parmem is 9 to 30 %
under ten of them and 3 and 6 % over the two deepest pipelines without tensor parallelism
(t = 1, p = 4 and 8), a pattern no single term explains (benchmarks/heldout_runs.py --memory
prints every row)."""

from __future__ import annotations

import tomllib

import pytest

from parmem._data import data_path
from parmem.bounds import bounds
from parmem.config import even_split
from parmem.estimate import estimate
from parmem.planner.heldout import Scored, measured_memory, score
from parmem.units import GIB

DATA = tomllib.loads(data_path("measured_runs.toml").read_text())


def _torchtitan(compiled: bool) -> list:
    return [m for m in measured_memory()
            if m.run.group == "torchtitan_h100_202412" and m.compiled == compiled]  # fmt: skip


def test_every_printed_memory_is_read_with_what_it_measures():
    rows = [r for g in DATA.values() if "memory_measures" in g for r in g["rows"]
            if ("memory_gib" in r or "memory_as_printed" in r) and "left_out" not in r
            and r.get("precision", g.get("precision")) == "bf16"]  # fmt: skip
    got = measured_memory()
    assert len(got) == len(rows) >= 15
    assert {m.measures for m in got} == {"reserved", "nvidia-smi"}
    tt = _torchtitan(False)
    assert sorted(m.measured / GIB for m in tt) == pytest.approx([67.0, 82.4])


@pytest.mark.parametrize("compiled", [False, True])
def test_torchtitan_rows_are_held_within_ten_percent(compiled):
    """The eager rows are the program the fsdp2 profile describes (torchtitan's loss is not
    compiled in either: tests/test_measure.py measures it); the compiled rows' model saves less
    (82.4 -> 77.0 and 67.0 -> 62.0 GiB), still within 10 %. The allocated peak never exceeds what
    the allocator reserved: max_memory_reserved >= max_memory_allocated."""
    rows = _torchtitan(compiled)
    assert len(rows) == 2
    for m in rows:
        assert m.allocated <= m.measured
        assert abs(m.error) <= 0.10, (m.run.key, m.error)


def test_the_loss_transient_is_what_closed_the_gap():
    """Without the loss's transient (the paper profile's accounting of the loss) the same
    estimate falls more than 20 % short of both eager rows."""
    for m in _torchtitan(False):
        est = estimate(m.run.spec, m.run.parallel, m.run.setup,
                       layers_per_stage=even_split(m.run.spec.layers, m.run.parallel.pp),
                       gpus_per_node=m.run.cluster.gpus_per_node)  # fmt: skip
        assert est.peak.loss == m.loss > 0
        without = est.peak_bytes - est.peak.loss
        assert m.without_loss == without and without / m.measured < 0.80
        assert bounds(est, m.run.cluster.hardware).peak.reserved == m.modelled


def test_every_measured_run_fits_the_estimate():
    """Every scored run (the rows the planner models) ran on its GPUs, so parmem's allocated peak for it must fit them (an
    estimate above the GPU would call a real run impossible). The GPT-OSS 120B rows needed their
    recipe's distributed optimizer and bf16 gradient reduction to: data/measured_runs.toml."""
    runs = [s.run for s in score() if isinstance(s, Scored)]
    assert len(runs) >= 100
    # InternLM's ZeRO-1 within a node is timed as DDP (its gradients are all-reduced over the
    # whole data-parallel group): that layout's memory is not the run's, so it is not held here
    timed_as = [r for r in runs if r.timed_as]
    assert {r.group for r in timed_as} == {"internlm_a100_2023"} and len(timed_as) == 22
    for r in runs:
        if r.timed_as:
            continue
        est = estimate(r.spec, r.parallel, r.setup,
                       layers_per_stage=even_split(r.spec.layers, r.parallel.pp),
                       gpus_per_node=r.cluster.gpus_per_node)  # fmt: skip
        assert est.peak_bytes <= r.cluster.hardware.memory_bytes, r.key
