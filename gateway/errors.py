"""Errors the gateway returns, in OpenAI's shape, and the handlers that map exceptions to them.

Every message is written here or chosen from a fixed set; no handler echoes str(exc) of
a foreign exception, a token, or request content.
"""

from __future__ import annotations

import logging
import traceback

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("tenantgate.gateway")


class GatewayError(Exception):
    status_code = 500
    type = "server_error"
    code = "internal_error"  # every error carries a code (docs/api.md lists them)

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


def error_response(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _field_path(loc: tuple) -> str | None:
    """A body location as OpenAI names params ("messages.0.content"), without pydantic's union tags."""
    parts = []
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            parts.append(str(part))
        elif isinstance(part, str) and part.isidentifier() and part not in _TYPE_TAGS:
            parts.append(part)
        else:
            break  # a union member's tag ("list[str]", "function-after[...]"): the field ends here
    return ".".join(parts) or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "the request body is invalid", None
    if any(e.get("type") == "json_invalid" for e in errors):
        return "the request body is not valid JSON", None
    # Of a union's errors, the type mismatches of the other members say least.
    first = next((e for e in errors if not str(e.get("type", "")).endswith("_type")), errors[0])
    param = _field_path(tuple(first.get("loc", ())))
    # pydantic's msg describes the rule ("Input should be a valid integer"), never the input.
    message = "unknown field" if first.get("type") == "extra_forbidden" else str(first.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ")  # a validator's own words, without pydantic's tag
    return (f"{param}: {message}" if param else message), param


def _validation_code(exc: RequestValidationError) -> str:
    """OpenAI's code for the first problem in a body that fails validation."""
    kinds = [str(e.get("type", "")) for e in exc.errors()]
    if not kinds or "json_invalid" in kinds:
        return "invalid_json"
    first = next((k for k in kinds if not k.endswith("_type")), kinds[0])
    if first == "extra_forbidden":
        return "unknown_parameter"
    if first == "missing":
        return "missing_required_parameter"
    return "invalid_type" if first.endswith("_type") else "invalid_value"


def _answer(request: Request, error: GatewayError) -> JSONResponse:
    request.state.error_type = error.code  # the request span's error.type (gateway/tracing.py)
    return error_response(error)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return _answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return _answer(request, InvalidRequest(message, param=param, code=_validation_code(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        messages = {404: ("no such route", "route_not_found"), 405: ("method not allowed", "method_not_allowed")}
        message, code = messages.get(exc.status_code, ("request failed", "request_failed"))
        error = GatewayError(message, code=code, headers=dict(exc.headers or {}))
        error.status_code = exc.status_code
        error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _answer(request, error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The server log gets the frames but not the exception's message, which may quote
        # request content; the caller gets a fixed text.
        frames = "".join(traceback.format_tb(exc.__traceback__))
        logger.error("unhandled %s on %s\n%s", type(exc).__name__, request.url.path, frames)
        return error_response(GatewayError("internal error"))
