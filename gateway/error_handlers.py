"""The HTTP side of the gateway's errors: each GatewayError, invalid body and unmatched route
answered in OpenAI's error shape, and nothing unexpected answered with its message."""

from __future__ import annotations

import logging
import traceback

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.errors import GatewayError, InvalidRequest

logger = logging.getLogger("tenantgate.gateway")


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
