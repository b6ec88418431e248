"""Errors the gateway returns, in OpenAI's shape (gateway/error_handlers.py answers them over HTTP).

Every message is written here or chosen from a fixed set; no handler echoes str(exc) of
a foreign exception, a token, or request content.
"""

from __future__ import annotations


class GatewayError(Exception):
    status_code = 500
    type = "server_error"
    code = "internal_error"  # every error carries a code (docs/api.md lists them)
    # A policy refusal's Judgement, for its audit record (pipeline/admission.judge sets it).
    judgement: object | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


class InvalidRequest(GatewayError):
    status_code = 400
    type = "invalid_request_error"
    code = "invalid_value"


class ContextLengthExceeded(InvalidRequest):
    """A prompt that leaves no room in the context window: OpenAI's 400, which clients that trim
    their history on overflow react to (a 403 would read as a permission problem). Deployments'
    own refusals of this kind carry the code with their own message."""

    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, context_tokens: int, *, tenants: bool = False) -> None:
        # OpenAI's wording whichever window binds: clients (LiteLLM's ContextWindowExceededError,
        # its fallbacks) recognise the error by it. Which window it was follows it.
        window = "this tenant's policy" if tenants else "the model"
        super().__init__(f"This model's maximum context length is {context_tokens} tokens. However, your messages "
                         f"resulted in {prompt_tokens} tokens, which leaves no room for a completion. Please "
                         f"reduce the length of the messages or the prompt (the window is set by {window}).",
                         param="messages")


class Unauthenticated(GatewayError):
    """A refused token. Every refused token gets this same answer (the reason is in the log and in
    tenantgate_auth_failures_total{code}): an unknown tenant must look like a bad signature, or
    anyone could test which tenants are customers."""

    status_code = 401
    type = "invalid_request_error"  # OpenAI's type for a refused key
    code = "invalid_token"
    MESSAGE = "the access token is invalid or is not accepted by this service"

    def __init__(self, message: str = MESSAGE, *, code: str = "invalid_token") -> None:
        # RFC 6750: the challenge names the realm and the error, never the token.
        description = message.replace('"', "'").replace("\\", "/")
        super().__init__(message, code=code, headers={
            "WWW-Authenticate": f'Bearer realm="tenantgate", error="invalid_token", error_description="{description}"'
        })


class MissingCredentials(Unauthenticated):
    def __init__(self) -> None:
        GatewayError.__init__(self, "an Authorization: Bearer <Entra ID access token> header is required",
                              code="missing_token", headers={"WWW-Authenticate": 'Bearer realm="tenantgate"'})


class ClaimsChallenge(GatewayError):
    """A valid token that lacks what the request needs (an authentication context, a recent
    enough sign-in) or that tenant data has revoked, sent to a client that declared it can follow
    a claims challenge (xms_cc cp1): 401 with Entra's `insufficient_claims` WWW-Authenticate
    (gateway/auth/challenge.py builds it), after which MSAL and azure-identity get a token with
    those claims and retry. The body is OpenAI's error shape; the message names no claim value
    of the token."""

    status_code = 401
    type = "invalid_request_error"
    code = "insufficient_claims"

    def __init__(self, message: str, www_authenticate: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": www_authenticate})


class AuthenticationContextRequired(GatewayError):
    """The same lack, for a client that cannot follow a challenge: Entra sends challenges only to
    clients that declared cp1, so others get a 403 naming what they must sign in with."""

    status_code = 403
    type = "permission_denied"
    code = "authentication_context_required"


class TokenRevoked(Unauthenticated):
    """A token that tenant data revokes (its principal, its session, or every token of the tenant
    issued before a time), for a client that cannot follow a challenge: a 401 with the plain
    invalid_token challenge, so the client signs in again."""

    code = "token_revoked"
    MESSAGE = "the access token has been revoked; sign in again"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE, code="token_revoked")


class PolicyDenied(GatewayError):
    status_code = 403
    type = "permission_denied"
    code = "policy_denied"

    def __init__(self, reasons: list[str], revision: str) -> None:
        super().__init__("denied by policy: " + "; ".join(reasons))
        self.reasons = reasons
        self.revision = revision


class ModelNotFound(GatewayError):
    status_code = 404
    type = "invalid_request_error"
    code = "model_not_found"
    MESSAGE = "the requested model does not exist or is not available to you"

    def __init__(self) -> None:
        # The name is the caller's text; it is not echoed back.
        super().__init__(self.MESSAGE, param="model")


class ModelDenied(PolicyDenied):
    """Policy denies the tenant this model: answered exactly as a model not served here (404), so
    a tenant cannot tell a name served for others from one that does not exist. The reasons stay
    in the audit record."""

    status_code = 404
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, reasons: list[str], revision: str) -> None:
        super().__init__(reasons, revision)
        GatewayError.__init__(self, ModelNotFound.MESSAGE, param="model")


class ResponseNotFound(GatewayError):
    """A stored response that is not there for this tenant: never stored, expired, or another
    tenant's (the same answer, so no tenant learns what another stored)."""

    status_code = 404
    type = "invalid_request_error"
    code = "response_not_found"

    def __init__(self, param: str | None = None, code: str | None = None) -> None:
        # The id is the caller's text; it is not echoed back.
        super().__init__("no stored response has this id for this tenant (it was never stored, has expired, "
                         "or is not this tenant's)", param=param, code=code)


class RateLimited(GatewayError):
    """A spent budget. The type is OpenAI's: the kind of budget, `requests` or `tokens`."""

    status_code = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after_s: float, *, code: str | None = None, kind: str = "requests",
                 headers: dict[str, str] | None = None) -> None:
        seconds = max(1, int(retry_after_s + 0.999))
        super().__init__(message, code=code, headers={**(headers or {}), "Retry-After": str(seconds)})
        self.type = kind
        self.retry_after_s = seconds


class NeverAdmissible(RateLimited):
    """A request larger than a whole budget: no wait lets it through, so the answer says not to
    retry (`x-should-retry: false`, which the openai SDKs obey) and has no Retry-After."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 0, kind="tokens")
        self.headers = {"x-should-retry": "false"}


class Unavailable(GatewayError):
    status_code = 503
    type = "service_unavailable"
    code = "service_unavailable"


AUDIT_RETRY_S = 5


class AuditUnavailable(Unavailable):
    """The audit trail cannot keep this request's record (a full disk, a full Redis queue): the
    request is refused, or its answer withheld, rather than served without its record."""

    code = "audit_unavailable"
    MESSAGE = "the audit trail cannot record requests at the moment, so this one is refused; retry shortly"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE, headers={"Retry-After": str(AUDIT_RETRY_S)})


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
