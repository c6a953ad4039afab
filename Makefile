# pdserve: the two commands are `make run` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= smollm2
PORT ?= 8000

.PHONY: setup tools run test test-fast test-real lint format bench docs

setup:
	@bash deploy/install.sh

## redis-server and promtool for the tests (Redis backend, alert rules).
tools:
	@bash deploy/install_test_tools.sh

## Start a local cluster (router + 1 prefill + 1 decode) with SmolLM2-135M-Instruct.
run: setup
	$(BIN)/pdserve up --model $(MODEL) --port $(PORT)

## Lint, then every test tier: fast (no vLLM) and real (vLLM CPU + tiny model).
test: setup tools lint
	$(BIN)/pytest -v

test-fast: setup tools
	$(BIN)/pytest -v -m "not vllm"

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
