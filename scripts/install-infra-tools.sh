#!/usr/bin/env bash
# Installs what tests/infra needs, apart from the project's own .venv:
#   .venv-infra/                checkov and kubernetes-validate (checkov pins many packages, so it
#                               never shares an environment with the gateway's fastapi/pydantic)
#   .venv-infra/python-hcl2/    python-hcl2, kept off sys.path by default: checkov ships its own
#                               fork under the same module name (hcl2); the parity extractor
#                               puts this folder first on its own sys.path
#   .venv-infra/grafana-foundation-sdk/  the Grafana dashboard schema's models (Grafana 11.6), off
#                               sys.path too; tests/infra/test_alerts.py checks the dashboard with them
#   helm v3.22.0                on PATH or in $(go env GOPATH)/bin, built with `go install` if absent
#   tflint v0.64.0              likewise (its terraform ruleset is bundled)
#   .venv-infra/bin/promtool    checks and unit-tests the alert rules: the one binary, unpacked from
#                               Debian's prometheus package (`apt-get download`, no root, none of the
#                               server's dependencies); where apt has no such package, built with
#                               `go install` from the Go module version below (about 15 minutes)
#   .venv-infra/tflint-plugins/ the azurerm ruleset v0.32.0, a tflint plugin binary (or in
#                               $TFLINT_PLUGIN_DIR): `go install` from the Go module proxy, or, where the
#                               proxy does not serve it, `go build` in the checkout that
#                               TFLINT_RULESET_AZURERM_SRC names; without either it is left out
#                               and its tests skip, saying so
# Idempotent and fast when already installed (stamps and module versions record the pins).
set -euo pipefail
source "$(dirname "$0")/go-tool.sh"
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv-infra
CHECKOV_VERSION=3.3.30
KUBERNETES_VALIDATE_VERSION=1.37.0
PYTHON_HCL2_VERSION=8.1.4
HELM_VERSION=3.22.0
TFLINT_VERSION=0.64.0
TFLINT_RULESET_AZURERM_VERSION=0.32.0
# The Go module version of github.com/prometheus/prometheus that promtool is built from.
PROMETHEUS_MODULE_VERSION=0.316.0
# PyPI's versions carry the Grafana schema version after the epoch.
GRAFANA_FOUNDATION_SDK_VERSION='1769699379!11.6.0'
TFLINT_PLUGINS="${TFLINT_PLUGIN_DIR:-$VENV/tflint-plugins}"

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

sdk="$VENV/grafana-foundation-sdk"
sdk_stamp="grafana-foundation-sdk==$GRAFANA_FOUNDATION_SDK_VERSION"
if [ "$(cat "$sdk/.installed" 2>/dev/null)" != "$sdk_stamp" ]; then
    rm -rf "$sdk"
    "$VENV/bin/pip" install --quiet --no-deps --target "$sdk" "$sdk_stamp"
    echo "$sdk_stamp" > "$sdk/.installed"
fi
echo "grafana dashboard models: $sdk ($sdk_stamp)"

go_tool helm helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "version --template {{.Version}}"
go_tool tflint github.com/terraform-linters/tflint github.com/terraform-linters/tflint "$TFLINT_VERSION" "--version"
# promtool: Debian's (2.42 on bookworm checks and unit-tests these rules as 3.x does), else built.
promtool="$VENV/bin/promtool"
debian_promtool() {  # unpacks the candidate's promtool into $promtool; false where apt has none
    local unpacked
    unpacked="$(mktemp -d)"
    if (cd "$unpacked" && apt-get download -q "$1" >/dev/null 2>&1 && dpkg-deb -x prometheus_*.deb root); then
        install -m 0755 "$unpacked/root/usr/bin/promtool" "$promtool"
    fi
    rm -rf "$unpacked"
    [ -x "$promtool" ]
}
promtool_stamp="prometheus=$(apt-cache policy prometheus 2>/dev/null | awk '$1 == "Candidate:" {print $2}')"
if [ "$(cat "$VENV/.promtool" 2>/dev/null)" = "$promtool_stamp" ] && [ -x "$promtool" ]; then
    :
elif ! { rm -f "$promtool"; debian_promtool "$promtool_stamp"; }; then
    go_tool promtool github.com/prometheus/prometheus github.com/prometheus/prometheus/cmd/promtool \
        "$PROMETHEUS_MODULE_VERSION" "--version"
    ln -sf "$(command -v promtool || echo "$(go env GOPATH)/bin/promtool")" "$promtool"
    promtool_stamp="go:$PROMETHEUS_MODULE_VERSION"
fi
echo "$promtool_stamp" > "$VENV/.promtool"
echo "promtool ($promtool_stamp): $promtool"

# The azurerm ruleset, as a plugin binary in a local directory: tflint loads it from
# TFLINT_PLUGIN_DIR and never downloads it (infra/terraform/.tflint.hcl has no source for it).
ruleset="$TFLINT_PLUGINS/tflint-ruleset-azurerm"
ruleset_stamp="tflint-ruleset-azurerm==$TFLINT_RULESET_AZURERM_VERSION"
if [ -x "$ruleset" ] && [ "$(cat "$TFLINT_PLUGINS/.installed" 2>/dev/null)" = "$ruleset_stamp" ]; then
    echo "tflint azurerm ruleset $TFLINT_RULESET_AZURERM_VERSION: $ruleset"
    exit 0
fi
mkdir -p "$TFLINT_PLUGINS"
rm -f "$ruleset" "$TFLINT_PLUGINS/.installed"
plugins="$(cd "$TFLINT_PLUGINS" && pwd)"
if GOBIN="$plugins" go install "github.com/terraform-linters/tflint-ruleset-azurerm@v$TFLINT_RULESET_AZURERM_VERSION"; then
    :
elif [ -n "${TFLINT_RULESET_AZURERM_SRC:-}" ]; then
    echo "install-infra-tools: building the azurerm ruleset in $TFLINT_RULESET_AZURERM_SRC..." >&2
    (cd "$TFLINT_RULESET_AZURERM_SRC" && go build -o "$plugins/tflint-ruleset-azurerm" .)
else
    echo "install-infra-tools: the Go module proxy does not serve" \
         "tflint-ruleset-azurerm@v$TFLINT_RULESET_AZURERM_VERSION; set TFLINT_RULESET_AZURERM_SRC to a" \
         "checkout of that tag to build it (tests/infra/test_tflint.py skips its azurerm tests without it)" >&2
    exit 0
fi
echo "$ruleset_stamp" > "$TFLINT_PLUGINS/.installed"
echo "tflint azurerm ruleset $TFLINT_RULESET_AZURERM_VERSION: $ruleset"
