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
import math
import os
import sys
import typing

from parmem._check import OneLineParser, UsageError, run_guarded, strict_json, write_out
from parmem.config import SCHEDULES
from parmem.distributed import DEMOS
from parmem.distributed.launcher import (
    MAX_WORLD_SIZE,
    Pool,
    RankError,
    RankHung,
    WorkerDied,
    check_kwargs,
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


#: the largest integer a demo argument may take: the demos build toy models on CPU ranks, and a
#: size past this would exhaust memory on the ranks instead of failing here
MAX_DEMO_INT = 2**24

#: string arguments with a fixed set of values, by parameter name (pp's demos build their
#: schedule from these names, as parmem.pipeline.simulate does)
CHOICES: dict[str, tuple[str, ...]] = {"schedule": SCHEDULES}

#: real arguments that cannot be negative (a learning rate, pp's emulated compute times);
#: others (ep's ``imbalance``, a logit bias) can
NONNEGATIVE = frozenset({"lr", "delay_ms"})


def check_args(name: str, fn, kwargs: dict) -> None:
    """Refuse, before any rank starts, the arguments that ``fn`` would refuse on every rank: a
    name not in its signature, a value of another type than its annotation (``int``,
    ``float``, ``bool``, ``str``, ``X | None``, ``tuple[float, float]``), an integer outside
    ``1..MAX_DEMO_INT`` (from the default where that is below 1), a real that is not finite (a
    probability, ``*_p``, outside [0, 1); one of :data:`NONNEGATIVE` below 0), a ``schedule``
    not in :data:`CHOICES`, a ``dtype`` that is not a torch dtype. Rules that need the world
    size (a width divisible by it) stay with the demo, on the ranks."""
    import inspect

    check_kwargs(name, fn, kwargs)
    try:
        params = inspect.signature(fn).parameters
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not evaluate: the signature check alone
        return
    for key, value in kwargs.items():
        if key in hints and key in params:
            _check_value(f"{key}={value!r:.60}", key, value, hints[key], params[key].default)


def _check_value(what: str, key: str, value, hint, default) -> None:
    """Raise ``ValueError`` naming ``what`` unless ``value`` fits the annotation ``hint``."""
    args = typing.get_args(hint)
    if type(None) in args:  # X | None
        rest = [a for a in args if a is not type(None)]
        if value is None or len(rest) != 1:
            return
        hint, args = rest[0], typing.get_args(rest[0])
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{what} must be True or False")
    elif hint is int:
        low = default if isinstance(default, int) and not isinstance(default, bool) else 1
        _check_int(what, value, min(low, 1))
    elif hint is float:
        _check_real(what, key, value)
    elif hint is str:
        _check_str(what, key, value)
    elif typing.get_origin(hint) is tuple and args and Ellipsis not in args:
        if not isinstance(value, (tuple, list)) or len(value) != len(args):
            raise ValueError(f"{what} must be a tuple of {len(args)} values")
        for v, a in zip(value, args, strict=True):
            _check_value(what, key, v, a, None)


def _check_int(what: str, value, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer")
    if not lo <= value <= MAX_DEMO_INT:
        raise ValueError(f"{what} must be an integer in {lo}..{MAX_DEMO_INT}")


def _check_real(what: str, key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number")
    if key.endswith("_p"):
        if not 0 <= value < 1:
            raise ValueError(f"{what} must be a probability in [0, 1)")
    elif not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number")
    elif key in NONNEGATIVE and value < 0:
        raise ValueError(f"{what} must be >= 0")


def _check_str(what: str, key: str, value) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string")
    if key in CHOICES and value not in CHOICES[key]:
        raise ValueError(f"{what} must be one of {', '.join(CHOICES[key])}")
    if key == "dtype":
        import torch

        if not isinstance(getattr(torch, value, None), torch.dtype):
            raise ValueError(f"{what} is not a torch dtype name (e.g. float32, bfloat16)")


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
            write_out(f"{name:12s} {target}")
        return 0
    target = _target(ns.demo)
    kwargs = _kwargs(ns.args)
    _need_torch()
    name, fn = resolve(target)
    check_args(name, fn, kwargs)  # before any rank starts (also under torchrun)
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
    write_out(strict_json(results, indent=1, default=str) if ns.json else format_results(results))
    return 0


def _rank_error(e: RankError) -> str:
    """A rank's failure on one line: the rank, the demo and the last line of its traceback (for
    a rank that died or hung, the first line: what happened to it, not its peer's error)."""
    lines = [line for line in str(e.traceback).splitlines() if line.strip()]
    if isinstance(e, (WorkerDied, RankHung)):
        lines = lines[:1]
    return f"rank {e.rank} failed in {e.target}: {lines[-1].strip() if lines else 'no message'}"


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m parmem.distributed`` with ``argv``; the exit status (errors: one line, 2;
    a closed pipe: 141; see :func:`parmem.cli.run_guarded`)."""

    def body() -> int:
        try:
            return _run(_parser().parse_intermixed_args(argv))
        except RankError as e:
            raise ValueError(_rank_error(e)) from None

    return run_guarded(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
