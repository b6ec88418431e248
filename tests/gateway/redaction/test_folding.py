"""Folding: the spelling the detectors read, and the map back to the text as written."""

import random
import unicodedata

import pytest

from gateway.redaction.folding import Folded, fold, fold_character

# Characters that fold to themselves, to one other character, to several, or to none.
SAME = "az09 @.-_+/:=\"'\né中ñ"
ONE = "４＠．ｓ\u0455\u03bf٤४\U0001d7ce\u00a0\u2009\u2013\u00b7\u3002“’"
SEVERAL = "ﬁﬀ\ufdfa㎒½⑴⒋²\u00a8"  # fi, ff, 18 characters, MHz, 1/2, (1), 4., 2, " " + mark
NONE = "\u0301\u0332\u20dd\ufe0f\u200b\u00ad"
ALPHABET = SAME + ONE + SEVERAL + NONE


def reference_span(text: str, start: int, end: int) -> tuple[int, int]:
    """original_span worked out the slow way: every character's folding, laid end to end."""
    owners = [index for index, char in enumerate(text) for _ in fold_character(char)]
    first, last = owners[start], owners[end - 1]
    written_end = last + 1
    while written_end < len(text) and fold_character(text[written_end]) == "":
        written_end += 1
    return first, written_end


def random_text(generator: random.Random) -> str:
    return "".join(generator.choice(ALPHABET) for _ in range(generator.randint(1, 40)))


def test_folded_text_is_each_character_folded_in_turn() -> None:
    generator = random.Random(24)
    for _ in range(500):
        text = random_text(generator)
        assert fold(text).text == "".join(map(fold_character, text))


def test_every_folded_span_maps_to_the_fewest_written_characters_that_cover_it() -> None:
    generator = random.Random(7)
    checked = 0
    for _ in range(400):
        text = random_text(generator)
        folded = fold(text)
        for _ in range(20):
            if not folded.text:
                break
            start = generator.randrange(len(folded.text))
            end = generator.randint(start + 1, len(folded.text))
            assert folded.original_span(start, end) == reference_span(text, start, end), (text, start, end)
            checked += 1
    assert checked > 5000


def test_a_written_span_folds_to_a_superset_of_the_folded_span() -> None:
    generator = random.Random(11)
    for _ in range(300):
        text = random_text(generator)
        folded = fold(text)
        if not folded.text:
            continue
        start = generator.randrange(len(folded.text))
        end = generator.randint(start + 1, len(folded.text))
        written_start, written_end = folded.original_span(start, end)
        prefix = fold(text[:written_start]).text
        assert len(prefix) <= start
        assert fold(text[:written_end]).text.startswith(folded.text[:end])
        assert folded.text[start:end] in fold(text[written_start:written_end]).text


def test_ascii_and_unchanged_text_fold_to_themselves_with_no_map() -> None:
    for text in ("plain ascii 4111 jane@contoso.com", "café 中文 ñandú"):
        folded = fold(text)
        assert folded == Folded(text)
        assert folded.original_span(2, 7) == (2, 7)


def test_one_to_one_folding_keeps_positions() -> None:
    folded = fold("ｊａｎｅ＠ｃｏｎｔｏｓｏ．ｃｏｍ")
    assert folded.text == "jane@contoso.com"
    assert folded.original_span(5, 16) == (5, 16)


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("４６０９", "4609"),
        ("٤٦٠٩", "4609"),
        ("۴۶۰۹", "4609"),
        ("४६०९", "4609"),
        ("\U0001d7d2\U0001d7d4", "46"),
        ("＠﹫", "@@"),
        ("．。·", "..."),
        ("\u00a0\u2009\u202f\u3000\u1680", "     "),
        ("\u2010\u2011\u2013\u2014\u2212－", "------"),
        ("\u0455\u043a-", "s\u043a-"),  # Cyrillic dze is drawn like s; ka is not k
        ("Веаrеr", "Bearer"),
        ("“password”", '"password"'),
        ("4\u03321\u0332", "41"),
    ],
)
def test_spellings_the_detectors_read_as_ascii(written: str, read: str) -> None:
    assert fold(written).text == read


def test_every_decimal_digit_folds_to_its_ascii_digit_and_no_character_grows_past_18() -> None:
    longest = 0
    for code in range(0x110000):
        char = chr(code)
        folded = fold_character(char)
        longest = max(longest, len(folded))
        if unicodedata.category(char) == "Nd":
            assert folded == str(unicodedata.decimal(char)), hex(code)
    assert longest == 18  # so folded text is at most 18 times as long as the text: linear
    fold_character.cache_clear()
