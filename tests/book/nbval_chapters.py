"""The chapters stage: nbval runs every chapter as a test, and what it ran is what the book shows.

``make notebooks`` runs ``pytest --nbval-lax`` over every chapter of ``_toc.yml``; the root
``conftest.py`` registers this plugin whenever nbval runs (``pytest --nbval-lax chapters/...`` by
hand too). nbval runs each code cell as a test item, in one kernel per notebook, with the
notebook's folder as working directory. This plugin makes that run the build's execution:

* the kernel starts with its own inline matplotlib backend (``conftest.py`` sets ``MPLBACKEND=Agg``
  for the processes pytest starts; a kernel that inherited it would draw no figure), and each
  cell gets the build's per-cell timeout (``execute.timeout`` of ``_config.yml``) unless
  ``--nbval-cell-timeout`` is given;
* every kernel message nbval reads for a cell is recorded, and after the last cell an extra
  item, ``<notebook>::checks``, replays them through nbclient's own output handling (the code
  that executes the notebook in the build): the executed notebook has the outputs, execution
  counts, widget state and language info that myst-nb renders. nbval's own list of a cell's
  outputs (``IPyNbCell.test_outputs``) is not enough: it drops ``update_display_data``, so the
  prose cells, whose numbers arrive by ``update_display``, would keep their pending marks, and
  it drops the widgets' comm messages (their state on the static site);
* ``checks`` then fails, naming the notebook, when the chapter shows no output, no figure, or a
  prose cell still has a pending number; when every cell passed and the checks hold, it stores
  the notebook in the execution cache (``_build/.jupyter_cache``, or ``--nb-cache DIR``;
  ``--nb-cache none`` stores nothing) with jupyter-cache, under the key the build computes
  (``store`` of ``scripts/execute_notebooks.py``). The book stage then finds every chapter cached
  and executes nothing.

The seconds of each chapter (kernel start, every cell, the checks) go to the table of the root
``conftest.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from contextlib import contextmanager
from pathlib import Path
from queue import Empty

import pytest
from nbval.plugin import IPyNbCell, IPyNbFile

ROOT = Path(__file__).resolve().parents[2]
#: nbval's own default of --nbval-cell-timeout (seconds): left at it, the build's timeout applies
NBVAL_DEFAULT_TIMEOUT = 2000
#: seconds nbval waits for each output message once a cell has replied (nbval's default is 5 s,
#: which a starved machine can exceed between the reply and the last output)
OUTPUT_TIMEOUT_S = 60


def _executor():
    spec = importlib.util.spec_from_file_location(
        "execute_notebooks", ROOT / "scripts" / "execute_notebooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXECUTOR = _executor()


class _Run:
    """What nbval did with one notebook: each code cell's request id and the kernel messages
    read for it (by nbval's cell number), the cells that did not pass, and the seconds."""

    def __init__(self) -> None:
        self.msg_ids: dict[int, str] = {}
        self.messages: dict[int, list[dict]] = {}
        self.not_passed: dict[int, str] = {}
        self.seconds = 0.0


RUN = pytest.StashKey[_Run]()


def _run(nbfile: IPyNbFile) -> _Run:
    return nbfile.stash.setdefault(RUN, _Run())


def cache_dir(config) -> Path | None:
    value = config.getoption("nb_cache", None) or str(EXECUTOR.CACHE)
    return None if value.lower() == "none" else Path(value).resolve()


def pytest_configure(config) -> None:
    if config.option.nbval_cell_timeout == NBVAL_DEFAULT_TIMEOUT:
        config.option.nbval_cell_timeout = EXECUTOR.cell_timeout()


@pytest.hookimpl(tryfirst=True)  # before -m/-k select by the marker it adds
def pytest_collection_modifyitems(session, config, items) -> None:
    """After each notebook's last cell, its ``checks`` item; every cell marked ``chapters``."""
    result = []
    for i, item in enumerate(items):
        result.append(item)
        if not isinstance(item, IPyNbCell):
            continue
        item.add_marker(pytest.mark.chapters)
        item.output_timeout = OUTPUT_TIMEOUT_S
        last = i + 1 == len(items) or items[i + 1].parent is not item.parent
        if last:
            result.append(ChapterChecks.from_parent(item.parent, name="checks"))
    items[:] = result


@contextmanager
def _without(name: str):
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


#: the pool of ranks this process serves to the chapters' kernels (one per test worker)
SERVER = pytest.StashKey[object]()


def _serve_pool(config) -> None:
    """Start this worker's :class:`parmem.distributed.PoolServer` and point the kernels it starts at it
    (``$PARMEM_SHARED_POOL``): every chapter's ``Pool()`` then relays to the same ranks, which
    start, and import torch and the engines' modules, once per worker instead of once per
    chapter. ``--nb-pool own`` (or ``$PARMEM_SHARED_POOL`` set to ``0``) leaves each chapter its
    own ranks, as in the build and a live notebook."""
    if SERVER in config.stash or config.getoption("nb_pool", "shared") != "shared":
        return
    if os.environ.get("PARMEM_SHARED_POOL") == "0":
        return
    from parmem.distributed.launcher import SHARED_POOL_ENV, PoolServer

    server = PoolServer()
    config.stash[SERVER] = server
    os.environ[SHARED_POOL_ENV] = server.address


def pytest_unconfigure(config) -> None:
    server = config.stash.get(SERVER, None)
    if server is not None:
        server.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    # nbval starts the notebook's kernel in the setup of its first cell, with this process's
    # environment: without MPLBACKEND, ipykernel selects its inline backend (figures as outputs)
    if isinstance(item, IPyNbCell | ChapterChecks):
        _serve_pool(item.config)
        with _without("MPLBACKEND"):
            yield
    else:
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Record the request id of the cell and every kernel message nbval reads for it."""
    if not isinstance(item, IPyNbCell) or item.parent.kernel is None:
        yield
        return
    nbfile, kernel, run = item.parent, item.parent.kernel, _run(item.parent)
    messages = run.messages.setdefault(item.cell_num, [])
    execute, get_message = kernel.execute_cell_input, nbfile.get_kernel_message

    def execute_cell_input(*args, **kwargs):
        run.msg_ids[item.cell_num] = msg_id = execute(*args, **kwargs)
        return msg_id

    def get_kernel_message(*args, **kwargs):
        msg = get_message(*args, **kwargs)
        messages.append(msg)
        return msg

    kernel.execute_cell_input = execute_cell_input
    nbfile.get_kernel_message = get_kernel_message
    try:
        yield
    finally:
        del kernel.execute_cell_input, nbfile.get_kernel_message


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if isinstance(item, IPyNbCell):
        report = outcome.get_result()
        run = _run(item.parent)
        run.seconds += report.duration
        if report.failed or report.skipped:
            run.not_passed.setdefault(item.cell_num, "failed" if report.failed else "skipped")


def assemble(nbfile: IPyNbFile, run: _Run, language_info: dict | None):
    """The executed notebook: nbval's notebook with each code cell's recorded messages replayed
    through nbclient's output handling, as ``NotebookClient.execute`` (jupyter-cache's executor,
    run by the build) handles them while a cell runs."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionComplete

    nb = copy.deepcopy(nbfile.nb)
    client = NotebookClient(nb, record_timing=False)
    code_num = executed = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        msg_id, messages = run.msg_ids.get(code_num), run.messages.get(code_num, [])
        code_num += 1
        cell.outputs = []
        cell.execution_count = None
        if not cell.source.strip():  # nbclient does not send an empty cell
            continue
        client.clear_before_next_output = False
        for msg in messages:
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            try:
                client.process_message(msg, cell, index)
            except CellExecutionComplete:
                break
        executed += 1
        cell.execution_count = executed
    client.set_widgets_metadata()
    if language_info:
        nb.metadata["language_info"] = language_info
    return nb


def _language_info(nbfile: IPyNbFile, timeout: float = 30) -> dict | None:
    """The kernel's ``language_info`` (nbclient puts it in the notebook's metadata)."""
    kc = nbfile.kernel.kc
    msg_id = kc.kernel_info()
    while True:
        try:
            reply = kc.get_shell_msg(timeout=timeout)
        except Empty:
            return None
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"].get("language_info")


def problems(nb) -> list[str]:
    """What the chapter must show: an output, a figure, and every quoted number glued."""
    from parmem.book.prose import PENDING, names

    found = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.get("outputs", [])]
    if not outputs:
        found.append("no output at all")
    if not any("image/png" in o.get("data", {}) for o in outputs):
        found.append("no figure among the outputs (every chapter draws at least one)")
    for i, cell in enumerate(code):
        if cell.source.startswith('prose(r"""') and names(cell.source):
            shown = "".join(o.get("data", {}).get("text/markdown", "") for o in cell.outputs)
            if not shown or shown.count(PENDING) != cell.source.count(PENDING):
                found.append(f"Cell {i}: a quoted number was never glued: {shown[:300]!r}")
    return found


class ChapterChecks(pytest.Item):
    """The checks of one executed chapter, and its store into the execution cache."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.add_marker(pytest.mark.chapters)
        self.user_properties.append(("cells", 0))  # conftest.py counts nbval's items as cells

    def runtest(self) -> None:
        nbfile: IPyNbFile = self.parent
        rel = self.nodeid.split("::", 1)[0]  # the notebook, as pytest names it
        run = _run(nbfile)
        failed = sorted(n for n, how in run.not_passed.items() if how == "failed")
        if failed:
            pytest.skip(f"{rel}: not checked, not cached: cell(s) {failed} failed")
        unrun = sorted(set(range(self._code_cells())) - set(run.msg_ids) | set(run.not_passed))
        if unrun:
            pytest.fail(f"{rel}: cell(s) {unrun} did not run (skipped or deselected); the build "
                        "runs every cell, so the notebook is neither checked nor cached",
                        pytrace=False)
        if nbfile.kernel is None or not nbfile.kernel.is_alive():
            pytest.fail(f"{rel}: the kernel is gone after the last cell", pytrace=False)
        nb = assemble(nbfile, run, _language_info(nbfile))
        found = problems(nb)
        if found:
            pytest.fail(f"{rel}:\n  " + "\n  ".join(found), pytrace=False)
        target = cache_dir(self.config)
        if target is not None:
            EXECUTOR.store(nb, nbfile.path, run.seconds, target)

    def _code_cells(self) -> int:
        return sum(c.cell_type == "code" for c in self.parent.nb.cells)

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: checks and cache"
