#!/usr/bin/env bash
# Makes Debian's chromium and chromedriver available for the operator console's browser test
# (tests/gateway/console/test_console_browser.py): the Debian packages when they are absent and
# this user may install packages (root, or passwordless sudo). Idempotent.
set -euo pipefail
here="$(dirname "$0")"
"$here/install-debian-package.sh" chromium chromium "the operator console's browser test"
exec "$here/install-debian-package.sh" chromedriver chromium-driver "the operator console's browser test"
