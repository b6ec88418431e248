#!/usr/bin/env bash
# Makes OPA v1.22.3 available: uses one already on PATH or in $(go env GOPATH)/bin,
# otherwise builds it with `go install`. Idempotent; prints where opa is.
set -euo pipefail

OPA_VERSION="${OPA_VERSION:-1.22.3}"

_opa_version() {
    # `opa version` prints "Version: 1.22.3" on its first line.
    "$1" version 2>/dev/null | awk -F': ' '/^Version:/ {print $2; exit}'
}

_candidates() {
    command -v opa 2>/dev/null || true
    if command -v go >/dev/null 2>&1; then
        local gopath
        gopath="$(go env GOPATH)"
        [ -x "$gopath/bin/opa" ] && echo "$gopath/bin/opa"
    fi
    return 0
}

for candidate in $(_candidates); do
    if [ "$(_opa_version "$candidate")" = "$OPA_VERSION" ]; then
        echo "opa $OPA_VERSION: $candidate"
        exit 0
    fi
done

if ! command -v go >/dev/null 2>&1; then
    echo "install-opa: opa $OPA_VERSION not found and Go is not installed;" \
         "install Go or put opa $OPA_VERSION on PATH" >&2
    exit 1
fi

echo "install-opa: building opa $OPA_VERSION with go install (takes a few minutes)..." >&2
go install "github.com/open-policy-agent/opa@v$OPA_VERSION"
opa_bin="$(go env GOPATH)/bin/opa"
if [ "$(_opa_version "$opa_bin")" != "$OPA_VERSION" ]; then
    echo "install-opa: $opa_bin does not report version $OPA_VERSION" >&2
    exit 1
fi
echo "opa $OPA_VERSION: $opa_bin"
