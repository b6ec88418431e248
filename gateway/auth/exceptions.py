"""Authentication errors. Every one is an HTTP 401, and callers all get the same one (deps.authenticated):
the code and message are for the log and `tenantgate_auth_failures_total`. None carries the token or a claim value."""

# One fixed, safe message per code: a message is never built from anything the caller sent.
MESSAGES = {
    "invalid_token": "The access token is invalid.",
    "malformed_token": "The access token is not a well-formed JWS compact token.",
    "token_too_large": "The access token is larger than allowed.",
    "unsupported_algorithm": "The access token must be signed with RS256.",
    "forbidden_header": "The access token header names a key source, which is not accepted.",
    "missing_kid": "The access token header has no key id.",
    "unsupported_token_version": "The access token version is not 1.0 or 2.0.",
    "invalid_tenant": "The access token has no valid tenant id.",
    "tenant_not_allowed": "The tenant of the access token may not call this service.",
    "invalid_issuer": "The access token issuer is not the tenant's Entra ID issuer.",
    "invalid_audience": "The access token is not for this service.",
    "token_expired": "The access token has expired.",
    "token_not_yet_valid": "The access token is not valid yet.",
    "missing_claim": "The access token lacks a required claim.",
    "invalid_claim": "The access token has a claim of the wrong form.",
    "invalid_token_type": "The access token is neither a delegated nor an app-only token.",
    "unknown_key": "The access token was signed with an unknown key.",
    "invalid_signature": "The access token signature is invalid.",
    "keys_unavailable": "The signing keys of the tenant could not be obtained.",
}


class AuthError(Exception):
    """A token was refused: HTTP 401 with WWW-Authenticate.

    `code` is a short machine code (a key of MESSAGES); `message` is the fixed text for it.
    """

    def __init__(self, code: str) -> None:
        if code not in MESSAGES:
            code = "invalid_token"
        super().__init__(MESSAGES[code])
        self.code = code
        self.message = MESSAGES[code]


class TenantsUnknownError(Exception):
    """The policy cannot say yet which tenants are registered (its source has not answered since
    start-up), so a token can be neither accepted nor refused as a bad one: HTTP 503, not 401."""


class AuthUnavailableError(AuthError):
    """No usable keys for the tenant could be fetched and none are cached: still a 401 to the
    caller, but the gateway can tell an identity-provider outage from a bad token."""

    def __init__(self) -> None:
        super().__init__("keys_unavailable")
