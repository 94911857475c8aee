"""Real ``torch.distributed`` demos that measure what the book claims, on 2-4 CPU ranks or GPUs.

One module per parallel axis (picotron style): :mod:`~parmem.dist.tp`, :mod:`~parmem.dist.sp`,
:mod:`~parmem.dist.pp`, :mod:`~parmem.dist.zero`, :mod:`~parmem.dist.ep`,
:mod:`~parmem.dist.collectives`, :mod:`~parmem.dist.dp`; :mod:`~parmem.dist.launcher` holds the
:class:`Pool` that starts ranks once per notebook::

    from parmem.dist import Pool, format_results
    with Pool(world_size=2) as pool:          # gloo ranks on this machine's CPUs
        rows = pool.run("parmem.dist.tp:demo")
    print(format_results(rows))

From a shell: ``python -m parmem.dist tp --world-size 2``. On a GPU node the same demos run one
process per GPU with NCCL: ``torchrun --nproc-per-node 4 -m parmem.dist tp``.

A pool never returns a stale result: a start that fails or is interrupted stops its ranks, and
each task's replies carry its id. Its ranks run in their own session (a notebook interrupt does
not reach them), exit with their parent, and a task sent to a rank that died raises
:class:`WorkerDied`. Importing this package does not import torch; starting a pool does.
"""

from parmem.dist.launcher import (
    MAX_WORLD_SIZE,
    Pool,
    RankError,
    RankHung,
    RunTimeout,
    WorkerDied,
    default_world_size,
    format_results,
)

#: demo name -> worker function, for ``python -m parmem.dist <demo>`` and the benchmark
DEMOS: dict[str, str] = {
    "anatomy": "parmem.dist.anatomy:demo",
    "collectives": "parmem.dist.collectives:demo",
    "tp": "parmem.dist.tp:demo",
    "tp-dtensor": "parmem.dist.tp:demo_dtensor",
    "sp": "parmem.dist.sp:demo",
    "tp-states": "parmem.dist.tp:demo_states",
    "tp-comm": "parmem.dist.tp:demo_comm",
    "sp-recompute": "parmem.dist.sp:demo_recompute",
    "pp": "parmem.dist.pp:demo",
    "zero": "parmem.dist.zero:demo",
    "ddp-buckets": "parmem.dist.zero:demo_ddp_buckets",
    "ep": "parmem.dist.ep:demo",
    "hybrid": "parmem.dist.hybrid:demo",
    "send-recv": "parmem.dist.collectives:demo_send_recv",
    "zero-losses": "parmem.dist.zero:demo_losses",
    "dp": "parmem.dist.dp:demo",
    "dp-activation-sharding": "parmem.dist.dp:demo_activation_sharding",
}

__all__ = [
    "Pool",
    "RankError",
    "WorkerDied",
    "RankHung",
    "RunTimeout",
    "default_world_size",
    "format_results",
    "DEMOS",
    "MAX_WORLD_SIZE",
]
