# Two entry points for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean browser

# setup.py and the C scanner too: an edit rebuilds the extension in place (pip install -e).
$(STAMP): pyproject.toml setup.py torchscope/trace/_fastscan.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	# torch pinned again: the test extras' lightning/transformers must not replace it.
	$(PY) -m pip install -q -e '.[test]' torch==2.13.0
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/torchscope demo --out runs/demo

# `make test` runs everything, then a second, short pass (about 1-1.5 min) on the msgspec path that users
# without a C compiler get (TORCHSCOPE_NO_FASTSCAN=1): the loader, parse, stream, schema, rule, real-trace,
# bad-input, fuzz and golden tests. Not the scanner's own tests (test_fastscan.py compares both paths in the
# first pass; test_extension_built.py requires the scanner), nor test_ranges.py (its msgspec half already
# runs in the first pass, its threads half needs the scanner).
NO_FASTSCAN_TESTS := tests/unit/test_stream.py tests/unit/test_schema_variants.py tests/unit/test_columns.py \
	tests/unit/test_tables.py tests/unit/test_cache_and_jobs.py tests/unit/test_real_traces.py \
	$(wildcard tests/unit/test_rules_*.py) tests/reliability/test_bad_inputs.py tests/reliability/test_fuzz.py \
	tests/golden/test_golden.py

# The browser tests drive Debian's Chromium through Playwright (never a downloaded browser): installed here
# when missing, so `make test` alone sets everything up (needs root, as on the CI and developer machines).
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
		else echo "make test needs Debian's chromium: sudo apt-get install -y chromium" >&2; exit 1; fi; \
	fi

# --durations: the CI log names the slowest tests, so a test that creeps towards pyproject's `timeout` shows.
test: $(STAMP) browser
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(PY) -m pytest -q --durations=15
	TORCHSCOPE_NO_FASTSCAN=1 $(PY) -m pytest -q $(NO_FASTSCAN_TESTS)

# Loader/analysis figures vs HTA and the JSON floor (benchmarks/README.md); sets up its own HTA venv.
# e.g. make bench BENCH_ARGS="--quick"   or   BENCH_ARGS="--sizes 50mb,500mb --skip-hta"
bench: $(STAMP)
	$(PY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
