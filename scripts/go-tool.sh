# Sourced by the install scripts: go_tool makes one Go-built tool available at a pinned version.

_module_version() {
    # A `go install` build's module version is in its build info (helm itself reports only
    # "v3.22"); a release binary reports its full version with `$3`.
    local version=""
    if command -v go >/dev/null 2>&1; then
        version="$(go version -m "$1" 2>/dev/null | awk -v module="$2" '$1 == "mod" && $2 == module {print $3}')"
    fi
    if [ -z "$version" ]; then
        version="$($1 $3 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1 || true)"
        version="${version:+v$version}"
    fi
    echo "$version"
}

_candidates() {
    command -v "$1" 2>/dev/null || true
    if command -v go >/dev/null 2>&1; then
        local gopath
        gopath="$(go env GOPATH)"
        [ -x "$gopath/bin/$1" ] && echo "$gopath/bin/$1"
    fi
    return 0
}

# go_tool NAME MODULE PACKAGE VERSION VERSION-COMMAND: NAME at VERSION on PATH or in GOPATH/bin,
# built with `go install PACKAGE@vVERSION` when neither has it.
go_tool() {
    local name="$1" module="$2" package="$3" version="$4" version_command="$5" candidate
    for candidate in $(_candidates "$name"); do
        if [ "$(_module_version "$candidate" "$module" "$version_command")" = "v$version" ]; then
            echo "$name $version: $candidate"
            return 0
        fi
    done
    if ! command -v go >/dev/null 2>&1; then
        echo "${0##*/}: $name $version not found and Go is not installed;" \
             "install Go or put $name $version on PATH" >&2
        exit 1
    fi
    echo "${0##*/}: building $name $version with go install (takes a few minutes)..." >&2
    go install "$package@v$version"
    local built
    built="$(go env GOPATH)/bin/$name"
    if [ "$(_module_version "$built" "$module" "$version_command")" != "v$version" ]; then
        echo "${0##*/}: $built does not report version $version" >&2
        exit 1
    fi
    echo "$name $version: $built"
}
