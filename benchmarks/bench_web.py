"""Speed of the calculator and planner pages in the browser (issue 17): parmem on Pyodide in a
Web Worker, in headless Chromium, offline, against the built site in ``_build/html``.

Goals: from opening the calculator to its first result <= 5 s; a new estimate <= 100 ms after a
change of the form. Prints, over ``--runs`` fresh page loads (a new browser context each time,
so nothing is cached in memory; the HTTP cache is empty too):

* the calculator's first result: from ``page.goto`` to the first table shown, and how much of
  it Python took in the worker (Pyodide's start and the import of parmem are not in that part);
* a change: median and worst time from changing a field (alternating t between 2 and 4 and the
  model between three presets) to the new numbers on the page, and the Python part of it;
* the planner's first result and the Python part of it (one ``plan()`` search).

Run after ``make book``: ``python benchmarks/bench_web.py [--runs 3] [--changes 20]``. Also prints
the bytes the pages add to the site (Pyodide's files, the wheel and the snapshot). The machine's load matters
(Pyodide's start is a few seconds of one CPU core): the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SETTLED = """(count) => {
    const root = document.querySelector('[data-parmem-tool]');
    return Number(root.dataset.parmemResults || 0) > count && root.dataset.parmemBusy === '0';
}"""
STATE = """() => {
    const r = document.querySelector('[data-parmem-tool]').dataset;
    return [Number(r.parmemResults || 0), Number(r.parmemPythonMs || 0), r.parmemStart];
}"""
CHANGE = """([name, value]) => {
    const input = document.querySelector(`[name="${name}"]`);
    input.value = value;
    input.dispatchEvent(new Event('change', {bubbles: true}));
}"""


STARTS: set[str] = set()  # how Python started: "snapshot" or "start" (see tools/worker.js)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass


def serve() -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def offline(context, origin: str, outside: list[str]) -> None:
    """Abort and record every request that would leave the site."""

    def route(r):
        if r.request.url.startswith(origin + "/") or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    context.route("**/*", route)


def first_result(browser, origin: str, path: str, outside: list[str]):
    context = browser.new_context()
    offline(context, origin, outside)
    page = context.new_page()
    start = time.perf_counter()
    page.goto(f"{origin}/{path}")
    page.wait_for_function(SETTLED, arg=0, timeout=180_000)
    seconds = time.perf_counter() - start
    state = page.evaluate(STATE)
    STARTS.add(state[2])
    return context, page, seconds, state[1]


def changes(page, count: int) -> tuple[list[float], list[float]]:
    walls, pythons = [], []
    steps = [("t", "4"), ("t", "2"), ("model", "llama-3-8b"), ("model", "mistral-7b"),
             ("model", "llama-2-7b")]
    for i in range(count):
        name, value = steps[i % len(steps)]
        before = page.evaluate(STATE)[0]
        start = time.perf_counter()
        page.evaluate(CHANGE, [name, value])
        page.wait_for_function(SETTLED, arg=before, timeout=60_000, polling="raf")
        walls.append((time.perf_counter() - start) * 1000)
        pythons.append(page.evaluate(STATE)[1])
    return walls, pythons


def site_bytes() -> dict[str, int]:
    py = SITE / "py"
    snapshot = sum(f.stat().st_size for f in py.glob("snapshot*"))
    parts = {
        "Pyodide (vendor/pyodide)": sum(f.stat().st_size for f in (SITE / "vendor" / "pyodide").iterdir()),
        "parmem wheel (py/*.whl)": sum(f.stat().st_size for f in py.glob("*.whl")),
        "Pyodide snapshot (py/snapshot.bin)": snapshot,
        "page scripts (tools)": sum(f.stat().st_size for f in (SITE / "tools").iterdir()),
    }
    return parts


def set_site(path: Path) -> None:
    global SITE
    SITE = path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh page loads of each page")
    parser.add_argument("--changes", type=int, default=20, help="form changes per calculator load")
    parser.add_argument("--site", type=Path, default=SITE, help="the built site (_build/html)")
    args = parser.parse_args()
    set_site(args.site)
    if not (SITE / "chapters" / "tools" / "calculator.html").is_file():
        print(f"skipped: {SITE}/chapters/tools/calculator.html is missing (run `make book` first)")
        return 0
    from playwright.sync_api import sync_playwright

    server, origin = serve()
    outside: list[str] = []
    first, first_py, walls, pythons, plans, plans_py = [], [], [], [], [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for _ in range(args.runs):
            ctx, page, seconds, py_ms = first_result(
                browser, origin, "chapters/tools/calculator.html", outside)
            first.append(seconds)
            first_py.append(py_ms)
            w, p = changes(page, args.changes)
            walls += w
            pythons += p
            ctx.close()
            ctx, page, seconds, py_ms = first_result(
                browser, origin, "chapters/tools/planner.html", outside)
            plans.append(seconds)
            plans_py.append(py_ms)
            ctx.close()
        browser.close()
    server.shutdown()

    load = os.getloadavg()[0]
    print(f"calculator and planner in Chromium, {args.runs} page loads each, "
          f"load average {load:.1f} on {os.cpu_count()} CPUs; Python started from: "
          f"{', '.join(sorted(STARTS))}")
    print(f"{'measure':46} {'median':>9} {'worst':>9} {'goal':>8}")
    rows = [
        ("calculator: open -> first result (s)", first, 5.0),
        ("  of which Python's first estimate (ms)", first_py, None),
        ("change -> new numbers shown (ms)", walls, 100.0),
        ("  of which Python: estimate + SVG (ms)", pythons, None),
        ("planner: open -> first plan (s)", plans, None),
        ("  of which Python: plan() (ms)", plans_py, None),
    ]
    for name, values, goal in rows:
        goal_text = f"<= {goal:g}" if goal else ""
        print(f"{name:46} {statistics.median(values):9.2f} {max(values):9.2f} {goal_text:>8}")
    print("bytes the pages add to the site:")
    for name, size in site_bytes().items():
        print(f"  {name:30} {size / 2**20:7.2f} MiB")
    if outside:
        print(f"requests that left the site (blocked): {sorted(set(outside))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
