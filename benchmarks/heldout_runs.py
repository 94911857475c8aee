"""The planner's step time on the held-out measured runs of data/measured_runs.toml (issue 29):
each row's measured and modelled step time, the mean and worst |error| per organisation, and
how they move with the DP overlap (dp_overlap, 0.05, is the paper profile's, from 2021
software; dp_overlap_on that of the engines that overlap), and the leave-one-organisation-out
fits: dp_overlap_on alone (the rest at their defaults), and the engines' kernel scales by GPU
generation (mfu_ampere_scale, mfu_hopper_scale) with mfu_half_tokens on every point of
FIT_GRID. With --per-cluster instead: what `parmem calibrate` does for a reader with one cluster's runs: each
source's table on one GPU preset is calibrated on its own (mfu; then mfu and the inter-node
bandwidth factor), every run predicted from the others of its cluster and from each single
other run. Not part of `make bench` (minutes):

    PYTHONPATH=lib python benchmarks/heldout_runs.py [--rows | --per-cluster | --joint | --memory]

With --joint: the kernel scales and mfu_half_tokens fitted together on every combination of
their grids, then with dp_overlap_on, then with attention_efficiency; on all organisations (the
defaults) and leaving each organisation out (minutes).

With --write: data/step_time_accuracy.toml, the held-out fit's answer that every plan prints
(parmem.planner.accuracy), dated today; tests/test_heldout_runs.py checks it against the runs.

With --memory: the peak memory per GPU the sources printed (torchtitan's max_memory_reserved,
FlagPerf's nvidia-smi) beside parmem's estimate and bounds for the same layout and engine
profile (parmem.planner.heldout.measured_memory; nothing fitted).
"""

from __future__ import annotations

import sys

from parmem.planner.heldout import (
    FIT_GRID,
    Scored,
    accuracy_toml,
    by_table,
    grid_fit,
    leave_one_out,
    measure_accuracy,
    pooled_folds,
    pooled_spread,
    score,
    skipped,
    summary,
)


def main(rows: bool = False) -> None:
    print(f"left out: {len(skipped())} rows")
    for why in sorted({w for _, w in skipped()}):
        print(f"  {sum(w == why for _, w in skipped())} x {why}")
    scored = score()
    if rows:
        for s in scored:
            if isinstance(s, Scored):
                print(f"{s.error:+8.1%}  {s.run.step_time:9.3f} s measured  "
                      f"{s.modelled:9.3f} s modelled  {s.run.key}")
            else:
                print(f"    n/a   {s[0].key}: {s[1]}")
    for dpo in (None, 0.5, 0.9, 1.0):
        kw = {} if dpo is None else {"dp_overlap": dpo, "dp_overlap_on": dpo}
        res = summary(score(**kw) if kw else scored)
        label = "defaults" if dpo is None else f"dp_overlap={dpo}"
        print(f"{label:>16}: {res['scored']} scored, mean |error| {res['mean |error|']:.1%}, "
              f"worst {res['worst |error|']:.1%}")
        for org, (n, mean, worst) in sorted(res["by organisation"].items()):
            print(f"{'':>18}{org:<20}{n:>4}  mean {mean:6.1%}  worst {worst:6.1%}")


    tables = by_table(scored)
    print("by source table (defaults): offset = mean signed error; the last column is the mean "
          "|error| once the table's offset is taken out")
    for t in tables:
        print(f"  {t.group:<32} {t.org:<18} {t.rows:>3}  offset {t.offset:+6.1%}  mean "
              f"{t.mean:6.1%}  without offset {t.mean_without_offset:6.1%}")
    print(f"  pooled mean |error| without each table's offset: {pooled_spread(tables):.1%}")

    neutral = summary(score(mfu_ampere_scale=1.0, mfu_hopper_scale=1.0))
    print(f"{'scales = 1':>16}: {neutral['scored']} scored, mean |error| "
          f"{neutral['mean |error|']:.1%}, worst {neutral['worst |error|']:.1%} (no kernel scale "
          "by engine and GPU generation)")

    def folds(title: str, fs: list) -> None:
        pooled, worst, _ = pooled_folds(fs)
        print(f"leave one organisation out, {title}: pooled held-out mean |error| {pooled:.1%}, "
              f"worst {worst:.1%}")
        for f in fs:
            print(f"  {f.held_out:<20} fitted {f.value}  train {f.train_mean:6.1%}  "
                  f"held out {f.held_out_mean:6.1%} (worst {f.held_out_worst:6.1%}, "
                  f"{f.held_out_rows} rows)")

    folds("dp_overlap_on fitted on the others, every other assumption at its default (fitted on "
          "all organisations: this scores dp_overlap_on's fit alone)",
          leave_one_out("dp_overlap_on", tuple(i / 20 for i in range(21))))
    folds("the kernel scales and mfu_half_tokens fitted on the others on every point of FIT_GRID "
          "(how the defaults are chosen; --joint adds dp_overlap_on or attention_efficiency)",
          grid_fit(tuple(FIT_GRID), tuple(FIT_GRID.values())).folds)


def per_cluster() -> None:
    """Each (source table, GPU) with two runs or more calibrated on its own runs
    (parmem.planner.own_runs.calibration_study): every run predicted with the defaults, from
    the fit to its cluster's other runs, and from the fit to one other run alone."""
    from parmem.planner.own_runs import calibration_study, cluster_tables

    tables = cluster_tables()
    for fit in (("mfu",), ("mfu", "inter_node_scale")):
        print(f"fitted per cluster: {', '.join(fit)}; mean |error| (worst) of each run predicted"
              " with the defaults, from its cluster's other runs, from one other run")
        rows = calibration_study(tables, fit=fit)
        for s in rows:
            print(f"  {s.group:<32}{s.gpu:<11}{s.runs:>3} runs  "
                  + "  ".join(f"{name} {m:6.1%} ({w:5.1%})" for name, (m, w) in (
                      ("defaults", s.defaults), ("others", s.others), ("one", s.one or (0, 0)))
                      if s.one or name != "one"))
        n = sum(s.runs for s in rows)
        for name in ("defaults", "others"):
            mean = sum(getattr(s, name)[0] * s.runs for s in rows) / n
            print(f"  pooled over {n} runs, {name}: mean |error| {mean:.1%}, worst "
                  f"{max(getattr(s, name)[1] for s in rows):.1%}")
        ones = [(s.one, s.runs * (s.runs - 1)) for s in rows if s.one]
        if ones:
            pairs = sum(k for _, k in ones)
            mean = sum(one[0] * k for one, k in ones) / pairs
            print(f"  pooled over {pairs} pairs, one run: mean |error| {mean:.1%}, worst "
                  f"{max(one[1] for one, _ in ones):.1%}")


#: the grids of the joint fits (--joint): every combination is scored; the kernel scales' and
#: the micro-batch cost's are the library's (FIT_GRID: the defaults are its best point)
JOINT_GRIDS = {
    **FIT_GRID,
    "dp_overlap_on": tuple(round(0.1 * i, 1) for i in range(11)),
    "attention_efficiency": (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.4),
}


def joint() -> None:
    """Several assumptions fitted together on every combination of their grids
    (parmem.planner.heldout.grid_fit), once on all organisations (how the defaults are chosen)
    and once per organisation left out, scored on it. Every point is tried, so no fold starts
    from values fitted with its own rows (a descent from the defaults did, and scored
    7.9 % where the grid's own best points score 9.9 %: 2026-12-04)."""
    from parmem.planner.heldout import grid_fit

    base = ("mfu_ampere_scale", "mfu_hopper_scale", "mfu_half_tokens")
    for names in (base, (*base, "dp_overlap_on"), (*base, "attention_efficiency")):
        print(f"fitted together: {', '.join(names)}")
        fit = grid_fit(names, tuple(JOINT_GRIDS[n] for n in names))
        print(f"  all organisations: {fit.value}  mean |error| {fit.mean:.1%}, worst "
              f"{fit.worst:.1%} ({fit.rows} runs)")
        for f in fit.folds:
            print(f"  {f.held_out:<28} fitted {f.value}  train {f.train_mean:6.1%}  held out "
                  f"{f.held_out_mean:6.1%} (worst {f.held_out_worst:6.1%}, {f.held_out_rows} rows)")
        pooled, worst, _ = fit.held_out
        print(f"  leave one organisation out: pooled held-out mean |error| {pooled:.1%}, worst "
              f"{worst:.1%}")


def memory() -> None:
    """Each printed peak memory beside parmem's allocated peak and the bound held against it."""
    from parmem.planner.heldout import measured_memory
    from parmem.units import GIB

    print(f"{'error':>7}  {'measured':>8}  {'what':<10}  {'parmem':>6}  {'allocated':>9}  run")
    rows = measured_memory()
    for m in rows:
        tag = " (compiled)" if m.compiled else ""
        print(f"{m.error:+7.1%}  {m.measured / GIB:8.1f}  {m.measures:<10}  "
              f"{m.modelled / GIB:6.1f}  {m.allocated / GIB:9.1f}  {m.run.key}{tag}")
    for what in ("reserved", "nvidia-smi"):
        e = [abs(m.error) for m in rows if m.measures == what]
        print(f"{what}: {len(e)} rows, mean |error| {sum(e) / len(e):.1%}, worst {max(e):.1%}")


def write() -> None:
    """data/step_time_accuracy.toml from the held-out fit, dated today (UTC)."""
    from datetime import UTC, datetime

    from parmem._data import data_path
    from parmem.planner.accuracy import ACCURACY_FILE

    acc = measure_accuracy(datetime.now(UTC).date().isoformat())
    path = data_path(ACCURACY_FILE)
    path.write_text(accuracy_toml(acc))
    print(f"{path}: {acc.line()}")


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    elif "--memory" in sys.argv:
        memory()
    elif "--per-cluster" in sys.argv:
        per_cluster()
    elif "--joint" in sys.argv:
        joint()
    else:
        main("--rows" in sys.argv)
