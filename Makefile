# pdserve: the two commands are `make run` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= smollm2
PORT ?= 8000
# EMBED=1 adds an all-MiniLM-L6-v2 embedding worker (/v1/embeddings). Off by default: on a
# 2-core box a third engine takes turns on the cores the prefill/decode pair computes on.
EMBED ?= 0
# Test processes for the tiers without vLLM (pytest-xdist; one module per worker: --dist loadfile).
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile

.PHONY: setup tools run test test-fast test-real lint format bench docs

setup:
	@bash deploy/install.sh

## redis-server and promtool for the tests (Redis backend, alert rules).
tools:
	@bash deploy/install_test_tools.sh

## Start a local cluster (router + 1 prefill + 1 decode) with SmolLM2-135M-Instruct.
run: setup
	$(BIN)/pdserve up --model $(MODEL) --port $(PORT) --embed $(EMBED)

## Lint, then every test tier: fast and slow (no vLLM, in parallel), then real (vLLM CPU +
## the tiny model, one shared cluster, in order).
test: setup tools lint
	$(BIN)/pytest -v -m "not vllm" $(PARALLEL)
	$(BIN)/pytest -v -m vllm

## The tier to run often (the aim: under 2 minutes on a 2-core box).
test-fast: setup tools
	$(BIN)/pytest -v -m "not vllm and not slow" $(PARALLEL)

test-real: setup
	$(BIN)/pytest -v -m vllm

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format:
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## Router overhead and disaggregation overhead, side by side (tiny model).
bench: setup
	$(BIN)/python -m benchmarks.pd_overhead

## Regenerate docs/configuration.md's settings table from router/settings.py.
docs:
	$(BIN)/python deploy/readme_settings.py
