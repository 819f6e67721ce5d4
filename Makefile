# One-command set-up: `make run` (the embedded default) and `make test` (the whole suite) create the
# virtual environment, install the project from pyproject.toml and build the Weaviate server with Go.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WEAVIATE_VERSION := v1.36.0
WEAVIATE_BIN := .build/bin/weaviate-server
CONFIG ?= configs/local.yaml

.PHONY: run test setup venv weaviate lint format bench clean

run: setup
	$(BIN)/python -m pipeline run $(CONFIG)

test: setup
	$(BIN)/python -m pytest

setup: venv weaviate

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[vdb,dev]"
	touch $(STAMP)

# The real Weaviate server, built from the Go module proxy (about 4 minutes, 170 MB).
# Without Go the build is skipped with a note; the Weaviate adapter then explains what to install.
weaviate:
	@if [ -x "$(WEAVIATE_BIN)" ]; then \
		true; \
	elif command -v go >/dev/null 2>&1; then \
		echo "building weaviate-server $(WEAVIATE_VERSION) with go install (a few minutes, once)"; \
		GOBIN="$(CURDIR)/.build/bin" go install github.com/weaviate/weaviate/cmd/weaviate-server@$(WEAVIATE_VERSION); \
	else \
		echo "note: Go not found; Weaviate stages need $(WEAVIATE_BIN) (install Go >= 1.25 and run 'make weaviate')"; \
	fi

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf store runs benchmarks/out .pytest_cache
