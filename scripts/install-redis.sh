#!/usr/bin/env bash
# Makes redis-server available for the tests: the Debian package when it is absent and
# this user may install packages (root, or passwordless sudo). Idempotent.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; then
    echo "redis-server: $(command -v redis-server || echo /usr/bin/redis-server)"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    apt=(apt-get)
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    apt=(sudo -n apt-get)
else
    echo "install-redis: redis-server is absent and this user cannot install packages;" >&2
    echo "install-redis: install it (apt-get install redis-server) to run the quota tests" >&2
    exit 1
fi
echo "install-redis: installing the redis-server Debian package..." >&2
export DEBIAN_FRONTEND=noninteractive
"${apt[@]}" install -y -q --no-install-recommends redis-server >/dev/null \
    || { "${apt[@]}" update -q >/dev/null && "${apt[@]}" install -y -q --no-install-recommends redis-server >/dev/null; }
echo "redis-server: $(command -v redis-server || echo /usr/bin/redis-server)"
