"""Execute the book's chapters into Jupyter Book's execution cache, several at a time.

`make test` fills the cache in its chapters stage (nbval, ``tests/book/nbval_chapters.py``, which
stores each chapter with :func:`store`), so after it this script finds every chapter cached and
runs nothing. It runs what the cache lacks: chapters changed since, or a `make book` without
`make test`. Jupyter Book (execute_notebooks: cache) would run each outdated notebook one after
another while Sphinx reads the sources; this script runs them first, in parallel (default: two
at a time), exactly as myst-nb would (same jupyter-cache call, the notebook's folder as working
directory, the same per-cell timeout, errors not allowed), and stores the results in the same
cache. The build then finds every notebook cached and only renders.

jupyter-cache's own parallel executor (``JupyterExecutorLocalMproc``, ``jcache project execute
--executor local-parallel``) would do the same but cannot be given a job count: it starts
``multiprocessing.Pool()``, one process per CPU, each chapter with its own ranks (on a machine of
many cores, that many kernels and ranks at once); its worker processes also write the cache's
database at the same time, without the lock :func:`store` takes, and a failure is only logged
(its traceback goes into the database). So this script stays.

Usage: python scripts/execute_notebooks.py [--jobs N] [--timeout S] [--cache DIR] [NOTEBOOK ...]
With no notebook given: every chapters/**/*.ipynb listed in _toc.yml. ``--list`` prints those
(relative paths, toc order) and exits.
Exit status 1 if a notebook failed (its traceback is printed).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def toc_notebooks() -> list[Path]:
    """Notebooks under chapters/ that _toc.yml lists, in toc order."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    found: list[Path] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if "file" in node:
                path = ROOT / (str(node["file"]) + ".ipynb")
                if path.is_file():
                    found.append(path)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return found


CACHE = ROOT / "_build" / ".jupyter_cache"


def cell_timeout() -> int:
    """Seconds per cell, as the build uses them (``execute.timeout`` in ``_config.yml``)."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return int(config.get("execute", {}).get("timeout", 30))


def store(nb, path, seconds: float, cache_dir: Path = CACHE) -> None:
    """Put an executed notebook into the execution cache, as the build would. A file lock keeps
    two processes (pytest-xdist workers) from writing the cache's database at once."""
    import fcntl

    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir.parent / ".jupyter_cache.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        get_cache(str(cache_dir)).cache_notebook_bundle(
            CacheBundleIn(nb, str(path), data={"execution_seconds": seconds}),
            check_validity=False,
            overwrite=True,
        )


def execute(path: str, timeout: int):
    """Run one notebook; return (path, notebook, seconds, traceback)."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(path, as_version=4)
    result = single_nb_execution(
        nb, cwd=str(Path(path).parent), timeout=timeout, allow_errors=False, meta_override=True
    )
    return path, result.nb, result.time, result.exc_string if result.err else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")))
    parser.add_argument("--timeout", type=int, default=None,
                        help="seconds per cell (default: execute.timeout in _config.yml)")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--list", action="store_true",
                        help="print the chapters of _toc.yml and exit")
    args = parser.parse_args()
    if args.list:
        print("\n".join(str(p.relative_to(ROOT)) for p in toc_notebooks()))
        return 0

    import nbformat
    from jupyter_cache import get_cache

    if args.timeout is None:
        args.timeout = cell_timeout()
    cache = get_cache(str(args.cache))
    notebooks = [p.resolve() for p in args.notebooks] or toc_notebooks()
    todo = []
    for path in notebooks:
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            todo.append(str(path))
    print(f"execute: {len(notebooks) - len(todo)} of {len(notebooks)} notebooks cached, "
          f"{len(todo)} to run ({args.jobs} at a time)", flush=True)
    if not todo:
        return 0

    failed = []
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=context) as pool:
        futures = [pool.submit(execute, path, args.timeout) for path in todo]
        for future in as_completed(futures):
            path, nb, seconds, traceback = future.result()
            rel = os.path.relpath(path, ROOT)
            if traceback:
                failed.append(rel)
                print(f"  FAILED {rel} after {seconds:.1f} s\n{traceback}", flush=True)
                continue
            store(nb, path, seconds, args.cache)
            print(f"  {seconds:6.1f} s  {rel}", flush=True)
    print(f"execute: {len(todo)} notebooks in {time.perf_counter() - start:.1f} s wall time",
          flush=True)
    if failed:
        print("execute: failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
