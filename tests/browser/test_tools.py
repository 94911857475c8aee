"""The calculator and planner pages in headless Chromium, offline: parmem runs in the page on
Pyodide, and every number the pages show equals CPython parmem's for the same inputs, computed
here by calling the library directly (``estimate``, ``plan``, ``Plan.emit``).

Each page is opened once (Pyodide starts once per page); the test then sets the form for one
configuration after another. The calculator page is first opened with settings in its URL, so
the query string is checked too. Bad input must show the library's own ``ValueError`` message
next to its field. No request may leave the site. Speed is measured by
``benchmarks/bench_web.py``, not here.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pytest
from test_site import SITE, PageVisit, browser, origin  # noqa: F401 (fixtures)

from parmem import Cluster, ModelSpec, ParallelConfig, TrainingSetup, estimate, plan
from parmem.bounds import bounds
from parmem.hardware import hardware_preset
from parmem.planner import Assumptions
from parmem.units import GIB

pytestmark = pytest.mark.browser

PYODIDE_START_MS = 120_000  # generous: two shared cores; benchmarks/bench_web.py measures it

CALC_DEFAULTS = {
    "model": "llama-2-7b", "config": "", "gpu": "h100-sxm", "engine": "paper", "d": "1",
    "t": "1", "p": "1", "e": "1", "cp": "1", "v": "1", "zero": "0", "sp": "0",
    "recompute": "none", "seq": "4096", "b": "1", "m": "1", "precision": "bf16-mixed",
    "flash": "auto",
}
HF_CONFIG = {
    "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "tie_word_embeddings": False,
}
# the first one is opened from the URL; the rest are set in the form
CONFIGS = [
    {"model": "llama-2-7b", "d": "8", "t": "4", "p": "2", "sp": "1", "zero": "1", "m": "8",
     "recompute": "selective", "engine": "megatron-core"},
    {"model": "llama-3-70b", "d": "4", "t": "8", "p": "4", "sp": "1", "zero": "1",
     "seq": "8192", "m": "16", "engine": "megatron-core"},
    {"model": "mixtral-8x7b", "d": "8", "zero": "2", "seq": "2048", "engine": "deepspeed"},
    {"model": "gpt3-175b", "d": "2", "t": "8", "p": "8", "seq": "2048", "m": "8",
     "recompute": "full", "gpu": "a100-80gb", "precision": "fp16-mixed"},
    {"model": "llama-3-8b", "d": "8", "zero": "3", "engine": "fsdp2", "flash": "1", "b": "2"},
    {"model": "gpt2", "engine": "hf", "precision": "fp32", "seq": "1024", "b": "8"},
    {"model": "llama-2-7b", "p": "4", "v": "2", "m": "8"},
    {"model": "llama-3-8b", "d": "2", "t": "2", "cp": "2", "sp": "1", "seq": "16384",
     "flash": "1"},
    {"config": json.dumps(HF_CONFIG), "t": "2", "zero": "1", "d": "2"},
    {"model": "llama-3-70b", "gpu": "a100-40gb"},  # does not fit
]
PLANS = [
    {"model": "llama-3-8b", "gpu": "h100-sxm", "gpn": "8", "nodes": "1", "batch": "64",
     "seq": "4096", "top": "10", "engine": "megatron-core", "emit": "auto", "pick": "1"},
    {"model": "llama-2-13b", "gpu": "a100-80gb", "gpn": "8", "nodes": "2", "batch": "128",
     "seq": "4096", "top": "5", "engine": "deepspeed", "emit": "deepspeed", "pick": "1"},
]


def reference(settings: dict):
    """CPython parmem for the calculator's settings, built here from the library's own API."""
    s = {**CALC_DEFAULTS, **settings}
    spec = (ModelSpec.from_hf_config(json.loads(s["config"])) if s["config"]
            else ModelSpec.preset(s["model"]))
    par = ParallelConfig(dp=int(s["d"]), tp=int(s["t"]), pp=int(s["p"]), ep=int(s["e"]),
                         cp=int(s["cp"]), vpp=int(s["v"]), zero=int(s["zero"]),
                         sp=s["sp"] == "1")
    setup = TrainingSetup(
        seq_len=int(s["seq"]), micro_batch=int(s["b"]), num_microbatches=int(s["m"]),
        precision=s["precision"], recompute=s["recompute"], engine=s["engine"],
        flash_attention=None if s["flash"] == "auto" else s["flash"] == "1",
        schedule="interleaved" if int(s["v"]) > 1 else "1f1b",
    )
    return estimate(spec, par, setup), hardware_preset(s["gpu"])


SET_FORM = """([values, count]) => {
    const root = document.querySelector('[data-parmem-tool]');
    for (const [name, value] of Object.entries(values)) {
        const input = root.querySelector(`[name="${name}"]`);
        if (input.type === 'checkbox') input.checked = value === '1';
        else input.value = value;
    }
    root.querySelector('form').dispatchEvent(new Event('change', {bubbles: true}));
}"""
SETTLED = """(count) => {
    const root = document.querySelector('[data-parmem-tool]');
    return Number(root.dataset.parmemResults || 0) > count && root.dataset.parmemBusy === '0';
}"""


def results(page) -> int:
    return int(page.get_attribute("[data-parmem-tool]", "data-parmem-results") or 0)


def submit(page, values: dict) -> None:
    count = results(page)
    page.evaluate(SET_FORM, [values, count])
    page.wait_for_function(SETTLED, arg=count, timeout=60_000)


def shown_stages(page) -> list[dict]:
    return page.eval_on_selector_all(
        ".parmem-table tbody tr",
        """rows => rows.map(r => Object.fromEntries([...r.querySelectorAll('td[data-term]')]
                .map(td => [td.dataset.term, [Number(td.dataset.bytes), td.textContent]])))""",
    )


def check_calculation(page, settings: dict) -> None:
    est, hw = reference(settings)
    name = json.dumps(settings)[:80]
    errors = page.eval_on_selector_all(".parmem-error", "els => els.map(e => e.textContent)")
    assert not any(errors), f"{name}: {errors}"
    summary = page.locator(".parmem-summary")
    assert int(summary.get_attribute("data-peak-bytes")) == est.peak_bytes, name
    usable = Assumptions().usable_bytes(hw)  # the planner's headroom: one rule for both pages
    fits = est.peak_bytes <= usable and bounds(est, hw).fits  # and the high bound (fit.fits)
    assert summary.get_attribute("data-fits") == str(fits).lower()
    assert f"peak {est.peak_bytes / GIB:.2f} GiB" in summary.inner_text(), name
    band, want = page.locator(".parmem-band"), bounds(est, hw)  # parmem.bounds, in the page
    assert int(band.get_attribute("data-high")) == want.high, name
    assert int(band.get_attribute("data-reserved")) == want.reserved, name
    assert f"high bound {want.high / GIB:.2f} GiB" in band.inner_text(), name
    stages = shown_stages(page)
    assert len(stages) == len(est.stages), name
    for got, ref in zip(stages, est.stages, strict=True):
        for term in (*ref.FIELDS, "total"):
            value = getattr(ref, term)
            assert got[term] == [value, f"{value / GIB:.2f}"], (name, ref.stage, term)
    bars = page.eval_on_selector_all(
        ".parmem-chart svg rect[data-term]", "rs => rs.map(r => Number(r.dataset.bytes))"
    )
    assert sum(bars) == sum(s.total for s in est.stages), name  # the chart draws every byte


def check_start(page) -> None:
    """Python started from the memory snapshot when the site has one (a broken snapshot would
    otherwise hide behind the slow fallback)."""
    manifest = json.loads((SITE / "py" / "manifest.json").read_text())
    expected = "snapshot" if "snapshot" in manifest else "start"
    assert page.get_attribute("[data-parmem-tool]", "data-parmem-start") == expected


def test_calculator(browser, origin):  # noqa: F811 (fixtures)
    first = CONFIGS[0]
    query = "&".join(f"{k}={v}" for k, v in first.items())
    visit = PageVisit(browser, origin, f"chapters/tools/calculator.html?{query}")
    page = visit.page
    try:
        page.wait_for_function(SETTLED, arg=0, timeout=PYODIDE_START_MS)
        check_start(page)
        check_calculation(page, first)  # settings from the URL
        for settings in CONFIGS[1:]:
            submit(page, {**CALC_DEFAULTS, **settings})
            check_calculation(page, settings)
            shared = parse_qs(urlsplit(page.url).query)
            for key, value in settings.items():  # the address carries the settings
                if key != "config" and value != CALC_DEFAULTS[key]:
                    assert shared[key] == [value], (settings, page.url)

        # bad input: the library's own message next to the field, the last result kept
        with pytest.raises(ValueError) as bad:
            estimate(ModelSpec.preset("llama-2-7b"), ParallelConfig(tp=3),
                     TrainingSetup(seq_len=4096))
        submit(page, {**CALC_DEFAULTS, "t": "3"})
        assert page.locator('[data-error-for="t"]').inner_text() == str(bad.value)
        assert page.locator('.parmem-field[data-field="t"]').get_attribute("class").count(
            "parmem-invalid") == 1
        submit(page, {**CALC_DEFAULTS, "t": "2"})
        assert page.locator('[data-error-for="t"]').inner_text() == ""
        check_calculation(page, {"t": "2"})
        visit.screenshot("calculator")
        assert not visit.external(), visit.external()
        assert not visit.bad_responses, visit.bad_responses
        assert not visit.errors, visit.errors
    finally:
        visit.close()


def test_planner(browser, origin):  # noqa: F811 (fixtures)
    visit = PageVisit(browser, origin, "chapters/tools/planner.html")
    page = visit.page
    try:
        page.wait_for_function(SETTLED, arg=0, timeout=PYODIDE_START_MS)
        check_start(page)
        for i, settings in enumerate(PLANS):
            if i:
                submit(page, settings)
            ref = plan(ModelSpec.preset(settings["model"]),
                       Cluster(settings["gpu"], int(settings["gpn"]), int(settings["nodes"])),
                       int(settings["batch"]), int(settings["seq"]), top=int(settings["top"]),
                       engine=settings["engine"])
            rows = page.eval_on_selector_all(
                ".parmem-table tbody tr",
                "rs => rs.map(r => [r.dataset.label, Number(r.dataset.peakBytes), "
                "r.querySelector('[data-col=step_s]').textContent])",
            )
            assert rows == [[c.label(), c.peak_bytes, f"{c.step_time:.3f}"]
                            for c in ref.candidates], settings
            emit = None if settings["emit"] == "auto" else settings["emit"]
            assert page.locator(".parmem-recipe").inner_text().strip() == ref.emit(emit).strip()
            # how far the step time is from held-out measured runs: the plan's own line
            assert page.locator(".parmem-accuracy").inner_text().strip() == \
                ref.accuracy_text()
        # choosing the second layout shows its recipe
        count = results(page)
        page.locator('.parmem-table tbody tr[data-rank="2"]').click()
        page.wait_for_function(SETTLED, arg=count, timeout=60_000)
        assert page.locator(".parmem-recipe").inner_text().strip() == ref.emit(
            PLANS[-1]["emit"], 1).strip()
        assert parse_qs(urlsplit(page.url).query)["pick"] == ["2"]
        visit.screenshot("planner")
        assert not visit.external(), visit.external()
        assert not visit.bad_responses, visit.bad_responses
        assert not visit.errors, visit.errors
    finally:
        visit.close()


def test_calculator_serving_mode(browser, origin):  # noqa: F811 (fixtures)
    """The Serving tab: parmem.serving.startup and emit_command in the page, its state in the
    address (mode=serve), a bad value named next to its field with the last result dimmed."""
    from parmem.serving import emit_command, startup

    visit = PageVisit(browser, origin, "chapters/tools/calculator.html?model=llama-3-70b")
    page = visit.page
    try:
        page.wait_for_function(SETTLED, arg=0, timeout=PYODIDE_START_MS)
        count = results(page)
        page.locator('[data-mode="serve"]').click()  # the model carries over
        page.wait_for_function(SETTLED, arg=count, timeout=60_000)
        assert page.locator('[name="engine"]').input_value() == "vllm"
        submit(page, {"tp": "2"})
        ref = startup(ModelSpec.preset("llama-3-70b"), "h100-sxm", tp=2)
        verdict = page.locator(".parmem-verdict")
        assert ref.verdict in verdict.inner_text()
        assert verdict.inner_text().split(": ", 1)[1].startswith(("starts", "does not start"))
        assert verdict.get_attribute("data-starts") == str(ref.starts).lower()
        assert int(verdict.get_attribute("data-kv-bytes")) == ref.kv
        command = page.locator(".parmem-command").inner_text().strip()
        assert command.startswith("vllm serve")
        assert command == emit_command("vllm", "llama-3-70b", tp=2,
                                       max_model_len=ref.max_model_len)
        bars = page.eval_on_selector_all(
            ".parmem-serve-chart svg rect[data-term]", "rs => rs.map(r => Number(r.dataset.bytes))")
        assert sum(bars) == ref.weights + ref.activation + ref.non_torch + ref.kv
        assert parse_qs(urlsplit(page.url).query) == {
            "mode": ["serve"], "model": ["llama-3-70b"], "tp": ["2"]}
        submit(page, {"tp": "3"})  # 64 heads: the library's message, under tp
        assert page.locator('[data-error-for="tp"]').inner_text() == "tp=3 must divide heads=64"
        assert page.locator(".parmem-serve-output").get_attribute("data-stale") == "1"
        visit.screenshot("calculator-serving")
        assert not visit.external(), visit.external()
        assert not visit.bad_responses, visit.bad_responses
        assert not visit.errors, visit.errors
    finally:
        visit.close()


PHONE = {"width": 390, "height": 844}
# the planner's rule for near-ties, as planner.md states it (parmem.planner.search.TIE)
ORDER_RULE = "within 1% of the fastest of them"
PLAN_ROWS = """rs => rs.map(r => {
    const col = (k) => r.querySelector(`[data-col=${k}]`).textContent;
    return {rank: Number(r.dataset.rank), time: Number(r.dataset.stepTime),
            peak: Number(r.dataset.peakBytes),
            simple: [['d', 't', 'p', 'cp', 'e'].filter(k => Number(col(k)) > 1).length,
                     Number(col('v')) > 1 ? 1 : 0, Number(col('v')), Number(col('zero'))]};
})"""


def fits_the_width(page) -> list[str]:
    """What sticks out of a phone's width: [] when the page does not scroll sideways, else
    the widest elements, to say what to fix."""
    return page.evaluate(
        """() => {
            if (document.documentElement.scrollWidth <= window.innerWidth) return [];
            const wide = [...document.querySelectorAll('body *')]
                .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
                .map(e => `${e.tagName.toLowerCase()}.${e.className} ${e.getBoundingClientRect().right | 0}`);
            return [`scrollWidth ${document.documentElement.scrollWidth} > ${window.innerWidth}`,
                    ...wide.slice(-8)];
        }"""
    )


@pytest.mark.parametrize("path", [
    "chapters/tools/calculator.html", "chapters/tools/planner.html",
    "zh/chapters/tools/calculator.html", "zh/chapters/tools/planner.html",
])
def test_phone_width(browser, origin, path):  # noqa: F811 (fixtures)
    """Issue 33: at 390 px the result tables scroll inside their own box; the page itself never
    scrolls sideways (the serving mode's table too)."""
    visit = PageVisit(browser, origin, path, viewport=PHONE)
    page = visit.page
    try:
        page.wait_for_function(SETTLED, arg=0, timeout=PYODIDE_START_MS)
        assert page.locator(".parmem-table tbody tr").count() > 0, path
        assert fits_the_width(page) == [], path
        box = page.locator(".parmem-table").first.evaluate(
            "t => [getComputedStyle(t.parentElement).overflowX, t.scrollWidth,"
            " t.parentElement.clientWidth]")
        assert box[0] == "auto" and box[1] > box[2], (path, box)  # it scrolls in its box
        if "calculator" in path:
            count = results(page)
            page.locator('[data-mode="serve"]').click()
            page.wait_for_function(SETTLED, arg=count, timeout=60_000)
            assert page.locator(".parmem-serve-table tbody tr").count() > 0
            assert fits_the_width(page) == [], (path, "serve")
        else:
            words = ("单步耗时", "单卡峰值显存", "帕累托前沿", "复制") if path.startswith("zh/") else (
                "step time (s)", "peak memory per GPU (GiB)", "Pareto front", "Copy")
            shown = page.locator(".parmem-plan-chart svg").inner_html() + page.locator(
                "button.parmem-copy").inner_text()
            assert all(w in shown for w in words), (path, words)
        visit.screenshot("phone-" + path.replace("/", "-").removesuffix(".html"))
        assert not visit.errors, visit.errors
    finally:
        visit.close()


def non_dominated(rows: list[dict]) -> set[int]:
    """The ranks of the rows that no other row beats on step time and peak memory both."""
    return {r["rank"] for r in rows if not any(
        o["time"] <= r["time"] and o["peak"] <= r["peak"]
        and (o["time"], o["peak"]) != (r["time"], r["peak"]) for o in rows)}


def check_order(rows: list[dict]) -> None:
    """The table's order is the rule planner.md states: each next row is the simplest of the
    rows left within 1% of the fastest of them (fewest parallel sizes above 1, no
    interleaving, fewest virtual stages, lowest ZeRO stage), then the faster."""
    left = list(rows)
    for row in rows:
        fastest = min(r["time"] for r in left)
        near = [r for r in left if r["time"] <= fastest * 1.01]
        want = min(near, key=lambda r: (r["simple"], r["time"]))
        assert row["rank"] == want["rank"], (row, want)
        left.remove(row)
    for i, row in enumerate(rows):  # so no row is more than 1% slower than one below it
        assert all(row["time"] <= 1.01 * below["time"] for below in rows[i + 1:]), row


def test_planner_chart_order_and_copy(browser, origin):  # noqa: F811 (fixtures)
    """Issue 33: the chart of the listed layouts (one point each, the Pareto front exactly the
    non-dominated ones, the picked one marked), the order the page states, and the recipe's
    copy button (the clipboard read back)."""
    visit = PageVisit(browser, origin, "chapters/tools/planner.html?pick=2")
    visit.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=origin)
    page = visit.page
    try:
        page.wait_for_function(SETTLED, arg=0, timeout=PYODIDE_START_MS)
        assert ORDER_RULE in page.locator("article").inner_text()
        for i, settings in enumerate(PLANS):
            if i:
                submit(page, {**settings, "pick": "3"})
            rows = page.eval_on_selector_all(".parmem-table tbody tr", PLAN_ROWS)
            assert 2 <= len(rows) <= int(settings["top"])
            check_order(rows)
            chart = page.locator(".parmem-plan-chart svg")
            text = chart.inner_html()
            assert "step time (s)" in text and "peak memory per GPU (GiB)" in text
            points = chart.evaluate("""s => [...s.querySelectorAll('circle[data-front]')].map(c => ({
                rank: Number(c.dataset.rank), time: Number(c.dataset.stepTime),
                peak: Number(c.dataset.peakBytes), x: Number(c.getAttribute('cx')),
                y: Number(c.getAttribute('cy')), front: c.dataset.front === '1'}))""")
            assert sorted((p["rank"], p["time"], p["peak"]) for p in points) == [
                (r["rank"], r["time"], r["peak"]) for r in sorted(rows, key=lambda r: r["rank"])]
            front = non_dominated(rows)
            assert front and {p["rank"] for p in points if p["front"]} == front
            line = chart.locator("polyline.parmem-front-line").get_attribute("points").split()
            assert len(line) == len(front)
            # slower is further right, heavier is higher up (y grows downwards)
            for a in points:
                for b in points:
                    if a["time"] < b["time"]:
                        assert a["x"] <= b["x"], (a, b)
                    if a["peak"] < b["peak"]:
                        assert a["y"] >= b["y"], (a, b)
            pick = int(page.locator('[name="pick"]').input_value())
            assert [int(r) for r in chart.locator(".parmem-picked-mark").evaluate_all(
                "ms => ms.map(m => m.dataset.pick)")] == [pick]

        recipe = page.locator("pre.parmem-recipe").inner_text()
        button = page.locator("button.parmem-copy")
        assert button.inner_text() == "Copy" and recipe.strip()
        button.click()
        page.wait_for_function(
            "() => document.querySelector('button.parmem-copy').textContent === 'Copied'")
        assert page.evaluate("() => navigator.clipboard.readText()") == page.locator(
            "pre.parmem-recipe").evaluate("p => p.textContent")
        assert not visit.external(), visit.external()
        assert not visit.errors, visit.errors
    finally:
        visit.close()
