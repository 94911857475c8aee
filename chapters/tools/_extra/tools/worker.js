// The Python side of the calculator and planner pages: Pyodide (served by the site, from
// vendor/pyodide) runs parmem's own wheel (py/, built by scripts/build_wheel.py) in this Web
// Worker, so that a long plan never freezes the page. Messages: {id, kind, settings} in,
// {id, result, ms} or {id, error} out; kind is "options", "calculate" or "plan" and the result is
// what parmem.book.web.run_json returns.
//
// Start-up: when py/manifest.json lists a memory snapshot made from this very wheel
// (scripts/pyodide_snapshot.mjs), Pyodide is restored from it, with parmem already imported;
// otherwise, or if restoring fails, Python starts from scratch. Either way the wheel is unpacked
// into site-packages (a snapshot holds memory, not files: parmem reads its data files from there).
import { loadPyodide } from "../vendor/pyodide/pyodide.mjs";

const site = new URL("../", import.meta.url);
const indexURL = new URL("vendor/pyodide/", site).href;

async function bytes(path) {
  const response = await fetch(new URL(path, site));
  if (!response.ok) throw new Error(`${response.status} ${response.url}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function start(manifest) {
  const snap = manifest.snapshot;
  if (snap && snap.wheel_sha256 === manifest.sha256) {
    try {
      const snapshot = await bytes(`py/${snap.file}?v=${snap.sha256}`);
      return { pyodide: await loadPyodide({ indexURL, _loadSnapshot: snapshot }), from: "snapshot" };
    } catch (error) {
      console.warn(`parmem: the Pyodide snapshot did not load (${error}); starting Python`);
    }
  }
  return { pyodide: await loadPyodide({ indexURL }), from: "start" };
}

const ready = (async () => {
  const manifest = await (await fetch(new URL("py/manifest.json", site))).json();
  const wheelPromise = bytes(`py/${manifest.wheel}?v=${manifest.sha256}`); // while Python starts
  const { pyodide, from } = await start(manifest);
  const target = pyodide.runPython("import site; site.getsitepackages()[0]");
  pyodide.unpackArchive(await wheelPromise, "wheel", { extractDir: target });
  self.parmemStart = from;
  return pyodide.pyimport("parmem.book.web").run_json;
})();

self.onmessage = async ({ data }) => {
  try {
    const run = await ready;
    const start = performance.now();
    const text = run(data.kind, JSON.stringify(data.settings || {}));
    self.postMessage({ id: data.id, result: JSON.parse(text), ms: performance.now() - start, from: self.parmemStart });
  } catch (error) {
    self.postMessage({ id: data.id, error: String(error) });
  }
};
