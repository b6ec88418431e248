"""Each detector's positives and negatives, one case each, from the shared corpus."""

import re

import pytest
from stdnum.luhn import is_valid as luhn_ok

from devkit.redaction_samples import EVASIONS, NEGATIVES, POSITIVES, Positive, jwt, storage_key
from gateway.redaction import DETECTORS, Redactor
from gateway.redaction.validators import iban

PLACEHOLDER = re.compile(r"\[[A-Z_]+(?::[0-9a-f]{8})?\]")


@pytest.mark.parametrize("sample", POSITIVES, ids=[sample.id for sample in POSITIVES])
def test_positive_is_replaced_by_its_typed_placeholder(redactor: Redactor, sample: Positive) -> None:
    scrubbed = redactor.scrub(sample.text)
    assert sample.secret not in scrubbed
    assert f"[{sample.kind}" in scrubbed
    # the words around the finding stay (the token touching it may be a key name)
    at = sample.text.index(sample.secret)
    before = sample.text[:at].split()[:-1]
    after = sample.text[at + len(sample.secret) :].split()[1:]
    for word in before + after:
        assert word in scrubbed


@pytest.mark.parametrize("sample", EVASIONS.values(), ids=EVASIONS.keys())
def test_a_secret_spelled_otherwise_is_one_placeholder_and_the_rest_stays_as_written(
    redactor: Redactor, sample: Positive
) -> None:
    before, after = sample.text.split(sample.secret)
    placeholder = rf"\[{sample.kind}(?::[0-9a-f]{{8}})?\]"
    # line breaks in the secret become spaces before detection; nothing of the secret is left
    assert re.fullmatch(re.escape(before) + placeholder + re.escape(after), redactor.scrub(sample.text))


@pytest.mark.parametrize("sentence", NEGATIVES)
def test_ordinary_text_comes_back_unchanged(redactor: Redactor, sentence: str) -> None:
    assert redactor.scrub(sentence) == sentence


# Near misses: each looks like one detector's finding but is not one.
NEAR_MISSES = {
    "card failing Luhn": "Pay with 4111 1111 1111 1112 today",
    "16 digits failing Luhn": "ref 4111111111111112",
    "Luhn-valid but no card network": "id 1234567812345670",
    "card with mixed separators": "4111 1111-1111 1111",
    "20 digits": "4111 1111 1111 1111 2222",
    "IBAN with a wrong check": "DE88 3704 0044 0532 0130 00",
    "IBAN of the wrong length": "DE89 3704 0044 0532 0130",
    "IBAN of an unknown country": "ZZ89370400440532013000",
    "octet over 255": "host 256.1.1.1 down",
    "octets with leading zeros": "code 01.02.03.04",
    "four-part version after 'version'": "version 1.2.3.4 is out",
    "five-part version": "build 1.2.3.4.5",
    "time": "at 12:30:45",
    "MAC address": "nic 00:1a:2b:3c:4d:5e",
    "code path": "call a::b and dead::beef",
    "IPv6 without a second colon": "ratio 1:2",
    "eyJ without segments": "eyJhbGciOiJSUzI1NiJ9 alone",
    "87 base64 chars and ==": storage_key()[:85] + "==",
    "storage key inside a longer blob": "x" + storage_key(),
    "short Q~": "abc8Q~short",
    "sk- too short": "use sk-learn and sk-abc",
    "AKIA too short": "AKIA1234",
    "public key": "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkq\n-----END PUBLIC KEY-----",
    "handle": "ping @contoso or @ops-team",
    "at without a domain": "meet me @ 5",
    "plus without digits groups": "from -5 to +12 degrees",
    "plain integer": "it is 4155552671 bytes",
    "short national": "ext 555-1234",
    "date": "on 2026-05-12 and 12/05/2026",
    "bearer in prose": "the bearer of bad news, a bearer token",
    "api key without a value": "rotate the api key.",
    "password without a value": "reset your password.",
    "connection string without a key": "Endpoint=https://x.openai.azure.com/;Deployment=gpt",
    "lower-case IBAN with a wrong check": "de88 3704 0044 0532 0130 00",
    "dotted groups failing Luhn": "build 4111.1111.1111.1112",
    "fullwidth digits failing Luhn": "番号 ４１１１ １１１１ １１１１ １１１２",
    "lower-case AWS key id": "akiaiosfodnn7example",
    "'at' in brackets in prose": "look (at) this, or data[at].shape",
    "entity without an address": "a &commat; b and 100%40 off",
}


@pytest.mark.parametrize("text", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_miss_is_not_a_finding(redactor: Redactor, text: str) -> None:
    assert redactor.scrub(text) == " ".join(text.split("\n"))


@pytest.mark.parametrize(
    "text",
    ["Bearer abc", "bearer abc", "BEARER abc", "BeArEr abc", "Bearer\tabc", "Authorization: Bearer 'abc'"],
)
def test_bearer_is_case_insensitive_and_leaves_no_digest(redactor: Redactor, text: str) -> None:
    scrubbed = redactor.scrub(text)
    assert "abc" not in scrubbed
    assert "[BEARER]" in scrubbed


def test_bearer_jwt_is_one_bearer_placeholder(redactor: Redactor) -> None:
    token = jwt("bearer")
    assert redactor.scrub(f"Authorization: Bearer {token}") == "Authorization: [BEARER]"


def test_other_authorization_schemes_leave_no_digest(redactor: Redactor) -> None:
    assert redactor.scrub("Authorization: Basic dXNlcjpwYXNz") == "Authorization: [AUTHORIZATION]"


def test_jwe_with_five_segments_is_one_finding(redactor: Redactor) -> None:
    token = jwt("jwe", segments=5)
    assert token.count(".") == 4
    assert PLACEHOLDER.fullmatch(redactor.scrub(token))


def test_jwt_at_the_end_of_a_sentence_keeps_the_full_stop(redactor: Redactor) -> None:
    assert redactor.scrub(f"It was {jwt()}.").endswith("].")


def test_private_key_without_end_marker_goes_to_its_last_line(redactor: Redactor) -> None:
    text = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nq9x+/ab==\n\nThanks"
    scrubbed = redactor.scrub(text)
    assert "MIIE" not in scrubbed and "q9x" not in scrubbed
    assert scrubbed.endswith("Thanks")


def test_key_value_keeps_the_key_name(redactor: Redactor) -> None:
    assert re.fullmatch(r'\{"api_key": "\[API_KEY:[0-9a-f]{8}\]"\}', redactor.scrub('{"api_key": "abc123xyz"}'))


@pytest.mark.parametrize(
    ("digits", "valid"),
    [("4111111111111111", True), ("4111111111111112", False), ("79927398713", True), ("79927398710", False)],
)
def test_luhn(digits: str, valid: bool) -> None:
    assert luhn_ok(digits) is valid


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("GB82WEST12345698765432", 22),
        ("GB82 WEST 1234 5698 7654 32", 27),
        ("GB82WEST12345698765433", 0),
        ("BE68 5390 0754 7034 CASH", 19),
        ("XX82WEST12345698765432", 0),
    ],
)
def test_iban_is_checked_by_country_length_and_mod_97(text: str, kept: int) -> None:
    assert iban(text) == kept


def test_uppercase_i_with_dot_does_not_shift_findings(redactor: Redactor) -> None:
    scrubbed = redactor.scrub("İstanbul: ayse@example.com.tr, İzmir")
    assert re.fullmatch(r"İstanbul: \[EMAIL:[0-9a-f]{8}\], İzmir", scrubbed)


def test_lower_casing_changes_the_length_of_no_character_but_dotted_capital_i() -> None:
    # Redactor.find relies on this to run lower-case patterns on text.lower().
    grown = [code for code in range(0x110000) if len(chr(code).lower()) != 1]
    assert grown == [0x130]


def test_every_detector_kind_is_exercised_by_the_corpus() -> None:
    kinds = {detector.kind for detector in DETECTORS} - {"AUTHORIZATION", "ACCESS_TOKEN"}
    assert kinds <= {sample.kind for sample in POSITIVES}
