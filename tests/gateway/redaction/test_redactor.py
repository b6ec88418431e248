import copy
import hashlib
import json
import re
import time
import unicodedata

import pytest

from devkit.redaction_samples import EVASIONS, POSITIVES, entra_secret, jwt, private_key, storage_key
from gateway.redaction import Redactor
from tests.gateway.redaction.conftest import KEY

EMAIL_PLACEHOLDER = re.compile(r"\[EMAIL:[0-9a-f]{8}\]")


@pytest.mark.parametrize(
    "breaker",
    ["\r", "\n", "\r\n", "\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1b", "\x00", "\x7f", "\x9b"],
    ids=repr,
)
def test_line_breaks_and_controls_become_spaces(redactor: Redactor, breaker: str) -> None:
    forged = f"ok{breaker}2026-05-12 level=INFO user=admin msg=forged"
    assert redactor.scrub(forged) == "ok" + " " * len(breaker) + "2026-05-12 level=INFO user=admin msg=forged"


def test_no_control_separator_or_format_character_survives(redactor: Redactor) -> None:
    categories = {"Cc", "Cf", "Zl", "Zp", "Cs"}
    unsafe = [chr(code) for code in range(0x110000) if unicodedata.category(chr(code)) in categories]
    scrubbed = redactor.scrub("a" + "".join(unsafe) + "b")
    assert not [char for char in scrubbed if unicodedata.category(char) in categories]
    assert scrubbed.startswith("a") and scrubbed.endswith("b")


def test_zero_width_characters_cannot_hide_a_secret(redactor: Redactor) -> None:
    hidden = "mail jane\u200b.doe@conto\u200dso.com and sk-\u2060" + "a1" * 15
    scrubbed = redactor.scrub(hidden)
    assert re.fullmatch(r"mail \[EMAIL:[0-9a-f]{8}\] and \[API_KEY:[0-9a-f]{8}\]", scrubbed)


def test_same_value_and_key_give_the_same_placeholder() -> None:
    first = Redactor(KEY).scrub("from jane.doe@contoso.com")
    second = Redactor(KEY).scrub("cc: jane.doe@contoso.com today")
    assert EMAIL_PLACEHOLDER.search(first).group() == EMAIL_PLACEHOLDER.search(second).group()


def test_different_values_give_different_placeholders(redactor: Redactor) -> None:
    placeholders = EMAIL_PLACEHOLDER.findall(redactor.scrub("jane@contoso.com and john@contoso.com"))
    assert len(set(placeholders)) == 2


def test_a_different_key_gives_a_different_digest() -> None:
    text = "from jane.doe@contoso.com"
    assert Redactor(KEY).scrub(text) != Redactor(KEY[::-1]).scrub(text)


def test_the_digest_is_a_keyed_hmac_not_a_plain_hash(redactor: Redactor) -> None:
    value = "jane.doe@contoso.com"
    digest = EMAIL_PLACEHOLDER.search(redactor.scrub(value)).group()[7:-1]
    assert digest not in hashlib.sha256(value.encode()).hexdigest()


@pytest.mark.parametrize("key", [b"", b"short", "a string key of 32 characters...."], ids=repr)
def test_a_weak_or_mistyped_key_is_refused(key: object) -> None:
    with pytest.raises(ValueError):
        Redactor(key)  # type: ignore[arg-type]


def test_scrub_refuses_non_text_without_echoing_it(redactor: Redactor) -> None:
    with pytest.raises(TypeError) as caught:
        redactor.scrub(b"jane.doe@contoso.com")  # type: ignore[arg-type]
    assert "jane" not in str(caught.value)


def test_an_address_spelled_otherwise_gets_the_same_placeholder(redactor: Redactor) -> None:
    spellings = ["jane.doe@contoso.com", "jane.doe＠contoso．com", "ｊａｎｅ.ｄｏｅ@contoso.com",
                 "jane.doe﹫contoso.com"]
    placeholders = {redactor.scrub(spelling) for spelling in spellings}
    assert len(placeholders) == 1 and EMAIL_PLACEHOLDER.fullmatch(placeholders.pop())


def test_text_around_a_finding_keeps_its_own_spelling(redactor: Redactor) -> None:
    scrubbed = redactor.scrub("ﬁnance：ｊａｎｅ＠ｃｏｎｔｏｓｏ．ｃｏｍ、电话 ٤٢ ﷺ")
    assert re.fullmatch(r"ﬁnance：\[EMAIL:[0-9a-f]{8}\]、电话 ٤٢ ﷺ", scrubbed)


def test_findings_are_spans_of_the_text_as_written(redactor: Redactor) -> None:
    text = "\ufdfa ﬁ e\u0301 card ４６０９.８４１２.８０３５.０７４９ end"
    [finding] = redactor.find(text)
    assert text[finding.start : finding.end] == "４６０９.８４１２.８０３５.０７４９"


@pytest.mark.parametrize(
    "sample", [*POSITIVES, *EVASIONS.values()], ids=[*(sample.id for sample in POSITIVES), *EVASIONS]
)
def test_scrub_is_idempotent(redactor: Redactor, sample) -> None:
    once = redactor.scrub(sample.text)
    assert redactor.scrub(once) == once


def test_overlapping_findings_merge_into_one_placeholder(redactor: Redactor) -> None:
    findings = redactor.find(f"api_key=sk-{'x1' * 20}")
    assert len(findings) == 1
    assert findings[0].kind == "API_KEY"


def request_document() -> dict:
    return {
        "tenant": "contoso",
        "request": {
            "messages": [
                {"role": "user", "name": "alice", "content": "Mail jane.doe@contoso.com\nthe report."},
                {"role": "assistant", "content": "Done, Jane."},
            ],
            "user": "alice@contoso.com",
            "temperature": 0.2,
            "stream": False,
            "seed": None,
            "max_tokens": 256,
            "card": 4111111111111111,
            "order": 4111111111111112,
        },
        "headers": {"authorization": "Bearer abc.def", "x-request-id": "r-1"},
        "jane.doe@contoso.com": "a key that is an e-mail",
    }


def test_redact_removes_pointers_then_scrubs_every_string(redactor: Redactor) -> None:
    result = redactor.redact(request_document(), ["/request/messages/*/name", "/request/user"])
    messages = result["request"]["messages"]
    assert "name" not in messages[0] and "user" not in result["request"]
    assert re.fullmatch(r"Mail \[EMAIL:[0-9a-f]{8}\] the report\.", messages[0]["content"])
    assert messages[1]["content"] == "Done, Jane."
    assert result["headers"] == {"authorization": "[BEARER]", "x-request-id": "r-1"}


def test_redact_scrubs_keys(redactor: Redactor) -> None:
    result = redactor.redact(request_document(), [])
    [email_key] = [key for key in result if key.startswith("[EMAIL:")]
    assert result[email_key] == "a key that is an e-mail"


def test_redact_keeps_other_scalars_and_scrubs_card_numbers_stored_as_integers(redactor: Redactor) -> None:
    request = redactor.redact(request_document(), [])["request"]
    kept = (request["temperature"], request["stream"], request["seed"], request["max_tokens"])
    assert kept == (0.2, False, None, 256)
    assert re.fullmatch(r"\[CREDIT_CARD:[0-9a-f]{8}\]", request["card"])
    assert request["order"] == 4111111111111112


def test_redact_does_not_mutate_its_input(redactor: Redactor) -> None:
    document = request_document()
    before = copy.deepcopy(document)
    result = redactor.redact(document, ["/request/messages/0", "/headers"])
    assert document == before
    assert result is not document and result["request"] is not document["request"]


def test_redact_with_the_empty_pointer_keeps_nothing(redactor: Redactor) -> None:
    assert redactor.redact(request_document(), [""]) == {}


def test_canaries_never_survive_while_ordinary_words_do(redactor: Redactor) -> None:
    """Unique canaries inside every kind of finding; none may come back, the prose must."""
    canaries = {
        "email": "cnry01",
        "bearer": "cnry02",
        "jwt": jwt("cnry03"),
        "sk": "cnry04",
        "github": "cnry05",
        "entra": entra_secret("cnry06"),
        "storage": storage_key("cnry07"),
        "password": "cnry08",
        "pem": "cnry09",
        "sas": "cnry10",
        "client_secret": "cnry11",
        "dropped": "cnry12",
        "card": "5555555555554444",
        "iban": "GB82WEST12345698765432",
        "phone": "+44 20 7946 0123",
        "ipv4": "203.0.113.77",
        "ipv6": "2001:db8:cafe::17",
    }
    prose = "Please summarise the quarterly report for Contoso by Friday."
    pem = private_key("cnry09").replace("\n", "\ncnry09", 1)
    content = " ".join(
        [
            prose,
            f"Write to {canaries['email']}.smith@contoso.com\r\nor call {canaries['phone']}.",
            f"Authorization: Bearer {canaries['bearer']}xyz",
            f"The id token is {canaries['jwt']}, the key sk-{canaries['sk']}{'q' * 24},",
            f"push with ghp_{canaries['github']}{'Z' * 31}; the app secret is {canaries['entra']}",
            f"and AccountKey={canaries['storage']}; password={canaries['password']}!",
            f"\u2028Here is a key:\n{pem}\n",
            f"blob?sv=2022-11-02&sig={canaries['sas']}AbCdEf0123456789",
            f'{{"client_secret": "{canaries["client_secret"]}-value"}}',
            f"Card {canaries['card']}, IBAN {canaries['iban']}, hosts {canaries['ipv4']} and {canaries['ipv6']}.",
            prose,
        ]
    )
    document = {
        "request": {
            "messages": [{"role": "user", "name": canaries["dropped"], "content": content}],
            "metadata": {f"owner {canaries['email']}@contoso.com": canaries["storage"]},
        }
    }
    result = json.dumps(redactor.redact(document, ["/request/messages/*/name"]), ensure_ascii=False)
    leaked = [name for name, canary in canaries.items() if canary.lower() in result.lower()]
    assert not leaked
    assert "cnry" not in result
    assert result.count(prose) == 2
    for word in ("Write to", "or call", "The id token is", "push with", "Card", "IBAN", "hosts"):
        assert word in result
    assert not re.search(r"[\r\n\u2028\u2029\u0085]|\\[rn]|\\u2028", result)


ADVERSARIAL = {
    "long digit runs after plus": "+1234567890123456789012345678901234567890 ",
    "digits": "1",
    "private key headers without end": "-----BEGIN PRIVATE KEY----- ",
    "colon chains": "1:",
    "hex colon chains": "ab:",
    "at signs": "a@",
    "dotted digits": "1.",
    "bearer words": "bearer ",
    "key names": "api_key=",
    "separated digits": "0 1-2.3 (4) 5",
    "dotted card groups": "4111.1111.1111.1111.",
    "digits with three-character separators": "1 - ",
    "fullwidth digits": "４",
    "other scripts' digits": "٤ ४ ",
    "combining marks between digits": "4\u0332",
    "characters that fold to 18": "\ufdfa",
    "spelled-out at signs": "a [at] b [dot] ",
    "encoded at signs": "a%40b.&#64;c.",
    "look-alike prefixes": "ѕk-",
}


@pytest.mark.parametrize("unit", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_adversarial_text_scrubs_in_linear_time(redactor: Redactor, unit: str) -> None:
    # 64 KB takes ~10 ms; a pattern that backtracks through every split would take minutes.
    text = (unit * (65536 // len(unit) + 1))[:65536]
    started = time.perf_counter()
    redactor.scrub(text)
    assert time.perf_counter() - started < 2.0


def test_a_long_domain_after_one_at_sign_scrubs_in_linear_time(redactor: Redactor) -> None:
    text = "x@" + "a." * 32767 + "1"  # every label is tried as the last one, once
    started = time.perf_counter()
    redactor.scrub(text)
    assert time.perf_counter() - started < 2.0
