#!/usr/bin/env bash
# install-debian-package.sh BINARY PACKAGE WHAT: makes BINARY available (on PATH or in /usr/bin or
# /usr/sbin), installing the Debian PACKAGE when it is absent and this user may install packages
# (root, or passwordless sudo); WHAT says which tests need it. Idempotent. A package's service is
# never started (no init system, or policy-rc.d refuses it): tests run their own processes.
set -euo pipefail
binary=$1 package=$2 what=$3

found() { command -v "$binary" 2>/dev/null || { for dir in /usr/bin /usr/sbin; do
    [ -x "$dir/$binary" ] && echo "$dir/$binary" && return 0; done; return 1; }; }

if path=$(found); then
    echo "$binary: $path"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    apt=(apt-get)
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    apt=(sudo -n apt-get)
else
    echo "install-$package: $binary is absent and this user cannot install packages;" >&2
    echo "install-$package: install it (apt-get install $package) to run $what" >&2
    exit 1
fi
echo "install-$package: installing the $package Debian package..." >&2
export DEBIAN_FRONTEND=noninteractive
"${apt[@]}" install -y -q --no-install-recommends "$package" >/dev/null \
    || { "${apt[@]}" update -q >/dev/null && "${apt[@]}" install -y -q --no-install-recommends "$package" >/dev/null; }
echo "$binary: $(found)"
