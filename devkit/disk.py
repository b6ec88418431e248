"""Filling a filesystem, for full-disk tests and the soak's full-disk phase."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def fill(path: Path, leave_bytes: int = 0) -> int:
    """Writes zeros to `path` until the filesystem refuses (ENOSPC), then gives back `leave_bytes`;
    returns the file's size."""
    with path.open("wb", buffering=0) as file:
        block = b"\0" * 4096
        try:
            while True:
                file.write(block)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        size = file.tell()
        if leave_bytes:
            file.truncate(max(0, size - leave_bytes))
        os.fsync(file.fileno())
    return path.stat().st_size
