"""How admission answers the decision's authentication section, one branch at a time (the API tests
show the same answers over HTTP)."""

from __future__ import annotations

import copy

from gateway.errors import AuthenticationContextRequired, ClaimsChallenge, TokenRevoked
from gateway.pipeline.admission import authentication_refusal
from gateway.policy.schema import validate_decision
from gateway.policy.service import Judgement
from tests.gateway.policy.conftest import SAMPLES

AUTHORITY = "https://login.microsoftonline.com"
NOW = 1_764_800_000
NEEDS_C1 = "this request needs authentication context c1"


def _judgement(*, allow: bool = True, reasons: list[str] | None = None, **authentication) -> Judgement:
    document = copy.deepcopy(SAMPLES["allow_free_restricted_with_context"]["expected"])
    document["allow"] = allow
    document["reasons"] = reasons if reasons is not None else ([] if allow else [NEEDS_C1])
    document["authentication"] = {"contexts": [], "missing": [], "max_age_s": 0, "revoked": False,
                                  "challenge": False, **authentication}
    return Judgement(validate_decision(document), "rev")


def test_a_token_that_shows_what_is_needed_is_not_refused() -> None:
    judgement = _judgement(contexts=["c1"], max_age_s=3600, challenge=True)
    assert authentication_refusal(AUTHORITY, judgement, {"auth_time": NOW - 3600}, NOW) is None


def test_a_missing_context_is_a_challenge_for_cp1_and_a_403_otherwise() -> None:
    challenge = authentication_refusal(AUTHORITY, _judgement(allow=False, contexts=["c1"], missing=["c1"],
                                                             challenge=True), {}, NOW)
    assert isinstance(challenge, ClaimsChallenge) and challenge.status_code == 401
    assert 'claims="eyJhY2Nlc3NfdG9rZW4iOnsiYWNycyI6eyJlc3NlbnRpYWwiOnRydWUsInZhbHVlIjoiYzEifX19"' in (
        challenge.headers["WWW-Authenticate"])
    refusal = authentication_refusal(AUTHORITY, _judgement(allow=False, contexts=["c1"], missing=["c1"]), {}, NOW)
    assert isinstance(refusal, AuthenticationContextRequired) and "authentication context c1" in refusal.message


def test_a_deny_that_a_new_token_would_not_cure_is_left_to_the_ordinary_denial() -> None:
    judgement = _judgement(allow=False, reasons=[NEEDS_C1, "this deployment's region is not allowed for the tenant"],
                           contexts=["c1"], missing=["c1"], challenge=True)
    assert authentication_refusal(AUTHORITY, judgement, {}, NOW) is None


def test_a_stale_or_absent_auth_time_is_challenged_with_max_age() -> None:
    for principal in ({"auth_time": NOW - 3601}, {}, {"auth_time": True}):
        refusal = authentication_refusal(AUTHORITY, _judgement(max_age_s=3600, challenge=True), principal, NOW)
        assert isinstance(refusal, ClaimsChallenge) and refusal.headers["WWW-Authenticate"].endswith(', max_age="3600"')


def test_a_revoked_token_is_refused_before_anything_else() -> None:
    judgement = _judgement(allow=False, reasons=["the caller's token has been revoked",
                                                 "this deployment's region is not allowed for the tenant"],
                           revoked=True)
    assert isinstance(authentication_refusal(AUTHORITY, judgement, {}, NOW), TokenRevoked)
    revoked_cae = _judgement(allow=False, reasons=["the caller's token has been revoked"], revoked=True, challenge=True)
    assert isinstance(authentication_refusal(AUTHORITY, revoked_cae, {}, NOW, step_up=False), ClaimsChallenge)


def test_without_step_up_only_revocation_is_answered() -> None:
    judgement = _judgement(allow=False, contexts=["c1"], missing=["c1"], challenge=True)
    assert authentication_refusal(AUTHORITY, judgement, {}, NOW, step_up=False) is None
