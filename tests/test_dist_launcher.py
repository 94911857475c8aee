"""The rank pool: reuse, failures that fail fast, no port collisions, the CLI and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from parmem.dist import DEMOS, Pool, RankError, RankHung, RunTimeout, WorkerDied  # noqa: E402
from parmem.dist.__main__ import _kwargs  # noqa: E402
from parmem.dist.launcher import default_world_size, format_results, resolve  # noqa: E402

pytestmark = pytest.mark.dist

N = 2  # the failure tests need two ranks; more would only cost start-up time


@pytest.fixture(scope="module")
def pool():
    # a short group timeout, so the "rank skips a collective" test waits 3 s, not 60
    with Pool(world_size=N, pg_timeout=3.0) as p:
        yield p


def test_run_returns_one_result_per_rank_and_reuses_processes(pool):
    first = pool.run("parmem.dist.checks:ping")
    again = pool.run("parmem.dist.checks:ping")
    assert [r["rank"] for r in first] == list(range(N))
    assert all(r["world_size"] == N and r["backend"] == "gloo" for r in first)
    assert all(r["rank_sum"] == N * (N - 1) // 2 for r in first)  # the all-reduce worked
    assert [r["pid"] for r in first] == [r["pid"] for r in again]  # started once, reused


def test_a_function_object_is_accepted():
    from parmem.dist import checks

    assert resolve(checks.ping) == ("parmem.dist.checks:ping", checks.ping)


def test_rank_that_raises_fails_fast_with_its_traceback_and_the_pool_restarts(pool):
    t0 = time.perf_counter()
    with pytest.raises(RankError) as info:
        pool.run("parmem.dist.checks:raise_on", which=1, message="boom from rank one")
    assert time.perf_counter() - t0 < 10  # not the 3 s group timeout of the waiting rank, x3
    err = info.value
    assert err.rank == 1 and "ValueError: boom from rank one" in str(err)
    assert "rank 1 failed in parmem.dist.checks:raise_on" in str(err)
    assert not pool.alive  # torn down...
    assert [r["rank"] for r in pool.run("parmem.dist.checks:ping")] == list(range(N))  # ...restarted


def test_run_deadline(pool):
    t0 = time.perf_counter()
    with pytest.raises(RunTimeout):
        pool.run("parmem.dist.checks:sleep", seconds=30, timeout=0.5)
    assert time.perf_counter() - t0 < 20  # far below the 30 s sleep, with room for a busy CI
    assert not pool.alive


def test_group_timeout_turns_a_hang_into_an_error(pool):
    """Rank 1 skips an all-reduce; rank 0 would wait forever without the group's timeout."""
    t0 = time.perf_counter()
    with pytest.raises(RankError) as info:
        pool.run("parmem.dist.checks:skip_collective", which=1)
    assert info.value.rank == 0
    assert 2.5 < time.perf_counter() - t0 < 30


def test_two_pools_at_once_do_not_collide():
    with Pool(world_size=2) as a, Pool(world_size=2) as b:
        ra, rb = a.run("parmem.dist.checks:ping"), b.run("parmem.dist.checks:ping")
    assert [r["rank_sum"] for r in ra + rb] == [1, 1, 1, 1]
    assert {r["pid"] for r in ra}.isdisjoint(r["pid"] for r in rb)


def test_default_world_size(monkeypatch):
    monkeypatch.delenv("PARMEM_WORLD_SIZE", raising=False)
    monkeypatch.setenv("CI", "true")
    assert default_world_size() == 2
    monkeypatch.delenv("CI")
    assert default_world_size() == 4
    monkeypatch.setenv("PARMEM_WORLD_SIZE", "3")
    assert default_world_size() == 3
    monkeypatch.setenv("PARMEM_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="PARMEM_WORLD_SIZE"):
        default_world_size()


@pytest.mark.parametrize("kw, field", [({"world_size": 0}, "world_size"),
                                       ({"world_size": 2.0}, "world_size"),
                                       ({"backend": "mpi"}, "backend"),
                                       ({"pg_timeout": 0}, "pg_timeout")])
def test_bad_pool_arguments(kw, field):
    with pytest.raises(ValueError, match=field):
        Pool(**kw)


@pytest.mark.parametrize("target", ["parmem.dist.checks", "no.such.module:fn",
                                    "parmem.dist.checks:nope", 42, lambda: 0])
def test_bad_targets_are_rejected_before_any_rank_starts(target):
    p = Pool(world_size=2)
    with pytest.raises(ValueError, match="target"):
        p.run(target)
    assert not p.alive


def test_format_results_one_column_per_rank():
    text = format_results([{"a": 1, "b": {"c": 0.5}}, {"a": 2, "b": {"c": 0.25}}])
    lines = text.splitlines()
    assert lines[0].split() == ["key", "rank", "0", "rank", "1"]
    assert lines[2].split() == ["a", "1", "2"] and lines[3].split() == ["b.c", "0.5", "0.25"]


def test_cli_kwargs_and_list():
    assert _kwargs(["schedule=gpipe", "v=2", "lr=1e-3", "flag=True"]) == {
        "schedule": "gpipe", "v": 2, "lr": 1e-3, "flag": True}
    with pytest.raises(SystemExit):
        _kwargs(["novalue"])
    out = subprocess.run([sys.executable, "-m", "parmem.dist", "--list"], check=True,
                         capture_output=True, text=True).stdout
    assert all(name in out for name in DEMOS)


def test_torchrun_runs_a_demo_on_each_rank():
    """``torchrun -m parmem.dist`` runs the function directly on each rank (gloo on CPU)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "parmem.dist", "collectives", "numel=64", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout[proc.stdout.index("["):])
    assert [r["all_reduce"]["bytes_sent"] for r in results] == [2 * 1 * 64 * 4 // 2] * 2


# ---------------------------------------------------------------------------- faults
# Each test below reproduces one failure of issue 21 that the pool used to have; every wait in
# them is bounded (subprocess timeouts, deadlines), so a regression fails instead of hanging.
TESTS = os.path.dirname(os.path.abspath(__file__))


def _gone(pid: int) -> bool:
    """The process has exited (a zombie that nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def _wait_gone(pids, seconds: float) -> list[int]:
    """Poll until every pid is gone or ``seconds`` pass; the ones still running."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if not _gone(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if not _gone(p)]


def _wait_for_file(path: str, seconds: float) -> bool:
    """Poll until ``path`` exists (a rank marks what it reached) or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _readline(proc, seconds: float) -> str:
    """The next line ``proc`` prints, or ``""`` when it prints none within ``seconds`` (a bare
    ``readline`` would wait forever on a child that hangs)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=seconds):
            return ""
    return proc.stdout.readline()


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_pool_arguments_are_checked_at_construction():
    for kw, field in [({"start_timeout": float("nan")}, "start_timeout"),
                      ({"start_timeout": float("inf")}, "start_timeout"),
                      ({"pg_timeout": "5"}, "pg_timeout"), ({"pg_timeout": -1}, "pg_timeout"),
                      ({"world_size": 10**6}, "world_size"), ({"world_size": True}, "world_size"),
                      ({"backend": None}, "backend")]:
        with pytest.raises(ValueError, match=field):
            Pool(**{"world_size": 2, **kw})


def test_run_arguments_are_checked_before_any_rank_starts():
    p = Pool(world_size=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        p.run("parmem.dist.checks:ping", nope=1)
    with pytest.raises(ValueError, match="picklable"):
        p.run("parmem.dist.checks:sleep", seconds=lambda: 1)
    for kw, field in [({"timeout": float("nan")}, "timeout"), ({"timeout": 0}, "timeout"),
                      ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed")]:
        with pytest.raises(ValueError, match=field):
            p.run("parmem.dist.checks:ping", **kw)
    assert not p.alive and not p._procs


def test_no_stale_result_after_a_failed_start():
    """A start that times out used to leave the ranks running with their "ready" replies unread;
    the next run returned them ([None, None]) as its results."""
    p = Pool(world_size=2, start_timeout=0.05)
    with pytest.raises(RunTimeout, match="<start>"):
        p.run("parmem.dist.checks:ping")
    assert not p.alive and not p._procs  # the half-started ranks were stopped
    p.start_timeout = 120.0
    try:
        assert p.run("parmem.dist.checks:sleep", seconds=0) == [{"rank": 0}, {"rank": 1}]
        assert [r["rank_sum"] for r in p.run("parmem.dist.checks:ping")] == [1, 1]
    finally:
        p.close()


def test_no_stale_result_after_ctrl_c_during_the_lazy_start(monkeypatch):
    """Ctrl-C while ``run`` starts the ranks: the start is torn down, later runs are right.

    The interrupt is delivered at a known point, not raced against the start: once every rank
    has sent its "ready" (the replies a start that is not torn down would leave unread), this
    process sends itself SIGINT, as Ctrl-C or a kernel interrupt does, inside the start."""
    import signal
    from multiprocessing.connection import wait

    p = Pool(world_size=2)
    spawned: list = []
    collect = Pool._collect

    def interrupted_start(self, task, name, timeout):
        if task == 0:
            spawned.extend(self._procs)
            ready: set = set()
            deadline = time.monotonic() + 120
            while len(ready) < 2 and time.monotonic() < deadline:
                ready.update(wait(self._conns, timeout=deadline - time.monotonic()))
            assert len(ready) == 2, "the ranks never became ready"
            os.kill(os.getpid(), signal.SIGINT)
        return collect(self, task, name, timeout)

    monkeypatch.setattr(Pool, "_collect", interrupted_start)
    with pytest.raises(KeyboardInterrupt):
        p.run("parmem.dist.checks:ping")
    monkeypatch.undo()
    assert len(spawned) == 2 and all(proc.poll() is not None for proc in spawned)
    assert not p.alive
    try:
        assert [r["rank_sum"] for r in p.run("parmem.dist.checks:ping")] == [1, 1]
        assert p.run("parmem.dist.checks:sleep", seconds=0) == [{"rank": 0}, {"rank": 1}]
    finally:
        p.close()


def test_replies_are_matched_to_their_task(pool):
    """Replies carrying another task's id (left over from an earlier call) are dropped."""
    assert pool.run("dist_faults:stale_reply") == [{"rank": 0, "stale": False},
                                                   {"rank": 1, "stale": False}]
    assert [r["rank"] for r in pool.run("parmem.dist.checks:ping")] == [0, 1]


# ------------------------------------------------------------------ failure attribution
# Whatever rank reports first, the root cause is named: a rank whose process exited, or one that
# hung while its peers waited for it in a collective (their collectives fail with "Connection
# reset by peer" or a timeout). Each rank in turn, twice, since the order in which the ranks
# report is a race.
EACH_RANK_TWICE = pytest.mark.parametrize("which", [0, 1, 0, 1], ids=["r0", "r1", "r0-again",
                                                                      "r1-again"])


@EACH_RANK_TWICE
def test_a_rank_killed_while_idle_is_named(pool, which):
    """It used to raise a bare BrokenPipeError (or hang on the live ranks)."""
    pids = [r["pid"] for r in pool.run("parmem.dist.checks:ping")]
    os.kill(pids[which], 9)
    assert _wait_gone([pids[which]], 30) == []
    with pytest.raises(WorkerDied) as info:
        pool.run("parmem.dist.checks:ping")
    err = info.value
    assert err.rank == which and err.exit_code == -9, str(err)
    assert "code -9 (killed by SIGKILL)" in str(err) and not pool.alive
    assert [r["rank_sum"] for r in pool.run("parmem.dist.checks:ping")] == [1, 1]


@EACH_RANK_TWICE
def test_a_rank_that_exits_in_a_collective_is_named_not_its_peer(pool, which):
    """The peer's all-reduce fails too; the rank that exited is the cause, the peer is listed."""
    with pytest.raises(WorkerDied) as info:
        pool.run("dist_faults:exit_in_collective", which=which, code=3)
    err = info.value
    assert (err.rank, err.exit_code, err.others) == (which, 3, (1 - which,)), str(err)
    assert "exit code 3" in str(err) and not pool.alive


@pytest.mark.parametrize("which", [0, 1])
def test_a_rank_killed_during_an_all_reduce_loop_is_named(pool, which, tmp_path):
    """SIGKILL (the OOM killer, a Ctrl-C in the rank's terminal) while both ranks all-reduce: the
    survivor's gloo fails with a reset connection, and is listed, not named."""
    import threading

    pids = [r["pid"] for r in pool.run("parmem.dist.checks:ping")]
    started = tmp_path / "started"
    killed = threading.Event()

    def kill_once_started():
        if _wait_for_file(f"{started}.{which}", 120):
            os.kill(pids[which], 9)
            killed.set()

    t = threading.Thread(target=kill_once_started, daemon=True)
    t.start()
    try:
        with pytest.raises(WorkerDied) as info:
            pool.run("dist_faults:allreduce_loop", seconds=120, started=str(started), timeout=150)
    finally:
        t.join(130)
    assert killed.is_set()
    err = info.value
    assert (err.rank, err.exit_code, err.others) == (which, -9, (1 - which,)), str(err)


@pytest.mark.parametrize("which", [0, 1])
def test_a_rank_that_hangs_while_its_peer_waits_is_named(pool, which):
    """The peer's all-reduce times out (the group timeout, 3 s here) while the hung rank is
    still busy: RankHung names the hung rank, not the peer whose collective gave up."""
    t0 = time.perf_counter()
    with pytest.raises(RankHung) as info:
        pool.run("dist_faults:hang_in_collective", which=which, seconds=120, timeout=150)
    err = info.value
    assert (err.rank, err.others) == (which, (1 - which,)), str(err)
    assert f"rank {1 - which}'s error" in str(err) and not pool.alive
    assert time.perf_counter() - t0 < 100  # not the 120 s the rank sleeps


def test_a_hung_rank_is_stopped_by_the_run_timeout(pool):
    """A rank that ignores SIGTERM and never returns is killed when the run's deadline passes."""
    pids = [r["pid"] for r in pool.run("parmem.dist.checks:ping")]
    t0 = time.perf_counter()
    with pytest.raises(RunTimeout):
        pool.run("dist_faults:hang_ignoring_sigterm", seconds=60, timeout=1.0)
    assert time.perf_counter() - t0 < 15 and not pool.alive
    assert _wait_gone(pids, 5) == []


_IDLE_SCRIPT = """
import json, sys, time
sys.path.insert(0, {tests!r})
from parmem.dist import Pool
pool = Pool(world_size=2).start()
first = pool.run("parmem.dist.checks:ping")
try:
    print("ready", flush=True)
    time.sleep(60)  # an unrelated cell, the pool idle
except KeyboardInterrupt:
    print("interrupted", flush=True)
again = pool.run("parmem.dist.checks:ping")
print(json.dumps([[r["pid"] for r in first], [r["pid"] for r in again]]), flush=True)
pool.close()
"""


def test_an_interrupt_in_an_unrelated_cell_leaves_the_pool_usable():
    """A notebook kernel's interrupt signals its whole process group; the ranks used to be in it,
    died, and the next run raised BrokenPipeError. Now they run in their own session."""
    import signal

    proc = subprocess.Popen([sys.executable, "-c", _IDLE_SCRIPT.format(tests=TESTS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group, like a kernel's
    try:
        assert _readline(proc, 120).strip() == "ready", "the pool never started"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)
    assert proc.returncode == 0, err[-2000:]
    lines = out.splitlines()
    assert lines[0] == "interrupted"
    first, again = json.loads(lines[1])
    assert first == again  # the same ranks served both calls


_KILLED_SCRIPT = """
import sys, threading
sys.path.insert(0, {tests!r})
from parmem.dist import Pool
pool = Pool(world_size=2)
if {from_thread}:  # no parent-death signal then: the watchdog alone must stop the ranks
    t = threading.Thread(target=pool.start); t.start(); t.join()
pids = [r["pid"] for r in pool.run("parmem.dist.checks:ping")]
print(*pids, flush=True)
pool.run({target!r}, seconds=60, started={started!r})
"""


@pytest.mark.parametrize("target, from_thread", [("dist_faults:sleep_marked", False),
                                                 ("dist_faults:allreduce_loop", False),
                                                 ("dist_faults:allreduce_loop", True)])
def test_ranks_exit_within_5_s_of_the_parent_being_killed(target, from_thread, tmp_path):
    """SIGKILL the parent in the middle of a task: the ranks used to run on until the task
    ended (38.7 s asleep, 39.7 s in an all-reduce loop)."""
    started = str(tmp_path / "started")
    script = _KILLED_SCRIPT.format(tests=TESTS, target=target, from_thread=from_thread,
                                   started=started)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids: list[int] = []
    try:
        line = _readline(proc, 120)
        if not line:
            proc.kill()  # so that reading its stderr below cannot wait forever
        pids = [int(x) for x in line.split()]
        assert len(pids) == 2, proc.stderr.read()[-2000:] if not line else line
        # the task is running on both ranks
        assert all(_wait_for_file(f"{started}.{r}", 120) for r in range(2)), "never started"
        assert not any(_gone(p) for p in pids)
        proc.kill()
        proc.wait(10)
        t0 = time.monotonic()
        left = _wait_gone(pids, 5.0)
        assert left == [], f"ranks {left} still running {time.monotonic() - t0:.1f} s after"
    finally:
        _kill([proc.pid, *pids])
        if proc.poll() is None:
            proc.wait(10)


# ---------------------------------------------------------------------------- python -m parmem.dist
@pytest.mark.parametrize("args, needle", [
    (["nope"], "demo='nope' is not one of"),
    (["--world-size", "0"], "argument --world-size/-n: 0 must be an integer in 1..64"),
    (["tp", "-n", "2", "--world-size", "x"], "argument --world-size/-n"),
    (["tp", "novalue"], "argument 'novalue' must look like key=value"),
    (["tp", "bogus=1"], "unexpected keyword argument 'bogus'"),
    (["no.such.module:fn"], "cannot be imported"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_dist_cli_errors_are_one_line_exit_2(args, needle, capsys):
    from parmem.dist.__main__ import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and err.startswith("python -m parmem.dist: ")


def test_dist_cli_a_demo_that_fails_on_a_rank_is_one_line():
    r = subprocess.run([sys.executable, "-m", "parmem.dist", "pp", "-n", "2", "schedule=zigzag"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert "failed in parmem.dist.pp:demo: ValueError: schedule='zigzag'" in r.stderr


def test_dist_cli_without_torch_says_install_it():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from parmem.dist.__main__ import main\n"
            "sys.exit(main(['tp']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "torch is not installed" in r.stderr and "pip install torch" in r.stderr


def test_dist_cli_version():
    r = subprocess.run([sys.executable, "-m", "parmem.dist", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "parmem" in r.stdout


# ---------------------------------------------------------------------------- a shared pool
def test_a_shared_pool_relays_tasks_results_and_errors(monkeypatch):
    """Pools in other processes (the chapters' kernels) relay to one PoolServer: the same ranks
    serve every client, and every error arrives as the same class, rank and exit code as on a
    pool of one's own; a pool of another world size starts its own ranks."""
    from parmem.dist.launcher import SHARED_POOL_ENV, PoolServer

    with PoolServer(world_size=2, pg_timeout=3.0) as server:
        monkeypatch.setenv(SHARED_POOL_ENV, server.address)
        a = Pool(world_size=2).start()
        assert a.shared and a.alive and not a._procs  # no ranks of its own
        first = a.run("parmem.dist.checks:ping")
        a.close()
        b = Pool(world_size=2)
        again = b.run("parmem.dist.checks:ping")
        assert [r["rank_sum"] for r in again] == [1, 1]
        assert [r["pid"] for r in first] == [r["pid"] for r in again]  # the same ranks
        assert not any(p["pid"] == os.getpid() for p in first)
        with pytest.raises(WorkerDied) as died:
            b.run("dist_faults:exit_in_collective", which=0, code=5)
        assert (died.value.rank, died.value.exit_code, died.value.others) == (0, 5, (1,))
        with pytest.raises(RankError, match="boom") as raised:
            b.run("parmem.dist.checks:raise_on", which=1, message="boom")
        assert raised.value.rank == 1 and type(raised.value) is RankError
        with pytest.raises(RankHung) as hung:
            b.run("dist_faults:hang_in_collective", which=1, seconds=60)
        assert hung.value.rank == 1
        with pytest.raises(TypeError, match="nope"):  # checked here, before the relay
            b.run("parmem.dist.checks:ping", nope=1)
        assert [r["rank_sum"] for r in b.run("parmem.dist.checks:ping")] == [1, 1]
        b.close()
        assert server.served == 6
        other = Pool(world_size=1)
        try:
            assert not other.start().shared and len(other._procs) == 1
        finally:
            other.close()
    assert not os.path.exists(server.address)
    assert not server.pool.alive


def test_a_shared_pool_client_interrupted_mid_task_leaves_the_server_usable(monkeypatch):
    """A client interrupted while its task runs disconnects; the server finishes the task, drops
    the result and serves the next client."""
    import signal
    import threading

    from parmem.dist.launcher import SHARED_POOL_ENV, PoolServer

    with PoolServer(world_size=2) as server:
        monkeypatch.setenv(SHARED_POOL_ENV, server.address)
        a = Pool(world_size=2).start()
        a.run("parmem.dist.checks:ping")  # the server's ranks are up
        sent = threading.Event()
        send = a._shared.send

        def send_then_interrupt(msg):
            send(msg)
            sent.set()

        a._shared.send = send_then_interrupt
        t = threading.Timer(0, lambda: sent.wait(60) and os.kill(os.getpid(), signal.SIGINT))
        t.start()
        with pytest.raises(KeyboardInterrupt):
            a.run("parmem.dist.checks:sleep", seconds=1.0)
            time.sleep(60)  # reached only if the task returned first; the interrupt lands here
        t.join(60)
        assert not a.shared and not a.alive
        b = Pool(world_size=2)
        assert [r["rank_sum"] for r in b.run("parmem.dist.checks:ping")] == [1, 1]
        b.close()
