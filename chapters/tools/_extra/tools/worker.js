// The Python side of the calculator and planner pages: Pyodide (served by the site, from
// vendor/pyodide) runs parmem's own wheel (py/, built by scripts/build_wheel.py) in this Web
// Worker, so that a long plan never freezes the page. Messages: {id, kind, settings} in,
// {id, result, ms} or {id, error} out; kind is "options", "calculate" or "plan" and the result is
// what parmem.book.web.run_json returns.
import { loadPyodide } from "../vendor/pyodide/pyodide.mjs";

const site = new URL("../", import.meta.url);

async function fetchWheel() {
  const manifest = await (await fetch(new URL("py/manifest.json", site))).json();
  const url = new URL(`py/${manifest.wheel}?v=${manifest.sha256}`, site);
  return (await fetch(url)).arrayBuffer();
}

const ready = (async () => {
  const wheelPromise = fetchWheel(); // fetched while Python starts
  const pyodide = await loadPyodide({ indexURL: new URL("vendor/pyodide/", site).href });
  const wheel = await wheelPromise;
  const target = pyodide.runPython("import site; site.getsitepackages()[0]");
  pyodide.unpackArchive(wheel, "wheel", { extractDir: target });
  return pyodide.pyimport("parmem.book.web").run_json;
})();

self.onmessage = async ({ data }) => {
  try {
    const run = await ready;
    const start = performance.now();
    const text = run(data.kind, JSON.stringify(data.settings || {}));
    self.postMessage({ id: data.id, result: JSON.parse(text), ms: performance.now() - start });
  } catch (error) {
    self.postMessage({ id: data.id, error: String(error) });
  }
};
