"""Real ``torch.distributed`` demos that measure what the book claims, on 2-4 CPU ranks or GPUs.

One module per parallel axis (picotron style): :mod:`~parmem.distributed.tp`, :mod:`~parmem.distributed.sp`,
:mod:`~parmem.distributed.pp`, :mod:`~parmem.distributed.zero`, :mod:`~parmem.distributed.ep`,
:mod:`~parmem.distributed.collectives`, :mod:`~parmem.distributed.dp`; :mod:`~parmem.distributed.launcher` holds the
:class:`Pool` that starts ranks once per notebook::

    from parmem.distributed import Pool, format_results
    with Pool(world_size=2) as pool:          # gloo ranks on this machine's CPUs
        rows = pool.run("parmem.distributed.tp:demo")
    print(format_results(rows))

From a shell: ``python -m parmem.distributed tp --world-size 2``. On a GPU node the same demos run one
process per GPU with NCCL: ``torchrun --nproc-per-node 4 -m parmem.distributed tp``.

A pool never returns a stale result: a start that fails or is interrupted stops its ranks, and
each task's replies carry its id. Its ranks run in their own session (a notebook interrupt does
not reach them), exit with their parent, and a task sent to a rank that died raises
:class:`WorkerDied`. Importing this package does not import torch; starting a pool does.
"""

from parmem.distributed.launcher import (
    MAX_WORLD_SIZE,
    Pool,
    RankError,
    RankHung,
    RunTimeout,
    WorkerDied,
    default_world_size,
    format_results,
)

#: demo name -> worker function, for ``python -m parmem.distributed <demo>`` and the benchmark
DEMOS: dict[str, str] = {
    "anatomy": "parmem.distributed.anatomy:demo",
    "collectives": "parmem.distributed.collectives:demo",
    "tp": "parmem.distributed.tp:demo",
    "tp-dtensor": "parmem.distributed.tp:demo_dtensor",
    "sp": "parmem.distributed.sp:demo",
    "tp-states": "parmem.distributed.tp:demo_states",
    "tp-comm": "parmem.distributed.tp:demo_comm",
    "sp-recompute": "parmem.distributed.sp:demo_recompute",
    "pp": "parmem.distributed.pp:demo",
    "zero": "parmem.distributed.zero:demo",
    "ddp-buckets": "parmem.distributed.zero:demo_ddp_buckets",
    "ep": "parmem.distributed.ep:demo",
    "hybrid": "parmem.distributed.hybrid:demo",
    "send-recv": "parmem.distributed.collectives:demo_send_recv",
    "zero-losses": "parmem.distributed.zero:demo_losses",
    "dp": "parmem.distributed.dp:demo",
    "dp-activation-sharding": "parmem.distributed.dp:demo_activation_sharding",
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
