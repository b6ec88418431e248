"""The byte-exact encodings that signatures and digests depend on, each written once: unpadded
base64url (JWS, JWKS, OPA bundle signatures) and canonical JSON (audit entries, policy revisions)."""

from __future__ import annotations

import base64
import binascii
import json
import re

_B64URL = re.compile(rb"[A-Za-z0-9_-]*")
# json.dumps leaves these raw with ensure_ascii=False, and str.splitlines() and many
# log viewers break lines at them; escaped, one entry is always one line.
_LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def b64url(data: bytes) -> str:
    """Unpadded base64url (RFC 7515, section 2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(segment: bytes | str) -> bytes:
    """Strict unpadded base64url: any character outside the alphabet is an error, not skipped."""
    if isinstance(segment, str):
        segment = segment.encode("ascii")
    if not _B64URL.fullmatch(segment) or len(segment) % 4 == 1:
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(segment + b"=" * (-len(segment) % 4))
    except binascii.Error:
        raise ValueError("not base64url") from None


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, UTF-8 text, no NaN, line breaks escaped: the exact text an
    entry is hashed as. ValueError for NaN or Infinity."""
    text = _CANONICAL(value)
    if text.isascii():  # the usual case: no character to escape
        return text
    for raw, escaped in _LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return text
