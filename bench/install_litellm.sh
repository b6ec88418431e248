#!/usr/bin/env bash
# LiteLLM's proxy for bench/vs_litellm.py, in a virtualenv of its own (.venv-litellm): its pins
# conflict with the gateway's. 1.100.5 is the newest release whose `proxy` extra installs from
# PyPI alone (later ones need litellm-proxy, which PyPI does not serve). wrk comes from Debian.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VERSION=1.100.5
if [ "$(cat .venv-litellm/.installed 2>/dev/null)" != "$VERSION" ]; then
    rm -rf .venv-litellm
    "$PYTHON" -m venv .venv-litellm
    .venv-litellm/bin/python -m pip install --quiet --disable-pip-version-check "litellm[proxy]==$VERSION"
    echo "$VERSION" > .venv-litellm/.installed
fi
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
echo "litellm $VERSION: .venv-litellm/bin/litellm; wrk: $(command -v wrk)"
