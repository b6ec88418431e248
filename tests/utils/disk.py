"""A real, tiny filesystem for full-disk tests: a tmpfs of a given size, mounted for one test.

Mounting needs root (CAP_SYS_ADMIN), which the test machines and CI have; elsewhere the test
skips saying so (and fails in CI, where a skip would hide an unchecked part).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devkit.disk import fill, mount_tmpfs, unmount  # noqa: F401 - fill is re-exported: the tests' fill
from tests.utils.tools import missing_tool


@contextmanager
def tiny_filesystem(directory: Path, size_bytes: int) -> Iterator[Path]:
    """`directory` becomes the mount point of a tmpfs of `size_bytes`; unmounted when the block ends."""
    refused = mount_tmpfs(directory, size_bytes)
    if refused is not None:
        missing_tool(f"cannot mount a {size_bytes}-byte tmpfs for a full-disk test (needs root): {refused}")
    try:
        yield directory
    finally:
        unmount(directory)
