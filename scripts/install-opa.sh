#!/usr/bin/env bash
# Makes OPA v1.22.3 available: uses one already on PATH or in $(go env GOPATH)/bin,
# otherwise builds it with `go install`. Idempotent; prints where opa is.
set -euo pipefail
source "$(dirname "$0")/go-tool.sh"

OPA_VERSION="${OPA_VERSION:-1.22.3}"

go_tool opa github.com/open-policy-agent/opa github.com/open-policy-agent/opa "$OPA_VERSION" version
