"""Random identifiers (request ids, decision ids) from the OS's CSPRNG, read a block at a time.

A request takes several: its id at the edge, its completion's, its decision's, its audit
record's. A getrandom() call for each cost more on the request path than making the ids (a
system call, and the caches it leaves cold), so the bytes are read 4 KiB at a time and handed
out in order. They are the same bytes os.urandom gives; nothing else about them changes. A
forked child drops its parent's block, so the two never hand out the same ids.
"""

from __future__ import annotations

import os
import threading

BLOCK_BYTES = 4096

_lock = threading.Lock()
_block = b""
_at = 0


def random_bytes(n: int) -> bytes:
    global _block, _at
    with _lock:
        if _at + n > len(_block):
            _block, _at = os.urandom(max(BLOCK_BYTES, n)), 0
        start = _at
        _at += n
        return _block[start:_at]


def random_hex(n: int = 16) -> str:
    """n random bytes as 2n hex digits (16: as long as a UUID's hex)."""
    return random_bytes(n).hex()


def random_uuid() -> str:
    """A version 4 UUID in its canonical text form, as str(uuid.uuid4())."""
    raw = bytearray(random_bytes(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _forget_in_child() -> None:
    global _lock, _block, _at
    _lock, _block, _at = threading.Lock(), b"", 0


os.register_at_fork(after_in_child=_forget_in_child)
