"""Worker functions for the pool's fault tests (``tests/test_dist_launcher.py``): a long
all-reduce loop, a rank that ignores SIGTERM, a rank that sends a stale reply. The ranks import
them from ``tests/`` because a pool gives its ranks the parent's ``sys.path``."""

from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing.connection import Connection

from parmem.dist.launcher import rank


def allreduce_loop(seconds: float = 60.0) -> dict:
    """All-reduce a small tensor again and again for ``seconds``."""
    import torch
    import torch.distributed as dist

    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        dist.all_reduce(torch.ones(16))
        n += 1
    return {"rank": rank(), "iterations": n}


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
