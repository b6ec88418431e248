"""How a detector finds its findings, fast.

A detector is a compiled pattern and an optional validator (validators.py). Where a
pattern has a `secret` group only that group is replaced, so "api_key=" stays readable.

Speed: CPython's `re` skips quickly to a pattern's leading literal (2-3 us over 4 KB) but
tries a pattern that starts with a class or a lookbehind at every position, ten to fifty
times slower. So patterns start with a literal ("eyJ", "@", "."), case-insensitive ones
run on the lower-cased text, and what lies left of the literal (an e-mail's local part,
an address's first octet) is matched by `Left`, a pattern run backwards from the
literal. The three detectors that must start at a digit (cards, national phone numbers,
IBANs) only search the windows around runs of eight or more digits. Detectors read folded
text (folding.py) and report spans of it; the redactor maps them back to the text as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

NUMERIC_RUN = re.compile(r"[0-9](?:[ ()._/-]{0,3}[0-9]){7,}")
# How far a numeric detector's match may reach beyond its run: an IBAN's country code and
# letters before the digits, its letters after them.
_NUMERIC_BEFORE = 36
_NUMERIC_AFTER = 24


@dataclass(frozen=True, slots=True)
class Left:
    """What must stand left of the anchor: `pattern` matched on the reversed `width`
    characters before it; its lookaheads are therefore lookbehinds in the text."""

    pattern: re.Pattern[str]
    width: int

    def start(self, text: str, anchor: int) -> int:
        """Where the finding starts, or -1 when the left part does not match."""
        begin = max(0, anchor - self.width)
        match = self.pattern.match(text[begin:anchor][::-1])
        return -1 if match is None else anchor - match.end()


@dataclass(frozen=True, slots=True)
class Detector:
    kind: str
    pattern: re.Pattern[str]
    validate: Callable[[str], int] | None = None
    digest: bool = True  # False: the placeholder carries no digest of the value
    lowercase: bool = False  # the pattern is lower-case and runs on text.lower()
    left: Left | None = None
    numeric: bool = False  # searched only around runs of digits

    def spans(self, text: str, lowered: str, windows: Sequence[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """(start, end) of each finding in `text`; `lowered` is `text.lower()`, same length."""
        subject = lowered if self.lowercase else text
        has_secret = "secret" in self.pattern.groupindex
        for window_start, window_end in windows:
            for match in self.pattern.finditer(subject, window_start, window_end):
                start, end = match.span("secret") if has_secret else match.span()
                if self.left is not None:
                    left_start = self.left.start(subject, match.start())
                    if left_start < 0:
                        continue
                    if not has_secret:
                        start = left_start
                if self.validate is not None:
                    kept = self.validate(text[start:end])
                    if not kept:
                        continue
                    end = start + kept
                yield start, end


def numeric_windows(text: str) -> list[tuple[int, int]]:
    """The stretches of `text` around runs of 8+ digits, merged where they overlap."""
    windows: list[tuple[int, int]] = []
    for match in NUMERIC_RUN.finditer(text):
        start = max(0, match.start() - _NUMERIC_BEFORE)
        end = min(len(text), match.end() + _NUMERIC_AFTER)
        if windows and start <= windows[-1][1]:
            windows[-1] = (windows[-1][0], end)
        else:
            windows.append((start, end))
    return windows


def detector(
    kind: str,
    pattern: str,
    *,
    left: str | None = None,
    width: int = 0,
    flags: int = 0,
    **options,
) -> Detector:
    """A Detector from pattern text; `left` is written reversed, as it runs backwards."""
    return Detector(
        kind,
        re.compile(pattern, flags),
        left=Left(re.compile(left, flags), width) if left is not None else None,
        **options,
    )
