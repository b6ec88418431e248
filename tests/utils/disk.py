"""A real, tiny filesystem for full-disk tests: a tmpfs of a given size, mounted for one test.

Mounting needs root (CAP_SYS_ADMIN), which the test machines and CI have; elsewhere the test
skips saying so (and fails in CI, where a skip would hide an unchecked part).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devkit.disk import fill  # noqa: F401 (the tests' fill)
from tests.utils.tools import missing_tool


@contextmanager
def tiny_filesystem(directory: Path, size_bytes: int) -> Iterator[Path]:
    """`directory` becomes the mount point of a tmpfs of `size_bytes`; unmounted when the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(directory)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        missing_tool(f"cannot mount a {size_bytes}-byte tmpfs for a full-disk test (needs root): "
                     f"{mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=True)
