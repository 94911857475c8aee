"""The built site in a real browser: it renders, typesets, shows figures and widgets, and
loads nothing from outside itself.

Serves ``_build/html`` on 127.0.0.1 (a free port) with Python's ``http.server`` and drives
Debian's Chromium (``/usr/bin/chromium``) with Playwright. For the landing page and the first
chapter in ``_toc.yml`` it checks that

* the page renders: HTTP 200, the book's title, a visible heading;
* MathJax typeset at least one formula (an ``mjx-container``) and no raw ``$$`` or ``\\[`` is
  left in the visible text outside code;
* every image in the article has loaded (non-zero natural width), and the chapter has one;
* the chapter's "Explore" section is not empty: the saved widget state renders, or at least the
  plain figure the Explore cell leaves is there;
* every request stays on the local origin, nothing answers with an error status (the favicon
  included), no script throws and the console shows no error or warning;
* the chapter's Explore controls are marked inactive, with a note that links to running it live,
  and there is no "Live Code" (Thebe) button (it would load Thebe from a CDN).

Screenshots go to ``_build/screenshots/``. Run with ``pytest tests/browser -m browser`` after
``make book`` (``make test`` does both).
"""

from __future__ import annotations

import functools
import http.server
import sys
import threading
from pathlib import Path

import preflight
import pytest
import yaml

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = preflight.chromium_path()
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
TIMEOUT_MS = 30_000
#: The one console warning allowed: the vendored @jupyter-widgets/html-manager compiles the widget
#: state's JSON schema with ajv, whose strict mode warns about the schema's own union type. It
#: comes from that package, not from the book, and changes nothing on the page.
KNOWN_WARNING = "strict mode: use allowUnionTypes to allow union type keyword"


def _unavailable(reason: str):
    """Fail, on every machine: a skipped browser test would leave a green run that tested no
    page. `make test BROWSER=0` does not run these tests at all (tests/browser/preflight.py)."""
    pytest.fail(reason)


def first_chapter() -> str:
    """The first file listed under the toc's parts (or chapters), as a site path."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        for entry in part.get("chapters", []):
            if "file" in entry:
                return f"{entry['file']}.html"
    raise AssertionError("_toc.yml lists no chapter")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A page that navigates away mid-download resets its connection (the 30 MiB Pyodide
        snapshot, say): nothing to report. Anything else is printed, as the base class does."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def origin():
    if not (SITE / "index.html").is_file():
        _unavailable(f"{SITE.relative_to(ROOT)}/index.html does not exist: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    problems = preflight.check()
    if problems:
        _unavailable(preflight.message(problems))
    from playwright import sync_api

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class PageVisit:
    """One page load with every request, failed response and script error recorded."""

    def __init__(self, browser, origin: str, path: str, viewport: dict | None = None):
        self.origin = origin
        self.requests: list[str] = []
        self.bad_responses: list[str] = []
        self.errors: list[str] = []
        self.console: list[str] = []
        self.context = browser.new_context(viewport=viewport or {"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("response", self._response)
        self.page.on("requestfailed", lambda r: self.bad_responses.append(f"failed {r.url}"))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", self._console)
        self.response = self.page.goto(f"{origin}/{path}", wait_until="load", timeout=TIMEOUT_MS)
        self.page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)

    def _response(self, response) -> None:
        if response.status >= 400:
            self.bad_responses.append(f"{response.status} {response.url}")

    def _console(self, message) -> None:
        if message.type == "error" or (
            message.type == "warning" and not message.text.startswith(KNOWN_WARNING)
        ):
            self.console.append(f"{message.type}: {message.text[:300]}")

    def favicon_status(self) -> int:
        """HTTP status of the page's icon, or of /favicon.ico when it names none (what a
        browser then asks for)."""
        href = self.page.evaluate(
            "() => { const l = document.querySelector('link[rel~=\"icon\"]');"
            " return l ? l.href : null; }"
        ) or f"{self.origin}/favicon.ico"
        return self.page.request.get(href).status

    def external(self) -> list[str]:
        local = (self.origin + "/", "data:", "blob:", "about:")
        return sorted({u for u in self.requests if not u.startswith(local)})

    def wait_for_mathjax(self) -> None:
        self.page.wait_for_function(
            "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
            timeout=TIMEOUT_MS,
        )
        self.page.evaluate("() => MathJax.startup.promise")

    def prose_text(self) -> str:
        """Visible text of the article, without code, scripts and typeset math."""
        return self.page.evaluate(
            """() => {
                const main = document.querySelector('article') || document.body;
                const copy = main.cloneNode(true);
                copy.querySelectorAll('pre, code, script, style, mjx-container, .MathJax')
                    .forEach(e => e.remove());
                return copy.innerText;
            }"""
        )

    def images(self, selector: str = "article img") -> list[dict]:
        return self.page.eval_on_selector_all(
            selector,
            "els => els.map(e => ({src: e.currentSrc || e.src, w: e.naturalWidth, "
            "done: e.complete}))",
        )

    def screenshot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.page.screenshot(path=str(SHOTS / f"{name}-top.png"))
        return path

    def close(self) -> None:
        self.context.close()


def check_common(visit: PageVisit, name: str) -> None:
    assert visit.response is not None and visit.response.status == 200
    title = visit.page.title()
    assert "Parallelism & GPU Memory" in title, f"{name}: unexpected title {title!r}"
    heading = visit.page.locator("article h1").first
    assert heading.is_visible(), f"{name}: no visible h1 in the article"

    visit.wait_for_mathjax()
    formulas = visit.page.locator("mjx-container").count()
    assert formulas >= 1, f"{name}: MathJax typeset no formula"
    text = visit.prose_text()
    for raw in ("$$", "\\[", "\\(", "\\begin{"):
        assert raw not in text, f"{name}: untypeset math {raw!r} left in the text"

    broken = [img["src"] for img in visit.images() if not img["done"] or img["w"] == 0]
    assert not broken, f"{name}: images that did not load: {broken}"

    visit.screenshot(name)
    assert not visit.external(), (
        f"{name}: requests left the site (the book must load nothing from outside): "
        f"{visit.external()}"
    )
    assert not visit.bad_responses, f"{name}: failed requests: {visit.bad_responses}"
    assert not visit.errors, f"{name}: script errors: {visit.errors}"
    assert not visit.console, f"{name}: console errors or warnings: {visit.console}"
    assert visit.favicon_status() == 200, f"{name}: no favicon"


def test_index_redirect(browser, origin):
    """index.html only redirects to the landing page; it too must log nothing and have its
    favicon (a browser asks for /favicon.ico)."""
    visit = PageVisit(browser, origin, "index.html")
    try:
        visit.page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
        assert not visit.bad_responses, f"index: failed requests: {visit.bad_responses}"
        assert not visit.console, f"index: console errors or warnings: {visit.console}"
        assert visit.page.request.get(f"{origin}/favicon.ico").status == 200
    finally:
        visit.close()


def test_landing_page(browser, origin):
    visit = PageVisit(browser, origin, "intro.html")
    try:
        check_common(visit, "index")
        toc_links = visit.page.locator("nav.bd-docs-nav a.reference.internal").count()
        assert toc_links >= 2, "the navigation lists no chapters"
    finally:
        visit.close()


def test_first_chapter(browser, origin):
    path = first_chapter()
    name = Path(path).stem
    visit = PageVisit(browser, origin, path)
    try:
        check_common(visit, name)
        images = visit.images()
        assert images, f"{name}: the chapter has no figure"

        # launch buttons are plain links (nothing is fetched until a reader follows one)
        hrefs = visit.page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        for service in ("mybinder.org", "colab.research.google.com", "/hub/user-redirect/"):
            assert any(service in h for h in hrefs), f"{name}: no launch link to {service}"
        assert visit.page.locator("button.btn-launch-thebe, .thebe-launch-button").count() == 0, (
            f"{name}: a Live Code (Thebe) button (it loads Thebe from a CDN; issue 16 removed it)"
        )

        explore = visit.page.locator("section#explore")
        assert explore.count() == 1, f"{name}: no 'Explore' section"
        has_widget_state = visit.page.locator(
            'script[type="application/vnd.jupyter.widget-view+json"]'
        ).count() > 0
        rendered = 0
        if has_widget_state:
            # the HTML manager replaces each saved view with live widgets
            visit.page.wait_for_selector(".jupyter-widgets", timeout=TIMEOUT_MS)
            rendered = visit.page.evaluate(
                """() => [...document.querySelectorAll('section#explore .jupyter-widgets')]
                        .filter(e => e.getBoundingClientRect().height > 0).length"""
            )
        explore_images = [
            img for img in visit.images("section#explore img") if img["done"] and img["w"] > 0
        ]
        assert rendered or explore_images, (
            f"{name}: the Explore section shows neither a widget nor a figure"
        )
        assert len(explore_images) == 1, (
            f"{name}: the Explore section shows {len(explore_images)} figures, not one"
        )
        if has_widget_state:
            controls = visit.page.locator("section#explore .parmem-explorer")
            assert controls.count() >= 1, f"{name}: the Explore controls are not marked"
            assert controls.first.evaluate("e => getComputedStyle(e).pointerEvents") == "none"
            note = visit.page.locator("section#explore .parmem-static-note")
            note.first.wait_for(timeout=TIMEOUT_MS)
            assert "mybinder.org" in (note.first.inner_html() or ""), (
                f"{name}: the inactive controls do not link to Binder"
            )
            if name.startswith("ch00"):  # explore_estimate carries its settings (issue 17)
                link = note.first.locator("a.parmem-calculator-link")
                href = link.evaluate("a => a.href")
                page, _, query = href.partition("?")
                assert (SITE / page.removeprefix(origin + "/")).is_file(), href
                assert "model=llama-2-7b" not in query  # the default is left out
                assert {"seq=2048", "flash=1", "m=8"} <= set(query.split("&")), query
        visit.screenshot(name)  # again, now that the widgets have rendered
    finally:
        visit.close()
