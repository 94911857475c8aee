# Parallelism & GPU Memory: build, test and explore the book.
#
#   make book    the site, in _build/html, and its Chinese edition in _build/html/zh (executes every
#                chapter once; cached afterwards)
#   make i18n    update the Chinese edition's catalogs (locales/) after changing English prose
#   make test    lint, unit tests, every chapter as a test, the book with -W (the live notebooks
#                in JupyterLab beside it), the browser tests of the site (they need Chromium and a
#                CJK font: make test fails at its start without them; BROWSER=0 skips them)
#   make stress  the pool and distributed tests 5 times (RUNS=N) while busy loops load every core
#   make lab     JupyterLab on the chapters, with parmem installed in the kernel
#   make bench   run every benchmarks/bench_*.py
#   make engines run each engine's own training step on CPU ranks and record it (data/engine_runs/)
#   make clean   remove the build (keeps .venv and node_modules); make distclean removes those too
#
# Setup is shared and incremental: the virtual environment is (re)installed only when
# requirements.txt or pyproject.toml change, the npm assets (MathJax, the widget manager, Pyodide)
# only when package-lock.json does, the wheel of parmem the browser pages load when lib/ or data/ do.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
JOBS ?= 2
BUILD := _build
HTML := $(BUILD)/html
STAMP_PY := $(VENV)/.installed
STAMP_NPM := node_modules/.installed
STAMP_ASSETS := _assets/vendor/.copied
# the wheel of parmem the calculator and planner pages load into Pyodide (scripts/build_wheel.py)
WHEEL_MANIFEST := _assets/py/manifest.json
# and a memory snapshot of Pyodide with that wheel imported (scripts/pyodide_snapshot.mjs): the
# pages start from it in a fraction of the time (30 MiB; `make book WEB_SNAPSHOT=0` leaves it out,
# and the pages start Python from scratch)
WEB_SNAPSHOT ?= 1
SNAPSHOT := _assets/py/snapshot.bin
WHEEL_SOURCES := $(shell find lib/parmem -name '*.py' -not -path '*/__pycache__/*') $(wildcard data/*.toml)
# BROWSER=0 skips the browser and live stages (and says so); otherwise they need Chromium,
# Playwright and a CJK font, and `make test` stops at its start, in one line, when one is missing
BROWSER ?= 1

# The chapters' torch.distributed demos start this many ranks; one BLAS thread per process keeps
# two notebooks of two ranks each from fighting over two cores.
export PARMEM_WORLD_SIZE ?= 2
export OMP_NUM_THREADS ?= 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# A kernel that a Jupyter server started has JPY_SESSION_NAME; parmem.book.prose then writes
# citations as author-year text for a live reader. The build and the tests keep the roles, even
# when `make` itself runs from a notebook's terminal or a `!make` cell.
unexport JPY_SESSION_NAME

# pytest exits 5 when it collected no test: say so, and fail (a stage that tests nothing is broken)
no_tests = { rc=$$?; [ $$rc -ne 5 ] || echo "$(1): pytest collected no tests (exit 5); the stage must run tests" >&2; exit $$rc; }

# Append "stage seconds" to $(BUILD)/stage-times.txt while running a stage: $(call timed,NAME) CMD
timed = bash -c 's=$$SECONDS; "$$@"; rc=$$?; printf "  %-22s %5d s\n" "$(1)" $$((SECONDS - s)) >> $(BUILD)/stage-times.txt; exit $$rc' _

.PHONY: help setup book execute build-html i18n test lint unit notebooks nbval browser-check browser live lab bench engines clean distclean

help:
	@sed -n 's/^#   //p' Makefile

# ---------------------------------------------------------------------------------------- setup
$(STAMP_PY): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed, found " + sys.version.split()[0]'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $@

$(STAMP_NPM): package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

$(STAMP_ASSETS): $(STAMP_NPM) scripts/vendor_assets.py
	$(PYTHON) scripts/vendor_assets.py
	touch $@

# pip wheel with the pinned hatchling of .venv (hence after it; README.md is the wheel's description)
$(WHEEL_MANIFEST): $(WHEEL_SOURCES) pyproject.toml README.md scripts/build_wheel.py | $(STAMP_PY)
	$(PY) scripts/build_wheel.py

$(SNAPSHOT): $(WHEEL_MANIFEST) $(STAMP_NPM) scripts/pyodide_snapshot.mjs
	node scripts/pyodide_snapshot.mjs
	@# the script records the snapshot in the manifest, which would leave the manifest newer than
	@# the snapshot (rebuilt on every make, raced by parallel sub-makes): mark the snapshot current
	touch $@

setup: $(STAMP_PY) $(STAMP_ASSETS) $(WHEEL_MANIFEST) $(if $(filter 1,$(WEB_SNAPSHOT)),$(SNAPSHOT))

# ----------------------------------------------------------------------------------------- book
# Run the chapters the execution cache lacks (changed since `make notebooks` ran them, or never
# run), $(JOBS) at a time, into the cache; then build.
execute: setup
	$(PY) scripts/execute_notebooks.py --jobs $(JOBS)

# Sphinx re-reads only changed pages, so a warning from an unchanged page is not repeated: after
# a failed build the next one re-reads everything (--all), so it cannot pass by forgetting.
# Two editions from one execution cache (scripts/build_book.py): English in $(HTML), Chinese in
# $(HTML)/zh from the catalogs in locales/ (a message missing from them is a warning: -W fails).
# Sphinx builds on one core: the two editions build at the same time.
build-html: setup
	@mkdir -p $(BUILD)
	@echo "building the English and the Chinese edition (logs: $(BUILD)/book-en.log, book-zh.log)"
	@s=$$SECONDS; en=0; zh=0; \
	  $(PY) scripts/build_book.py -W -n --quiet $(if $(wildcard $(BUILD)/.build-failed),--all) \
	    > $(BUILD)/book-en.log 2>&1 & pid=$$!; \
	  $(PY) scripts/build_book.py --lang zh -W -n --quiet \
	    $(if $(wildcard $(BUILD)/.build-failed-zh),--all) > $(BUILD)/book-zh.log 2>&1 || zh=$$?; \
	  wait $$pid || en=$$?; \
	  echo "-- English edition:"; cat $(BUILD)/book-en.log; echo "-- Chinese edition:"; cat $(BUILD)/book-zh.log; \
	  echo "both editions in $$((SECONDS - s)) s"; \
	  if [ $$en -eq 0 ]; then rm -f $(BUILD)/.build-failed; else touch $(BUILD)/.build-failed; fi; \
	  if [ $$zh -eq 0 ]; then rm -f $(BUILD)/.build-failed-zh; else touch $(BUILD)/.build-failed-zh; fi; \
	  [ $$en -eq 0 ] && [ $$zh -eq 0 ]

# After changing English prose: update the Chinese catalogs (then translate what check lists)
i18n: setup
	$(PY) scripts/i18n.py extract
	$(PY) scripts/i18n.py check > $(BUILD)/i18n-todo.txt && echo "catalogs complete" \
	  || echo "to translate: $(BUILD)/i18n-todo.txt"

book: execute
	@$(MAKE) --no-print-directory build-html

# ----------------------------------------------------------------------------------------- test
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check lib/parmem
	$(BIN)/mypy

unit: setup
	$(PY) -m pytest tests -m "not browser and not chapters" -n $(JOBS) --dist loadfile -q --durations=15 \
	  || $(call no_tests,unit)

# The pool and distributed tests $(RUNS) times in a row beside one busy loop per core: they wait
# on events with deadlines, never on fixed delays, so a starved machine makes them slower, not red
RUNS ?= 5
stress: setup
	$(PY) scripts/stress.py --runs $(RUNS)

# Every chapter is a test: nbval runs each chapter of _toc.yml (NB=... for some) cell by cell in
# its own kernel, with its folder as working directory and the build's per-cell timeout, one
# notebook per worker (--dist loadfile). tests/book/nbval_chapters.py then checks each chapter (an
# output, a figure, no pending number) and stores it in the build's execution cache, so the book
# stage only renders what ran here. conftest.py prints each chapter's seconds at the end.
# `make nbval` is the same run.
NB ?= $(shell $(PY) scripts/execute_notebooks.py --list)
notebooks: setup
	@mkdir -p $(BUILD)
	PARMEM_NB_TIMES=$(BUILD)/notebook-times.txt $(PY) -m pytest --nbval-lax -n $(JOBS) \
	  --dist loadfile -q $(NB) || $(call no_tests,notebooks)

nbval: notebooks

# What the browser stages need from the machine (tests/browser/preflight.py): one line and exit 1
# if Chromium, Playwright or a CJK font is missing; with BROWSER=0 one line (from the top-level
# make only) that they are skipped
browser-check: $(STAMP_PY)
ifeq ($(BROWSER),0)
	@$(if $(filter 0,$(MAKELEVEL)),$(PY) tests/browser/preflight.py --skipped,:)
else
	@$(PY) tests/browser/preflight.py
endif

# the site in Chromium (needs the built site); `make live`: the chapters in JupyterLab (needs none)
browser: setup browser-check
ifeq ($(BROWSER),0)
	@:
else
	$(PY) -m pytest tests/browser -m browser -q --ignore=tests/browser/test_live.py -n $(JOBS) \
	  --dist loadfile \
	  || $(call no_tests,browser)
endif

live: setup browser-check
ifeq ($(BROWSER),0)
	@:
else
	$(PY) -m pytest tests/browser/test_live.py -m browser -q -s || $(call no_tests,live)
endif

test: setup browser-check
	@mkdir -p $(BUILD) && : > $(BUILD)/stage-times.txt && date +%s > $(BUILD)/.stages-start
	@echo "== lint" && $(call timed,lint (ruff)) $(MAKE) --no-print-directory lint
	@echo "== unit tests" && $(call timed,unit tests) $(MAKE) --no-print-directory unit
	@echo "== chapters" && $(call timed,chapters) $(MAKE) --no-print-directory notebooks
	@# Sphinx builds on one core: the live-notebook test (JupyterLab, no site needed) runs beside it
	@echo "== book (execute + both editions with -W), and beside it the live notebooks in JupyterLab"
	@$(call timed,book build) $(MAKE) --no-print-directory book > $(BUILD)/book.log 2>&1 & book=$$!; \
	  live=0; $(call timed,live notebooks) $(MAKE) --no-print-directory live || live=$$?; \
	  rc=0; wait $$book || rc=$$?; echo "-- book build output:"; cat $(BUILD)/book.log; \
	  if [ $$rc -ne 0 ]; then echo "the book build failed (exit $$rc)" >&2; exit $$rc; fi; \
	  if [ $$live -ne 0 ]; then echo "the live-notebook test failed (exit $$live)" >&2; fi; \
	  exit $$live
	@echo "== browser" && $(call timed,browser test) $(MAKE) --no-print-directory browser
	@# the live notebooks run beside the book: the stages' wall time is less than their sum
	@printf "  %-22s %5d s (budget 480 s)\n" "all stages, wall" \
	  $$(( $$(date +%s) - $$(cat $(BUILD)/.stages-start) )) >> $(BUILD)/stage-times.txt
	@echo; echo "Seconds per chapter:"; cat $(BUILD)/notebook-times.txt 2>/dev/null || echo "  (no notebooks)"
	@echo; echo "Seconds per stage:"; cat $(BUILD)/stage-times.txt

# ------------------------------------------------------------------------------------ the rest
# LAB_ARGS="--no-browser --port 8899" for a remote machine; root (a container) needs --allow-root
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)
lab: setup
	$(BIN)/jupyter lab --notebook-dir=chapters $(LAB_ARGS)

bench: setup
	@shopt -s nullglob; files=(benchmarks/bench_*.py); \
	if [ $${#files[@]} -eq 0 ]; then echo "bench: no benchmarks/bench_*.py yet"; fi; \
	for f in "$${files[@]}"; do echo "== $$f"; $(PY) "$$f"; done

# each engine's own training step on CPU gloo ranks, recorded in data/engine_runs/ (minutes;
# make test holds the records against the estimate without running the engines)
engines: setup
	$(PY) scripts/record_engine_runs.py

clean:
	rm -rf $(BUILD) _assets .pytest_cache .ruff_cache .hypothesis .jupyter_cache
	find . -name __pycache__ -type d -not -path './.venv/*' -not -path './node_modules/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) node_modules
