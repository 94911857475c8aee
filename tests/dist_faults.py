"""Worker functions for the pool's fault tests (``tests/test_dist_launcher.py``): a long
all-reduce loop, a rank that ignores SIGTERM, a rank that sends a stale reply. The ranks import
them from ``tests/`` because a pool gives its ranks the parent's ``sys.path``."""

from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing.connection import Connection

from parmem.distributed.launcher import rank


def _mark(started: str | None) -> None:
    """Create ``started.<rank>``: the test waits for these files, not for a fixed delay."""
    if started:
        with open(f"{started}.{rank()}", "w") as f:
            f.write(str(os.getpid()))


def allreduce_loop(seconds: float = 60.0, started: str | None = None) -> dict:
    """All-reduce a small tensor again and again for ``seconds``; after the first all-reduce,
    mark ``started`` (see :func:`_mark`)."""
    import torch
    import torch.distributed as dist

    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        dist.all_reduce(torch.ones(16))
        if n == 0:
            _mark(started)
        n += 1
    return {"rank": rank(), "iterations": n}


def sleep_marked(seconds: float = 60.0, started: str | None = None) -> dict:
    """Mark ``started``, then sleep ``seconds``."""
    _mark(started)
    time.sleep(seconds)
    return {"rank": rank()}


def exit_in_collective(which: int = 1, code: int = 3) -> dict:
    """Rank ``which`` exits its process (``os._exit``) while the others wait in an all-reduce
    for it: their collective fails because it is gone."""
    import torch
    import torch.distributed as dist

    if rank() == which:
        os._exit(code)
    dist.all_reduce(torch.ones(1))
    return {"rank": rank()}


def hang_in_collective(which: int = 1, seconds: float = 60.0) -> dict:
    """Rank ``which`` sleeps ``seconds`` while the others wait in an all-reduce for it: they
    fail at the group timeout, and rank ``which`` is the one that hung."""
    import torch
    import torch.distributed as dist

    if rank() == which:
        time.sleep(seconds)
    dist.all_reduce(torch.ones(1))
    return {"rank": rank()}


def hang_ignoring_sigterm(seconds: float = 60.0) -> dict:
    """Ignore SIGTERM, then sleep: a hung rank that only SIGKILL stops."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)
    return {"rank": rank()}


def stale_reply() -> dict:
    """Send the parent a reply to an earlier task id (as a reply left over from an interrupted
    call would be) before returning the real result."""
    conn = Connection(os.dup(int(sys.argv[1])))  # the rank's socket to the parent (a copy)
    conn.send((0, "ok", {"stale": True}))
    conn.send((-1, "ok", {"stale": True}))
    conn.close()
    return {"rank": rank(), "stale": False}
