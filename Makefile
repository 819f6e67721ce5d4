# One-command set-up: `make run` (the embedded default) and `make test` (the whole suite) create the
# virtual environment, install the project from pyproject.toml and build the Weaviate server with Go.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WEAVIATE_VERSION := v1.36.0
WEAVIATE_BIN := .build/bin/weaviate-server
CONFIG ?= configs/local.yaml

.PHONY: run test setup venv weaviate lint format bench clean slurm-install slurm-testbed slurm-testbed-stop slurm-local

run: setup
	$(BIN)/python -m pipeline run $(CONFIG)

test: setup slurm-install
	$(BIN)/python -m pytest

setup: venv weaviate

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[vdb,dev]"
	touch $(STAMP)

# The real Weaviate server, built from the Go module proxy's source with scripts/weaviate/listen-host.patch
# (its gRPC and cluster data ports then listen where GRPC_BIND_HOST / CLUSTER_DATA_BIND_HOST say, not on
# every interface); about 4 minutes, 170 MB. The script rebuilds only when the version or the patch changed
# (recorded in $(WEAVIATE_BIN).build). Without Go the build is skipped with a note.
weaviate:
	@scripts/weaviate/build.sh $(WEAVIATE_VERSION) "$(CURDIR)/$(WEAVIATE_BIN)"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python -m benchmarks

# The local Slurm testbed (scripts/slurm/README.md): Debian's slurm-wlm and munge, several slurmd nodes on this
# machine. `make test` installs Slurm when it can; the tests start and stop their own testbeds.
SLURM_TESTBED := scripts/slurm/testbed.sh
SLURM_TESTBED_DIR ?= $(CURDIR)/.slurm-testbed

slurm-install:
	@if [ "$$(id -u)" = 0 ]; then $(SLURM_TESTBED) install; \
	elif PATH="$$PATH:/usr/sbin" command -v slurmctld >/dev/null 2>&1; then true; \
	elif [ "$$CI" = true ]; then echo "error: CI=true: Slurm is not installed and installing it needs root" >&2; exit 1; \
	else echo "note: Slurm is not installed and this is not root: the Slurm testbed tests will be skipped"; fi

slurm-testbed: slurm-install  # then: source $(SLURM_TESTBED_DIR)/env.sh; srun -N3 hostname
	$(SLURM_TESTBED) start $(SLURM_TESTBED_DIR)

slurm-testbed-stop:
	$(SLURM_TESTBED) stop $(SLURM_TESTBED_DIR)

# configs/slurm-local.yaml through the testbed (docs/slurm-local.md): start it, run, always stop it.
slurm-local: setup slurm-install
	$(SLURM_TESTBED) start $(SLURM_TESTBED_DIR)
	. $(SLURM_TESTBED_DIR)/env.sh && $(BIN)/python -m pipeline run configs/slurm-local.yaml; \
	rc=$$?; $(SLURM_TESTBED) stop $(SLURM_TESTBED_DIR); exit $$rc

clean:
	@if [ -d .slurm-testbed ]; then $(SLURM_TESTBED) stop $(SLURM_TESTBED_DIR); fi
	rm -rf store runs benchmarks/out .pytest_cache .slurm-testbed
