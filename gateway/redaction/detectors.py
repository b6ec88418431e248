"""The detectors for secrets and personal data, in precedence order.

Patterns anchor on what is rare in prose (a prefix, a key name, a checksum, a separator
layout) so ordinary words, years, versions, prices and times survive. When findings
overlap they merge into one placeholder of the earliest kind below.

Patterns read the text folded (folding.py), so ASCII classes also catch fullwidth and
other scripts' digits, look-alike letters, Unicode spaces and dashes. Patterns marked
`lowercase=True` are written in lower case and run on the lower-cased folded text; `left=`
patterns are written reversed (see matching.Left).

Spellings caught: cards grouped by one kind of separator (space . - / _, up to three, so
" - " and a CRLF too), IBANs in any case with spaces, hyphens or dots, vendor key prefixes
in any case, e-mail addresses with `[at]`/`(dot)` in brackets, `%40`, `&#64;` or
`&commat;`, and with Latin, Greek or Cyrillic letters. Not caught, by choice: the bare
words "at" and "dot" (prose: "look at example dot com"), card groups apart by mixed
separators or in other groupings (lists of years and decimals would pass for cards),
spaces around a plain "@" (Python's `x @ np.linalg.inv`), digits spelled as words or
letters ("four one", "O" for 0), and encodings of the whole value (base64, hex).
"""

from __future__ import annotations

import re

from gateway.redaction import validators
from gateway.redaction.matching import Detector, detector

_KV = r"""["']?\s*[:=]\s*["']?"""  # `key=v`, `key: v`, `"key": "v"`, `key = 'v'`
_VALUE = r"""[^\s"'`,;&<>]"""
_TOKEN = r"""[^\s"'`,;<>]"""
# Already redacted (lower-cased): a placeholder, or the digest after a placeholder's own
# kind ("[API_KEY:1a2b3c4d]" reads as a key name and a value).
_PLACEHOLDER = r"\[[a-z_]+(?::[0-9a-f]{8})?\]|[0-9a-f]{8}\]"
# Words that follow "bearer" in prose ("the bearer of", "a bearer token"), never a token.
_PROSE_AFTER_BEARER = r"(?:of|to|for|and|or|the|an?|is|was|in|on|with|tokens?|auth\w*|scheme|header|credentials?)"
# A chunk of a PEM body: headers, and base64 that is long, padded, or not a plain word.
_PEM_CHUNK = (
    r"(?:(?:Proc-Type|DEK-Info):\s*\S+|[A-Za-z0-9+/]{16,}={0,2}|[A-Za-z0-9+/]*={1,2}"
    r"|[A-Za-z]*[0-9+/][A-Za-z0-9+/]*)"
)
# E-mail addresses in Latin (with diacritics), Greek and Cyrillic letters. Not CJK: text in
# those scripts has no spaces, so an address could not be told from the words around it.
_LETTER = r"A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0386\u0388-\u03ff\u0400-\u04ff"
_LOCAL_PART = rf"[{_LETTER}0-9_.%+-]+"
_LABEL = rf"[{_LETTER}0-9](?:[{_LETTER}0-9-]{{0,61}}[{_LETTER}0-9])?"
_DOT = r"(?:\.| ?[\[({<](?i:dot)[\])}>] ?|%2[eE])"
_DOMAIN = rf"(?:{_LABEL}{_DOT})+(?:[{_LETTER}]{{2,24}}|(?i:xn--)[A-Za-z0-9-]{{1,59}})(?![{_LETTER}0-9-])"
_CARD_SEPARATOR = r"[ ._/-]"
# "Section 4.2.1.3" is a section, not an address: these words, reversed, may not precede.
_NOT_BEFORE_IPV4 = "|".join(f" ?{word[::-1]}" for word in ("section", "chapter", "clause", "version", "release", "§"))


def _key_value(kind: str, key: str, rest: str, least: int, value: str = _VALUE, **options) -> Detector:
    """The literal `key` and `rest` of its name (lower case), `=` or `:`, a value of `least`+
    characters. Only the value is replaced. Without `left`, the key may not continue a word.
    """
    boundary = "" if "left" in options else rf"(?<![a-z0-9]{key})"
    return detector(
        kind,
        rf"{key}{boundary}{rest}{_KV}(?!{_PLACEHOLDER})(?P<secret>(?:{value}){{{least},}})",
        lowercase=True,
        **options,
    )


def _prefixed(prefix: str, rest: str) -> Detector:
    """An API key recognised by its vendor's literal prefix, in any case ("SK-", "Ghp_"): a
    key whose prefix was re-cased still carries its secret. `rest` is written in lower case."""
    literal = re.escape(prefix.lower())
    return detector("API_KEY", rf"{literal}(?<![a-z0-9_-]{literal}){rest}", lowercase=True)


DETECTORS: tuple[Detector, ...] = (
    # PEM: BEGIN to END over any lines (an 8192-bit RSA key is 6.4 KB); a key cut off
    # before END goes to its last base64 chunk.
    detector(
        "PRIVATE_KEY",
        r"-----BEGIN[A-Z0-9 ]{0,20} PRIVATE KEY(?: BLOCK)?-----"
        r"(?:(?:(?!-----BEGIN).){0,12000}?-----END[A-Z0-9 ]{0,20} PRIVATE KEY(?: BLOCK)?-----"
        rf"|(?:\s+{_PEM_CHUNK})*)",
        flags=re.DOTALL,
    ),
    # Bearer tokens are never written in any form, not even as a keyed digest.
    detector(
        "BEARER",
        rf"bearer(?<![a-z0-9_-]bearer)\s+[\"'`]?(?!{_PROSE_AFTER_BEARER}[.!?:)]*(?!{_TOKEN})){_TOKEN}+",
        lowercase=True,
        digest=False,
    ),
    # Whatever the scheme (Basic, Digest, Negotiate...), a header's credentials go like a bearer's.
    _key_value("AUTHORIZATION", "authorization", "", 1, value=rf"[a-z][a-z0-9-]*\s+{_TOKEN}+", digest=False),
    # DefaultEndpointsProtocol=...;AccountKey=..., Endpoint=sb://...;SharedAccessKey=...
    detector(
        "AZURE_CONNECTION_STRING",
        r"""endpoint(?:sprotocol)?=[^\s;"'`]+(?:;[a-z]+=[^\s;"'`]*)+;?""",
        left=r"(?:tluafed|bolb|eueuq|elbat|elif)?(?![a-z0-9])",
        width=8,
        lowercase=True,
        validate=validators.connection_string,
    ),
    # JWS (3 segments) and JWE (5 segments); the header is base64url JSON, so "eyJ".
    detector(
        "JWT",
        r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*){2}(?:(?:\.[A-Za-z0-9_-]*){2})?",
    ),
    # A storage account key is 64 random bytes: 88 base64 characters ending in "==".
    detector(
        "AZURE_STORAGE_KEY",
        r"==(?![A-Za-z0-9+/=])",
        left=r"[A-Za-z0-9+/]{86}(?![A-Za-z0-9+/])",
        width=87,
    ),
    _key_value("AZURE_STORAGE_KEY", "accountkey", "", 8),
    _key_value("AZURE_STORAGE_KEY", "sharedaccesskey", "", 8),
    _key_value("AZURE_SAS", "sharedaccesssignature", "", 16, value=r"""[^\s;"'`]"""),
    _key_value("AZURE_SAS", "sig", "", 16, value=r"[a-z0-9%+/=_-]"),
    # Entra ID client secrets: 3 characters, a version digit, "Q~", then 31-34 more.
    detector(
        "ENTRA_CLIENT_SECRET",
        r"Q~[A-Za-z0-9_~.-]{31,34}",
        left=r"\d[A-Za-z0-9_~.-]{3}(?![A-Za-z0-9_~.-])",
        width=5,
    ),
    _key_value("ENTRA_CLIENT_SECRET", "client", "[_-]?secret", 4),
    _prefixed("sk-", "[a-z0-9_-]{20,}"),  # OpenAI, Anthropic
    _prefixed("gh", "[pousr]_[a-z0-9]{36,}"),  # GitHub
    _prefixed("github_pat_", "[a-z0-9_]{22,}"),
    # AWS key ids are upper case by construction: "akia" and 16 letters is a word.
    detector("API_KEY", r"A(?<![A-Za-z0-9_-]A)(?:KIA|SIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    _prefixed("xox", "[baprs]-[a-z0-9-]{10,}"),  # Slack
    _prefixed("AIza", "[a-z0-9_-]{35}"),  # Google
    detector(  # Stripe
        "API_KEY",
        r"_live_[a-z0-9]{16,}",
        left=r"(?:ks|kr)(?![a-z0-9_-])",
        width=3,
        lowercase=True,
    ),
    _key_value("API_KEY", "api", "[_ -]?key", 4),  # also x-api-key, apiKey
    _key_value("API_KEY", "aws", "[_-]?secret[_-]?access[_-]?key", 4),
    _key_value("PASSWORD", "passw", "(?:or)?d", 3),
    _key_value("PASSWORD", "pwd", "", 3),
    _key_value(
        "ACCESS_TOKEN",
        "token",
        "",
        3,
        left=r"[_-]?(?:ssecca|hserfer|di)(?![a-z0-9])",  # access_token, refresh-token, idtoken
        width=9,
    ),
    detector("EMAIL", rf"@{_DOMAIN}", left=_LOCAL_PART, width=256),
    # Spelled out, "jane [at] contoso (dot) com" (the bare words "at" and "dot" are prose),
    # or encoded: "jane%40contoso.com" in a URL, "jane&#64;contoso.com" in HTML.
    detector("EMAIL", rf"at[\])}}>] ?{_DOMAIN}", left=rf"[\[({{<] ?{_LOCAL_PART}", width=258, lowercase=True),
    detector("EMAIL", rf"%40{_DOMAIN}", left=_LOCAL_PART, width=256),
    detector("EMAIL", rf"&(?:#0*64|#x0*40|commat);{_DOMAIN}", left=_LOCAL_PART, width=256, lowercase=True),
    # Grouped like a card (4-4-4-4, 4-6-5) with one kind of separator (up to three of
    # space . - / _, so " - " and a CRLF's two spaces too), or contiguous.
    detector(
        "CREDIT_CARD",
        rf"(?<![0-9.,])(?<![0-9]{_CARD_SEPARATOR})(?:[0-9]{{13,19}}"
        rf"|[0-9]{{4}}(?P<s>{_CARD_SEPARATOR}{{1,3}})[0-9]{{4}}(?P=s)[0-9]{{4}}(?P=s)[0-9]{{1,4}}(?:(?P=s)[0-9]{{3}})?"
        rf"|[0-9]{{4}}(?P<t>{_CARD_SEPARATOR}{{1,3}})[0-9]{{6}}(?P=t)[0-9]{{4,5}})"
        rf"(?![0-9]|[.,][0-9]|{_CARD_SEPARATOR}[0-9])",
        numeric=True,
        validate=validators.credit_card,
    ),
    # Any case ("de89 3704 ..."); groups of four apart by a space, hyphen or dot, or none.
    detector(
        "IBAN",
        r"(?<![a-z0-9])[a-z]{2}[0-9]{2}(?:[ .-]?[a-z0-9]{4}){2,7}(?:[ .-]?[a-z0-9]{1,3})?(?![a-z0-9])",
        lowercase=True,
        numeric=True,
        validate=validators.iban,
    ),
    detector(
        "IP_ADDRESS",
        r"\.(?<=[0-9]\.)[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?!\w|\.[0-9])",
        left=rf"[0-9]{{1,3}}(?![\w.])(?!{_NOT_BEFORE_IPV4})",
        width=12,
        flags=re.IGNORECASE,
        validate=validators.ipv4,
    ),
    detector(
        "IP_ADDRESS",
        r":[0-9A-Fa-f:]{1,38}+(?:(?:\.[0-9]{1,3}){3})?(?:%[A-Za-z0-9_.-]+)?(?![\w:]|\.[0-9])",
        left=r"[0-9A-Fa-f]{0,4}(?![\w:.])",
        width=5,
        validate=validators.ipv6,
    ),
    # E.164: "+" and 8 to 15 digits, single separators between them. One digit a step, so
    # a long run of digits cannot make the pattern backtrack through every grouping.
    detector(
        "PHONE",
        r"\+(?<![\w+]\+)[1-9](?:[ .-]?[0-9]|[ .-]?\([0-9]{1,5}\)){6,16}(?!\w|[ .-]?[0-9])",
        validate=validators.phone_international,
    ),
    # National: North American 3-3-4, or a trunk "0" then groups with one separator.
    detector(
        "PHONE",
        r"(?<![\w+.-])(?<![0-9][ .-])(?:"
        r"(?:1[ .-])?(?:\([0-9]{3}\) ?[0-9]{3}[ .-]|[0-9]{3}(?P<n>[ .-])[0-9]{3}(?P=n))[0-9]{4}"
        r"|\(0[0-9]{1,4}\) ?[0-9]{2,8}(?:[ -][0-9]{2,8}){0,3}"
        r"|0[0-9]{1,4}(?P<z>[ .-])[0-9]{2,8}(?:(?P=z)[0-9]{2,8}){0,3}"
        r")(?![\w:/]|[ .-][0-9])",
        numeric=True,
        validate=validators.phone_national,
    ),
)
