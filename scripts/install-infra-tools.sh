#!/usr/bin/env bash
# Installs what tests/infra needs, apart from the project's own .venv:
#   .venv-infra/                checkov and kubernetes-validate (checkov pins many packages, so it
#                               never shares an environment with the gateway's fastapi/pydantic)
#   .venv-infra/python-hcl2/    python-hcl2, kept off sys.path by default: checkov ships its own
#                               fork under the same module name (hcl2); the parity extractor
#                               puts this folder first on its own sys.path
#   helm v3.22.0                on PATH or in $(go env GOPATH)/bin, built with `go install` if absent
# Idempotent and fast when already installed (a stamp file records the pinned versions).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv-infra
CHECKOV_VERSION=3.3.30
KUBERNETES_VALIDATE_VERSION=1.37.0
PYTHON_HCL2_VERSION=8.1.4
HELM_VERSION=3.22.0

stamp="checkov==$CHECKOV_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION python-hcl2==$PYTHON_HCL2_VERSION"
if [ ! -f "$VENV/.installed" ] || [ "$(cat "$VENV/.installed")" != "$stamp" ]; then
    echo "install-infra-tools: installing $stamp into $VENV (about a minute)..." >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet "checkov==$CHECKOV_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    "$VENV/bin/pip" install --quiet --target "$VENV/python-hcl2" "python-hcl2==$PYTHON_HCL2_VERSION"
    echo "$stamp" > "$VENV/.installed"
fi
echo "infra python tools: $VENV ($stamp)"

_helm_version() {
    # A `go install` build reports only "v3.22" itself; its module version is in the binary's
    # build info. A release binary reports the full version.
    local version=""
    if command -v go >/dev/null 2>&1; then
        version="$(go version -m "$1" 2>/dev/null | awk '$1 == "mod" && $2 == "helm.sh/helm/v3" {print $3}')"
    fi
    if [ -z "$version" ]; then
        version="$("$1" version --template '{{.Version}}' 2>/dev/null || true)"
    fi
    echo "$version"
}

_helm_candidates() {
    command -v helm 2>/dev/null || true
    if command -v go >/dev/null 2>&1; then
        local gopath
        gopath="$(go env GOPATH)"
        [ -x "$gopath/bin/helm" ] && echo "$gopath/bin/helm"
    fi
    return 0
}

for candidate in $(_helm_candidates); do
    if [ "$(_helm_version "$candidate")" = "v$HELM_VERSION" ]; then
        echo "helm $HELM_VERSION: $candidate"
        exit 0
    fi
done

if ! command -v go >/dev/null 2>&1; then
    echo "install-infra-tools: helm $HELM_VERSION not found and Go is not installed;" \
         "install Go or put helm $HELM_VERSION on PATH" >&2
    exit 1
fi

echo "install-infra-tools: building helm $HELM_VERSION with go install (takes a few minutes)..." >&2
go install "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
helm_bin="$(go env GOPATH)/bin/helm"
if [ "$(_helm_version "$helm_bin")" != "v$HELM_VERSION" ]; then
    echo "install-infra-tools: $helm_bin does not report version $HELM_VERSION" >&2
    exit 1
fi
echo "helm $HELM_VERSION: $helm_bin"
