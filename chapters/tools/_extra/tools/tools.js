// Glue between the calculator and planner pages and parmem (parmem.book.web, in worker.js):
// builds the form from the field lists parmem returns, sends the settings, shows the answer.
// Every number shown comes from parmem; this file only lays it out (the planner chart's axes too).
const root = document.querySelector("[data-parmem-tool]");
// what is asked: "calculate" or "plan" (the page's), or "serve" (the calculator's serving mode,
// chosen by its mode switch or by mode=serve in the address)
let kind = root.dataset.parmemTool;
let options = null;
const worker = new Worker(new URL("worker.js", import.meta.url), { type: "module" });
const pending = new Map();
let nextId = 0;
let busy = false;
let queued = null;

worker.onmessage = ({ data }) => {
  const done = pending.get(data.id);
  pending.delete(data.id);
  if (done) done(data);
};

function ask(what, settings) {
  const id = nextId++;
  return new Promise((resolve) => {
    pending.set(id, resolve);
    worker.postMessage({ id, kind: what, settings });
  });
}

const CHOICES = {
  model: (o) => o.models,
  gpu: (o) => Object.keys(o.gpus),
  engine: (o) => Object.keys(o.engines),
  recompute: (o) => o.recompute,
  precision: (o) => o.precisions,
  emit: (o) => o.emit,
  zero: () => ["0", "1", "2", "3"],
  flash: () => ["auto", "1", "0"],
  solve: () => ["none", "seq", "b"],
  adapter: (o) => o.adapters,
  targets: (o) => o.lora_targets,
  quant: (o) => o.base_quants,
  fp8: (o) => o.fp8,
  optimizer: (o) => o.optimizers,
};
// the serving mode's drop-downs (parmem.serving's engines and formats)
const SERVE_CHOICES = {
  model: (o) => o.models,
  gpu: (o) => Object.keys(o.gpus),
  engine: (o) => o.serve.engines,
  quant: (o) => o.serve.quantizations,
  dtype: (o) => o.serve.dtypes,
  kv: (o) => o.serve.kv_dtypes,
};
const FLAGS = new Set(["sp", "offload_act"]);
// the words this file draws, in the page's language (the zh/ edition's pages say lang="zh-CN")
const WORDS = {
  en: {
    time: "step time (s)", peak: "peak memory per GPU (GiB)", front: "Pareto front",
    layout: "listed layout", picked: "picked layout", copy: "Copy", copied: "Copied",
    chart: "Modelled step time against peak memory per GPU of the listed layouts",
  },
  zh: {
    time: "单步耗时（秒）", peak: "单卡峰值显存（GiB）", front: "帕累托前沿",
    layout: "列出的配置", picked: "选中的配置", copy: "复制", copied: "已复制",
    chart: "所列配置的建模单步耗时与单卡峰值显存",
  },
};
const T = WORDS[document.documentElement.lang.startsWith("zh") ? "zh" : "en"];
const SVG = "http://www.w3.org/2000/svg";
// settings that are not form fields: the serving mode's "mode" is the mode switch
const HIDDEN = new Set(["mode"]);

function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

function buildForm(options, fields, choices) {
  const form = root.querySelector("form");
  form.replaceChildren();
  for (const [name, field] of Object.entries(fields)) {
    if (HIDDEN.has(name)) continue;
    const row = el("div", { class: "parmem-field", "data-field": name });
    const id = `parmem-${name}`;
    row.append(el("label", { for: id, title: field.doc }, name));
    let input;
    if (choices[name]) {
      input = el("select", { id, name });
      for (const value of choices[name](options)) input.append(el("option", { value }, value));
    } else if (FLAGS.has(name)) {
      input = el("input", { id, name, type: "checkbox" });
    } else if (name === "config") {
      input = el("textarea", { id, name, rows: "3", placeholder: "paste a Hugging Face config.json (optional)" });
    } else {
      // a field whose default is "auto" takes a word too
      const mode = /^[0-9]/.test(field.default) ? { inputmode: "numeric" } : {};
      input = el("input", { id, name, type: "text", ...mode, size: "7" });
    }
    row.append(input, el("span", { class: "parmem-doc" }, field.doc));
    row.append(el("span", { class: "parmem-error", "data-error-for": name, role: "alert" }));
    form.append(row);
  }
  const general = el("div", { class: "parmem-error", "data-error-for": "_", role: "alert" });
  form.append(general);
}

function setValues(fields, params) {
  for (const [name, field] of Object.entries(fields)) {
    if (HIDDEN.has(name)) continue;
    const input = root.querySelector(`[name="${name}"]`);
    const value = params.has(name) ? params.get(name) : field.default;
    if (input.type === "checkbox") {
      input.checked = ["1", "true", "on", "yes"].includes(value.toLowerCase());
    } else {
      // a value the drop-down does not offer is kept, so that parmem names what is wrong with it
      if (input.tagName === "SELECT" && ![...input.options].some((o) => o.value === value)) {
        input.append(el("option", { value }, value));
      }
      input.value = value;
    }
  }
  // a URL name that is not a field is passed on, so that parmem reports it
  const extra = {};
  for (const [name, value] of params) if (!(name in fields)) extra[name] = value;
  return extra;
}

let fieldNames = [];
let extraSettings = {};
function settings() {
  const out = { ...extraSettings };
  if (kind === "serve") out.mode = "serve";
  for (const name of fieldNames) {
    const input = root.querySelector(`[name="${name}"]`);
    out[name] = input.type === "checkbox" ? (input.checked ? "1" : "0") : input.value;
  }
  return out;
}

function showErrors(errors) {
  for (const node of root.querySelectorAll(".parmem-error")) {
    const message = errors[node.dataset.errorFor] || "";
    node.textContent = message;
    node.closest(".parmem-field")?.classList.toggle("parmem-invalid", Boolean(message));
  }
}

function svg(tag, attrs = {}, text = "") {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

// Round tick values (steps of 1, 2 or 5 × 10^k, at most six) over lo..hi with a margin
function ticks(lo, hi) {
  const pad = hi > lo ? (hi - lo) * 0.08 : Math.abs(hi) * 0.05 || 1;
  lo -= pad; hi += pad;
  let step = 10 ** Math.floor(Math.log10((hi - lo) / 5));
  for (const f of [2, 2.5, 2]) if ((hi - lo) / step > 6) step *= f;
  const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const values = [];
  for (let k = Math.ceil(lo / step); k * step <= hi; k++) values.push(k * step);
  return { lo, hi, values, label: (v) => v.toFixed(digits) };
}

// The planner's chart: each listed layout at (modelled step time, peak memory per GPU), the
// Pareto front parmem found (plan_layouts' "pareto": parmem.planner.pareto_front) joined by a
// line, the picked layout ringed. Clicking a point picks its layout, as its row does.
function planChart(r, pick) {
  const W = 640, H = 300, L = 64, R = 16, TOP = 24, B = 44;
  const front = new Set(r.pareto);
  const x = ticks(Math.min(...r.candidates.map((c) => c.step_time_s)), Math.max(...r.candidates.map((c) => c.step_time_s)));
  const gib = (c) => c.peak_bytes / 2 ** 30;
  const y = ticks(Math.min(...r.candidates.map(gib)), Math.max(...r.candidates.map(gib)));
  const px = (v) => (L + (v - x.lo) / (x.hi - x.lo) * (W - L - R)).toFixed(1);
  const py = (v) => (H - B - (v - y.lo) / (y.hi - y.lo) * (H - B - TOP)).toFixed(1);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": T.chart,
    "font-family": "sans-serif", "font-size": "11" });
  for (const v of x.values) {
    chart.append(svg("line", { x1: px(v), x2: px(v), y1: TOP, y2: H - B, stroke: "#ddd" }),
      svg("text", { x: px(v), y: H - B + 14, "text-anchor": "middle" }, x.label(v)));
  }
  for (const v of y.values) {
    chart.append(svg("line", { x1: L, x2: W - R, y1: py(v), y2: py(v), stroke: "#ddd" }),
      svg("text", { x: L - 6, y: Number(py(v)) + 4, "text-anchor": "end" }, y.label(v)));
  }
  chart.append(svg("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle" }, T.time),
    svg("text", { x: 14, y: (TOP + H - B) / 2, "text-anchor": "middle",
      transform: `rotate(-90 14 ${(TOP + H - B) / 2})` }, T.peak));
  const onFront = r.candidates.filter((c) => front.has(c.rank)).sort((a, b) => a.step_time_s - b.step_time_s);
  chart.append(svg("polyline", { class: "parmem-front-line", fill: "none", stroke: "#C44E52", "stroke-width": "1.5",
    points: onFront.map((c) => `${px(c.step_time_s)},${py(gib(c))}`).join(" ") }));
  for (const c of r.candidates) {
    const dot = svg("circle", { cx: px(c.step_time_s), cy: py(gib(c)), r: front.has(c.rank) ? 4.5 : 3.5,
      fill: front.has(c.rank) ? "#C44E52" : "#4C72B0", "data-rank": c.rank, "data-step-time": c.step_time_s,
      "data-peak-bytes": c.peak_bytes, "data-front": front.has(c.rank) ? "1" : "0" });
    dot.append(svg("title", {}, `${c.rank}. ${c.label}: ${c.step_s} s, ${c.peak_gib} GiB`));
    dot.addEventListener("click", () => pickLayout(c.rank));
    chart.append(dot);
    if (c.rank === pick) {
      chart.append(svg("circle", { class: "parmem-picked-mark", cx: px(c.step_time_s), cy: py(gib(c)), r: 8,
        fill: "none", stroke: "#000", "stroke-width": "1.5", "data-pick": c.rank }));
    }
  }
  // the legend, along the top
  const items = [[T.layout, "#4C72B0"], [T.front, "#C44E52"]];
  let lx = L;
  for (const [name, colour] of items) {
    chart.append(svg("circle", { cx: lx + 4, cy: 10, r: 4, fill: colour }), svg("text", { x: lx + 12, y: 14 }, name));
    lx += 24 + [...name].reduce((w, ch) => w + (ch.charCodeAt(0) > 255 ? 11 : 6.5), 0);
  }
  chart.append(svg("circle", { cx: lx + 4, cy: 10, r: 6, fill: "none", stroke: "#000", "stroke-width": "1.5" }),
    svg("text", { x: lx + 14, y: 14 }, T.picked));
  return chart;
}

function pickLayout(rank) {
  root.querySelector('[name="pick"]').value = String(rank);
  update();
}

// A "Copy" button before each launch recipe: the clipboard, or (where the page may not write
// it) the text selected for the reader to copy
function addCopyButtons() {
  for (const pre of root.querySelectorAll("pre.parmem-recipe")) {
    const button = el("button", { type: "button", class: "parmem-copy" }, T.copy);
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(pre.textContent);
      } catch {
        getSelection().selectAllChildren(pre);
        if (!document.execCommand("copy")) return;
      }
      button.textContent = T.copied;
      setTimeout(() => { button.textContent = T.copy; }, 2000);
    });
    pre.before(button);
  }
}

function cell(row, text, attrs = {}) {
  row.append(el("td", attrs, String(text)));
}

// The band of parmem.bounds: allocated, expected reserved and the high bound, with its headroom
function renderBand(out, b) {
  const node = out.querySelector(".parmem-band");
  if (!node) return;
  if (!b) { node.textContent = ""; return; }
  const verdict = b.fits ? "fits" : "does not fit";
  node.textContent =
    `Stage ${b.stage}: allocated ${b.gib.allocated} GiB, expected reserved ${b.gib.reserved} GiB ` +
    `(+${b.gib.allocator} allocator), high bound ${b.gib.high} GiB (+${b.gib.cuda_context} CUDA context, ` +
    `+${b.gib.nccl} NCCL, +${b.gib.workspace} cuBLAS): the high bound ${verdict} (${b.gib.headroom} GiB headroom).`;
  node.dataset.allocated = String(b.allocated);
  node.dataset.reserved = String(b.reserved);
  node.dataset.high = String(b.high);
  node.dataset.fits = String(b.fits);
}

function renderCalculation(r) {
  const out = root.querySelector(".parmem-output");
  const fits = r.fits ? "fits" : "does not fit";
  out.querySelector(".parmem-summary").textContent =
    `${r.model} on ${r.world_size} GPUs: peak ${r.peak_gib} GiB per GPU (stage ${r.peak_stage}) — ` +
    `${fits}: the estimate within the ${r.usable_gib} GiB usable of the ${r.gpu}'s ${r.memory_gib} GiB (${r.headroom} kept free), ` +
    `and the high bound below within the whole GPU.`;
  out.querySelector(".parmem-summary").dataset.fits = String(r.fits);
  out.querySelector(".parmem-summary").dataset.peakBytes = String(r.peak_bytes);
  renderBand(out, r.band);
  const solved = out.querySelector(".parmem-solve");
  if (solved) {
    solved.textContent = r.solve ? `Largest that fits on the high bound: ${r.solve.text}.` : "";
    solved.dataset.value = r.solve ? String(r.solve.value) : "";
  }
  const table = el("table", { class: "parmem-table" });
  const head = el("tr");
  for (const h of ["stage", "layers", ...r.components.map((c) => r.labels[c]), "total"]) head.append(el("th", {}, h));
  table.appendChild(el("thead")).append(head);
  const body = table.appendChild(el("tbody"));
  for (const s of r.stages) {
    const row = el("tr", { "data-stage": String(s.stage) });
    cell(row, s.stage);
    cell(row, s.layers);
    for (const c of [...r.components, "total"]) cell(row, s.gib[c], { "data-term": c, "data-bytes": String(s[c]) });
    body.append(row);
  }
  out.querySelector(".parmem-table-box").replaceChildren(table);
  out.querySelector(".parmem-chart").innerHTML = r.svg; // SVG drawn by parmem.book.svg
  out.querySelector(".parmem-text").textContent = r.text;
}

function renderPlan(r) {
  const out = root.querySelector(".parmem-output");
  out.querySelector(".parmem-summary").textContent = r.candidates.length
    ? `${r.model} on ${r.world_size} GPUs (${r.usable_gib} GiB usable per GPU): ${r.candidates.length} best layouts by modelled step time.`
    : r.message;
  const table = el("table", { class: "parmem-table" });
  const cols = ["rank", "t", "p", "d", "cp", "e", "v", "zero", "sp", "recompute", "b", "m", "peak_gib", "step_s", "tokens_per_s", "mfu"];
  const head = el("tr");
  for (const h of cols) head.append(el("th", {}, h === "peak_gib" ? "peak GiB" : h === "step_s" ? "step s" : h === "tokens_per_s" ? "tokens/s" : h));
  table.appendChild(el("thead")).append(head);
  const body = table.appendChild(el("tbody"));
  const pick = Number(root.querySelector('[name="pick"]').value);
  for (const c of r.candidates) {
    const row = el("tr", { "data-rank": String(c.rank), "data-label": c.label, "data-peak-bytes": String(c.peak_bytes),
      "data-step-time": String(c.step_time_s) });
    if (c.rank === pick) row.classList.add("parmem-picked");
    for (const k of cols) cell(row, k === "sp" ? (c.sp ? "yes" : "no") : c[k], { "data-col": k });
    row.addEventListener("click", () => pickLayout(c.rank));
    body.append(row);
  }
  out.querySelector(".parmem-table-box").replaceChildren(table);
  out.querySelector(".parmem-accuracy").textContent = r.accuracy;
  out.querySelector(".parmem-plan-chart").replaceChildren(...(r.candidates.length ? [planChart(r, pick)] : []));
  out.querySelector(".parmem-recipe").textContent = r.recipe;
  for (const button of out.querySelectorAll(".parmem-copy")) button.hidden = !r.recipe;
  renderBand(out, r.band);
}

// The serving mode: parmem.serving.startup on the busiest GPU, its verdict and launch command
function renderServe(r) {
  const out = root.querySelector(".parmem-serve-output");
  const n = (x) => Number(x).toLocaleString("en-US");
  const verdict = out.querySelector(".parmem-verdict");
  verdict.textContent = `${r.model} on ${r.engine}, ${r.gpus} × ${r.gpu}: ${r.verdict}.`;
  verdict.dataset.starts = String(r.starts);
  verdict.dataset.kvBytes = String(r.kv);
  const summary = out.querySelector(".parmem-serve-summary");
  summary.textContent =
    `The engine's budget is ${r.budget_gib} GiB of the GPU's ${r.total_gib} GiB. ` +
    `KV cache ${r.kv_gib} GiB per GPU (${n(r.kv_token_bytes)} bytes a token): ${n(r.tokens)} tokens ` +
    `in ${n(r.blocks)} blocks; the longest request it holds has ${n(r.longest)} tokens; ` +
    `${r.concurrency} requests of max_model_len = ${n(r.max_model_len)} tokens fit at once.` +
    r.warnings.map((w) => ` ${w}`).join("");
  summary.dataset.tokens = String(r.tokens);
  summary.dataset.longest = String(r.longest);
  const table = el("table", { class: "parmem-table" });
  const head = el("tr");
  for (const h of ["per GPU", "GiB"]) head.append(el("th", {}, h));
  table.appendChild(el("thead")).append(head);
  const body = table.appendChild(el("tbody"));
  for (const row of r.rows) {
    const tr = el("tr", { "data-term": row.term });
    cell(tr, row.label);
    cell(tr, row.gib, { "data-term": row.term, "data-bytes": String(row.bytes) });
    body.append(tr);
  }
  const budget = el("tr", { "data-term": "budget" });
  cell(budget, "engine budget");
  cell(budget, r.budget_gib, { "data-term": "budget", "data-bytes": String(r.budget) });
  body.append(budget);
  out.querySelector(".parmem-serve-table").replaceChildren(table);
  out.querySelector(".parmem-serve-chart").innerHTML = r.svg; // SVG drawn by parmem.book.svg
  out.querySelector(".parmem-command").textContent = r.command;
}

const RENDER = { calculate: (r) => renderCalculation(r), plan: (r) => renderPlan(r), serve: (r) => renderServe(r) };

// the output of the mode shown; the other mode's is hidden (the calculator page has both)
function activeOutput() {
  return root.querySelector(kind === "serve" ? ".parmem-serve-output" : ".parmem-output");
}

async function update() {
  if (busy) { queued = true; return; }
  busy = true;
  root.dataset.parmemBusy = "1";
  const started = performance.now();
  const asked = kind;
  const reply = await ask(kind, settings());
  busy = false;
  const out = activeOutput();
  if (asked !== kind) {
    queued = true; // the mode changed meanwhile: this answer is for the other form
  } else if (reply.error || !reply.result.ok) {
    showErrors(reply.error ? { _: reply.error } : reply.result.errors);
    out.classList.add("parmem-stale"); // the last result stays, dimmed: it is not these settings'
    out.dataset.stale = "1";
  } else {
    showErrors({});
    out.classList.remove("parmem-stale");
    out.dataset.stale = "0";
    RENDER[kind](reply.result);
    const url = new URL(window.location.href);
    url.search = reply.result.query;
    window.history.replaceState(null, "", url);
    for (const share of root.querySelectorAll(".parmem-share")) share.href = url.href;
  }
  root.dataset.parmemResults = String(Number(root.dataset.parmemResults || 0) + 1);
  root.dataset.parmemMs = (performance.now() - started).toFixed(1);
  root.dataset.parmemPythonMs = reply.ms ? reply.ms.toFixed(1) : "";
  root.dataset.parmemStart = reply.from || ""; // "snapshot" or "start": how Python started
  if (queued) { queued = false; update(); return; }
  root.dataset.parmemBusy = "0";
}

// Each output as the page has it, before any answer: switching modes restores the other one
const EMPTY = new Map([...root.querySelectorAll(".parmem-output, .parmem-serve-output")].map((n) => [n, n.innerHTML]));

// Show mode k ("calculate", "serve" or "plan"): its form, with params (URLSearchParams) or the
// defaults, and its output
function showMode(k, params) {
  kind = k;
  const fields = { calculate: options.calc_fields, serve: options.serve_fields, plan: options.plan_fields }[k];
  fieldNames = Object.keys(fields).filter((name) => !HIDDEN.has(name));
  buildForm(options, fields, k === "serve" ? SERVE_CHOICES : CHOICES);
  params.delete("mode");
  extraSettings = setValues(fields, params);
  for (const tab of root.querySelectorAll("[data-mode]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.mode === k));
  }
  for (const [node, html] of EMPTY) {
    const shown = node === activeOutput();
    if (node.hidden === shown) { node.innerHTML = html; node.classList.remove("parmem-stale"); }
    node.hidden = !shown;
  }
  root.dataset.parmemMode = k;
}

(async () => {
  const status = root.querySelector(".parmem-status");
  const reply = await ask("options", {});
  if (reply.error) { status.textContent = `Python did not start: ${reply.error}`; return; }
  options = reply.result;
  const params = new URLSearchParams(window.location.search);
  const tabs = root.querySelectorAll("[data-mode]");
  const start = tabs.length && params.get("mode") === "serve" ? "serve" : kind;
  showMode(start, params);
  const form = root.querySelector("form");
  form.addEventListener("input", () => update());
  form.addEventListener("change", () => update());
  form.addEventListener("submit", (e) => e.preventDefault());
  for (const tab of tabs) {
    tab.addEventListener("click", () => {
      if (tab.dataset.mode === kind) return;
      // the model and the GPU carry over to the other mode; the rest takes its defaults
      const carried = new URLSearchParams();
      for (const name of ["model", "gpu"]) {
        const input = root.querySelector(`[name="${name}"]`);
        if (input && input.value) carried.set(name, input.value);
      }
      showMode(tab.dataset.mode, carried);
      update();
    });
  }
  addCopyButtons();
  status.textContent = "";
  root.dataset.parmemReady = "1";
  await update();
})();
