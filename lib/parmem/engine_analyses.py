"""One job under each engine profile (chapter 22, "Same model, four engines"): the layout each
engine can run (:func:`engine_layout`) and the peak stage :func:`parmem.estimate` gives it under
that engine's profile (:func:`engine_table`). The profiles themselves are data
(:mod:`parmem.engines`, ``data/engines.toml``)."""

from __future__ import annotations

from dataclasses import replace

from .config import ParallelConfig, TrainingSetup
from .engines import engine, engines
from .estimate import estimate
from .model import ModelSpec

__all__ = ["engine_layout", "engine_table"]


def engine_layout(
    name: str, parallel: ParallelConfig, setup: TrainingSetup
) -> tuple[ParallelConfig, TrainingSetup]:
    """``parallel`` and ``setup`` as the engine profile ``name`` can run them, on the same GPUs:
    the parallelisms it refuses (``[engines.*.refuses]``: DeepSpeed on Transformers layers and
    the Trainer have no TP, SP, CP or EP) folded into data parallelism; p stages folded into d
    where it has no pipeline (hf); no virtual stages where it cannot interleave; 1F1B where it
    has no GPipe; the least ZeRO sharding at or above the asked stage (FSDP2: ZeRO-1 becomes 3),
    else its largest, within its pipeline's limit when p > 1 (DeepSpeed: ZeRO-1); full
    recomputation, no offload where it lacks the asked one."""
    prof = engine(name)
    t = 1 if prof.refusal("tp") else parallel.tp
    cp = 1 if prof.refusal("cp") else parallel.cp
    ep = 1 if prof.refusal("ep") else parallel.ep
    sp = parallel.sp and t > 1 and not prof.refusal("sp")
    pp = parallel.pp if prof.pipeline else 1
    rec = setup.recompute if setup.recompute in prof.recompute else "full"
    # ZB-V where the engine runs it, and without recomputation (parmem.layout's rule)
    zbv = pp > 1 and setup.schedule == "zbv" and not prof.refusal("zbv") and rec == "none"
    vpp = parallel.vpp if pp > 1 and (zbv or not prof.refusal("interleaved")) else 1
    stages = [z for z in prof.zero_stages if pp == 1 or z <= prof.pipeline_zero_max]
    zero = min((z for z in stages if z >= parallel.zero), default=max(stages))
    dp = parallel.world_size // (t * cp * pp)
    par = ParallelConfig(dp=dp, tp=t, pp=pp, ep=ep, cp=cp, sp=sp, zero=zero, vpp=vpp)
    offload = setup.offload if setup.offload in prof.offload else "none"
    schedule = "zbv" if zbv else "interleaved" if vpp > 1 else setup.schedule
    if schedule in ("interleaved", "zbv") and vpp == 1 or prof.refusal(schedule):
        schedule = "1f1b"
    return par, replace(setup, engine=name, recompute=rec, offload=offload, schedule=schedule)


def engine_table(
    spec: ModelSpec,
    parallel: ParallelConfig,
    setup: TrainingSetup,
    names: list[str] | None = None,
) -> list[dict]:
    """One job under each engine profile (``names``, default all): the layout
    :func:`engine_layout` gives it and the peak stage of :func:`parmem.estimate`, one row per
    engine with ``engine``, ``version``, ``layout``, ``recompute``, ``changed`` (whether the
    profile had to change the layout or the recomputation), the byte fields ``params``,
    ``grads``, ``optimizer``, ``activations`` (logits included), ``buffers`` and ``total``,
    ``host`` (offloaded bytes per node) and the ``estimate`` itself. Used in chapter 22."""
    rows = []
    for name in names if names is not None else list(engines()):
        par, run = engine_layout(name, parallel, setup)
        est = estimate(spec, par, run)
        st = est.peak
        row: dict = {"engine": name, "version": engine(name).version, "layout": str(par)}
        row["recompute"] = run.recompute
        row["changed"] = (par, run.recompute) != (parallel, setup.recompute)
        row.update({f: getattr(st, f) for f in ("params", "grads", "optimizer")})
        row["activations"] = st.activations + st.logits
        row.update(buffers=st.comm_buffers, total=st.total, host=est.host_bytes_per_node)
        rows.append({**row, "estimate": est})
    return rows
