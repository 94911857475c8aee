"""Run a ``parmem.dist`` demo from the shell, on CPU ranks or under ``torchrun`` on GPUs.

On a laptop (spawns a pool of gloo ranks, prints one column per rank)::

    python -m parmem.dist tp --world-size 2
    python -m parmem.dist pp --world-size 4 schedule=interleaved v=2
    python -m parmem.dist --list

On a GPU node (one process per GPU; torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; with CUDA the
demos use NCCL and GPU ``LOCAL_RANK``, otherwise gloo on CPU)::

    torchrun --nproc-per-node 4 -m parmem.dist tp
    torchrun --nproc-per-node 8 -m parmem.dist zero steps=5

Extra ``key=value`` arguments are passed to the demo function (values parsed as Python
literals when they are, strings otherwise).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys

from parmem.dist import DEMOS
from parmem.dist.launcher import Pool, format_results, resolve


def _kwargs(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise SystemExit(f"argument {item!r} must look like key=value")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) has set RANK, WORLD_SIZE and MASTER_ADDR."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def run_torchrun(target: str, kwargs: dict, seed: int = 0, timeout_s: float = 300.0):
    """Run ``target`` on this rank of a torchrun job; return all results on rank 0, else None."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from parmem.dist import launcher

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    launcher.set_state(rank, ws, backend)
    kw = {"device_id": launcher.device()} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kw)
    try:
        torch.manual_seed(seed)
        result = resolve(target)[1](**kwargs)
        gathered = [None] * ws if rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
        return gathered
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parmem.dist", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("demo", nargs="?", help=f"one of {', '.join(DEMOS)} (or pkg.module:function)")
    ap.add_argument("args", nargs="*", help="key=value arguments for the demo")
    ap.add_argument("--world-size", "-n", type=int, default=None,
                    help="ranks to spawn (default $PARMEM_WORLD_SIZE, 2 on CI, else 4); "
                         "ignored under torchrun")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--list", action="store_true", help="list the demos")
    ns = ap.parse_args(argv)
    if ns.list or not ns.demo:
        for name, target in DEMOS.items():
            print(f"{name:12s} {target}")
        return 0
    target = DEMOS.get(ns.demo, ns.demo)
    kwargs = _kwargs(ns.args)
    if under_torchrun():
        results = run_torchrun(target, kwargs)
        if results is None:
            return 0
    else:
        with Pool(ns.world_size) as pool:
            results = pool.run(target, **kwargs)
    print(json.dumps(results, indent=1, default=str) if ns.json else format_results(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
