"""A pool of ``torch.distributed`` ranks, started once and reused by every demo of a notebook.

Starting ranks is the expensive part on a laptop (spawning a Python process and importing torch:
seconds per rank on two cores), so a chapter starts its ranks once::

    with parmem.distributed.Pool(world_size=2) as pool:
        rows = pool.run("parmem.distributed.tp:demo", hidden=64)   # one result per rank

How it works:

* ``world_size`` defaults to ``$PARMEM_WORLD_SIZE``, else 2 when ``$CI`` is true, else 4.
* Ranks are never forked from the caller (``fork`` after torch has started threads is unsafe)
  and talk to it over a socket pair, so the caller's ``__main__`` is never re-imported (scripts
  need no ``if __name__ == "__main__"`` guard; POSIX only). On Linux they are forked from a
  *rank template*, a child process that imported torch once and does nothing else
  (:class:`_Template`): a pool's restart costs milliseconds instead of an interpreter importing
  torch per rank; elsewhere, or with ``$PARMEM_RANK_START=spawn``, each rank is a fresh
  interpreter started with ``subprocess``. Each sets ``torch.set_num_threads(1)`` and joins a gloo (CPU) or NCCL (GPU) process
  group through a ``TCPStore`` that the parent owns on port 0 (the OS picks a free port), so
  any number of pools, notebooks and tests can run at once without port collisions.
* Every process group has a timeout (``pg_timeout``, 60 s); every ``run`` has a deadline too,
  so a hung rank is stopped (terminated, then killed) when it passes.
* A rank that raises sends back its traceback; the parent tears the pool down and raises
  :class:`RankError` naming the rank. A rank that dies is seen when its socket closes (or before
  a task is sent to it) and raises :class:`WorkerDied`. The next ``run`` on a torn-down pool
  starts fresh ranks.
* Failures are attributed to their root cause, not to the first rank that reports
  (:meth:`Pool._root_cause`): a rank whose process exited is the cause, whatever its peers
  report (their collectives fail with "Connection reset by peer"); else a rank that raised an
  error of its own; else, when the others failed in a collective while a rank was still busy,
  that rank hung (:class:`RankHung`). The ranks that failed because of it are listed in
  ``others``.
* Every task carries an id and only the replies with that id are its results; a start that
  fails or is interrupted (Ctrl-C) stops the ranks it started, so a later ``run`` never reads a
  stale reply.
* Ranks run in their own session: interrupting a notebook cell (the kernel signals its whole
  process group) does not reach them, and an idle pool stays usable. They exit when the parent
  dies, even in the middle of a task (:func:`die_with_parent`).
* Safe at every Ctrl-C: ``SIGINT`` is deferred (recorded, then raised as ``KeyboardInterrupt``
  once the step is done) while torch is imported (an import of torch cut short cannot be
  retried: the next one aborts the process, "cannot initialize type ... already defined"),
  while the ranks are spawned, and while they are stopped, so neither an interrupted first start
  nor a second Ctrl-C during teardown leaves a rank running or the pool unusable
  (:func:`_sigint_deferred`).
* One pool may be used from several threads: :meth:`Pool.run`, :meth:`Pool.start` and
  :meth:`Pool.close` hold a lock, so calls run one after another and every reply reaches the
  call that sent its task (two threads used to read each other's replies and drop them).
* Messages are pickled with the standard ``pickle`` (by value), not with multiprocessing's
  ``ForkingPickler``: torch registers reductions there that pass a tensor's storage as a file
  descriptor through ``multiprocessing.resource_sharer``, which authenticates with this
  process's ``authkey``, one the ranks (started with ``subprocess``) do not share, so a tensor
  argument used to kill the rank with ``AuthenticationError``. Tensors as arguments and results
  are now copied like any other value. A task's arguments are unpickled inside the task, so one
  a rank cannot read (a class from ``__main__``) is a :class:`RankError`, not a dead rank.
* Each rank leads its own process group (its session); processes a task starts join it, and
  are killed (``os.killpg``) when the rank is stopped or exits with its parent.
* Before each task every rank calls ``torch.manual_seed(seed)`` (same seed on all ranks), so
  results are deterministic; a demo that needs different data per rank derives it from its rank.
* A shared pool (:class:`PoolServer`): a process that runs many notebooks one after another (the
  chapters' test run) can serve one pool to all of them. With ``$PARMEM_SHARED_POOL`` set to its
  socket, a :class:`Pool` of the same world size and backend relays its tasks there instead of
  starting ranks of its own (``shared`` is then true), so the ranks start, and import torch and
  the engines' modules, once per test worker instead of once per chapter. Everything else is
  unchanged: the same tasks, seeds, results and errors; a pool that cannot reach the server
  starts its own ranks.

Worker functions are named ``"package.module:function"`` (or passed as a module-level
function) and must live in an importable module: a function defined in a notebook cannot be
pickled for ``spawn``. They take keyword arguments and return something picklable (the demos
return plain dicts of numbers).

Inside a worker, :func:`rank`, :func:`world_size` and :func:`device` describe the rank; the same
functions work under ``torchrun`` (see ``python -m parmem.distributed --help``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import threading
import time
import traceback
from typing import Any

from parmem._check import choice, integer, number

__all__ = [
    "Pool",
    "PoolServer",
    "RankError",
    "WorkerDied",
    "RankHung",
    "RunTimeout",
    "default_world_size",
    "rank",
    "world_size",
    "device",
    "backend",
    "resolve",
    "format_results",
    "set_state",
    "rank_main",
    "die_with_parent",
    "template_main",
    "RANK_START_ENV",
    "MAX_WORLD_SIZE",
    "MAX_TIMEOUT_S",
    "BACKENDS",
    "SHARED_POOL_ENV",
    "exit_status",
]

#: the most ranks a pool starts on one machine (each is a Python process that imports torch)
MAX_WORLD_SIZE = 64
#: the longest timeout a pool accepts, in seconds (one day)
MAX_TIMEOUT_S = 86_400.0
#: the process-group backends a pool can use
BACKENDS = ("gloo", "nccl")
#: seconds between two checks of a rank's watchdog that its parent is still alive
WATCHDOG_S = 0.25
#: after a rank fails inside a collective (a peer's fault, usually), seconds to wait for the
#: other ranks to report or exit before the cause is decided (a dead peer is seen at once: its
#: sockets close when it exits; this only bounds the wait for a rank that is still busy)
PEER_GRACE_S = 2.0
#: what gloo and the store say when a peer's connection is gone or it never arrived
_PEER_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Socket Timeout",
    "Timed out waiting",
    "timed out",
    "Timeout",
)
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
#: the environment variable that points a :class:`Pool` at a :class:`PoolServer`'s socket
SHARED_POOL_ENV = "PARMEM_SHARED_POOL"
#: seconds a shared pool's client waits for the server beyond the task's own timeout (the server
#: may first have to start its ranks)
SHARED_START_S = 120.0

_STATE: dict = {"rank": 0, "world_size": 1, "device": "cpu", "backend": None}


class RankError(RuntimeError):
    """A rank raised inside a worker function; carries the rank and its traceback."""

    def __init__(self, rank: int, target: str, tb: str, others: tuple[int, ...] = ()):
        self.rank, self.target, self.traceback, self.others = rank, target, tb, others
        also = f" (ranks {list(others)} also failed)" if others else ""
        super().__init__(f"rank {rank} failed in {target}{also}:\n{tb}")


class WorkerDied(RankError):
    """A rank's process exited while the pool was running or starting (``exit_code``: its exit
    status, negative for a signal, ``None`` if unknown)."""

    def __init__(
        self,
        rank: int,
        target: str,
        tb: str,
        others: tuple[int, ...] = (),
        exit_code: int | None = None,
    ):
        self.exit_code = exit_code
        super().__init__(rank, target, tb, others)


class RankHung(RankError):
    """A rank was still running a task when its peers failed in a collective, waiting for it."""


class RunTimeout(TimeoutError):
    """``Pool.run`` did not finish before its deadline; the pool was torn down."""


def default_world_size() -> int:
    """``$PARMEM_WORLD_SIZE`` if set, else 2 when ``$CI`` is true, else 4."""
    env = os.environ.get("PARMEM_WORLD_SIZE")
    if env:
        try:
            return _check_world_size(int(env))
        except ValueError:
            raise ValueError(
                f"PARMEM_WORLD_SIZE={env!r} must be an integer in 1..{MAX_WORLD_SIZE}"
            ) from None
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return 2
    return 4


def _check_world_size(n: object) -> int:
    return integer("world_size", n, 1, MAX_WORLD_SIZE)


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
            raise ValueError(
                f"target={name!r} must be a function in an importable module "
                "(a notebook's functions cannot be sent to spawned ranks)"
            )
        return name, target
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"target={target!r} must look like 'package.module:function'")
    mod, _, fn = target.partition(":")
    try:
        with _sigint_deferred():  # the module may import torch (see _sigint_deferred)
            obj = getattr(importlib.import_module(mod), fn)
    except Exception as e:  # ImportError, AttributeError, ValueError('Empty module name'), ...
        raise ValueError(f"target={target!r} cannot be imported: {e}") from e
    if not callable(obj):
        raise ValueError(f"target={target!r} is not a function")
    return target, obj


def set_state(rank_: int, ws: int, backend_: str) -> None:
    """Record this process's rank, world size and backend (what :func:`rank`, :func:`world_size`,
    :func:`device` and :func:`backend` report); under NCCL also select GPU ``$LOCAL_RANK``.
    Called by a pool's rank before it joins the group, and by ``python -m parmem.distributed`` under
    torchrun."""
    import torch

    dev = "cpu"
    if backend_ == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank_))
        torch.cuda.set_device(local)
        dev = f"cuda:{local}"
    _STATE.update(rank=rank_, world_size=ws, device=dev, backend=backend_)


def rank_main() -> None:
    """Entry point of a rank process that a :class:`Pool` starts
    (``python -c ... FD PARENT_PID DEATH_SIGNAL``): arrange to die with the parent, read the
    set-up from the socket ``FD``, join the group, then run tasks until told to stop."""
    import sys
    from multiprocessing.connection import Connection

    _rank_body(Connection(int(sys.argv[1])), int(sys.argv[2]), sys.argv[3] == "1")


def _rank_body(conn: Any, parent: int, death_signal: bool) -> None:
    """A rank's life from its socket on (a spawned rank's and a forked one's): arrange to die
    with ``parent``, read the set-up, join the group, run tasks, exit."""
    import sys

    die_with_parent(parent, death_signal)
    rank_, ws, host, port, backend_, timeouts, path = conn.recv()
    sys.path[:] = path
    _worker(rank_, ws, host, port, backend_, timeouts, conn)
    _kill_group_members()  # processes its tasks started (the parent may be gone: EOF)
    # the group is destroyed; skip the interpreter's slow teardown of torch (about 0.5 s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------- the rank template
class _Forked:
    """A rank forked by the template and re-parented to this process (a child subreaper): the
    part of ``subprocess.Popen`` a pool uses (``pid``, ``poll``, ``wait``, ``terminate``,
    ``kill``, ``returncode``), on ``os.waitpid``. A lock makes the reaping of the exit status
    happen once when two threads ask (:meth:`Pool.close` from another thread)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: its status is lost
                    self.returncode = -255
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            time.sleep(min(delay, 0.05) if left is None else max(0.0, min(delay, left, 0.05)))
            delay *= 2
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)


class _Template:
    """A child process that has imported torch once and forks ranks on request, so a pool's
    (re)start costs a ``fork`` per rank instead of a fresh interpreter importing torch (2 s of
    CPU per rank on the machines the book is tested on; the chapters' fault tests restart pools
    dozens of times). One per process, started with the first pool, in its own session, and
    exiting with this process (:func:`die_with_parent`).

    A rank must stay this process's child, so that its exit status can be read (a
    :class:`WorkerDied` names it): this process makes itself a child subreaper
    (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4, proc(5)/prctl(2)), the template forks an
    intermediate process that forks the rank and exits at once, and the orphaned rank is
    re-parented to the nearest subreaper above it: this process. The template answers with the
    rank's pid only once the intermediate process is reaped, so the rank is this process's child
    by then. The rank then runs in a new session, with the environment and ``sys.path`` the
    pool sends it, exactly as a spawned rank does. Where any of this is unavailable (not Linux,
    ``$PARMEM_RANK_START=spawn``, the template failing to start) ranks are spawned as fresh
    interpreters. A side effect to know: orphans of other descendants of this process are
    re-parented to it too (and stay zombies unless it waits for them)."""

    def __init__(self, proc: Any, conn: Any):
        self.proc, self.conn, self.owner = proc, conn, os.getpid()
        self.is_ready = False

    @classmethod
    def start(cls, env: dict[str, str], main: str) -> _Template:
        import ctypes
        import subprocess
        import sys
        from multiprocessing import Pipe

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
        parent, child = Pipe()
        cmd = [sys.executable, "-c",
               "from parmem.distributed.launcher import template_main; template_main()",
               str(child.fileno()), str(os.getpid()), main]  # fmt: skip
        try:
            proc = subprocess.Popen(cmd, pass_fds=(child.fileno(),), env=env,
                                    start_new_session=True)  # fmt: skip
        finally:
            child.close()
        return cls(proc, parent)

    def ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the template to have imported torch."""
        try:
            self.is_ready = bool(self.conn.poll(timeout)) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            self.is_ready = False
        return self.is_ready

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None and not self.conn.closed

    def fork(self, child: Any, env: dict[str, str], main: str) -> _Forked:
        """A rank forked with the socket ``child`` as its end of the pool's pair, this
        process's working directory and standard input, output and error (as they are now: a
        spawned rank inherits them at its start too); ``OSError`` when the template does not
        answer within :data:`TEMPLATE_TIMEOUT_S`. One exchange at a time (:data:`_TEMPLATE_LOCK`:
        pools of several threads share the template)."""
        from multiprocessing.reduction import send_handle

        with _TEMPLATE_LOCK:
            try:
                self.conn.send((os.getpid(), main, env, os.getcwd()))
                for fd in (child.fileno(), 0, 1, 2):
                    send_handle(self.conn, fd, self.proc.pid)
                if not self.conn.poll(TEMPLATE_TIMEOUT_S):
                    raise OSError("the rank template did not answer")
                pid = self.conn.recv()
            except (EOFError, OSError, ValueError) as e:
                self.close()
                raise OSError(f"the rank template failed: {e}") from None
        if not isinstance(pid, int):
            self.close()
            raise OSError(f"the rank template failed: {pid}")
        return _Forked(pid)

    def close(self) -> None:
        """Stop the template and what it started that is still in its group (an intermediate
        process; a rank leads its own session and is stopped by its pool)."""
        import signal
        import subprocess

        self.conn.close()
        _kill_group(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


#: this process's rank template (:class:`_Template`), once started
_TEMPLATE: dict[str, Any] = {"template": None}
#: held while the template is started or asked for a rank (pools in several threads share it)
_TEMPLATE_LOCK = threading.RLock()
#: ``$PARMEM_RANK_START``: ``fork`` (from the template, the default on Linux) or ``spawn``
RANK_START_ENV = "PARMEM_RANK_START"
_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>
#: seconds the rank template may take to import torch, and to answer a fork (a pool's own
#: ``start_timeout`` bounds the ranks' joining; the template is started once per process)
TEMPLATE_TIMEOUT_S = 120.0


def _template(begin_only: bool = False) -> _Template | None:
    """This process's rank template, started if need be (``begin_only``: without waiting for it
    to be ready, so that it imports torch while this process does too); ``None`` where ranks
    are spawned."""
    import sys

    if os.environ.get(RANK_START_ENV, "fork") != "fork" or not sys.platform.startswith("linux"):
        return None
    with _TEMPLATE_LOCK:
        return _template_locked(begin_only)


def _template_locked(begin_only: bool) -> _Template | None:
    t = _TEMPLATE["template"]
    if t is None or not t.alive():
        if t is not None and t.owner == os.getpid():
            t.close()
        _TEMPLATE["template"] = None
        try:
            t = _Template.start(_rank_env(), _main_flag())
        except OSError:
            return None
        _TEMPLATE["template"] = t
    if begin_only or t.is_ready:
        return t
    if not t.ready(TEMPLATE_TIMEOUT_S):
        t.close()
        _TEMPLATE["template"] = None
        return None
    return t


def _rank_env() -> dict[str, str]:
    """The environment of a rank: this process's, one BLAS thread unless it says otherwise, and
    parmem importable (a source checkout need not be installed)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }


def _main_flag() -> str:
    """``"1"`` when called from the main thread: the parent-death signal follows the thread that
    starts a process, so it is only asked for from the main thread, which lives as long as this
    process."""
    return "1" if threading.current_thread() is threading.main_thread() else "0"


def template_main() -> None:
    """Entry point of the rank template (``python -c ... FD PARENT_PID DEATH_SIGNAL``): import
    torch once, then fork one rank per request until the parent closes the socket."""
    import sys
    from multiprocessing.connection import Connection
    from multiprocessing.reduction import recv_handle

    conn = Connection(int(sys.argv[1]))
    parent = int(sys.argv[2])
    die_with_parent(parent, sys.argv[3] == "1")
    import torch  # noqa: F401  (what the ranks share)
    import torch.distributed  # noqa: F401

    conn.send("ready")
    while True:
        try:
            owner, main, env, cwd = conn.recv()
            fds = [recv_handle(conn) for _ in range(4)]  # the socket, stdin, stdout, stderr
        except (EOFError, OSError):
            os._exit(0)
        try:
            conn.send(_fork_rank(conn, fds, owner, main == "1", env, cwd))
        except Exception as e:  # the parent reads the reason: no pid
            conn.send(f"{type(e).__name__}: {e}")
        finally:
            for fd in fds:
                os.close(fd)


def _fork_rank(
    conn: Any, fds: list[int], owner: int, death_signal: bool, env: dict[str, str], cwd: str
) -> int:
    """In the template: fork an intermediate process that forks the rank and exits; the rank's
    pid once the intermediate is reaped (the rank is then re-parented to ``owner``)."""
    r, w = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    if middle == 0:  # the intermediate process
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:  # the rank
                os.close(w)
                _forked_rank(conn, fds, owner, death_signal, env, cwd)
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read()
    os.waitpid(middle, 0)
    if not text:
        raise OSError("the intermediate process did not fork the rank")
    return int(text)


def _forked_rank(
    conn: Any, fds: list[int], owner: int, death_signal: bool, env: dict[str, str], cwd: str
) -> None:
    """A forked rank: wait to be re-parented to the pool's process, take the pool's environment,
    working directory and standard streams (``fds``: its socket, then stdin, stdout, stderr),
    lead a new session, then live as a spawned rank does (:func:`_rank_body`); never returns.
    What the interpreter read when the template started stays the template's: ``PYTHONHASHSEED``
    and the like, and the environment torch read on import (a rank sets its threads itself)."""
    import sys
    from multiprocessing.connection import Connection

    try:
        conn.close()  # the template's socket is not the rank's
        deadline = time.monotonic() + 10.0
        while os.getppid() != owner:  # the intermediate process is exiting
            if time.monotonic() > deadline:
                os._exit(1)
            time.sleep(0.001)
        os.setsid()
        for target, fd in zip((0, 1, 2), fds[1:], strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        # the command line of a spawned rank (rank_main's): FD PARENT_PID DEATH_SIGNAL
        sys.argv[1:] = [str(fds[0]), str(owner), "1" if death_signal else "0"]
        _rank_body(Connection(fds[0]), owner, death_signal)
    except BaseException:  # a spawned rank's interpreter would print it too
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(1)


def _kill_group_members() -> None:
    """SIGKILL every other process of this process's group when it leads one (a pool's rank:
    the processes its tasks started), read from ``/proc`` (Linux; elsewhere the parent's
    ``killpg`` after the rank exits is all there is)."""
    import signal

    me = os.getpid()
    if os.getpgrp() != me or not os.path.isdir("/proc"):
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == me:  # field 5 of proc(5): the process group id
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours
            pass


def die_with_parent(parent: int, death_signal: bool = True) -> None:
    """Make this process exit when process ``parent`` dies, whatever it is doing: a rank runs in
    its own session (a notebook kernel's interrupt does not reach it), so nothing else would stop
    it when its parent is killed.

    Two mechanisms: on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (the kernel kills this
    process the moment the thread that started it exits; only asked for when ``death_signal``,
    i.e. the pool was started from the main thread, which lives as long as the process); and,
    everywhere, a daemon thread that checks every ``WATCHDOG_S`` seconds whether this
    process was re-parented (``os.getppid() != parent``) and then exits. A parent that died
    before either was in place is caught by the first check."""
    import sys
    import threading

    if death_signal and sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc symbol: the watchdog still works
            pass
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCHDOG_S)
        if os.getpgrp() == os.getpid():  # a pool's rank leads its group: take its task's
            import signal  # processes with it (this process too)

            os.killpg(os.getpid(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="parmem-parent-watchdog", daemon=True).start()


def _worker(
    rank_: int, ws: int, host: str, port: int, backend_: str, timeouts: tuple[float, float], conn
) -> None:
    """Body of one rank: join the group, then run tasks until told to stop. Every reply carries
    the id of the message it answers (``0``: the start), so the parent never takes a reply to an
    earlier request for the answer to the current one.

    ``timeouts``: the group's (``pg_timeout``) and the start's (``start_timeout``). The
    rendezvous (the store's connect, gloo's full-mesh connect, which waits for every peer's
    address) waits up to the longer of the two: on a loaded machine a peer may take seconds more
    to import torch than this rank, and a short group timeout must not fail the start. Once joined,
    the group and the store take ``pg_timeout``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    try:
        pg_timeout, start_timeout = timeouts
        timeout = timedelta(seconds=pg_timeout)
        join = timedelta(seconds=max(pg_timeout, start_timeout))
        store = dist.TCPStore(host, port, world_size=ws, is_master=False, timeout=join)
        set_state(rank_, ws, backend_)
        kw = {"device_id": device()} if backend_ == "nccl" else {}
        dist.init_process_group(
            backend_, store=store, rank=rank_, world_size=ws, timeout=join, **kw
        )
        if join != timeout:
            from torch.distributed.distributed_c10d import _set_pg_timeout

            _set_pg_timeout(timeout)
            store.set_timeout(timeout)
        conn.send((0, "ready", None))
    except BaseException:
        _reply(conn, 0, "error", traceback.format_exc())
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        task, target, blob, seed = msg
        try:
            kwargs = pickle.loads(blob)  # here, so an argument that cannot be read is an error
            torch.manual_seed(seed)
            conn.send_bytes(_pickle((task, "ok", resolve(target)[1](**kwargs))))
        except BaseException as e:
            kind = "collective" if _is_peer_error(e) else "error"
            if not _reply(conn, task, kind, traceback.format_exc()):
                break
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _is_peer_error(e: BaseException) -> bool:
    """Whether ``e`` is a collective or store failure (torch's ``DistError`` family, or gloo's
    runtime errors about a peer's connection or a timeout): the sign of another rank's fault, not
    of this rank's own code."""
    import torch.distributed as dist

    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in _PEER_MARKERS)


def exit_status(code: int | None) -> str:
    """A process's exit status in words: ``"exit code 3"``, ``"exit code -9 (killed by
    SIGKILL)"``, ``"an unknown exit code"``."""
    import signal

    if code is None:
        return "an unknown exit code"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"exit code {code} (killed by {name})"
    return f"exit code {code}"


def _reply(conn, task: int, kind: str, payload: object) -> bool:
    """Send one reply; ``False`` when the parent is gone."""
    try:
        conn.send_bytes(_pickle((task, kind, payload)))
    except OSError:
        return False
    return True


def _pickle(obj: object) -> bytes:
    """``obj`` pickled by value with the standard pickler (see the module's notes: not
    ``Connection.send``, whose ``ForkingPickler`` shares a tensor's storage by file descriptor,
    which only works between processes that share an ``authkey``); the other side reads it with
    ``Connection.recv``."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


@contextlib.contextmanager
def _sigint_deferred():
    """Hold a Ctrl-C back until the block is done, then deliver it: ``KeyboardInterrupt`` is
    raised on leaving the block (from inside an exception being raised, it is chained to it).

    Used around the steps that an interrupt must not cut short: importing torch (a second
    import after an interrupted one aborts the process), spawning the ranks (a process started
    but not yet recorded would be left running) and stopping them. Python runs signal handlers
    in the main thread only, so elsewhere there is nothing to defer; a ``SIGINT`` that is ignored
    stays ignored. Source: the ``signal`` module's documentation (handlers run in the main
    thread, between bytecode instructions)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN or previous is None:
        yield
        return
    got: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if got:
            if callable(previous):
                previous(signal.SIGINT, None)  # default_int_handler raises KeyboardInterrupt
            else:  # SIG_DFL: the default action, now that the block is done
                os.kill(os.getpid(), signal.SIGINT)


def _seconds(name: str, value: object) -> float:
    return number(name, value, 0.0, MAX_TIMEOUT_S, lo_open=True)


class Pool:
    """``world_size`` spawned ranks in one process group, reused for many :meth:`run` calls.

    Parameters (checked here, before any process starts): ``world_size`` (1 to
    :data:`MAX_WORLD_SIZE`; default :func:`default_world_size`), ``backend`` (``"gloo"``;
    ``"nccl"`` needs one GPU per rank), ``pg_timeout`` (seconds for every collective and store
    wait once the ranks have joined), ``start_timeout`` (seconds for all ranks to join: the
    rendezvous waits up to the longer of the two); timeouts are finite numbers
    of seconds, more than 0 and at most :data:`MAX_TIMEOUT_S`; ``share``: relay to the
    :class:`PoolServer` at ``$PARMEM_SHARED_POOL`` when one serves this world size and backend.

    Guarantees: a start that fails or is interrupted (Ctrl-C) stops every rank it started, so the
    next call starts afresh; each task carries an id and only replies with that id are results;
    the ranks run in their own session, so interrupting a notebook cell does not kill them, and
    they exit when this process dies (:func:`die_with_parent`); a task on a rank that died
    raises :class:`WorkerDied`. Ctrl-C is safe at every point: while torch is imported, the ranks
    are spawned or stopped, it is deferred to the end of that step (:func:`_sigint_deferred`).
    Processes a task starts are killed with its rank (each rank leads its own process group).

    Threads: :meth:`run`, :meth:`start` and :meth:`close` hold one lock, so calls from several
    threads run one after another, each getting the replies to its own task. :meth:`close` waits
    for a call in progress in another thread up to its ``timeout``, then stops the ranks under it
    (that call raises :class:`WorkerDied`).
    """

    def __init__(
        self,
        world_size: int | None = None,
        backend: str = "gloo",
        pg_timeout: float = 60.0,
        start_timeout: float = 120.0,
        *,
        share: bool = True,
    ):
        self.world_size = _check_world_size(
            default_world_size() if world_size is None else world_size
        )
        #: whether to relay to the :class:`PoolServer` at ``$PARMEM_SHARED_POOL`` when one serves
        #: this world size and backend (a server's own pool does not)
        self.share = bool(share)
        self.backend = choice("backend", backend, BACKENDS)
        self.pg_timeout = _seconds("pg_timeout", pg_timeout)
        self.start_timeout = _seconds("start_timeout", start_timeout)
        self._procs: list = []
        self._conns: list = []
        self._store: Any = None
        self._task = 0
        self._shared: Any = None  # the connection to a PoolServer, when relaying to one
        self.start_seconds: float | None = None
        # held by run, start and close: one call at a time, whatever thread it comes from
        self._lock = threading.RLock()

    # -- life cycle -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Whether the ranks are started and every one of them is still running (for a shared
        pool: whether it is connected to the server)."""
        if self._shared is not None:
            return not self._shared.closed
        return bool(self._procs) and all(p.poll() is None for p in self._procs)

    @property
    def shared(self) -> bool:
        """Whether this pool relays its tasks to a :class:`PoolServer` (``$PARMEM_SHARED_POOL``)."""
        return self._shared is not None

    def start(self) -> Pool:
        """Start the ranks and wait until all have joined the process group. A start that fails
        or is interrupted stops the ranks it started before re-raising. With
        ``$PARMEM_SHARED_POOL`` set, connect to that server instead when it serves this world
        size and backend."""
        with self._lock:
            return self._start()

    def _start(self) -> Pool:
        if self._procs or self._shared is not None:
            return self
        if self._connect_shared():
            self.start_seconds = 0.0
            return self
        with _sigint_deferred():  # an interrupted import of torch cannot be retried
            _template(begin_only=True)  # it imports torch while this process does
            import torch
            import torch.distributed  # noqa: F401

        timeout = _seconds("start_timeout", self.start_timeout)
        if self.backend == "nccl" and torch.cuda.device_count() < self.world_size:
            raise ValueError(
                f"backend='nccl' needs world_size={self.world_size} GPUs; "
                f"{torch.cuda.device_count()} visible (use backend='gloo')"
            )
        t0 = time.perf_counter()
        try:
            with _sigint_deferred():  # every process started is recorded in self._procs
                self._spawn()
            self._collect(0, "<start>", timeout)
        except BaseException:
            self._teardown()
            raise
        self.start_seconds = time.perf_counter() - t0
        return self

    def _spawn(self) -> None:
        """Start the store and one process per rank, each in its own session."""
        import subprocess
        import sys
        from datetime import timedelta
        from multiprocessing import Pipe

        import torch.distributed as dist

        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            world_size=self.world_size + 1,
            is_master=True,
            timeout=timedelta(seconds=max(self.pg_timeout, self.start_timeout)),
            wait_for_workers=False,
        )
        env = _rank_env()
        main = _main_flag()
        template = _template()
        for r in range(self.world_size):
            parent, child = Pipe()  # a socket pair on POSIX
            try:
                p: Any = None
                if template is not None:
                    try:
                        p = template.fork(child, env, main)
                    except OSError:
                        template = None  # spawned from here on; a new template next start
                        # a rank forked before the template failed may hold this pair: a new one
                        parent.close()
                        child.close()
                        parent, child = Pipe()
                if p is None:
                    cmd = [
                        sys.executable,
                        "-c",
                        "from parmem.distributed.launcher import rank_main; rank_main()",
                        str(child.fileno()),
                        str(os.getpid()),
                        main,
                    ]
                    p = subprocess.Popen(
                        cmd, pass_fds=(child.fileno(),), env=env, start_new_session=True
                    )
            finally:
                child.close()
            self._procs.append(p)
            self._conns.append(parent)
            parent.send(
                (
                    r,
                    self.world_size,
                    "127.0.0.1",
                    self._store.port,
                    self.backend,
                    (self.pg_timeout, self.start_timeout),
                    list(sys.path),
                )
            )

    def _connect_shared(self) -> bool:
        """Connect to the :class:`PoolServer` at ``$PARMEM_SHARED_POOL``; whether this pool now
        relays to it (not when it is unset, unreachable, or serves another world size or
        backend)."""
        from multiprocessing.connection import Client

        address = os.environ.get(SHARED_POOL_ENV)
        if not address or not self.share:
            return False
        try:
            conn = Client(address, family="AF_UNIX")
            conn.send(("hello", None))
            if not conn.poll(SHARED_START_S):
                raise OSError("the server did not answer")
            served = conn.recv()
        except (OSError, EOFError):
            return False
        if served != ("ok", (self.world_size, self.backend)):
            conn.close()
            return False
        self._shared = conn
        return True

    def _run_shared(self, name: str, kwargs: dict, seed: int, timeout: float) -> list:
        """Relay one task to the server; its results, or its error raised here."""
        conn = self._shared
        try:
            # the task pickled by value (:func:`_pickle`), inside a message of plain bytes
            conn.send(("run", _pickle((name, kwargs, seed, timeout))))
            if not conn.poll(timeout + SHARED_START_S):
                raise RunTimeout(
                    f"{name}: the shared pool did not answer within {timeout + SHARED_START_S:g} s"
                )
            kind, payload = conn.recv()
        except BaseException:
            # an interrupt, a timeout or a server that is gone: this pool is done with it (the
            # server finishes the task and drops the result); the next run connects again
            self._close_shared()
            raise
        if kind == "ok":
            return payload
        raise _error_from_state(kind, payload)

    def _close_shared(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the ranks: ask politely, join, then terminate and kill stragglers (a shared
        pool only disconnects: the server's ranks serve the next client). A Ctrl-C meanwhile is
        raised once the ranks are gone. A call in progress in another thread is waited for up to
        ``timeout`` seconds, then its ranks are stopped (it raises :class:`WorkerDied`)."""
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            # the call holding the lock sees its ranks gone and returns (a start in progress
            # may spawn more: stopped in turn, until the lock is free)
            while not self._lock.acquire(timeout=0.05):
                self._stop_processes()
        try:
            with _sigint_deferred():
                self._close_shared()
                for c in self._conns:
                    try:
                        c.send(None)
                    except (OSError, ValueError):
                        pass
                self._reap(timeout)
        finally:
            self._lock.release()

    def _stop_processes(self) -> None:
        """Kill the ranks and their process groups without touching this pool's state (used
        while another thread holds the lock; that thread then cleans up)."""
        for p in list(self._procs):
            if p.poll() is None:
                p.kill()
            _kill_group(p.pid)

    def _teardown(self) -> None:
        """Stop every rank now (terminate, then kill) and forget them."""
        self._close_shared()
        self._reap(0.0)

    def _reap(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the ranks to exit, terminate the rest, give them 2 s
        (together), then kill what is left; then kill what is left in each rank's process group
        (processes its tasks started). A Ctrl-C meanwhile is raised once this is done."""
        with _sigint_deferred():
            for grace, stop in ((timeout, "terminate"), (2.0, "kill")):
                deadline = time.monotonic() + grace
                for p in self._procs:
                    if not _exited(p, deadline - time.monotonic()):
                        getattr(p, stop)()
            for p in self._procs:
                _exited(p, 2.0)
                _kill_group(p.pid)
                if isinstance(p, _Forked) and p.poll() is not None:
                    _reap_group(p.pid)
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

        ``target``, the keyword arguments (they must fit its signature and be picklable),
        ``timeout`` (seconds) and ``seed`` are checked before any rank starts. Raises
        :class:`RankError` (a rank raised), :class:`WorkerDied` (a rank exited, also one that died
        while the pool was idle) or :class:`RunTimeout`; in each case, and when interrupted, the
        pool is torn down and the next ``run`` restarts it.
        """
        name, fn = resolve(target)
        timeout = _seconds("timeout", timeout)
        seed = integer("seed", seed, 0, 2**63 - 1)
        check_kwargs(name, fn, kwargs)
        blob = _dumps(name, kwargs)
        with self._lock:  # one call at a time: each reads the replies to its own task
            self._task += 1
            task = self._task
            data = _pickle((task, name, blob, seed))
            self._start()
            if self._shared is not None:
                return self._run_shared(name, kwargs, seed, timeout)
            try:
                self._send_all(name, data)
                return self._collect(task, name, timeout)
            except (RankError, RunTimeout):
                raise
            except BaseException:  # KeyboardInterrupt in a notebook: never leave ranks running
                self._teardown()  # a task whose result nobody will read
                raise

    def _send_all(self, name: str, data: bytes) -> None:
        """Send one task to every rank; a rank found dead (before or while sending) is a
        :class:`WorkerDied`, and the pool is torn down."""
        for r, p in enumerate(self._procs):
            if p.poll() is not None:
                raise self._died(r, name, "while the pool was idle")
        for r, c in enumerate(self._conns):
            try:
                c.send_bytes(data)
            except OSError:
                raise self._died(r, name, "before it received the task") from None

    def _died(self, r: int, name: str, when: str) -> WorkerDied:
        """Tear the pool down; the :class:`WorkerDied` to raise for rank ``r``."""
        try:
            code = self._procs[r].wait(2.0)
        except Exception:
            code = None
        self._teardown()
        return WorkerDied(
            r,
            name,
            f"process exited with {exit_status(code)} {when}; the pool "
            "was torn down and the next run starts fresh ranks",
            exit_code=code,
        )

    def _receive(self, r: int, task: int) -> tuple[str, Any] | None:
        """Rank ``r``'s reply to ``task``: ``(kind, payload)``, ``("died", None)`` at EOF, or
        ``None`` for a reply to another (earlier) message, which is dropped."""
        try:
            msg = self._conns[r].recv()
        except (EOFError, OSError):
            return "died", None
        except Exception as e:  # a result this process cannot unpickle
            return "error", f"its result could not be read here: {type(e).__name__}: {e}"
        if not (isinstance(msg, tuple) and len(msg) == 3 and msg[0] == task):
            return None
        return msg[1], msg[2]

    def _collect(self, task: int, name: str, timeout: float) -> list:
        """Wait for every rank's reply to ``task``; on a failure, tear the pool down and raise the
        root cause (:meth:`_root_cause`)."""
        from multiprocessing.connection import wait

        n = self.world_size
        results: list = [None] * n
        pending = set(range(n))
        errors: dict[int, tuple[str, object]] = {}
        deadline = time.monotonic() + timeout
        grace: float | None = None  # set when a rank failed in a collective: wait for the rest
        while pending:
            now = time.monotonic()
            if errors and (grace is None or now >= grace):
                break
            left = deadline - now
            if left <= 0:
                if errors:
                    break
                self._teardown()
                raise RunTimeout(
                    f"{name} did not finish within {timeout:g} s on ranks "
                    f"{sorted(pending)}; the pool was torn down"
                )
            if grace is not None:
                left = min(left, grace - now)
            handles = {self._conns[r]: r for r in pending}  # EOF when a rank's process dies
            for h in wait(list(handles), timeout=min(left, 1.0)):
                r = handles[h]
                reply = self._receive(r, task)
                if reply is None:
                    continue
                kind, payload = reply
                if kind in ("died", "error", "collective"):
                    errors[r] = (kind, payload)
                else:  # "ok" (a task's result) or "ready" (the start)
                    results[r] = payload
                pending.discard(r)
            kinds = {k for k, _ in errors.values()}
            if kinds & {"died", "error"} or any(self._procs[r].poll() is not None for r in pending):
                break  # a cause of its own: decided now
            if errors and grace is None:
                grace = time.monotonic() + PEER_GRACE_S
        if errors or pending and any(self._procs[r].poll() is not None for r in pending):
            raise self._root_cause(name, errors, pending)
        return results

    def _root_cause(
        self, name: str, errors: dict[int, tuple[str, object]], pending: set[int]
    ) -> RankError:
        """Tear the pool down; the error to raise for a failed task. The cause, in this order:
        the first rank whose process exited (its peers' collectives fail because of it), a rank
        that raised an error of its own, a rank still busy while the others failed in a
        collective (it hung), else the first rank that failed in a collective. ``others``: every
        other rank that failed or was still running."""
        dead = [r for r, (kind, _) in errors.items() if kind == "died"]
        dead += [
            r for r in range(self.world_size) if r not in dead and self._procs[r].poll() is not None
        ]
        codes = {r: self._exit_code(r) for r in dead}
        self._teardown()
        failed = set(errors) | pending | set(dead)

        def others(root: int) -> tuple[int, ...]:
            return tuple(sorted(failed - {root}))

        if dead:
            r = dead[0]
            also = ""
            if others(r):
                also = (
                    f"; ranks {list(others(r))} failed or were stopped because it was gone "
                    "(a peer's collective fails when its connection closes)"
                )
            return WorkerDied(
                r,
                name,
                f"process exited with {exit_status(codes[r])}{also}",
                others(r),
                exit_code=codes[r],
            )
        own = [r for r, (kind, _) in errors.items() if kind == "error"]
        if own:
            r = own[0]
            return RankError(r, name, str(errors[r][1]), others(r))
        if pending:
            r = min(pending)
            waited = sorted(errors)
            first = waited[0]
            return RankHung(
                r,
                name,
                f"still running when ranks {waited} failed in a collective "
                f"that waited for it (it hung, or it skipped the "
                f"collective); rank {first}'s error:\n{errors[first][1]}",
                others(r),
            )
        r = next(iter(errors))
        return RankError(r, name, str(errors[r][1]), others(r))

    def _exit_code(self, r: int) -> int | None:
        try:
            return self._procs[r].wait(2.0)
        except Exception:
            return None


def _error_state(e: BaseException) -> tuple[str, object]:
    """An error of :meth:`Pool.run` as plain data, to send from a :class:`PoolServer`."""
    if isinstance(e, RankError):
        return "rank", (
            type(e).__name__,
            e.rank,
            e.target,
            e.traceback,
            e.others,
            getattr(e, "exit_code", None),
        )
    if isinstance(e, RunTimeout):
        return "timeout", str(e)
    if isinstance(e, (ValueError, TypeError)):
        return type(e).__name__, str(e)
    return "other", f"{type(e).__name__}: {e}"


def _error_from_state(kind: str, payload: Any) -> Exception:
    """The error :func:`_error_state` described, rebuilt in the client."""
    if kind == "rank":
        cls_name, r, target, tb, others, code = payload
        if cls_name == "WorkerDied":
            return WorkerDied(r, target, tb, tuple(others), exit_code=code)
        cls = {"RankHung": RankHung}.get(cls_name, RankError)
        return cls(r, target, tb, tuple(others))
    if kind == "timeout":
        return RunTimeout(payload)
    if kind in ("ValueError", "TypeError"):
        return {"ValueError": ValueError, "TypeError": TypeError}[kind](payload)
    return RuntimeError(f"the shared pool failed: {payload}")


class PoolServer:
    """One :class:`Pool` served to the processes that connect to a Unix socket, one client at a
    time, in a thread of this process (``with PoolServer(2) as server: os.environ[
    SHARED_POOL_ENV] = server.address``).

    The chapters' test run starts one per test worker: every notebook's kernel then relays its
    ``Pool`` to the same ranks, which start (and import torch and the engines' modules) once.
    A client's tasks run exactly as on a pool of its own: the same seeds, results and errors;
    a task that fails tears the ranks down and the next one starts fresh ranks. A client that
    disconnects in the middle of a task (an interrupt) leaves the server to finish that task
    and drop its result. The socket lives in a new private folder (mode 0700), so only this
    user can connect; :meth:`close` stops the ranks and removes it."""

    def __init__(
        self,
        world_size: int | None = None,
        backend: str = "gloo",
        pg_timeout: float = 60.0,
        start_timeout: float = 120.0,
    ):
        import tempfile
        import threading
        from multiprocessing.connection import Listener

        self.pool = Pool(world_size, backend, pg_timeout, start_timeout, share=False)
        self._dir = tempfile.mkdtemp(prefix="parmem-pool-")
        self.address = os.path.join(self._dir, "pool.sock")
        self._listener = Listener(self.address, family="AF_UNIX")
        self._closed = False
        self.served = 0  # tasks run for clients
        self._thread = threading.Thread(target=self._serve, name="parmem-pool-server", daemon=True)
        self._thread.start()

    def __enter__(self) -> PoolServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except OSError:  # the listener was closed
                return
            with conn:
                self._handle(conn)

    def _handle(self, conn) -> None:
        while True:
            try:
                op, payload = conn.recv()
            except (EOFError, OSError, ValueError, TypeError):
                return
            if op == "hello":
                reply: tuple = ("ok", (self.pool.world_size, self.pool.backend))
            else:
                try:
                    name, kwargs, seed, timeout = pickle.loads(payload)
                    reply = ("ok", self.pool.run(name, timeout=timeout, seed=seed, **kwargs))
                except Exception as e:
                    reply = _error_state(e)
                self.served += 1
            try:
                conn.send_bytes(_pickle(reply))
            except OSError:
                return

    def close(self) -> None:
        """Stop serving, stop the ranks, remove the socket."""
        import shutil
        from multiprocessing.connection import Client

        if self._closed:
            return
        self._closed = True
        try:  # wake the accept() of the serving thread (closing the listener may not)
            Client(self.address, family="AF_UNIX").close()
        except OSError:
            pass
        self._thread.join(5.0)
        self._listener.close()
        self.pool.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of the process group ``pgid`` (a rank's: it was started in a new
    session, so its pid is the group's id, and the processes its tasks started are in it). The
    group id cannot be reused while any member lives; a group already empty is a no-op."""
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_group(pgid: int, seconds: float = 1.0) -> None:
    """Wait for what is left of a forked rank's process group (processes its tasks started,
    killed by :func:`_kill_group`): as a child subreaper, this process adopted the ones whose
    parent exited, and would keep them as zombies. Only members of that group are waited for
    (``waitpid(-pgid)``), for at most ``seconds``; the rank itself is reaped already."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:  # no child left in that group
            return
        if pid == 0:  # one is still dying
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)


def _exited(p, seconds: float) -> bool:
    """Wait up to ``seconds`` for process ``p``; whether it has exited (and been reaped)."""
    import subprocess

    try:
        p.wait(max(0.0, seconds))
    except subprocess.TimeoutExpired:
        return False
    return True


def check_kwargs(name: str, fn, kwargs: dict) -> None:
    """Raise ``TypeError`` naming ``name`` unless ``fn`` accepts ``kwargs`` (checked here, so a
    misspelt argument fails before any rank starts)."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: let the ranks find out
        return
    try:
        sig.bind(**kwargs)
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None


def _dumps(name: str, kwargs: dict) -> bytes:
    """A task's keyword arguments pickled by value (:func:`_pickle`); a ``ValueError`` naming
    the task when they cannot be."""
    try:
        return _pickle(kwargs)
    except Exception as e:
        raise ValueError(
            f"the arguments of {name} cannot be sent to the ranks (they must be "
            f"picklable): {type(e).__name__}: {e}"
        ) from None


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
