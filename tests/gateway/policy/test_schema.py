import copy

import pytest

from gateway.policy.exceptions import DecisionSchemaError
from gateway.policy.schema import Decision, parse_argument_denials, parse_decision, validate_decision
from tests.gateway.policy.conftest import SAMPLES

ALLOWED = SAMPLES["allow_enterprise_delegated_clamped"]["expected"]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_sample_expectation_is_a_valid_decision(name: str) -> None:
    assert isinstance(validate_decision(SAMPLES[name]["expected"]), Decision)


def _problems(document: dict) -> list[str]:
    with pytest.raises(DecisionSchemaError) as info:
        validate_decision(document)
    return info.value.problems


def test_missing_field_is_named() -> None:
    document = copy.deepcopy(ALLOWED)
    del document["limits"]["kv_blocks"]
    assert _problems(document) == ["limits.kv_blocks: Field required"]


def test_unknown_field_is_named() -> None:
    document = copy.deepcopy(ALLOWED)
    document["cache"]["ttl"] = 60
    assert any(p.startswith("cache.ttl:") for p in _problems(document))


def test_wrong_type_is_refused_not_coerced() -> None:
    document = copy.deepcopy(ALLOWED)
    document["batching"]["deterministic"] = "true"
    assert any(p.startswith("batching.deterministic:") for p in _problems(document))


def test_unknown_scope_value_is_refused() -> None:
    document = copy.deepcopy(ALLOWED)
    document["cache"]["scope"] = "global"
    assert any(p.startswith("cache.scope:") for p in _problems(document))


@pytest.mark.parametrize(
    ("scope", "namespace"),
    [("none", "tenant:t1"), ("shared", "tenant:t1"), ("tenant", "principal:t1:o1"), ("principal", "principal:")],
)
def test_namespace_must_match_scope(scope: str, namespace: str) -> None:
    document = copy.deepcopy(ALLOWED)
    document["cache"] = {"scope": scope, "namespace": namespace}
    assert any(p.startswith("cache:") and "namespace" in p for p in _problems(document))


def test_deny_without_reason_is_a_policy_error() -> None:
    document = copy.deepcopy(SAMPLES["deny_unknown_tenant"]["expected"])
    document["reasons"] = []
    assert any("reason" in p for p in _problems(document))


def test_negative_limit_is_refused() -> None:
    document = copy.deepcopy(ALLOWED)
    document["limits"]["tokens_per_minute"] = -1
    assert any(p.startswith("limits.tokens_per_minute:") for p in _problems(document))


def test_parse_decision_reads_json() -> None:
    with pytest.raises(DecisionSchemaError):
        parse_decision(b'{"allow": true}')
    assert parse_decision(Decision.model_validate(ALLOWED).model_dump_json()).allow is True


def _with_authentication(allow: bool = True, **section) -> dict:
    document = copy.deepcopy(ALLOWED)
    document["allow"] = allow
    document["authentication"] = {"contexts": [], "missing": [], "max_age_s": 0, "revoked": False,
                                  "challenge": False, **section}
    return document


def test_a_decision_from_before_the_authentication_section_requires_nothing() -> None:
    document = copy.deepcopy(ALLOWED)
    del document["authentication"]
    authentication = validate_decision(document).authentication
    assert (authentication.contexts, authentication.max_age_s, authentication.revoked) == ([], 0, False)


@pytest.mark.parametrize(("section", "field"), [
    ({"contexts": ["mfa"]}, "authentication.contexts.0"),
    ({"contexts": ["c100"]}, "authentication.contexts.0"),
    ({"max_age_s": -1}, "authentication.max_age_s"),
    ({"revoked": "false"}, "authentication.revoked"),
    ({"missing": ["c1"]}, "authentication"),  # missing names a context that contexts does not
])
def test_a_malformed_authentication_section_is_refused(section: dict, field: str) -> None:
    assert any(p.startswith(f"{field}:") for p in _problems(_with_authentication(**section)))


@pytest.mark.parametrize("section", [{"revoked": True}, {"contexts": ["c1"], "missing": ["c1"]}])
def test_an_allowed_decision_cannot_revoke_or_miss_a_context(section: dict) -> None:
    assert _problems(_with_authentication(**section)) == [
        "<decision>: Value error, an allowed decision cannot revoke the token or miss an authentication context"]
    assert validate_decision(_with_authentication(allow=False, **section) | {"reasons": ["x"]})  # a deny may


def test_speculation_is_optional_and_never_beside_the_deterministic_lane() -> None:
    document = copy.deepcopy(ALLOWED)
    assert validate_decision(document).batching.speculative is document["batching"]["speculative"]
    del document["batching"]["speculative"]  # a bundle from before the field
    assert validate_decision(document).batching.speculative is False
    document["batching"] |= {"deterministic": True, "speculative": True}
    assert _problems(document) == ["batching: Value error, speculative must be false in the deterministic lane"]
    document["batching"]["speculative"] = "yes"
    assert any(p.startswith("batching.speculative") for p in _problems(document))


@pytest.mark.parametrize("document", ["[]", b"[]", " [ ] "])
def test_no_argument_denials_is_an_empty_list(document: str | bytes) -> None:
    assert parse_argument_denials(document) == []


def test_argument_denials_are_reasons_and_nothing_else() -> None:
    assert parse_argument_denials('["too long", "not in the enum"]') == ["too long", "not in the enum"]
    for document in ("[1]", '{"a": 1}', "null", "[", '"[]"'):
        with pytest.raises(DecisionSchemaError):
            parse_argument_denials(document)
