"""External tools the tests run (redis-server, opa, tflint): where to find one built with Go, and
what to do when one is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest


def missing_tool(message: str) -> NoReturn:
    """Skips locally; fails in CI and under TENANTGATE_REQUIRE_TOOLS=1 (`make test`), where the
    install scripts have put every tool in place and a skip would hide an unchecked part."""
    if os.environ.get("CI", "").lower() == "true" or os.environ.get("TENANTGATE_REQUIRE_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def find_go_binary(name: str) -> Path | None:
    """A tool the install scripts build with `go install` (or go build): on PATH or in GOPATH/bin."""
    found = shutil.which(name)
    if found:
        return Path(found)
    gopath = os.environ.get("GOPATH") or (
        subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True, check=False).stdout.strip()
        if shutil.which("go")
        else ""
    )
    candidate = Path(gopath) / "bin" / name if gopath else None
    return candidate if candidate and candidate.exists() else None
