"""Tiny worker functions that exercise the pool itself: a round trip and each way a run fails.

The book's launcher section and the tests use them to show that a failing rank makes the call
fail fast with that rank's traceback instead of hanging.
"""

from __future__ import annotations

import os
import time

from parmem.distributed.launcher import rank, world_size


def ping() -> dict:
    """All-reduce each rank's id: the sum is ``n(n-1)/2``; also reports the process id."""
    import torch
    import torch.distributed as dist

    from parmem.distributed.launcher import device

    t = torch.tensor([float(rank())], device=device())
    dist.all_reduce(t)
    return {
        "rank": rank(),
        "world_size": world_size(),
        "pid": os.getpid(),
        "rank_sum": int(t.item()),
        "backend": dist.get_backend(),
    }


def raise_on(which: int = 1, message: str = "boom") -> dict:
    """Rank ``which`` raises ``ValueError(message)``; the others wait in an all-reduce."""
    import torch
    import torch.distributed as dist

    if rank() == which:
        raise ValueError(message)
    dist.all_reduce(torch.zeros(1))
    return {"rank": rank()}


def exit_on(which: int = 1, code: int = 3) -> dict:
    """Rank ``which`` exits its process abruptly (``os._exit``)."""
    if rank() == which:
        os._exit(code)
    time.sleep(0.2)
    return {"rank": rank()}


def sleep(seconds: float = 1.0) -> dict:
    """Every rank sleeps ``seconds`` (to trigger ``Pool.run``'s deadline)."""
    time.sleep(seconds)
    return {"rank": rank()}


def skip_collective(which: int = 1) -> dict:
    """Rank ``which`` skips an all-reduce that the others enter: they hit the group timeout."""
    import torch
    import torch.distributed as dist

    if rank() != which:
        dist.all_reduce(torch.zeros(1))
    return {"rank": rank()}
