#!/usr/bin/env bash
# Makes redis-server available for the tests: the Debian package when it is absent and
# this user may install packages (root, or passwordless sudo). Idempotent.
exec "$(dirname "$0")/install-debian-package.sh" redis-server redis-server "the quota tests"
