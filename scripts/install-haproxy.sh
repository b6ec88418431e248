#!/usr/bin/env bash
# Makes haproxy available for the failover test and bench (tests/infra/test_failover.py,
# bench/failover.py): the Debian package when it is absent and this user may install packages
# (root, or passwordless sudo). Idempotent.
exec "$(dirname "$0")/install-debian-package.sh" haproxy haproxy "the failover test"
