"""Folding: the spelling the detectors read, and the way back to the text as written.

The detectors are written for ASCII: `[0-9]`, `@`, `sk-`. Text spells the same things in
other characters, by habit (fullwidth digits from a Japanese input method, an IBAN typed in
lower case, a no-break space between a card's groups) or to slip past a filter (a Cyrillic
`ѕ` in `ѕk-`). `fold` gives the detectors one spelling, character by character:

- NFKC (compatibility) form: fullwidth `４` `＠` `．`, mathematical `𝟎`, small forms `﹫`,
  ligatures, circled and superscript digits, every Unicode space but one;
- any decimal digit (Arabic-Indic `٤`, Devanagari `४`, ...) as its ASCII digit;
- dashes and minus signs as `-`; middle dots, bullets and ideographic full stops as `.`;
  curly quotes as straight ones; fraction and division slashes as `/`;
- Cyrillic, Greek and Armenian letters drawn like Latin ones (`а` `е` `о` `р` `с` `ѕ` `і`,
  `Α` `Β` `Ο` ...) as those Latin letters: a short table, not Unicode's whole confusables
  list, whose pairs like `rn`/`m` would make ordinary words look like key names;
- combining marks and format characters dropped (`4̲1̲1̲1̲`), so none can split a number.

Case is not folded here: case-insensitive patterns read the folded text lower-cased.

Folding is per character, so it is linear and each folded character comes from exactly one
character as written; `Folded.original_span` maps a finding back to the characters as
written, which are what gets replaced, so text outside findings keeps its own spelling.
A character may fold to several (`ﬁ` → `fi`, at most 18) or to none (a combining mark);
a finding that covers part of a character's folding takes the whole character.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache

_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_DROPPED_CATEGORIES = frozenset({"Mn", "Me", "Cf"})  # combining and enclosing marks, format characters

_LOOKALIKES = {
    # Cyrillic
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "ѕ": "s",
    "і": "i", "ј": "j", "һ": "h", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ү": "y",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "Х": "X", "У": "Y", "Ѕ": "S", "І": "I", "Ј": "J", "Ԛ": "Q", "Ԝ": "W", "Һ": "H",
    "Ү": "Y", "Ӏ": "I",
    # Greek
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X", "ο": "o", "ρ": "p", "ν": "v", "ι": "i",
    "α": "a", "υ": "u", "κ": "k", "ϲ": "c", "ϳ": "j", "Ϲ": "C", "Ϳ": "J",
    # Armenian, and Latin letters outside ASCII drawn like ASCII ones
    "օ": "o", "ս": "u", "հ": "h", "ո": "n", "ı": "i", "ȷ": "j", "ɑ": "a", "ɡ": "g", "ɩ": "i",
    # punctuation
    "\u00b7": ".", "\u2022": ".", "\u2027": ".", "\u2219": ".", "\u30fb": ".", "\u3002": ".",
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u2044": "/", "\u2215": "/", "\u2212": "-",
}  # fmt: skip


@lru_cache(maxsize=4096)
def fold_character(char: str) -> str:
    """What the detectors read for one character as written: one character, several, or none."""
    return "".join(_fold_compatible(part) for part in unicodedata.normalize("NFKC", char))


def _fold_compatible(char: str) -> str:
    if char.isascii():
        return char
    lookalike = _LOOKALIKES.get(char)
    if lookalike is not None:
        return lookalike
    category = unicodedata.category(char)
    if category == "Nd":
        return str(unicodedata.decimal(char))
    if category == "Zs":
        return " "
    if category == "Pd":
        return "-"
    if category in _DROPPED_CATEGORIES:
        return ""
    return char


@dataclass(frozen=True, slots=True)
class Folded:
    """Folded text, and where its characters came from.

    Only characters that did not fold to exactly one character are recorded: for the k-th of
    them, its index as written, where its folding starts, and how long that folding is.
    Between them, folded and written positions differ by a constant.
    """

    text: str
    _written: list[int] = field(default_factory=list)
    _starts: list[int] = field(default_factory=list)
    _lengths: list[int] = field(default_factory=list)

    def written_position(self, position: int) -> int:
        """The index as written of the character whose folding holds folded `position`
        (len(written text) for the folded text's end)."""
        k = bisect_right(self._starts, position) - 1
        if k < 0:
            return position
        start, length = self._starts[k], self._lengths[k]
        if position < start + length:
            return self._written[k]
        return self._written[k] + 1 + position - start - length

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The characters as written whose foldings cover folded [start, end), end > start;
        characters that fold to nothing (combining marks) right after the last go with it."""
        if not self._starts:
            return start, end
        return self.written_position(start), self.written_position(self._folding_end(self.written_position(end - 1)))

    def _folding_end(self, index: int) -> int:
        """Where the folding of the character written at `index` ends."""
        k = bisect_right(self._written, index) - 1
        if k < 0:
            return index + 1
        if self._written[k] == index:
            return self._starts[k] + self._lengths[k]
        return self._starts[k] + self._lengths[k] + index - self._written[k]


def fold(text: str) -> Folded:
    """`text` in the detectors' spelling. ASCII text folds to itself, at no cost."""
    if text.isascii():
        return Folded(text)
    pieces: list[str] = []
    written: list[int] = []
    starts: list[int] = []
    lengths: list[int] = []
    growth = 0  # folded length minus written length, so far
    last = 0
    for run in _NON_ASCII.finditer(text):
        chars = run.group()
        folded = list(map(fold_character, chars))
        joined = "".join(folded)
        if joined == chars:
            continue
        pieces += (text[last : run.start()], joined)
        last = run.end()
        if len(joined) == len(chars) and "" not in folded:
            continue  # every character folded to exactly one
        for offset, piece in enumerate(folded):
            if len(piece) != 1:
                index = run.start() + offset
                written.append(index)
                starts.append(index + growth)
                lengths.append(len(piece))
                growth += len(piece) - 1
    if not pieces:
        return Folded(text)
    pieces.append(text[last:])
    return Folded("".join(pieces), written, starts, lengths)
