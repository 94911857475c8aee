// Glue between the calculator and planner pages and parmem (parmem.book.web, in worker.js):
// builds the form from the field lists parmem returns, sends the settings, shows the answer.
// Every number shown comes from parmem; nothing is computed here.
const root = document.querySelector("[data-parmem-tool]");
const kind = root.dataset.parmemTool; // "calculate" or "plan"
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
const FLAGS = new Set(["sp", "offload_act"]);

function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

function buildForm(options, fields) {
  const form = root.querySelector("form");
  for (const [name, field] of Object.entries(fields)) {
    const row = el("div", { class: "parmem-field", "data-field": name });
    const id = `parmem-${name}`;
    row.append(el("label", { for: id, title: field.doc }, name));
    let input;
    if (CHOICES[name]) {
      input = el("select", { id, name });
      for (const value of CHOICES[name](options)) input.append(el("option", { value }, value));
    } else if (FLAGS.has(name)) {
      input = el("input", { id, name, type: "checkbox" });
    } else if (name === "config") {
      input = el("textarea", { id, name, rows: "3", placeholder: "paste a Hugging Face config.json (optional)" });
    } else {
      input = el("input", { id, name, type: "text", inputmode: "numeric", size: "7" });
    }
    row.append(input, el("span", { class: "parmem-doc" }, field.doc));
    row.append(el("span", { class: "parmem-error", "data-error-for": name, role: "alert" }));
    form.append(row);
  }
  const general = el("div", { class: "parmem-error", "data-error-for": "_", role: "alert" });
  form.append(general);
  form.addEventListener("input", () => update());
  form.addEventListener("change", () => update());
  form.addEventListener("submit", (e) => e.preventDefault());
}

function setValues(fields, params) {
  for (const [name, field] of Object.entries(fields)) {
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
    const row = el("tr", { "data-rank": String(c.rank), "data-label": c.label, "data-peak-bytes": String(c.peak_bytes) });
    if (c.rank === pick) row.classList.add("parmem-picked");
    for (const k of cols) cell(row, k === "sp" ? (c.sp ? "yes" : "no") : c[k], { "data-col": k });
    row.addEventListener("click", () => {
      root.querySelector('[name="pick"]').value = String(c.rank);
      update();
    });
    body.append(row);
  }
  out.querySelector(".parmem-table-box").replaceChildren(table);
  out.querySelector(".parmem-recipe").textContent = r.recipe;
  renderBand(out, r.band);
}

async function update() {
  if (busy) { queued = true; return; }
  busy = true;
  root.dataset.parmemBusy = "1";
  const started = performance.now();
  const reply = await ask(kind, settings());
  busy = false;
  if (reply.error) {
    showErrors({ _: reply.error });
  } else if (!reply.result.ok) {
    showErrors(reply.result.errors);
  } else {
    showErrors({});
    (kind === "calculate" ? renderCalculation : renderPlan)(reply.result);
    const url = new URL(window.location.href);
    url.search = reply.result.query;
    window.history.replaceState(null, "", url);
    const share = root.querySelector(".parmem-share");
    if (share) share.href = url.href;
  }
  root.dataset.parmemResults = String(Number(root.dataset.parmemResults || 0) + 1);
  root.dataset.parmemMs = (performance.now() - started).toFixed(1);
  root.dataset.parmemPythonMs = reply.ms ? reply.ms.toFixed(1) : "";
  root.dataset.parmemStart = reply.from || ""; // "snapshot" or "start": how Python started
  if (queued) { queued = false; update(); return; }
  root.dataset.parmemBusy = "0";
}

(async () => {
  const status = root.querySelector(".parmem-status");
  const reply = await ask("options", {});
  if (reply.error) { status.textContent = `Python did not start: ${reply.error}`; return; }
  const fields = kind === "calculate" ? reply.result.calc_fields : reply.result.plan_fields;
  fieldNames = Object.keys(fields);
  buildForm(reply.result, fields);
  extraSettings = setValues(fields, new URLSearchParams(window.location.search));
  status.textContent = "";
  root.dataset.parmemReady = "1";
  await update();
})();
