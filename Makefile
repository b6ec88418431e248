# The two commands a newcomer needs (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= The gateway checks every request before it
ARGS ?= --max-tokens 64 --seed 0

.PHONY: run generate test install install-dev clean

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

# Serve the gateway with embedded defaults: the demo model, the embedded policy and a local
# token issuer (development only); it prints how to call it with curl and the openai SDK.
run: install
	$(BIN)/tenantgate serve --dev

# Stream one continuation from the engine directly, no gateway.
generate: install
	$(BIN)/tenantgate generate --model demo --prompt "$(PROMPT)" $(ARGS)

# Install with test extras and run every test. OPA and helm are built once with Go, the
# infra checkers go to .venv-infra, redis-server comes from Debian; with
# TENANTGATE_REQUIRE_TOOLS=1 a missing tool fails its tests instead of skipping them.
test: install-dev
	scripts/install-opa.sh
	scripts/install-infra-tools.sh
	scripts/install-redis.sh
	TENANTGATE_REQUIRE_TOOLS=1 PATH="$$(go env GOPATH)/bin:$$PATH" $(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
