"""Where tenantgate keeps what it builds or creates once and reuses: one cache directory.

`$TENANTGATE_CACHE_DIR`, else `~/.cache/tenantgate`. It holds the demo and converted models
(`models/`), the development issuer's signing key (`dev-issuer/`), the audit trail's default
signing key, and bench's llama.cpp builds (`bench/build_llamacpp.sh` reads the same variable).
No torch here: the gateway and the dev issuer import it without the engine's model code.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "TENANTGATE_CACHE_DIR"


def default_cache_dir() -> Path:
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "tenantgate"
