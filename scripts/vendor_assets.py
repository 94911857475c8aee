"""Copy the browser assets the book serves itself from node_modules/ into _assets/vendor/.

The site must load nothing from outside itself, so MathJax 3, RequireJS, the ipywidgets
HTML manager and Pyodide's core runtime (for the calculator and planner pages) come from npm (package.json, pinned; `npm ci` from package-lock.json) and are
served from the site. `_assets/` is listed in Sphinx's `html_extra_path`, so its contents land
at the site root: `_build/html/vendor/...`. They stay out of `_static/`, because Jupyter Book
adds every `.js` file under `_static/` to every page.

Usage: python scripts/vendor_assets.py [--check]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_MODULES = ROOT / "node_modules"
DEST = ROOT / "_assets" / "vendor"

# (npm package, folder or file inside it, destination under _assets/vendor, files to leave out)
# A folder is copied whole, less the files to leave out; a tuple of names copies only those.
ASSETS = [
    # MathJax loads its components and fonts relative to its own script, so copy the whole es5/.
    ("mathjax", "es5", "mathjax", ()),
    ("requirejs", "require.js", "requirejs/require.js", ()),
    # embed-amd.js finds its fonts beside itself; the other bundles and source maps are not needed.
    (
        "@jupyter-widgets/html-manager",
        "dist",
        "html-manager",
        ("embed.js", "embed.js.map", "embed.js.LICENSE.txt", "libembed-amd.js"),
    ),
    # Pyodide's core: the loader, the Emscripten module, the WebAssembly binary, the standard
    # library and the lock file loadPyodide reads (no packages: parmem needs only the stdlib).
    # ~13 MB; the console pages, type declarations and source maps stay out.
    (
        "pyodide",
        ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip",
         "pyodide-lock.json", "package.json"),
        "pyodide",
        (),
    ),
]

# Loaded after require.js and before embed-amd.js on pages with widgets (_config.yml).
WIDGETS_SETUP_JS = """\
// Written by scripts/vendor_assets.py; loaded after require.js and before embed-amd.js.
(function () {
  // 1. embed-amd.js defines AMD modules that find their fonts relative to their own module URL,
  // which RequireJS derives from the module's name (relative to the page by default). Map those
  // names to this folder, where the fonts are, so that every page finds them on the site.
  var here = document.currentScript.src.replace(/[^/]*$/, "");
  var paths = {"@jupyter-widgets/html-manager/dist": here.slice(0, -1)};
  ["base", "base7", "controls", "controls7", "html-manager", "output"].forEach(function (name) {
    paths["@jupyter-widgets/" + name] = here + name;
  });
  window.__jupyter_widgets_assets_path__ = here;
  window.requirejs.config({paths: paths});

  // 2. ipywidgets typesets labels with MathJax 2's MathJax.Hub.Queue; the book loads MathJax 3.
  // The deferred MathJax script has run by DOMContentLoaded, which comes before the widgets
  // render, so give it the one call the widgets make.
  document.addEventListener("DOMContentLoaded", function () {
    var mj = window.MathJax;
    if (!mj || mj.Hub || !mj.startup) return;
    mj.Hub = {
      Queue: function (command) {
        var element = command && command[2];
        mj.startup.promise.then(function () {
          return element ? mj.typesetPromise([element]) : mj.typesetPromise();
        });
      },
    };
  });
})();
"""

# Files the pages reference (see _config.yml: mathjax_path and nb_ipywidgets_js).
REQUIRED = [
    "mathjax/tex-mml-chtml.js",
    "mathjax/output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff",
    "requirejs/require.js",
    "html-manager/widgets-setup.js",
    "html-manager/embed-amd.js",
    "pyodide/pyodide.mjs",
    "pyodide/pyodide.asm.mjs",
    "pyodide/pyodide.asm.wasm",
    "pyodide/python_stdlib.zip",
    "pyodide/pyodide-lock.json",
]


def version(package: str) -> str:
    return json.loads((NODE_MODULES / package / "package.json").read_text())["version"]


def copy() -> None:
    if not NODE_MODULES.is_dir():
        sys.exit("node_modules/ is missing: run `npm ci` first (make does).")
    if DEST.exists():
        shutil.rmtree(DEST)
    versions = {}
    for package, inner, target, skip in ASSETS:
        names = inner if isinstance(inner, tuple) else None
        src = NODE_MODULES / package / ("" if names else inner)
        dst = DEST / target
        if not src.exists():
            sys.exit(f"{src} is missing: is {package} in package.json, and did `npm ci` run?")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if names:
            dst.mkdir(parents=True, exist_ok=True)
            for name in names:
                if not (src / name).is_file():
                    sys.exit(f"{src / name} is missing: is {package} in package.json?")
                shutil.copy2(src / name, dst / name)
        elif src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*skip) if skip else None)
        else:
            shutil.copy2(src, dst)
        versions[package] = version(package)
    (DEST / "html-manager" / "widgets-setup.js").write_text(WIDGETS_SETUP_JS)
    (DEST / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    print("vendored into _assets/vendor:", ", ".join(f"{k}@{v}" for k, v in versions.items()))


def check() -> int:
    missing = [name for name in REQUIRED if not (DEST / name).is_file()]
    for name in missing:
        print(f"missing: _assets/vendor/{name}", file=sys.stderr)
    return 1 if missing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the files are there")
    args = parser.parse_args()
    if not args.check:
        copy()
    return check()


if __name__ == "__main__":
    sys.exit(main())
