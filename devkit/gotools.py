"""Tools the install scripts build with Go (scripts/install-*.sh), found where `go install` puts them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


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
