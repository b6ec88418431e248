"""The sign-in claims Conditional Access reads: validated for type and size, an unknown shape
dropped (never trusted, never a refused token), and carried into the policy input."""

from __future__ import annotations

import logging

import pytest

from devkit.issuer import DEFAULT_AUDIENCE
from gateway.auth.claims import SessionClaims, session_claims

CONTOSO = "2f6c1a7e-5b3d-4e8a-9c0f-1a2b3c4d5e6f"
DEVICE = "7D0A1B2C-3D4E-4F50-8A6B-7C8D9E0F1A2B"


def test_well_formed_claims_are_kept() -> None:
    session = session_claims({"acrs": ["c1", "c25", "c1"], "amr": ["pwd", "mfa"], "xms_cc": ["cp1"],
                              "sid": "0aa1c2d3-0000-4000-8000-00000000051d", "uti": "AbC-_9", "auth_time": 1764800000,
                              "iat": 1764800100.0, "deviceid": DEVICE})
    assert session == SessionClaims(acrs=("c1", "c25"), amr=("pwd", "mfa"), xms_cc=("cp1",),
                                    sid="0aa1c2d3-0000-4000-8000-00000000051d", uti="AbC-_9",
                                    auth_time=1764800000, iat=1764800100, device_id=DEVICE.lower())
    assert session.takes_claims_challenge is True
    assert session.policy_input() == {"acrs": ["c1", "c25"], "amr": ["pwd", "mfa"], "xms_cc": ["cp1"],
                                      "sid": "0aa1c2d3-0000-4000-8000-00000000051d", "uti": "AbC-_9",
                                      "auth_time": 1764800000, "iat": 1764800100, "deviceid": DEVICE.lower()}


def test_absent_claims_give_empty_lists_and_no_single_values() -> None:
    session = session_claims({})
    assert session.policy_input() == {"acrs": [], "amr": [], "xms_cc": []}
    assert session.takes_claims_challenge is False


@pytest.mark.parametrize(("name", "value"), [
    ("acrs", "c1"),  # a string, not a list
    ("acrs", ["c0"]), ("acrs", ["c100"]), ("acrs", ["C1"]), ("acrs", ["c1", 1]),
    ("acrs", [f"c{i}" for i in range(1, 18)]),  # more than 16
    ("amr", ["pwd", {"mfa": True}]), ("amr", ["x" * 33]),
    ("xms_cc", "cp1"), ("xms_cc", ["cp1", None]), ("xms_cc", ["c" * 65]),
    ("sid", 42), ("sid", "a b"), ("sid", "s" * 129),
    ("uti", "has/slash"), ("auth_time", True), ("auth_time", "1764800000"), ("auth_time", -1), ("auth_time", 1e300),
    ("deviceid", "not-a-guid"),
])
def test_a_claim_of_an_unknown_shape_is_dropped_and_logged_by_name(name, value, caplog) -> None:
    caplog.set_level(logging.INFO, "tenantgate.auth")
    document = session_claims({name: value}).policy_input()
    assert document == {"acrs": [], "amr": [], "xms_cc": []}
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [f"token claim ignored: name={name} (not of the expected shape)"]  # the name, never the value


def test_a_client_without_cp1_takes_no_challenge() -> None:
    assert session_claims({"xms_cc": ["cp2"]}).takes_claims_challenge is False


async def test_a_token_with_odd_session_claims_still_verifies(issuer, make_verifier) -> None:
    """Not trusted, not refused: the claims are dropped and the principal stands."""
    token = issuer.mint(CONTOSO, audience=DEFAULT_AUDIENCE,
                        extra_claims={"acrs": "c1", "xms_cc": [["cp1"]], "auth_time": "yesterday"})
    principal = await make_verifier(issuer).verify(token)
    assert principal.session.acrs == () and principal.session.xms_cc == () and principal.session.auth_time is None


async def test_verified_session_claims_reach_the_policy_input(issuer, make_verifier) -> None:
    token = issuer.mint(CONTOSO, audience=DEFAULT_AUDIENCE,
                        extra_claims={"acrs": ["c1"], "xms_cc": ["cp1"], "auth_time": 1764800000, "sid": "s-1"})
    document = (await make_verifier(issuer).verify(token)).policy_input()
    assert (document["acrs"], document["xms_cc"], document["auth_time"], document["sid"]) == (
        ["c1"], ["cp1"], 1764800000, "s-1")
