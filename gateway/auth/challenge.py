"""Entra's claims challenge: the `WWW-Authenticate` value that tells an MSAL or azure-identity
client which claims its next token must carry, in the exact form Microsoft documents
("Claims challenges, claims requests, and client capabilities"):

    Bearer realm="", authorization_uri="https://login.microsoftonline.com/common/oauth2/authorize",
    error="insufficient_claims", claims="<base64 of the claims request>"

The claims request is compact JSON in standard base64 (padded, as Microsoft's own examples are;
azure-core's BearerTokenCredentialPolicy.on_challenge pads and decodes it, then passes it to
get_token(claims=...)). A freshness requirement adds RFC 9470's `max_age` auth-param.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

CHALLENGE_ERROR = "insufficient_claims"


def authorization_uri(authority: str) -> str:
    """Where a client signs in again: the authority's multi-tenant v1 authorize endpoint, as Entra's
    own APIs name it (the realm is then empty)."""
    return f"{authority.rstrip('/')}/common/oauth2/authorize"


def claims_request(contexts: Sequence[str], *, not_before: int | None = None) -> dict:
    """The OIDC claims request for an access token: the authentication contexts it must satisfy
    (`acrs`, essential) and, for a revoked or stale token, a token issued from this moment on
    (`nbf`, essential, as Entra's CAE challenges ask)."""
    access_token: dict = {}
    if len(contexts) == 1:
        access_token["acrs"] = {"essential": True, "value": contexts[0]}
    elif contexts:
        access_token["acrs"] = {"essential": True, "values": list(contexts)}
    if not_before is not None:
        access_token["nbf"] = {"essential": True, "value": str(not_before)}
    return {"access_token": access_token}


def encode_claims(request: dict) -> str:
    """The claims request as a challenge carries it: compact JSON, standard base64."""
    return base64.b64encode(json.dumps(request, separators=(",", ":")).encode()).decode("ascii")


def challenge_header(authority: str, request: dict, *, max_age_s: int = 0) -> str:
    """The WWW-Authenticate value of a claims challenge. Every value in it is ours (the authority
    from settings, base64 text, a number), never the caller's, so nothing needs quoting."""
    header = (f'Bearer realm="", authorization_uri="{authorization_uri(authority)}", '
              f'error="{CHALLENGE_ERROR}", claims="{encode_claims(request)}"')
    if max_age_s > 0:
        header += f', max_age="{int(max_age_s)}"'
    return header
