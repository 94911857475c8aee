// Make a memory snapshot of Pyodide with parmem imported, for the calculator and planner pages:
// restoring it skips Python's start-up and the import of parmem (about 5 s of CPU on a slow
// machine, a fraction of that from the snapshot). Written by `make book` after the wheel:
//
//   node scripts/pyodide_snapshot.mjs
//
// reads _assets/py/manifest.json and the wheel it names, writes _assets/py/snapshot.bin and
// records it in the manifest with the SHA-256 of the wheel it was made from; the page's worker
// uses the snapshot only when that matches the wheel it loads, and otherwise (or when restoring
// fails) starts Pyodide from scratch. Uses Pyodide's experimental snapshot API of the pinned
// version (loadPyodide({_makeSnapshot}) / makeMemorySnapshot() / loadPyodide({_loadSnapshot})).
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const out = join(root, "_assets", "py");
const { loadPyodide } = await import(join(root, "node_modules", "pyodide", "pyodide.mjs"));

const manifestPath = join(out, "manifest.json");
const manifest = JSON.parse(readFileSync(manifestPath, "utf8"));
const wheel = new Uint8Array(readFileSync(join(out, manifest.wheel)));
const started = performance.now();
const pyodide = await loadPyodide({ _makeSnapshot: true });
const site = pyodide.runPython("import site; site.getsitepackages()[0]");
pyodide.unpackArchive(wheel, "wheel", { extractDir: site });
pyodide.runPython("import parmem.book.web");
const snapshot = pyodide.makeMemorySnapshot();
writeFileSync(join(out, "snapshot.bin"), snapshot);
manifest.snapshot = {
  file: "snapshot.bin",
  sha256: createHash("sha256").update(snapshot).digest("hex"),
  wheel_sha256: manifest.sha256,
};
writeFileSync(manifestPath, JSON.stringify(manifest, null, 2) + "\n");
const mib = (snapshot.length / 2 ** 20).toFixed(1);
console.log(`snapshot: _assets/py/snapshot.bin (${mib} MiB, ${((performance.now() - started) / 1000).toFixed(1)} s)`);
