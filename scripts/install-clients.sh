#!/usr/bin/env bash
# Installs the client libraries that tests/clients drives the gateway with, each in a virtualenv
# of its own (their openai pins conflict): .venv-clients/NAME for each
# tests/clients/requirements/NAME.txt, a lock of the library's pin and everything it pulls in.
# A venv whose stamp matches its lock file is kept, so a second run takes a second.
# To move a client to a newer version: put only its pin in its file, run this script, then
#   .venv-clients/NAME/bin/pip freeze --exclude pip > tests/clients/requirements/NAME.txt
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
ROOT=.venv-clients
mkdir -p "$ROOT"
for lock in tests/clients/requirements/*.txt; do
    name="$(basename "$lock" .txt)"
    venv="$ROOT/$name"
    stamp="$(sha256sum "$lock" | cut -d' ' -f1)"
    if [ "$(cat "$venv/.installed" 2>/dev/null)" = "$stamp" ]; then
        echo "client $name: $venv"
        continue
    fi
    echo "install-clients: installing $name into $venv..." >&2
    started=$SECONDS
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$lock"
    echo "$stamp" > "$venv/.installed"
    echo "client $name: $venv (built in $((SECONDS - started)) s, $(du -sh "$venv" | cut -f1))"
done
