"""The redactor: what a tenant's `redacted` content mode lets reach a sink.

`redact` drops the decision's JSON pointers, then `scrub`s every string left, keys
included. `scrub` makes text safe to write on one log line: control characters, line and
paragraph separators become spaces (so nothing forges a log line), invisible format
characters go (so a zero-width space cannot hide a secret from the detectors), then each
finding becomes a typed placeholder such as "[EMAIL:1a2b3c4d]". The detectors read the
text folded (folding.py: fullwidth and other scripts' digits, look-alike letters, Unicode
spaces and dashes), but what is replaced is the text as written, and the rest of it is
written as it came, not folded. The digest is a keyed HMAC of the folded value: the same
e-mail gives the same placeholder across records and spellings under one key, and without
the key it cannot be reversed by guessing. Bearer tokens get no digest.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from gateway.redaction.detectors import DETECTORS
from gateway.redaction.folding import fold
from gateway.redaction.matching import Detector, numeric_windows
from gateway.redaction.pointers import copy_without, removal_tree

MIN_KEY_BYTES = 16
DIGEST_HEX_CHARS = 8
# Integers from 13 digits may be card numbers: scrubbed as text, kept if nothing is found.
_SCRUBBED_INTEGERS_FROM = 10**12

# C0/C1 controls (CR, LF, NEL U+0085 ...), line and paragraph separators, lone surrogates:
# each becomes a space. Format characters (Unicode category Cf: zero-width spaces and
# joiners, bidi overrides, soft hyphen, tags) are dropped, so "sk-\u200b..." is still found.
_BREAKING = "\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff"
_FORMAT = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
)
_BREAKING_CHARACTER = re.compile(f"[{_BREAKING}]")
_ASCII_BREAKING = {code: " " for code in (*range(0x20), 0x7F)}
_FORMAT_CHARACTER = re.compile(f"[{_FORMAT}]")


class Finding(NamedTuple):
    start: int
    end: int
    kind: str
    digest: bool  # False when any merged part may not be digested (a bearer token)


class Redactor:
    def __init__(self, key: bytes, detectors: Sequence[Detector] = DETECTORS) -> None:
        if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the redaction key must be bytes, at least {MIN_KEY_BYTES} of them")
        self._key = key
        self._detectors = tuple(detectors)

    def scrub(self, text: str) -> str:
        """`text` on one line, with every finding replaced by its placeholder."""
        if not isinstance(text, str):
            raise TypeError("scrub takes a str")
        if text.isascii():
            text = text.translate(_ASCII_BREAKING)
        else:
            text = _FORMAT_CHARACTER.sub("", _BREAKING_CHARACTER.sub(" ", text))
        findings = self.find(text)
        if not findings:
            return text
        pieces = []
        last = 0
        for start, end, kind, digest in findings:
            pieces.append(text[last:start])
            pieces.append(f"[{kind}:{self.digest(fold(text[start:end]).text)}]" if digest else f"[{kind}]")
            last = end
        pieces.append(text[last:])
        return "".join(pieces)

    def find(self, text: str) -> list[Finding]:
        """The findings in `text`, in order, overlapping ones merged into one.

        The detectors read `text` folded (folding.py); findings are spans of `text` as written.
        A merged finding covers the union of its parts, so no part of any finding survives,
        and takes the kind of its earliest detector in precedence order.
        """
        folded = fold(text)
        spelled = folded.text
        lowered = spelled.lower()
        if len(lowered) != len(spelled):  # only "İ" lower-cases to two characters
            lowered = spelled.replace("\u0130", "i").lower()
        whole = ((0, len(spelled)),)
        windows: list[tuple[int, int]] | None = None
        found: list[tuple[int, int, int]] = []
        for rank, detector in enumerate(self._detectors):
            ranges: Sequence[tuple[int, int]] = whole
            if detector.numeric:
                if windows is None:
                    windows = numeric_windows(spelled)
                ranges = windows
            for start, end in detector.spans(spelled, lowered, ranges):
                found.append((*folded.original_span(start, end), rank))
        if not found:
            return []
        found.sort()
        merged: list[list] = []
        for start, end, rank in found:
            digest = self._detectors[rank].digest
            if merged and start < merged[-1][1]:
                last = merged[-1]
                last[1] = max(last[1], end)
                last[2] = min(last[2], rank)
                last[3] = last[3] and digest
            else:
                merged.append([start, end, rank, digest])
        return [
            Finding(start, end, self._detectors[rank].kind, digest)
            for start, end, rank, digest in merged
        ]

    def digest(self, value: str) -> str:
        mac = hmac.new(self._key, b"redaction:" + value.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return mac.hexdigest()[:DIGEST_HEX_CHARS]

    def redact(self, document: dict, pointers: Sequence[str]) -> dict:
        """A new document: the pointers removed, then every string (and string key) scrubbed."""
        tree = removal_tree(document, pointers)
        if tree is None:
            return type(document)() if isinstance(document, (dict, list)) else None
        return copy_without(document, tree, leaf=self._scrub_value)

    def _scrub_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _SCRUBBED_INTEGERS_FROM:
            scrubbed = self.scrub(str(value))
            return value if scrubbed == str(value) else scrubbed
        return value
