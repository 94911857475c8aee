"""A pool of ``torch.distributed`` ranks, started once and reused by every demo of a notebook.

Starting ranks is the expensive part on a laptop (spawning a Python process and importing torch:
seconds per rank on two cores), so a chapter starts its ranks once::

    with parmem.dist.Pool(world_size=2) as pool:
        rows = pool.run("parmem.dist.tp:demo", hidden=64)   # one result per rank

How it works:

* ``world_size`` defaults to ``$PARMEM_WORLD_SIZE``, else 2 when ``$CI`` is true, else 4.
* Ranks are fresh Python processes (like ``spawn``: ``fork`` after torch has started threads is
  unsafe), started with ``subprocess`` and talking to the parent over a socket pair, so the
  caller's ``__main__`` is never re-imported (scripts need no ``if __name__ == "__main__"``
  guard; POSIX only). Each sets ``torch.set_num_threads(1)`` and joins a gloo (CPU) or NCCL (GPU) process
  group through a ``TCPStore`` that the parent owns on port 0 (the OS picks a free port), so
  any number of pools, notebooks and tests can run at once without port collisions.
* Every process group has a timeout (``pg_timeout``, 60 s); every ``run`` has a deadline too.
* A rank that raises sends back its traceback; the parent tears the pool down and raises
  :class:`RankError` naming the rank. A rank that dies is seen when its socket closes and
  raises :class:`WorkerDied`. The next ``run`` on a torn-down pool starts fresh ranks.
* Before each task every rank calls ``torch.manual_seed(seed)`` (same seed on all ranks), so
  results are deterministic; a demo that needs different data per rank derives it from its rank.

Worker functions are named ``"package.module:function"`` (or passed as a module-level
function) and must live in an importable module: a function defined in a notebook cannot be
pickled for ``spawn``. They take keyword arguments and return something picklable (the demos
return plain dicts of numbers).

Inside a worker, :func:`rank`, :func:`world_size` and :func:`device` describe the rank; the same
functions work under ``torchrun`` (see ``python -m parmem.dist --help``).
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
from typing import Any

from parmem._check import integer

__all__ = ["Pool", "RankError", "WorkerDied", "RunTimeout", "default_world_size", "rank",
           "world_size", "device", "backend", "resolve", "format_results", "set_state",
           "rank_main"]

_STATE: dict = {"rank": 0, "world_size": 1, "device": "cpu", "backend": None}


class RankError(RuntimeError):
    """A rank raised inside a worker function; carries the rank and its traceback."""

    def __init__(self, rank: int, target: str, tb: str, others: tuple[int, ...] = ()):
        self.rank, self.target, self.traceback, self.others = rank, target, tb, others
        also = f" (ranks {list(others)} also failed)" if others else ""
        super().__init__(f"rank {rank} failed in {target}{also}:\n{tb}")


class WorkerDied(RankError):
    """A rank's process exited while the pool was running or starting."""


class RunTimeout(TimeoutError):
    """``Pool.run`` did not finish before its deadline; the pool was torn down."""


def default_world_size() -> int:
    """``$PARMEM_WORLD_SIZE`` if set, else 2 when ``$CI`` is true, else 4."""
    env = os.environ.get("PARMEM_WORLD_SIZE")
    if env:
        try:
            return _check_world_size(int(env))
        except ValueError:
            raise ValueError(f"PARMEM_WORLD_SIZE={env!r} must be a positive integer") from None
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return 2
    return 4


def _check_world_size(n: object) -> int:
    return integer("world_size", n)


def rank() -> int:
    """This process's rank (0 outside a pool)."""
    return _STATE["rank"]


def world_size() -> int:
    """Number of ranks (1 outside a pool)."""
    return _STATE["world_size"]


def device():
    """The torch device of this rank: ``cuda:LOCAL_RANK`` under NCCL, else ``cpu``."""
    import torch

    return torch.device(_STATE["device"])


def backend() -> str | None:
    """``"gloo"`` or ``"nccl"`` inside a worker, ``None`` outside."""
    return _STATE["backend"]


def resolve(target):
    """Turn ``"pkg.mod:fn"`` (or a module-level function) into ``(name, function)``."""
    if callable(target):
        name = f"{target.__module__}:{target.__qualname__}"
        if "<" in name or target.__module__ == "__main__":
            raise ValueError(f"target={name!r} must be a function in an importable module "
                             "(a notebook's functions cannot be sent to spawned ranks)")
        return name, target
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"target={target!r} must look like 'package.module:function'")
    mod, _, fn = target.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"target={target!r} cannot be imported: {e}") from e
    return target, obj


def set_state(rank_: int, ws: int, backend_: str) -> None:
    """Record this process's rank, world size and backend (what :func:`rank`, :func:`world_size`,
    :func:`device` and :func:`backend` report); under NCCL also select GPU ``$LOCAL_RANK``.
    Called by a pool's rank before it joins the group, and by ``python -m parmem.dist`` under
    torchrun."""
    import torch

    dev = "cpu"
    if backend_ == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank_))
        torch.cuda.set_device(local)
        dev = f"cuda:{local}"
    _STATE.update(rank=rank_, world_size=ws, device=dev, backend=backend_)


def rank_main() -> None:
    """Entry point of a rank process that a :class:`Pool` starts (``python -c ... FD``): read the
    set-up from the socket ``FD``, join the group, then run tasks until told to stop."""
    import sys
    from multiprocessing.connection import Connection

    conn = Connection(int(sys.argv[1]))
    rank_, ws, host, port, backend_, pg_timeout, path = conn.recv()
    sys.path[:] = path
    _worker(rank_, ws, host, port, backend_, pg_timeout, conn)
    # the group is destroyed; skip the interpreter's slow teardown of torch (about 0.5 s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _worker(rank_: int, ws: int, host: str, port: int, backend_: str, pg_timeout: float,
            conn) -> None:
    """Body of one rank: join the group, then run tasks until told to stop."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    try:
        timeout = timedelta(seconds=pg_timeout)
        store = dist.TCPStore(host, port, world_size=ws, is_master=False, timeout=timeout)
        set_state(rank_, ws, backend_)
        kw = {"device_id": device()} if backend_ == "nccl" else {}
        dist.init_process_group(backend_, store=store, rank=rank_, world_size=ws,
                                timeout=timeout, **kw)
        conn.send(("ready", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        target, kwargs, seed = msg
        try:
            torch.manual_seed(seed)
            out = ("ok", resolve(target)[1](**kwargs))
            conn.send(out)
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


class Pool:
    """``world_size`` spawned ranks in one process group, reused for many :meth:`run` calls.

    Parameters: ``world_size`` (default :func:`default_world_size`), ``backend`` (``"gloo"``;
    ``"nccl"`` needs one GPU per rank), ``pg_timeout`` (seconds for every collective and the
    rendezvous), ``start_timeout`` (seconds for all ranks to join).
    """

    def __init__(self, world_size: int | None = None, backend: str = "gloo",
                 pg_timeout: float = 60.0, start_timeout: float = 120.0):
        self.world_size = _check_world_size(default_world_size() if world_size is None
                                            else world_size)
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r} must be 'gloo' or 'nccl'")
        if not pg_timeout > 0:
            raise ValueError(f"pg_timeout={pg_timeout!r} must be > 0 seconds")
        self.backend, self.pg_timeout, self.start_timeout = backend, pg_timeout, start_timeout
        self._procs: list = []
        self._conns: list = []
        self._store: Any = None
        self.start_seconds: float | None = None

    # -- life cycle -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs)

    def start(self) -> Pool:
        """Start the ranks and wait until all have joined the process group."""
        if self._procs:
            return self
        import subprocess
        import sys
        from datetime import timedelta
        from multiprocessing import Pipe

        import torch
        import torch.distributed as dist

        if self.backend == "nccl" and torch.cuda.device_count() < self.world_size:
            raise ValueError(f"backend='nccl' needs world_size={self.world_size} GPUs; "
                             f"{torch.cuda.device_count()} visible (use backend='gloo')")
        t0 = time.perf_counter()
        self._store = dist.TCPStore("127.0.0.1", 0, world_size=self.world_size + 1,
                                    is_master=True, timeout=timedelta(seconds=self.pg_timeout),
                                    wait_for_workers=False)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               # parmem importable in the rank even when it is not installed (a source checkout)
               "PYTHONPATH": os.pathsep.join(filter(None, [root,
                                                           os.environ.get("PYTHONPATH")]))}
        for r in range(self.world_size):
            parent, child = Pipe()  # a socket pair on POSIX
            cmd = [sys.executable, "-c", "from parmem.dist.launcher import rank_main; rank_main()",
                   str(child.fileno())]
            p = subprocess.Popen(cmd, pass_fds=(child.fileno(),), env=env)
            child.close()
            parent.send((r, self.world_size, "127.0.0.1", self._store.port, self.backend,
                         self.pg_timeout, list(sys.path)))
            self._procs.append(p)
            self._conns.append(parent)
        self._collect("<start>", self.start_timeout)
        self.start_seconds = time.perf_counter() - t0
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop the ranks: ask politely, join, then terminate and kill stragglers."""
        for c in self._conns:
            try:
                c.send(None)
            except (OSError, ValueError):
                pass
        self._reap(timeout)

    def _reap(self, timeout: float) -> None:
        import subprocess

        deadline = time.monotonic() + timeout
        for p in self._procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(2.0)
        for c in self._conns:
            c.close()
        self._procs, self._conns, self._store = [], [], None

    def __enter__(self) -> Pool:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_procs", None):
            try:
                self._reap(0.5)
            except Exception:  # interpreter shutdown: the ranks exit on their own at EOF
                pass

    # -- work -------------------------------------------------------------------------------
    def run(self, target, *, timeout: float = 300.0, seed: int = 0, **kwargs) -> list:
        """Run ``target(**kwargs)`` on every rank; return the per-rank results, rank order.

        Raises :class:`RankError` (a rank raised), :class:`WorkerDied` (a rank exited) or
        :class:`RunTimeout`; in each case the pool is torn down and the next ``run`` restarts it.
        """
        name, _ = resolve(target)
        self.start()
        try:
            for c in self._conns:
                c.send((name, kwargs, seed))
            return self._collect(name, timeout)
        except (RankError, RunTimeout):
            raise
        except BaseException:  # KeyboardInterrupt in a notebook, a broken pipe: never leave
            self._reap(0.0)    # ranks running a task whose result nobody will read
            raise

    def _collect(self, name: str, timeout: float) -> list:
        from multiprocessing.connection import wait

        n = self.world_size
        results: list = [None] * n
        pending = set(range(n))
        errors: dict[int, tuple[type, object]] = {}
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self._reap(0.0)
                raise RunTimeout(f"{name} did not finish within {timeout:g} s on ranks "
                                 f"{sorted(pending)}; the pool was torn down")
            handles = {self._conns[r]: r for r in pending}  # EOF when a rank's process dies
            for h in wait(list(handles), timeout=min(left, 1.0)):
                r = handles[h]
                if r not in pending:
                    continue
                conn = self._conns[r]
                try:
                    kind, payload = conn.recv() if conn.poll() else ("died", None)
                except (EOFError, OSError):
                    kind, payload = "died", None
                if kind == "died":
                    try:
                        code = self._procs[r].wait(2.0)
                    except Exception:
                        code = None
                    errors[r] = (WorkerDied, f"process exited with code {code}")
                elif kind == "error":
                    errors[r] = (RankError, payload)
                else:
                    results[r] = payload
                pending.discard(r)
            if errors:
                # the first rank to report is usually the root cause; the others may be
                # blocked in a collective with it, so they are terminated, not awaited
                first = next(iter(errors))
                self._reap(0.0)
                cls, msg = errors[first]
                raise cls(first, name, msg, tuple(sorted(set(errors) - {first})))
        return results


def format_results(results: list[dict], digits: int = 6) -> str:
    """Per-rank result dicts as a plain-text table (one row per key, one column per rank)."""
    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    rows: dict[str, list] = {}
    for r, res in enumerate(results):
        items = flat(res) if isinstance(res, dict) else [("result", res)]
        for k, v in items:
            rows.setdefault(k, [None] * len(results))[r] = v

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.{digits}g}"
        return "" if v is None else str(v)

    head = ["key", *[f"rank {r}" for r in range(len(results))]]
    body = [[k, *map(fmt, vs)] for k, vs in rows.items()]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    line = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])
