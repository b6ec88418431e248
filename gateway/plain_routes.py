"""The inference routes, dispatched without FastAPI's per-request machinery.

FastAPI's router, its dependency solver, its per-request exit stacks and exception layers cost
about 0.4 ms a request (issue 31's profile): more than the gateway's own work on a decision cache
hit. A route of the plain shape (a POST whose endpoint takes one JSON body model and one
dependency that needs only the Request) is dispatched here instead:

1. the body is decoded as FastAPI decodes it (JSON when the content type says so; an undecodable
   body is a 400 before anything else runs);
2. the dependency is awaited (authentication, and the tenant's held policy);
3. the body is validated against the endpoint's model, with FastAPI's error locations;
4. the endpoint is called, and any exception is answered by the app's own exception handlers.

A route of the request shape (an endpoint that takes only string path parameters and the Request,
with no dependencies: /mcp/{server}) is matched by its own path pattern and called with them.

The route stays declared in FastAPI: the OpenAPI document, the endpoint, its dependency and the
error handlers are the same objects; only the dispatch differs. Every other request, and every
request while the app has dependency overrides, goes on to FastAPI.
"""

from __future__ import annotations

import email.message
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send


@lru_cache(maxsize=64)
def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI would decode a body of this content type as JSON (its own test, kept per
    header value: a handful of distinct values in practice, 64 at most)."""
    if content_type is None:
        return False  # FastAPI's strict content type: no header, no JSON
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _missing_body() -> RequestValidationError:
    return RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])


@dataclass(frozen=True, slots=True)
class PlainRoute:
    """A route FastAPI declares and this module dispatches."""

    route: APIRoute
    body_name: str
    body_model: type[BaseModel]
    dependency_name: str
    dependency: Callable[[Request], Awaitable[Any]]

    @classmethod
    def of(cls, route: APIRoute) -> PlainRoute | None:
        """The plain form of a route, or None when its shape is anything else."""
        dependant = route.dependant
        if route.methods != {"POST"} or route.response_model is not None or len(dependant.dependencies) != 1:
            return None
        if dependant.path_params or dependant.query_params or dependant.header_params or dependant.cookie_params:
            return None
        if dependant.request_param_name or len(dependant.body_params) != 1:
            return None
        body, sub = dependant.body_params[0], dependant.dependencies[0]
        model = body.field_info.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or not body.field_info.is_required():
            return None
        if sub.dependencies or sub.body_params or sub.path_params or sub.query_params or sub.header_params:
            return None
        if sub.cookie_params or sub.request_param_name is None or sub.name is None or sub.call is None:
            return None
        if not inspect.iscoroutinefunction(sub.call) or not inspect.iscoroutinefunction(dependant.call):
            return None
        if len(inspect.signature(sub.call).parameters) != 1:
            return None
        return cls(route, body.name, model, sub.name, sub.call)

    async def respond(self, request: Request) -> Response:
        raw = await request.body()
        value: Any = raw
        if raw and _is_json(request.headers.get("content-type")):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise RequestValidationError([{"type": "json_invalid", "loc": ("body", exc.pos),
                                               "msg": "JSON decode error", "input": {},
                                               "ctx": {"error": exc.msg}}]) from None
        dependency = await self.dependency(request)
        if not raw:
            raise _missing_body()
        try:
            body = self.body_model.model_validate(value, from_attributes=True)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            for error in errors:
                error["loc"] = ("body", *error["loc"])
            raise RequestValidationError(errors) from None
        return await self.route.endpoint(**{self.body_name: body, self.dependency_name: dependency})


@dataclass(frozen=True, slots=True)
class RequestRoute:
    """A route FastAPI declares whose endpoint takes string path parameters and the Request only."""

    route: APIRoute
    request_name: str

    @classmethod
    def of(cls, route: APIRoute) -> RequestRoute | None:
        dependant = route.dependant
        if route.response_model is not None or dependant.dependencies or dependant.body_params:
            return None
        if dependant.query_params or dependant.header_params or dependant.cookie_params:
            return None
        if dependant.request_param_name is None or not inspect.iscoroutinefunction(dependant.call):
            return None
        if any(param.field_info.annotation is not str for param in dependant.path_params):
            return None  # FastAPI would convert and validate it
        if any(convertor.regex != "[^/]+" for convertor in route.param_convertors.values()):
            return None  # only plain {name} segments: the match is then the value, as Starlette's
        return cls(route, dependant.request_param_name)

    def match(self, scope: Scope) -> dict[str, str] | None:
        if scope["method"] not in self.route.methods:  # type: ignore[operator]  # an APIRoute's are a set
            return None
        match = self.route.path_regex.match(scope["path"])
        return match.groupdict() if match is not None else None

    async def respond(self, request: Request) -> Response:
        return await self.route.endpoint(**request.path_params, **{self.request_name: request})


class PlainRoutes:
    """Dispatches the plain routes of `routers` and the request routes of `request_routers` (see
    the module's docstring), which `fastapi_app` includes as they are (no prefix, no dependencies
    of its own); everything else goes on to `app`."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI, routers: list[APIRouter],
                 request_routers: tuple[APIRouter, ...] = ()) -> None:
        self.app = app
        self.fastapi_app = fastapi_app
        found = (PlainRoute.of(route) for router in routers for route in router.routes if isinstance(route, APIRoute))
        self.routes = {plain.route.path: plain for plain in found if plain is not None}
        requests = (RequestRoute.of(route) for router in request_routers for route in router.routes
                    if isinstance(route, APIRoute))
        self.request_routes = [route for route in requests if route is not None]

    def _find(self, scope: Scope) -> tuple[PlainRoute | RequestRoute, dict[str, str]] | None:
        if scope["type"] != "http":
            return None
        plain = self.routes.get(scope["path"]) if scope["method"] == "POST" else None
        if plain is not None:
            return plain, {}
        for route in self.request_routes:
            params = route.match(scope)
            if params is not None:
                return route, params
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._find(scope)
        if found is None or self.fastapi_app.dependency_overrides:
            await self.app(scope, receive, send)
            return
        plain, params = found
        scope["route"] = plain.route  # as FastAPI's router sets it: the span's http.route
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            response = await plain.respond(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise  # Starlette's error layer answers it, as it would for a FastAPI route
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Callable[[Request, Exception], Any] | None:
        """The app's handler for this exception, as Starlette looks it up (by class, nearest first);
        an unexpected one (Exception itself) is left to Starlette's error layer, which logs it."""
        handlers = self.fastapi_app.exception_handlers
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in handlers:
                return handlers[cls]
        return None
