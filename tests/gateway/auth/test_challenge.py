"""The claims challenge header, byte for byte as Microsoft documents it, and as azure-core parses it."""

from __future__ import annotations

import base64
import json

from azure.core.pipeline.policies._utils import get_challenge_parameter

from gateway.auth.challenge import challenge_header, claims_request, encode_claims

# "Claims challenges, claims requests, and client capabilities" (learn.microsoft.com), for context c1.
DOCUMENTED = ('Bearer realm="", authorization_uri="https://login.microsoftonline.com/common/oauth2/authorize", '
              'error="insufficient_claims", '
              'claims="eyJhY2Nlc3NfdG9rZW4iOnsiYWNycyI6eyJlc3NlbnRpYWwiOnRydWUsInZhbHVlIjoiYzEifX19"')


def test_the_c1_challenge_is_microsofts_documented_header() -> None:
    assert challenge_header("https://login.microsoftonline.com/", claims_request(["c1"])) == DOCUMENTED


def test_azure_core_reads_every_parameter_of_it() -> None:
    headers = {"WWW-Authenticate": challenge_header("https://login.microsoftonline.com",
                                                    claims_request(["c1"], not_before=1764800000), max_age_s=3600)}
    assert get_challenge_parameter(headers, "Bearer", "error") == "insufficient_claims"
    assert get_challenge_parameter(headers, "Bearer", "max_age") == "3600"
    encoded = get_challenge_parameter(headers, "Bearer", "claims")
    assert json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))) == {"access_token": {
        "acrs": {"essential": True, "value": "c1"}, "nbf": {"essential": True, "value": "1764800000"}}}


def test_several_contexts_are_asked_for_as_values() -> None:
    assert claims_request(["c1", "c2"]) == {"access_token": {"acrs": {"essential": True, "values": ["c1", "c2"]}}}


def test_claims_are_standard_padded_base64_as_in_microsofts_examples() -> None:
    # The doc's own example (a cp1 value) ends in "fQ==": padded, standard alphabet.
    assert encode_claims({"access_token": {"acrs": {"essential": True, "value": "cp1"}}}) == (
        "eyJhY2Nlc3NfdG9rZW4iOnsiYWNycyI6eyJlc3NlbnRpYWwiOnRydWUsInZhbHVlIjoiY3AxIn19fQ==")
