"""Run a ``parmem.distributed`` demo from the shell, on CPU ranks or under ``torchrun`` on GPUs.

On a laptop (spawns a pool of gloo ranks, prints one column per rank)::

    python -m parmem.distributed tp --world-size 2
    python -m parmem.distributed pp --world-size 4 schedule=interleaved v=2
    python -m parmem.distributed --list

On a GPU node (one process per GPU; torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; with CUDA the
demos use NCCL and GPU ``LOCAL_RANK``, otherwise gloo on CPU)::

    torchrun --nproc-per-node 4 -m parmem.distributed tp
    torchrun --nproc-per-node 8 -m parmem.distributed zero steps=5

Extra ``key=value`` arguments are passed to the demo function (values parsed as Python
literals when they are, strings otherwise); they are checked against the demo's signature before
any rank starts.

Errors (an unknown demo or argument, a bad ``--world-size``, a demo that fails on a rank, torch
not installed) print one line to stderr and exit with status 2, as ``parmem`` does.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys

from parmem._check import OneLineParser, UsageError, one_line, quiet_broken_pipe
from parmem.distributed import DEMOS
from parmem.distributed.launcher import (
    MAX_WORLD_SIZE,
    Pool,
    RankError,
    RankHung,
    RunTimeout,
    WorkerDied,
    format_results,
    resolve,
)

PROG = "python -m parmem.distributed"


def _kwargs(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(
                f"{PROG}: error: argument {item!r:.60} must look like key=value "
                f"(see '{PROG} --help')"
            )
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            out[key] = value
    return out


def _world_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r:.40} is not an integer") from None
    if not 1 <= n <= MAX_WORLD_SIZE:
        raise argparse.ArgumentTypeError(f"{text:.40} must be an integer in 1..{MAX_WORLD_SIZE}")
    return n


def _target(demo: str) -> str:
    """The worker function of ``demo``: a name of :data:`DEMOS` or ``package.module:function``."""
    if demo in DEMOS:
        return DEMOS[demo]
    if ":" not in demo:
        raise ValueError(
            f"demo={demo!r:.60} is not one of {', '.join(DEMOS)} (or a package.module:function)"
        )
    return demo


def _need_torch() -> None:
    """A one-line error unless torch can be imported (checked without importing it)."""
    import importlib.util

    if "torch" in sys.modules:
        missing = sys.modules["torch"] is None
    else:
        missing = importlib.util.find_spec("torch") is None
    if missing:
        raise ValueError(
            "torch is not installed: the demos need it (pip install torch, or "
            "pip install -r requirements.txt)"
        )


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) has set RANK, WORLD_SIZE and MASTER_ADDR."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def run_torchrun(target: str, kwargs: dict, seed: int = 0, timeout_s: float = 300.0):
    """Run ``target`` on this rank of a torchrun job; return all results on rank 0, else None."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from parmem.distributed import launcher

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


def _parser() -> argparse.ArgumentParser:
    from parmem import __version__

    ap = OneLineParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("demo", nargs="?", help=f"one of {', '.join(DEMOS)} (or pkg.module:function)")
    ap.add_argument("args", nargs="*", help="key=value arguments for the demo")
    ap.add_argument(
        "--world-size",
        "-n",
        type=_world_size,
        default=None,
        help="ranks to spawn (default $PARMEM_WORLD_SIZE, 2 on CI, else 4); ignored under torchrun",
    )
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--list", action="store_true", help="list the demos")
    ap.add_argument("--version", action="version", version=f"%(prog)s (parmem {__version__})")
    return ap


def _run(ns: argparse.Namespace) -> int:
    if ns.list or not ns.demo:
        for name, target in DEMOS.items():
            print(f"{name:12s} {target}")
        return 0
    target = _target(ns.demo)
    kwargs = _kwargs(ns.args)
    _need_torch()
    if under_torchrun():
        results = run_torchrun(target, kwargs)
        if results is None:
            return 0
    else:
        pool = Pool(ns.world_size)  # run checks the arguments before it starts the ranks
        try:
            results = pool.run(target, **kwargs)
        finally:
            pool.close()
    print(json.dumps(results, indent=1, default=str) if ns.json else format_results(results))
    return 0


def _rank_error(e: RankError) -> str:
    """A rank's failure on one line: the rank, the demo and the last line of its traceback (for
    a rank that died or hung, the first line: what happened to it, not its peer's error)."""
    lines = [line for line in str(e.traceback).splitlines() if line.strip()]
    if isinstance(e, (WorkerDied, RankHung)):
        lines = lines[:1]
    return f"rank {e.rank} failed in {e.target}: {lines[-1].strip() if lines else 'no message'}"


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m parmem.distributed`` with ``argv``; the exit status (errors: one line, 2)."""
    try:
        status = _run(_parser().parse_intermixed_args(argv))
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        return quiet_broken_pipe()
    except UsageError as e:
        print(e, file=sys.stderr)
    except RankError as e:
        print(f"{PROG}: error: {one_line(_rank_error(e))}", file=sys.stderr)
    except (ValueError, TypeError, OSError, RunTimeout) as e:
        print(f"{PROG}: error: {one_line(e)}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
