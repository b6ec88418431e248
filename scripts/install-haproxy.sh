#!/usr/bin/env bash
# Makes haproxy available for the failover test and bench (tests/infra/test_failover.py,
# bench/failover.py): the Debian package when it is absent and this user may install packages
# (root, or passwordless sudo), as scripts/install-redis.sh does for redis-server. Idempotent.
set -euo pipefail

if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then
    echo "haproxy: $(command -v haproxy || echo /usr/sbin/haproxy)"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    apt=(apt-get)
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    apt=(sudo -n apt-get)
else
    echo "install-haproxy: haproxy is absent and this user cannot install packages;" >&2
    echo "install-haproxy: install it (apt-get install haproxy) to run the failover test" >&2
    exit 1
fi
echo "install-haproxy: installing the haproxy Debian package..." >&2
export DEBIAN_FRONTEND=noninteractive
# The package's service is never started here (no init system, or policy-rc.d refuses it):
# the test and the bench run haproxy in the foreground with a configuration of their own.
"${apt[@]}" install -y -q --no-install-recommends haproxy >/dev/null \
    || { "${apt[@]}" update -q >/dev/null && "${apt[@]}" install -y -q --no-install-recommends haproxy >/dev/null; }
echo "haproxy: $(command -v haproxy || echo /usr/sbin/haproxy)"
