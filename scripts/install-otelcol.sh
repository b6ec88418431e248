#!/usr/bin/env bash
# Builds otelcol-tenantgate, the OpenTelemetry Collector the trace tests export to, into
# $(go env GOPATH)/bin: the collector's builder (ocb, `go install`ed at OTELCOL_VERSION) writes the
# distribution scripts/otelcol-builder.yaml describes, and `go build` compiles it (a few minutes).
# The builder's module step (`go mod tidy`) runs with -e: tidy also resolves the test-only
# dependencies of every component, and the Go module proxy lacks one of the file exporter's
# (the binary does not import it).
# Idempotent and fast when already built (a stamp beside the binary records the manifest's digest).
set -euo pipefail
source "$(dirname "$0")/go-tool.sh"
cd "$(dirname "$0")/.."

OTELCOL_VERSION=0.165.0  # the builder's; the components' are in the manifest
MANIFEST=scripts/otelcol-builder.yaml

go_tool builder go.opentelemetry.io/collector/cmd/builder go.opentelemetry.io/collector/cmd/builder \
    "$OTELCOL_VERSION" "version"
gopath="$(go env GOPATH)"
binary="$gopath/bin/otelcol-tenantgate"
stamp="ocb $OTELCOL_VERSION $(sha256sum "$MANIFEST" | cut -d' ' -f1)"
if [ -x "$binary" ] && [ "$(cat "$binary.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "otelcol-tenantgate $OTELCOL_VERSION: $binary"
    exit 0
fi
echo "${0##*/}: building otelcol-tenantgate $OTELCOL_VERSION (takes a few minutes)..." >&2
sources="$(mktemp -d)"
trap 'rm -rf "$sources"' EXIT
sed "s|^dist:\$|dist:\n  output_path: $sources|" "$MANIFEST" > "$sources/manifest.yaml"
GOFLAGS="${GOFLAGS:-} -e" "$gopath/bin/builder" --config "$sources/manifest.yaml" --skip-compilation
(cd "$sources" && go build -trimpath -o "$binary" .)
"$binary" --version
echo "$stamp" > "$binary.stamp"
echo "otelcol-tenantgate $OTELCOL_VERSION: $binary"
