"""The rank pool: reuse, failures that fail fast, no port collisions, the CLI and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from parmem.distributed import DEMOS, Pool, RankError, RankHung, RunTimeout, WorkerDied  # noqa: E402
from parmem.distributed.__main__ import _kwargs  # noqa: E402
from parmem.distributed.launcher import default_world_size, format_results, resolve  # noqa: E402

pytestmark = pytest.mark.dist

N = 2  # the failure tests need two ranks; more would only cost start-up time


@pytest.fixture(scope="module")
def pool():
    # a short group timeout, so the "rank skips a collective" test waits 3 s, not 60
    with Pool(world_size=N, pg_timeout=3.0) as p:
        yield p


def test_run_returns_one_result_per_rank_and_reuses_processes(pool):
    first = pool.run("parmem.distributed.checks:ping")
    again = pool.run("parmem.distributed.checks:ping")
    assert [r["rank"] for r in first] == list(range(N))
    assert all(r["world_size"] == N and r["backend"] == "gloo" for r in first)
    assert all(r["rank_sum"] == N * (N - 1) // 2 for r in first)  # the all-reduce worked
    assert [r["pid"] for r in first] == [r["pid"] for r in again]  # started once, reused


def test_a_function_object_is_accepted():
    from parmem.distributed import checks

    assert resolve(checks.ping) == ("parmem.distributed.checks:ping", checks.ping)


def test_rank_that_raises_fails_fast_with_its_traceback_and_the_pool_restarts(pool):
    t0 = time.perf_counter()
    with pytest.raises(RankError) as info:
        pool.run("parmem.distributed.checks:raise_on", which=1, message="boom from rank one")
    assert time.perf_counter() - t0 < 10  # not the 3 s group timeout of the waiting rank, x3
    err = info.value
    assert err.rank == 1 and "ValueError: boom from rank one" in str(err)
    assert "rank 1 failed in parmem.distributed.checks:raise_on" in str(err)
    assert not pool.alive  # torn down...
    assert [r["rank"] for r in pool.run("parmem.distributed.checks:ping")] == list(range(N))  # ...restarted


def test_run_deadline(pool):
    t0 = time.perf_counter()
    with pytest.raises(RunTimeout):
        pool.run("parmem.distributed.checks:sleep", seconds=30, timeout=0.5)
    assert time.perf_counter() - t0 < 20  # far below the 30 s sleep, with room for a busy CI
    assert not pool.alive


def test_group_timeout_turns_a_hang_into_an_error(pool):
    """Rank 1 skips an all-reduce; rank 0 would wait forever without the group's timeout."""
    t0 = time.perf_counter()
    with pytest.raises(RankError) as info:
        pool.run("parmem.distributed.checks:skip_collective", which=1)
    assert info.value.rank == 0
    assert 2.5 < time.perf_counter() - t0 < 30


def test_two_pools_at_once_do_not_collide():
    with Pool(world_size=2) as a, Pool(world_size=2) as b:
        ra, rb = a.run("parmem.distributed.checks:ping"), b.run("parmem.distributed.checks:ping")
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


@pytest.mark.parametrize("target", ["parmem.distributed.checks", "no.such.module:fn",
                                    "parmem.distributed.checks:nope", 42, lambda: 0])
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
    out = subprocess.run([sys.executable, "-m", "parmem.distributed", "--list"], check=True,
                         capture_output=True, text=True).stdout
    assert all(name in out for name in DEMOS)


def test_torchrun_runs_a_demo_on_each_rank():
    """``torchrun -m parmem.distributed`` runs the function directly on each rank (gloo on CPU)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "parmem.distributed", "collectives", "numel=64", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout[proc.stdout.index("["):])
    assert [r["all_reduce"]["bytes_sent"] for r in results] == [2 * 1 * 64 * 4 // 2] * 2


# ---------------------------------------------------------------------------- python -m parmem.distributed
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
    from parmem.distributed.__main__ import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and err.startswith("python -m parmem.distributed: ")


def test_dist_cli_a_demo_that_fails_on_a_rank_is_one_line():
    # layers=3 passes the argument check made before any rank starts (an integer >= 1) and
    # breaks the demo's own rule on the ranks (a multiple of p*v)
    r = subprocess.run([sys.executable, "-m", "parmem.distributed", "pp", "-n", "2", "layers=3"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert ("failed in parmem.distributed.pp:demo: ValueError: layers=3 must be a multiple of "
            "p*v=2") in r.stderr


def test_dist_cli_without_torch_says_install_it():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from parmem.distributed.__main__ import main\n"
            "sys.exit(main(['tp']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "torch is not installed" in r.stderr and "pip install torch" in r.stderr


def test_dist_cli_version():
    r = subprocess.run([sys.executable, "-m", "parmem.distributed", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "parmem" in r.stdout


# ---------------------------------------------------------------------------- a shared pool
def test_a_shared_pool_relays_tasks_results_and_errors(monkeypatch):
    """Pools in other processes (the chapters' kernels) relay to one PoolServer: the same ranks
    serve every client, and every error arrives as the same class, rank and exit code as on a
    pool of one's own; a pool of another world size starts its own ranks."""
    from parmem.distributed.launcher import SHARED_POOL_ENV, PoolServer

    with PoolServer(world_size=2, pg_timeout=3.0) as server:
        monkeypatch.setenv(SHARED_POOL_ENV, server.address)
        a = Pool(world_size=2).start()
        assert a.shared and a.alive and not a._procs  # no ranks of its own
        first = a.run("parmem.distributed.checks:ping")
        a.close()
        b = Pool(world_size=2)
        again = b.run("parmem.distributed.checks:ping")
        assert [r["rank_sum"] for r in again] == [1, 1]
        assert [r["pid"] for r in first] == [r["pid"] for r in again]  # the same ranks
        assert not any(p["pid"] == os.getpid() for p in first)
        with pytest.raises(WorkerDied) as died:
            b.run("dist_faults:exit_in_collective", which=0, code=5)
        assert (died.value.rank, died.value.exit_code, died.value.others) == (0, 5, (1,))
        with pytest.raises(RankError, match="boom") as raised:
            b.run("parmem.distributed.checks:raise_on", which=1, message="boom")
        assert raised.value.rank == 1 and type(raised.value) is RankError
        with pytest.raises(RankHung) as hung:
            b.run("dist_faults:hang_in_collective", which=1, seconds=60)
        assert hung.value.rank == 1
        with pytest.raises(TypeError, match="nope"):  # checked here, before the relay
            b.run("parmem.distributed.checks:ping", nope=1)
        assert [r["rank_sum"] for r in b.run("parmem.distributed.checks:ping")] == [1, 1]
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
    """A client interrupted while its task runs (Ctrl-C while it waits for the reply: raised at
    that very wait, not raced against the task) disconnects; the server finishes the task, drops
    the result and serves the next client."""
    from parmem.distributed.launcher import SHARED_POOL_ENV, PoolServer

    with PoolServer(world_size=2) as server:
        monkeypatch.setenv(SHARED_POOL_ENV, server.address)
        a = Pool(world_size=2).start()
        a.run("parmem.distributed.checks:ping")  # the server's ranks are up

        class Interrupted:
            """The client's connection, with Ctrl-C arriving while it waits for the reply."""

            def __init__(self, conn):
                self.conn, self.closed = conn, False

            def send(self, msg):
                self.conn.send(msg)

            def poll(self, timeout):
                raise KeyboardInterrupt

            def close(self):
                self.closed = True
                self.conn.close()

        a._shared = Interrupted(a._shared)
        with pytest.raises(KeyboardInterrupt):
            a.run("parmem.distributed.checks:sleep", seconds=1.0)
        assert not a.shared and not a.alive
        b = Pool(world_size=2)
        assert [r["rank_sum"] for r in b.run("parmem.distributed.checks:ping")] == [1, 1]
        b.close()
        assert server.served == 3  # the interrupted task ran to its end on the server
