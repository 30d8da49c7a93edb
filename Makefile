# execgate: `make run` starts the gateway on embedded defaults; `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint fmt bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/execgate serve

test: $(STAMP)
	$(BIN)/ruff check gateway backends tests
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check gateway backends tests
	$(BIN)/ruff format --check gateway backends tests

fmt: $(STAMP)
	$(BIN)/ruff format gateway backends tests
	$(BIN)/ruff check --fix gateway backends tests

bench: $(STAMP)
	$(BIN)/execgate bench

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
