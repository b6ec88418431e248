# The two commands a newcomer needs (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= The gateway checks every request before it
ARGS ?= --max-tokens 64 --seed 0

.PHONY: run test install install-dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# Serve the main job with embedded defaults (today: the engine CLI on the built-in demo model).
run: install
	$(BIN)/tenantgate generate --model demo --prompt "$(PROMPT)" $(ARGS)

# Install with test extras and run every test (the policy tests need OPA: built once with Go).
test: install-dev
	scripts/install-opa.sh
	PATH="$$(go env GOPATH)/bin:$$PATH" $(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
