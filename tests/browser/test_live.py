"""The chapters live, as a reader of Binder or a local JupyterLab sees them (issue 16).

Starts JupyterLab (the project's own, with jupyterlab-myst) on a free port of 127.0.0.1, token
auth off, no browser, root allowed, ``PYTHONPATH`` passed on so the kernel imports this tree's
``parmem``, ``PARMEM_WORLD_SIZE=2``. Two chapters are copied into a temporary folder first
(JupyterLab's autosave must not write outputs into the repository). For each, in headless
Chromium: Run All, wait until every cell has run, then check that

* no raw MyST is visible (``:::{``, ``{glue:``, ``{cite``, ``{sup}``, ``:class:``...);
* the short answer shows its numbers (a digit, and no pending value);
* no cell shows an error;
* moving the Explore section's first slider changes the figure below it (its image data).

Screenshots go to ``_build/screenshots/live-*.png``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import test_site
from test_site import SHOTS, _unavailable

pytestmark = pytest.mark.browser
browser = test_site.browser  # the site test's Chromium fixture, shared

ROOT = Path(__file__).resolve().parents[2]
#: one chapter with a torch.distributed pool demo, one with the pipeline schedules
CHAPTERS = [
    "chapters/p1_foundations/ch00_memory_anatomy.ipynb",
    "chapters/p4_pipeline/ch11_1f1b_vs_gpipe.ipynb",
]
RAW_MYST = (":::{", "```{", "{glue:", "{cite", "{sup}", "{sub}", "{py:", "{doc}", ":class:")
RUN_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if importlib_missing("jupyterlab_myst"):
        _unavailable("jupyterlab-myst is not installed: pip install -r requirements.txt")
    work = tmp_path_factory.mktemp("lab")
    for rel in CHAPTERS:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, work / rel)
    settings = work / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    notebook_settings = work / ".settings" / "@jupyterlab" / "notebook-extension"
    notebook_settings.mkdir(parents=True)
    (notebook_settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "lib"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.update(PARMEM_WORLD_SIZE="2", OMP_NUM_THREADS="1",
               JUPYTERLAB_SETTINGS_DIR=str(work / ".settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / ".workspaces"))
    env.pop("MPLBACKEND", None)  # the kernel's own inline backend, as a reader has it
    log = open(work / "lab.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
         "--ip=127.0.0.1", f"--port={port}", "--IdentityProvider.token=",
         "--ServerApp.password=", f"--ServerApp.root_dir={work}",
         "--LabApp.expose_app_in_browser=True"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # a first start on a loaded machine builds caches
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=5)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"JupyterLab exited: {(work / 'lab.log').read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not answer within 240 s: "
                                f"{(work / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def _run_all(page) -> None:
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext.session "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext.session.kernel",
                           timeout=60_000)
    # null-safe: the session can be replaced while the kernel starts (a second notebook)
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget?.sessionContext"
                           "?.session?.kernel?.status === 'idle'", timeout=60_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # done: no cell waits or runs ([*]) and every code cell has an execution count; or a cell
    # failed (Run All then stops, and the cells after it never get a count): say which
    try:
        page.wait_for_function(
            """() => {
                const nb = window.jupyterapp.shell.currentWidget.content;
                if (nb.node.querySelector(".jp-OutputArea-output[data-mime-type="
                                          + "'application/vnd.jupyter.stderr']")
                    && [...nb.node.querySelectorAll('.jp-OutputArea-output')]
                         .some(o => o.innerText.includes('Traceback'))) return true;
                const cells = nb.widgets.filter(c => c.model.type === 'code');
                return cells.length > 0 && cells.every(c => c.model.executionCount !== null)
                    && nb.node.querySelectorAll('.jp-InputPrompt').length > 0
                    && ![...nb.node.querySelectorAll('.jp-InputPrompt')]
                            .some(p => p.textContent.includes('*'))
                    && window.jupyterapp.shell.currentWidget?.sessionContext?.session
                            ?.kernel?.status === 'idle';
            }""",
            timeout=RUN_TIMEOUT_S * 1000, polling=500,
        )
    except Exception:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "live-run-all-timeout.png"))
        state = page.evaluate(
            """() => window.jupyterapp.shell.currentWidget.content.widgets
                 .filter(c => c.model.type === 'code')
                 .map((c, i) => `cell ${i}: count ${c.model.executionCount}, `
                      + c.node.querySelector('.jp-InputPrompt').textContent.trim())
                 .join('\\n')"""
        )
        raise AssertionError(f"Run All did not finish in {RUN_TIMEOUT_S} s:\n{state}") from None


def _figure_after_slider(page) -> tuple[str, str]:
    """The src of the image after the Explore controls, before and after moving a slider."""
    box = page.locator(".parmem-explorer").first
    box.scroll_into_view_if_needed()
    area = page.locator(".jp-Cell:has(.parmem-explorer)").first
    image = area.locator("img").last
    before = image.get_attribute("src")
    slider = box.locator(".widget-slider .noUi-handle, .widget-slider input").first
    slider.focus()
    slider.press("ArrowRight")
    page.wait_for_function(
        "([sel, old]) => { const imgs = document.querySelectorAll(sel);"
        " return imgs.length && imgs[imgs.length - 1].src !== old; }",
        arg=[".jp-Cell:has(.parmem-explorer) img", before], timeout=30_000,
    )
    return before or "", image.get_attribute("src") or ""


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: Path(c).stem)
def test_chapter_runs_live(lab, browser, chapter):
    started = time.perf_counter()
    name = Path(chapter).stem
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        # a workspace of its own, reset: else JupyterLab restores the previous chapter's tab,
        # which may be the current widget that Run All then runs (the other chapter never runs)
        page.goto(f"{lab}/lab/workspaces/{name}/tree/{chapter}?reset", wait_until="load",
                  timeout=60_000)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        page.wait_for_function("() => window.jupyterapp?.shell.currentWidget?.context?.path",
                               timeout=60_000)
        current = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.path")
        assert current == chapter, f"the current notebook is {current}, not {chapter}"
        _run_all(page)
        notebook = page.locator(".jp-Notebook").first
        # every cell is rendered when the notebook is not windowed (virtual scrolling)
        text = notebook.evaluate("n => n.innerText")

        answer = page.locator(".jp-OutputArea-output:has-text('Short answer')").first
        answer.scroll_into_view_if_needed()
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"live-{name}-short-answer.png"))
        shown = answer.inner_text()
        assert any(ch.isdigit() for ch in shown), f"{name}: short answer without numbers: {shown}"
        assert "…" not in shown, f"{name}: a short-answer value is still pending: {shown}"

        raw = [m for m in RAW_MYST if m in _prose(notebook)]
        assert not raw, f"{name}: raw MyST visible live: {raw}"
        failed = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                              ":has-text('Traceback'), .jp-RenderedText:has-text('Error')")
        assert "Traceback" not in text and failed.count() == 0, f"{name}: error output live"

        before, after = _figure_after_slider(page)
        assert before and after and before != after, f"{name}: the slider did not redraw"
        images = page.locator(".jp-Cell:has(.parmem-explorer) img").count()
        assert images == 1, f"{name}: the Explore cell shows {images} figures, not one"
        page.screenshot(path=str(SHOTS / f"live-{name}-explore.png"))
        assert not errors, f"{name}: script errors: {errors}"
    finally:
        print(f"{name}: {time.perf_counter() - started:.1f} s live")
        context.close()


def _prose(notebook) -> str:
    """Visible text of the rendered Markdown (cells and outputs), without code."""
    return notebook.evaluate(
        """n => { const parts = [];
            n.querySelectorAll('.jp-MarkdownOutput, .jp-RenderedMarkdown, .myst')
             .forEach(e => { const c = e.cloneNode(true);
                c.querySelectorAll('pre, code').forEach(x => x.remove());
                parts.push(c.innerText); });
            return parts.join('\\n'); }"""
    )
