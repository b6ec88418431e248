"""Checks that turn a pattern's candidate into a finding, or drop it.

Each takes the matched text and returns how many of its leading characters to redact:
0 drops the candidate, len(text) keeps all of it. Checksums (Luhn, IBAN's ISO 7064 mod 97-10,
both from python-stdnum) and the `ipaddress` module keep ordinary numbers, versions and times out
of the findings.
"""

from __future__ import annotations

import ipaddress
import re

from stdnum import luhn
from stdnum.iso7064 import mod_97_10

# Lengths of the IBAN of each country (SWIFT IBAN registry).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22,
    "BH": 22, "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24,
    "DE": 22, "DJ": 27, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18,
    "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27,
    "GT": 28, "HN": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20,
    "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20,
    "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25,
    "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
    "YE": 30,
}  # fmt: skip

_NOT_DIGIT = re.compile(r"\D")
_IBAN_SEPARATOR = re.compile(r"[ .-]")
_CONNECTION_SECRET = re.compile(r"(?i)(?:AccountKey|SharedAccessKey|SharedAccessSignature)=")


def credit_card(text: str) -> int:
    """13-19 digits in a card's grouping, a card network's first digit, Luhn-valid."""
    digits = _NOT_DIGIT.sub("", text)
    if not 13 <= len(digits) <= 19 or digits[0] not in "23456":
        return 0
    if len(set(digits)) == 1:  # 0000..., 4444...: placeholders, not cards
        return 0
    return len(text) if luhn.is_valid(digits) else 0


def iban(text: str) -> int:
    """Country code, check digits and BBAN of the country's length, mod 97 == 1, in any case.

    A candidate may have run on into a following word ("BE68 5390 0754 7034 CASH"):
    then only its first characters, up to the country's length, are checked and kept.
    """
    length = IBAN_LENGTHS.get(text[:2].upper())
    compact = _IBAN_SEPARATOR.sub("", text).upper()
    if length is None or len(compact) < length:
        return 0
    candidate = compact[:length]
    if not mod_97_10.is_valid(candidate[4:] + candidate[:4]):
        return 0
    if len(compact) == length:
        return len(text)
    kept = 0
    for end, char in enumerate(text, start=1):
        kept += _IBAN_SEPARATOR.fullmatch(char) is None
        if kept == length:
            return end
    return 0


def phone_international(text: str) -> int:
    """'+' then 8 to 15 digits (E.164 allows 15 at most)."""
    return len(text) if 8 <= len(_NOT_DIGIT.sub("", text)) <= 15 else 0


def phone_national(text: str) -> int:
    """A national number with separators: 9 to 12 digits, not all the same."""
    digits = _NOT_DIGIT.sub("", text)
    return len(text) if 9 <= len(digits) <= 12 and len(set(digits)) > 1 else 0


def ipv4(text: str) -> int:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:  # an octet over 255, or a leading zero
        return 0
    return len(text)


def ipv6(text: str) -> int:
    address = text.split("%", 1)[0]
    # a decimal digit keeps out code paths that happen to be addresses ("a::b", "dead::beef")
    if address.count(":") < 2 or not any(char.isdigit() for char in address):
        return 0
    try:
        ipaddress.IPv6Address(address)
    except ValueError:  # a time (12:30:45), a MAC address
        return 0
    return len(text)


def connection_string(text: str) -> int:
    """An Azure connection string counts only when it carries a key or a SAS."""
    return len(text) if _CONNECTION_SECRET.search(text) else 0
