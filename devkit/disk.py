"""A tiny tmpfs and filling it, for full-disk tests and the soak's full-disk phase."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path


def mount_tmpfs(directory: Path, size_bytes: int) -> str | None:
    """`directory` becomes the mount point of a tmpfs of size_bytes; None, or why it could not be
    (mounting needs root, CAP_SYS_ADMIN). Undo it with unmount()."""
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(directory)],
                          capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def unmount(directory: Path, check: bool = True) -> None:
    subprocess.run(["umount", "--lazy", str(directory)], check=check)


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
