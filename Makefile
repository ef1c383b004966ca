# Developer entry points. Every target runs inside .venv, which hack/venv.sh creates on first use from the
# hash-pinned requirements/dev.lock and refreshes only when pyproject.toml or the lock changes.
VENV ?= .venv
BIN := $(VENV)/bin
IMAGE ?= kube-vgpu:dev
LOCK_FLAGS ?=

.PHONY: help venv lock demo test gpu-check lint fmt image clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

venv: ## create/refresh .venv (idempotent)
	@VENV=$(VENV) hack/venv.sh

lock: venv ## re-resolve requirements/{dev,runtime}.lock after changing pyproject.toml (LOCK_FLAGS=--upgrade: newest of all)
	$(BIN)/uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 --generate-hashes \
		$(LOCK_FLAGS) --custom-compile-command "make lock" --quiet -o requirements/dev.lock
	$(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes \
		$(LOCK_FLAGS) --custom-compile-command "make lock" --quiet -o requirements/runtime.lock
	@VENV=$(VENV) hack/venv.sh

demo: venv ## replay the bundled llm-d P/D workload onto the embedded cluster (no cluster needed)
	$(BIN)/vgpu demo

test: venv ## run the whole test suite; the first run builds the tools it needs first (etcd, kube-apiserver, ...)
	$(BIN)/python -m pytest -q

gpu-check: venv ## on a machine with an NVIDIA GPU: the checks only a GPU can run, one line each (hack/gpu-check.py)
	$(BIN)/python hack/gpu-check.py

lint: venv ## ruff, formatting, mypy --strict and the import-linter contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: venv ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

image: ## build the extender container image
	docker build -t $(IMAGE) .

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
