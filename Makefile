# Two entry points for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

# setup.py and the C scanner too: an edit rebuilds the extension in place (pip install -e).
$(STAMP): pyproject.toml setup.py torchscope/trace/_fastscan.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/torchscope demo --out runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

# Loader/analysis figures vs HTA and the JSON floor (benchmarks/README.md); sets up its own HTA venv.
# e.g. make bench BENCH_ARGS="--quick"   or   BENCH_ARGS="--sizes 50mb,500mb --skip-hta"
bench: $(STAMP)
	$(PY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
