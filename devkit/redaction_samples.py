"""The redaction corpus: sentences that carry one secret or personal datum each, and
ordinary sentences that carry none. The detector tests, the canary test and the library
evaluation in bench/redaction.py all read it, so they measure one thing. `EVASIONS` holds
the same kinds of secret spelled in other characters, one sentence per way of spelling.

Every value is made here (test card numbers, IBANs from the registry's examples, keys
derived from a hash), none is real.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import NamedTuple

from gateway.encoding import b64url


class Positive(NamedTuple):
    kind: str  # the placeholder kind the finding must get
    secret: str  # the part that must not survive
    text: str  # a sentence that carries it

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.secret[:24]}"


def _bytes(label: str, size: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{label}:{counter}".encode()).digest()
        counter += 1
    return out[:size]


def _alnum(label: str, size: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(alphabet[byte % len(alphabet)] for byte in _bytes(label, size))


def jwt(label: str = "jwt", segments: int = 3) -> str:
    header = b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": label}).encode())
    payload = b64url(json.dumps({"sub": label, "tid": "contoso", "exp": 1900000000}).encode())
    if segments == 3:
        return f"{header}.{payload}.{b64url(_bytes(label, 256))}"
    parts = [b64url(_bytes(f"{label}:{n}", 32)) for n in range(3)]
    return f"{header}.{parts[0]}.{parts[1]}.{payload}.{parts[2]}"


def storage_key(label: str = "storage") -> str:
    return base64.b64encode(_bytes(label, 64)).decode()


def entra_secret(label: str = "entra") -> str:
    return f"{_alnum(label, 3)}8Q~{_alnum(label + ':tail', 30)}.~_-"


def private_key(label: str = "pem", kind: str = "RSA ") -> str:
    body = base64.b64encode(_bytes(label, 180)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {kind}PRIVATE KEY-----\n{lines}\n-----END {kind}PRIVATE KEY-----"


_JWT = jwt()
_KEY = storage_key()
_SAS_SIG = "Xb0fZ3%2Bq9kLm1N2oP3qR4sT5uV6wX7yZ8aB9cD0eF1g%3D"

POSITIVES: tuple[Positive, ...] = (
    Positive("BEARER", "Bearer " + _JWT, f"The header was Authorization: Bearer {_JWT} on that call."),
    Positive("BEARER", "bearer abc123", "Retry with bearer abc123 please."),
    Positive("BEARER", "BEARER 0a1b2c3d4e5f", "curl -H 'Authorization: BEARER 0a1b2c3d4e5f' https://x"),
    Positive("BEARER", "Bearer dGVuYW50Z2F0ZQ==", '{"authorization": "Bearer dGVuYW50Z2F0ZQ=="}'),
    Positive("BEARER", "Bearer s3cr3t", "I pasted Bearer s3cr3t, is that wrong?"),
    Positive("JWT", _JWT, f"Decode this token for me: {_JWT}. What does it say?"),
    Positive("JWT", jwt("jwe", 5), f"The encrypted one is {jwt('jwe', 5)} today."),
    Positive("JWT", jwt("id"), f'id_token="{jwt("id")}"'),
    Positive("AZURE_STORAGE_KEY", _KEY, f"The account key {_KEY} was rotated."),
    Positive("AZURE_STORAGE_KEY", "Kx9/" + _KEY[4:], f"key1: Kx9/{_KEY[4:]}"),
    Positive(
        "AZURE_CONNECTION_STRING",
        f"AccountKey={_KEY}",
        "Use DefaultEndpointsProtocol=https;AccountName=contosodata;"
        f"AccountKey={_KEY};EndpointSuffix=core.windows.net for the upload.",
    ),
    Positive(
        "AZURE_CONNECTION_STRING",
        "SharedAccessKey=q1w2e3r4t5y6u7i8o9p0AsDfGhJkL=",
        "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=Root;"
        "SharedAccessKey=q1w2e3r4t5y6u7i8o9p0AsDfGhJkL= is the bus.",
    ),
    Positive("AZURE_STORAGE_KEY", "pAsSwOrDkEy0123456789xyz", "AccountKey=pAsSwOrDkEy0123456789xyz;"),
    Positive(
        "AZURE_SAS",
        _SAS_SIG,
        f"Fetch https://contosodata.blob.core.windows.net/c/report.pdf?sv=2022-11-02&ss=b"
        f"&srt=o&sp=r&se=2026-06-30T00:00:00Z&sig={_SAS_SIG} then summarise it.",
    ),
    Positive(
        "AZURE_CONNECTION_STRING",
        "sv=2022-11-02&ss=bfqt&sig=Ab12Cd34Ef56Gh78Ij90",
        "BlobEndpoint=https://x.blob.core.windows.net/;"
        "SharedAccessSignature=sv=2022-11-02&ss=bfqt&sig=Ab12Cd34Ef56Gh78Ij90",
    ),
    Positive("ENTRA_CLIENT_SECRET", entra_secret(), f"The app secret is {entra_secret()} for now."),
    Positive("ENTRA_CLIENT_SECRET", entra_secret("b"), f"secret: {entra_secret('b')}"),
    Positive("ENTRA_CLIENT_SECRET", "hunter2-app-pw", "client_secret=hunter2-app-pw&grant_type=client_credentials"),
    Positive("ENTRA_CLIENT_SECRET", "Zq7.secret", '{"client_secret": "Zq7.secret", "scope": "api"}'),
    Positive("API_KEY", "sk-" + _alnum("openai", 48), f"my key is sk-{_alnum('openai', 48)} ok"),
    Positive("API_KEY", "sk-proj-" + _alnum("proj", 40), f"OPENAI_API_KEY=sk-proj-{_alnum('proj', 40)}"),
    Positive("API_KEY", "ghp_" + _alnum("gh", 36), f"push with ghp_{_alnum('gh', 36)} to the repo"),
    Positive("API_KEY", "github_pat_" + _alnum("pat", 60), f"token github_pat_{_alnum('pat', 60)}"),
    Positive("API_KEY", "AKIAIOSFODNN7EXAMPLE", "aws id AKIAIOSFODNN7EXAMPLE in the config"),
    Positive("API_KEY", "xoxb-2048-4096-" + _alnum("slack", 24), f"slack: xoxb-2048-4096-{_alnum('slack', 24)}"),
    Positive("API_KEY", "Qw3rTy-9876", "api_key = 'Qw3rTy-9876'"),
    Positive("API_KEY", "abcd1234efgh", "x-api-key: abcd1234efgh"),
    Positive("API_KEY", "zzZZ9999", '{"apiKey": "zzZZ9999"}'),
    Positive(
        "API_KEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    Positive("PASSWORD", "correct-horse-9", "password: correct-horse-9"),
    Positive("PRIVATE_KEY", private_key(), f"Here is the key:\n{private_key()}\nDo not share it."),
    Positive("PRIVATE_KEY", private_key("ec", "EC "), f"{private_key('ec', 'EC ')}"),
    Positive("PRIVATE_KEY", private_key("p8", ""), f"pkcs8 {private_key('p8', '')} end"),
    Positive("PRIVATE_KEY", private_key("ssh", "OPENSSH ")[:120], f"cut off: {private_key('ssh', 'OPENSSH ')[:120]}"),
    Positive("EMAIL", "jane.doe@contoso.com", "Send the summary to jane.doe@contoso.com by Friday."),
    Positive("EMAIL", "ops+alerts@mail.example.co.uk", "Alerts go to <ops+alerts@mail.example.co.uk>."),
    Positive("EMAIL", "J_Smith-2@Fabrikam.IO", "Contact J_Smith-2@Fabrikam.IO, thanks"),
    Positive("PHONE", "+1 415 555 2671", "Call me on +1 415 555 2671 tomorrow."),
    Positive("PHONE", "+14155552671", "sms +14155552671"),
    Positive("PHONE", "+44 20 7946 0958", "London office: +44 20 7946 0958."),
    Positive("PHONE", "+49 (30) 1234-5678", "Berlin: +49 (30) 1234-5678"),
    Positive("PHONE", "+33 6 12 34 56 78", "Mobile +33 6 12 34 56 78, evenings"),
    Positive("PHONE", "(555) 123-4567", "Her number is (555) 123-4567."),
    Positive("PHONE", "555-123-4567", "Text 555-123-4567 after six."),
    Positive("PHONE", "555.123.4567", "fax 555.123.4567"),
    Positive("PHONE", "1-800-555-0199", "Support: 1-800-555-0199"),
    Positive("PHONE", "020 7946 0958", "Ring 020 7946 0958 during office hours."),
    Positive("PHONE", "06 12 34 56 78", "Mon portable: 06 12 34 56 78"),
    Positive("PHONE", "030 12345678", "Tel. 030 12345678"),
    Positive("CREDIT_CARD", "4111 1111 1111 1111", "Charge 4111 1111 1111 1111, exp 12/26."),
    Positive("CREDIT_CARD", "4111111111111111", "card=4111111111111111"),
    Positive("CREDIT_CARD", "5500-0000-0000-0004", "Mastercard 5500-0000-0000-0004 please"),
    Positive("CREDIT_CARD", "3400 000000 00009", "Amex 3400 000000 00009 on file"),
    Positive("CREDIT_CARD", "378282246310005", "amex 378282246310005."),
    Positive("CREDIT_CARD", "6011111111111117", "Discover: 6011111111111117"),
    Positive("CREDIT_CARD", "4012888888881881", "visa 4012888888881881 declined"),
    Positive("IBAN", "DE89 3704 0044 0532 0130 00", "Pay to DE89 3704 0044 0532 0130 00 by Monday."),
    Positive("IBAN", "DE89370400440532013000", "IBAN:DE89370400440532013000"),
    Positive("IBAN", "GB29 NWBK 6016 1331 9268 19", "UK account GB29 NWBK 6016 1331 9268 19."),
    Positive("IBAN", "FR14 2004 1010 0505 0001 3M02 606", "FR14 2004 1010 0505 0001 3M02 606 is the IBAN"),
    Positive("IBAN", "NL91ABNA0417164300", "Dutch NL91ABNA0417164300"),
    Positive("IBAN", "BE68 5390 0754 7034", "Belgian BE68 5390 0754 7034 CASH account"),
    Positive("IBAN", "CH9300762011623852957", "Swiss CH9300762011623852957."),
    Positive("IP_ADDRESS", "10.0.0.1", "The pod at 10.0.0.1 failed."),
    Positive("IP_ADDRESS", "192.168.1.254", "router 192.168.1.254:8080"),
    Positive("IP_ADDRESS", "8.8.8.8", "dns=8.8.8.8"),
    Positive("IP_ADDRESS", "2001:db8::1", "Listen on [2001:db8::1]:443 now"),
    Positive("IP_ADDRESS", "fe80::1ff:fe23:4567:890a", "link-local fe80::1ff:fe23:4567:890a%eth0 seen"),
    Positive("IP_ADDRESS", "2001:0db8:85a3:0000:0000:8a2e:0370:7334", "v6 2001:0db8:85a3:0000:0000:8a2e:0370:7334."),
    Positive("IP_ADDRESS", "::ffff:192.0.2.128", "mapped ::ffff:192.0.2.128 here"),
)

# Ordinary text. None of it may be changed.
NEGATIVES: tuple[str, ...] = (
    "Please summarise the quarterly report for Contoso by Friday",
    "Redacted mode still keeps the non-sensitive words.",
    "The answer is 42, and it has been since 2026.",
    "Upgrade Python to 3.11.7 and pip to 24.0 before the release.",
    "The meeting moved to 2026-05-12 at 14:30, room 101.",
    "It costs $1,299.00, or €1.299,00 in Germany, or 1 299,00 € in France.",
    "We shipped 1,234,567 units and 12 345 678 widgets last year.",
    "Order 4111111111111112 was refunded.",
    "Tracking number 1234 5678 9012 3456 is not a card.",
    "The ISBN is 978-3-16-148410-0 and the ISSN 0317-8471.",
    "See RFC 6901 section 3, page 12 of 40.",
    "Timestamps like 12:30:45 and 23:59:59.999 are fine.",
    "A MAC address such as 00:1A:2B:3C:4D:5E is hardware, not a person.",
    "In C++ write std::vector<int> and std::map::find.",
    "Python's a::b and Rust's crate::module::Item are paths.",
    "The build 999.1.1.1 is not an address, neither is 1.2.3.",
    "Scores were 3-1, 2-2 and 10-0 across 3 games.",
    "Call the function with (1, 2, 3) and [4, 5, 6].",
    "The commit 9fceb02d0ae598e95dc970b74767f19372d61af8 fixed it.",
    "Hash: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "UUID 123e4567-e89b-12d3-a456-426614174000 names the run.",
    "The bearer of bad news was the ring bearer.",
    "A bearer token must never be logged; use the Bearer scheme.",
    "Set the api key in the portal, then rotate the password monthly.",
    "The secret to good soup is patience.",
    "Use the client secret flow only for daemons.",
    "Follow @contoso on social media and email us.",
    "Write to us at the address on the website.",
    "The invoice total was 12,450.75 USD across 16 line items.",
    "Between 08:00 and 17:00 on weekdays, 09:00-13:00 on Saturday.",
    "The population grew from 8.1 billion to 8.2 billion.",
    "Temperature was -5 to +12 degrees over 7 days.",
    "Call me in 2 hours, or at 5.",
    "The ratio is 1:2:3 and the map scale 1:25000.",
    "Section 4.2.1.3 of the spec covers retries.",
    "Model gpt-4o-mini scored 0.87 on the eval, up from 0.81.",
    "Kubernetes 1.30.2 with containerd 1.7.13 on Ubuntu 22.04.",
    "Token count: 4096 prompt, 512 completion, 4608 total.",
    "The tenant ID field is empty; the object ID is set.",
    "A skyscraper in sk-town? No, Slovakia uses the .sk domain.",
    "Dates: 01/12/2026, 12.01.2026, 2026/01/12 and 1 Dec 2026.",
    "Phone extensions 101, 102 and 103 ring the front desk.",
    "Lot 2023-0457-88 was recalled.",
    "Account number unknown; the reference is INV-2026-000123.",
    "Latitude 47.6062, longitude -122.3321.",
    "Key points: first, be concise; second, cite sources.",
    "Q~ is not a secret and neither is 8Q~ alone.",
    "The eyJ prefix means base64 JSON.",
    "DefaultEndpointsProtocol is a setting name.",
    "Write Endpoint=https://contoso.openai.azure.com/;Deployment=gpt4 in the config.",
    "They paid 4,111,111,111,111,111 won, a made-up amount.",
    "The years 2019 2020 2021 2022 were busy.",
    "Error 0x80070005 means access denied.",
    "Nine digits 123 456 789 grouped by thousands.",
    "French style 06.12.2026 is a date.",
    "The HTTP status was 429 and Retry-After was 30.",
    "A 4 KB message has about 1,000 tokens.",
    "Use --max-tokens=256 and --temperature=0.2.",
    "See https://learn.microsoft.com/azure/storage/common/storage-sas-overview for SAS.",
    "The regex [A-Za-z0-9+/]{86}== matches keys.",
    # other scripts and spellings: folding (gateway/redaction/folding.py) must not make findings of them
    "会議は２０２６年５月１２日の１４：３０から、参加者は１２名です。",
    "السعر ١٢٫٥٠ دولار، والكمية ٣٤ قطعة.",
    "कुल ४२ लोग आए, और बैठक २०२६ में हुई।",
    "Отчёт за третий квартал: выручка выросла на 8 %, см. раздел 4.2.",
    "Η αναφορά για το τρίτο τρίμηνο είναι έτοιμη.",
    "It costs 1\u00a0299,00\u00a0€, about 10² × ½ of last year’s “budget”.",
    "The ﬁnance team met on 12–14 May; see pages 10–12.",
    "Let 𝐱 = 𝟏𝟐 and 𝐲 = 𝟑𝟒, then 𝐱 + 𝐲 = 𝟒𝟔.",
    "The years 2019–2020 2021–2022 and 2023/2024 were busy.",
    "Look at the website (dot com) or ask me at the desk.",
    "Use x @ np.linalg.inv(a) for the inverse.",
    "Quote ‘sk-learn’ and “GITHUB_PAT” as names, not keys.",
    "Ｐｌｅａｓｅ ｓｕｍｍａｒｉｓｅ ｔｈｅ ｒｅｐｏｒｔ ｂｙ Ｆｒｉｄａｙ．",
)


def _card(separator: str, digits: str = "4609841280350749") -> str:
    return separator.join(digits[i : i + 4] for i in range(0, len(digits), 4))


def _digits_in(script_zero: str, text: str) -> str:
    """`text` with its ASCII digits written in the script whose zero is `script_zero`."""
    return "".join(chr(ord(script_zero) + int(char)) if char.isdigit() else char for char in text)


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(char) + 0xFEE0) if "!" <= char <= "~" else char for char in text)


def _evasion(kind: str, secret: str, before: str = "Here it is: ", after: str = " thanks.") -> Positive:
    return Positive(kind, secret, f"{before}{secret}{after}")


_BODY = _alnum("evasion", 40)
_IBAN = "DE89 3704 0044 0532 0130 00"

# The same secrets spelled so that ASCII patterns miss them (issue 24, item 7). Each sentence
# scrubs to exactly its text with the secret replaced by one placeholder of the kind.
EVASIONS: dict[str, Positive] = {
    # separators between a card's groups
    "card with dots": _evasion("CREDIT_CARD", "4609.8412.8035.0749"),
    "card with slashes": _evasion("CREDIT_CARD", _card("/")),
    "card with underscores": _evasion("CREDIT_CARD", _card("_")),
    "card with spaced hyphens": _evasion("CREDIT_CARD", _card(" - ")),
    "card with no-break spaces": _evasion("CREDIT_CARD", _card("\u00a0")),
    "card with thin spaces": _evasion("CREDIT_CARD", _card("\u2009")),
    "card with narrow no-break spaces": _evasion("CREDIT_CARD", _card("\u202f")),
    "card with ideographic spaces": _evasion("CREDIT_CARD", _card("\u3000")),
    "card with en dashes": _evasion("CREDIT_CARD", _card("\u2013")),
    "card with fullwidth hyphens": _evasion("CREDIT_CARD", _card("\uff0d")),
    "card with middle dots": _evasion("CREDIT_CARD", _card("\u00b7")),
    "card with line breaks": _evasion("CREDIT_CARD", _card("\n")),
    "card with CRLFs": _evasion("CREDIT_CARD", _card("\r\n")),
    "card with zero-width spaces": _evasion("CREDIT_CARD", _card("\u200b")),
    "card with zero-width joiners": _evasion("CREDIT_CARD", _card("\u200d")),
    "card with soft hyphens": _evasion("CREDIT_CARD", _card("\u00ad")),
    "card with word joiners": _evasion("CREDIT_CARD", _card("\u2060")),
    # digits of other forms and scripts
    "card in fullwidth digits": _evasion("CREDIT_CARD", _fullwidth(_card(" "))),
    "card in Arabic-Indic digits": _evasion("CREDIT_CARD", _digits_in("\u0660", _card(" "))),
    "card in Persian digits": _evasion("CREDIT_CARD", _digits_in("\u06f0", _card("-"))),
    "card in Devanagari digits": _evasion("CREDIT_CARD", _digits_in("\u0966", _card(" "))),
    "card in mathematical bold digits": _evasion("CREDIT_CARD", _digits_in("\U0001d7ce", _card(""))),
    "card in mixed scripts": _evasion("CREDIT_CARD", "4609 ८४१२ ８０３５ ٠٧٤٩"),
    "card with combining underlines": _evasion("CREDIT_CARD", "".join(c + "\u0332" for c in _card(" "))),
    "Amex with dots": _evasion("CREDIT_CARD", "3782.822463.10005"),
    # IBANs in any case, any separator, any digits
    "lower-case IBAN": _evasion("IBAN", _IBAN.lower()),
    "lower-case compact IBAN": _evasion("IBAN", "gb29nwbk60161331926819"),
    "mixed-case IBAN": _evasion("IBAN", "Gb29 NwBk 6016 1331 9268 19"),
    "IBAN with hyphens": _evasion("IBAN", _IBAN.replace(" ", "-")),
    "IBAN with no-break spaces": _evasion("IBAN", _IBAN.replace(" ", "\u00a0")),
    "IBAN across a line break": _evasion("IBAN", "DE89 3704 0044\n0532 0130 00"),
    "IBAN in fullwidth": _evasion("IBAN", _fullwidth(_IBAN)),
    # e-mail addresses
    "e-mail with a fullwidth at sign": _evasion("EMAIL", "jane.doe\uff20contoso.com"),
    "e-mail with a small at sign": _evasion("EMAIL", "jane.doe\ufe6bcontoso.com"),
    "e-mail in fullwidth": _evasion("EMAIL", _fullwidth("jane.doe@contoso.com")),
    "e-mail with an ideographic full stop": _evasion("EMAIL", "jane.doe@contoso\u3002com"),
    "e-mail with [at] and [dot]": _evasion("EMAIL", "jane.doe [at] contoso [dot] com"),
    "e-mail with (AT) and (DOT)": _evasion("EMAIL", "Jane.Doe(AT)Contoso(DOT)com"),
    "e-mail with {at}": _evasion("EMAIL", "jane.doe{at}contoso.com"),
    "URL-encoded e-mail": _evasion("EMAIL", "jane.doe%40contoso.com", before="mailto:", after="?subject=hi"),
    "HTML-encoded e-mail": _evasion("EMAIL", "jane.doe&#64;contoso.com"),
    "e-mail with a named at entity": _evasion("EMAIL", "jane.doe&commat;contoso.com"),
    "e-mail with diacritics": _evasion("EMAIL", "jöran.müller@exämple.de"),
    "e-mail in Cyrillic": _evasion("EMAIL", "иван@почта.рф"),
    "e-mail with a Punycode domain": _evasion("EMAIL", "info@xn--80ak6aa92e.xn--p1ai"),
    "e-mail with Cyrillic look-alikes": _evasion("EMAIL", "jаnе@соntoso.com"),
    # key prefixes and key names in other letters and cases
    "API key with a Cyrillic s": _evasion("API_KEY", "\u0455k-" + _BODY),
    "API key in fullwidth": _evasion("API_KEY", _fullwidth("sk-" + _BODY)),
    "API key with an upper-case prefix": _evasion("API_KEY", "SK-" + _BODY),
    "GitHub token with an upper-case prefix": _evasion("API_KEY", "GHP_" + _alnum("gh-upper", 36)),
    "API key with a Greek omicron": _evasion("API_KEY", "sk-pr\u03bfj-" + _BODY),
    "bearer in fullwidth": _evasion("BEARER", _fullwidth("Bearer") + " abc123def"),
    "bearer with Cyrillic look-alikes": _evasion("BEARER", "Веаrеr abc123def"),
    "bearer after a no-break space": _evasion("BEARER", "Bearer\u00a0abc123def"),
    "password key in fullwidth": _evasion("PASSWORD", "hunter22", before=_fullwidth("password=")),
    "password key with Cyrillic look-alikes": _evasion("PASSWORD", "hunter22", before="раssword: "),
    "password key in curly quotes": _evasion("PASSWORD", "hunter22", before="“password”: “", after="”"),
    "password after a fullwidth colon": _evasion("PASSWORD", "hunter22", before="password\uff1a"),
    # numbers the other detectors read
    "phone in fullwidth digits": _evasion("PHONE", "+" + _fullwidth("44 20 7946 0958")),
    "IP address in fullwidth": _evasion("IP_ADDRESS", _fullwidth("10.0.0.1")),
}

