"""The rank pool's safety (issue 34): one pool used from two threads, torch tensors as arguments
and results, processes a task starts, Ctrl-C while torch is imported, while the ranks are
spawned and while they are stopped. Every interrupt is sent at a known point (an import hook, a
wrapped call, a file a rank writes), never after a fixed delay; every wait has a deadline.

The worker functions live in this module: a pool's ranks get this process's ``sys.path``, so
they import it as ``test_dist_pool_safety``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import process_gone, wait_gone

torch = pytest.importorskip("torch")

from parmem.distributed import Pool, RankError, launcher  # noqa: E402
from parmem.distributed.launcher import rank  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]

HERE = "test_dist_pool_safety"
TESTS = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------ worker functions (ranks)
def echo(value: object) -> dict:
    return {"rank": rank(), "value": value}


def scale(x, factors: dict) -> dict:
    """Tensors in, tensors out: ``x`` times (rank + 1), all-reduced, and each of ``factors``."""
    import torch.distributed as dist

    y = x * (rank() + 1)
    dist.all_reduce(y)
    return {"sum": y, "scaled": {k: v * x for k, v in factors.items()}}


def spawn_sleep() -> int:
    """Start ``sleep 60`` and leave it running; its pid."""
    return subprocess.Popen(["sleep", "60"]).pid


def sleep_marked(seconds: float, started: str) -> dict:
    with open(f"{started}.{rank()}", "w"):
        pass
    time.sleep(seconds)
    return {"rank": rank()}


def _refuse_to_load():
    raise ValueError("this argument cannot be read here")


class Unreadable:
    """Pickles in the parent; unpickling it (in a rank) raises."""

    def __reduce__(self):
        return _refuse_to_load, ()


# ------------------------------------------------------------------------------ helpers
@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt here even when the suite runs in the background of a
    shell without job control (SIGINT ignored, no Python handler): see test_dist_pool_faults."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def pool():
    # one rank: what is tested here does not depend on the number of ranks, and every start
    # costs a Python process that imports torch (about 2 s of CPU)
    with Pool(world_size=1) as p:
        yield p


def _wait_for_files(paths, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _sigint_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)


# ---------------------------------------------------------------------------- threads
def test_one_pool_from_two_threads_every_reply_reaches_its_caller(pool):
    """Two threads used to read each other's replies (another task's id) and drop them: one
    call then waited for replies that never came. Now run holds a lock."""
    rounds = 8
    barrier = threading.Barrier(2, timeout=60)
    got: dict[int, list] = {0: [], 1: []}
    failed: list[BaseException] = []

    def use(t: int) -> None:
        try:
            barrier.wait()
            for i in range(rounds):
                got[t].append(pool.run(f"{HERE}:echo", value=[t, i], timeout=60))
        except BaseException as e:  # reported below, not lost in the thread
            failed.append(e)

    threads = [threading.Thread(target=use, args=(t,), daemon=True) for t in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(150)
    assert not failed, failed
    for t in (0, 1):
        assert got[t] == [[{"rank": 0, "value": [t, i]}] for i in range(rounds)]


def test_close_from_another_thread_stops_a_run_in_progress(tmp_path):
    """close() waits for a call in progress up to its timeout, then stops that call's ranks."""
    p = Pool(world_size=1)
    started = str(tmp_path / "started")
    outcome: list[BaseException] = []

    def long_run():
        try:
            p.run(f"{HERE}:sleep_marked", seconds=60, started=started, timeout=120)
        except BaseException as e:
            outcome.append(e)

    th = threading.Thread(target=long_run, daemon=True)
    th.start()
    try:
        assert _wait_for_files([f"{started}.0"], 120), "the task never started"
        pids = [proc.pid for proc in p._procs]
        t0 = time.monotonic()
        p.close(timeout=0.5)
        th.join(30)
        assert time.monotonic() - t0 < 30 and not th.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], RankError), outcome
        assert wait_gone(pids, 10) == [] and not p._procs
    finally:
        p.close()


# ---------------------------------------------------------------------------- tensors
def test_tensors_as_arguments_and_results(pool):
    """A tensor argument used to kill the ranks (AuthenticationError: torch's reductions pass
    storages by file descriptor through multiprocessing's resource sharer, whose authkey the
    ranks do not share). Now tensors are sent by value, in both directions."""
    x = torch.arange(4, dtype=torch.float32)
    out = pool.run(f"{HERE}:scale", x=x, factors={"half": torch.tensor(0.5)})
    # one rank: the all-reduce of x * (0 + 1) is x
    assert len(out) == 1 and torch.equal(out[0]["sum"], torch.tensor([0.0, 1.0, 2.0, 3.0]))
    assert torch.equal(out[0]["scaled"]["half"], torch.tensor([0.0, 0.5, 1.0, 1.5]))
    assert torch.equal(x, torch.arange(4, dtype=torch.float32))  # the caller's copy untouched
    back = pool.run(f"{HERE}:echo", value=torch.ones(2))
    assert torch.equal(back[0]["value"], torch.ones(2)) and pool.alive  # the same rank serves


def test_an_argument_a_rank_cannot_read_is_a_rank_error_naming_the_task(pool):
    """Arguments are unpickled inside the task: a failure there is the task's error (with its
    traceback), not a rank that died."""
    with pytest.raises(RankError) as info:
        pool.run(f"{HERE}:echo", value=Unreadable())
    err = info.value
    assert type(err) is RankError and err.target == f"{HERE}:echo"
    assert "this argument cannot be read here" in str(err)
    assert [r["value"] for r in pool.run(f"{HERE}:echo", value=1)] == [1]  # restarted


# ------------------------------------------------------------------ task-spawned processes
def test_processes_a_task_started_are_killed_with_its_rank(pool):
    """`sleep 60` started by a task used to outlive close(); now each rank's process group is
    killed once the rank is gone."""
    children = pool.run(f"{HERE}:spawn_sleep")
    assert len(children) == 1 and not any(process_gone(c) for c in children)
    pool.close()
    assert wait_gone(children, 10) == []


_GROUP_SCRIPT = """
import os, subprocess
from parmem.distributed.launcher import _kill_group_members
os.setsid()  # as a pool's rank: the leader of its own group
child = subprocess.Popen(["sleep", "60"])
outsider = subprocess.Popen(["sleep", "60"], start_new_session=True)  # another group
_kill_group_members()
print(child.wait(10), outsider.poll(), os.getpid() > 0, flush=True)  # this process lives on
outsider.kill()
outsider.wait(10)
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_rank_leaving_kills_the_other_members_of_its_group_only():
    """A rank that leaves on its own (its parent gone: EOF) kills what its tasks started, and
    nothing outside its group, and not itself (its exit status stays its own)."""
    proc = subprocess.run(
        [sys.executable, "-c", _GROUP_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(-signal.SIGKILL), "None", "True"]


# ------------------------------------------------------------------------------ Ctrl-C
_IMPORT_SCRIPT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a notebook kernel has it
assert "torch" not in sys.modules


class InterruptTorchImport:  # Ctrl-C in the middle of the first `import torch`
    fired = False

    def find_spec(self, name, path=None, target=None):
        if name == "torch.distributed.distributed_c10d" and not self.fired:
            InterruptTorchImport.fired = True
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, InterruptTorchImport())
from parmem.distributed import Pool

pool = Pool(world_size=1)
try:
    pool.run("parmem.distributed.checks:ping")
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", InterruptTorchImport.fired, pool.alive, flush=True)
print(pool.run("parmem.distributed.checks:ping")[0]["rank_sum"], flush=True)
pool.close()
"""


def test_ctrl_c_while_the_first_start_imports_torch_leaves_the_pool_usable():
    """An import of torch cut short cannot be retried: the next run aborted the process
    ("cannot initialize type 'GradBucket': an object with that name is already defined",
    SIGABRT). Now the interrupt waits for the import to finish, then is raised."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=TESTS,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["interrupted True False", "0"], proc.stdout


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_ctrl_c_while_the_ranks_are_spawned_stops_every_one(monkeypatch, sigint_raises, start):
    """Ctrl-C right after the first rank's process was created, before the pool recorded it:
    that process was left running. Now the spawn finishes, then the start is torn down. Both
    ways a rank starts: a fresh interpreter (``spawn``) and a fork of the rank template."""
    from parmem.distributed import launcher

    started: list = []
    monkeypatch.setenv(launcher.RANK_START_ENV, start)
    if start == "spawn":
        real_popen = subprocess.Popen

        def popen(*args, **kwargs):
            p = real_popen(*args, **kwargs)
            started.append(p)
            if len(started) == 1:
                _sigint_self()
            return p

        patch = (subprocess, "Popen", popen)
    else:
        real_fork = launcher._Template.fork

        def fork(self, *args, **kwargs):
            p = real_fork(self, *args, **kwargs)
            started.append(p)
            if len(started) == 1:
                _sigint_self()
            return p

        patch = (launcher._Template, "fork", fork)

    p = Pool(world_size=1)  # one rank: the interrupt comes before it is recorded
    monkeypatch.setattr(*patch)
    with pytest.raises(KeyboardInterrupt):
        p.start()
    monkeypatch.setattr(patch[0], patch[1], real_popen if start == "spawn" else real_fork)
    assert len(started) == 1 and started[0].poll() is not None  # stopped, not left running
    assert not p._procs and not p.alive
    try:
        assert [r["rank_sum"] for r in p.run("parmem.distributed.checks:ping")] == [0]
    finally:
        p.close()


@pytest.mark.parametrize("when", ["close", "teardown"])
def test_a_second_ctrl_c_while_the_ranks_stop_leaves_none_running(
    pool, monkeypatch, sigint_raises, when, tmp_path
):
    """A Ctrl-C while the ranks are stopped (in close, or in the teardown of a run a first
    Ctrl-C interrupted) cut the stopping short: ranks were left running. Now it is raised once
    every rank is gone."""
    started = str(tmp_path / "started")
    if when == "close":
        pool.run("parmem.distributed.checks:ping")
    else:  # a first Ctrl-C once both ranks run the task
        threading.Thread(
            target=lambda: _wait_for_files([f"{started}.0"], 120) and _sigint_self(),
            daemon=True,
        ).start()
    real_exited = launcher._exited
    calls: list = []

    def exited(p, seconds):
        calls.append(p)
        if len(calls) == 1:
            _sigint_self()  # the second Ctrl-C, at the first wait for a rank to exit
        return real_exited(p, seconds)

    procs = list(pool.start()._procs)
    monkeypatch.setattr(launcher, "_exited", exited)
    with pytest.raises(KeyboardInterrupt):
        if when == "close":
            pool.close()
        else:
            pool.run(f"{HERE}:sleep_marked", seconds=60, started=started, timeout=150)
    monkeypatch.undo()
    assert calls and len(procs) == 1
    assert all(proc.poll() is not None for proc in procs)  # reaped before the raise
    assert not pool._procs and not pool.alive
    assert [r["rank"] for r in pool.run(f"{HERE}:echo", value=0)] == [0]


# ------------------------------------------------------------------- the rank template
def _zombie_children() -> list[int]:
    """This process's children that exited and were not waited for."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] == "Z":
                out.append(int(entry))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the template is Linux's")
def test_forked_ranks_start_where_the_pool_is_and_leave_no_zombie(tmp_path, monkeypatch):
    """A forked rank used to keep the template's working directory (a spawned rank starts in
    its parent's), and a process its task left behind, adopted by the pool's process (a child
    subreaper), stayed a zombie of it after the pool closed."""
    monkeypatch.setenv(launcher.RANK_START_ENV, "fork")
    monkeypatch.chdir(tmp_path)
    before = set(_zombie_children())  # other tests' in this worker (ranks of killed parents)
    p = Pool(world_size=1, share=False)
    try:
        assert p.run("os:getcwd") == [str(tmp_path)]
        p.run("os:system", command="sleep 30 &")  # left running in the rank's group
    finally:
        p.close()
    deadline = time.monotonic() + 10
    while set(_zombie_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(_zombie_children()) - before == set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the template is Linux's")
def test_pools_started_in_two_threads_at_once_share_the_template(monkeypatch):
    """Two threads starting pools at once interleaved their requests to the one template: a
    rank read another's socket and died ("received 0 items of ancdata"), 4 times in 5."""
    monkeypatch.setenv(launcher.RANK_START_ENV, "fork")
    results: dict = {}

    def start(i: int) -> None:
        q = Pool(world_size=2, share=False)
        try:
            results[i] = (q.run("os:getpid"), [x.pid for x in q._procs])
        except Exception as e:  # noqa: BLE001 (reported below)
            results[i] = repr(e)
        finally:
            q.close()

    for _ in range(3):
        threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i in range(2):
            got = results.pop(i, "no result")
            assert isinstance(got, tuple) and got[0] == got[1], got
