"""The read-only operator console on the operator listener: server-rendered pages, no script.

GET /console (every view) and /console/<view> need a console session; without one the answer
is 401 with the login page. POST /console/login takes a pasted Entra access token with the
TenantGate.Operator app role (in development: `tenantgate token --tenant T --role
TenantGate.Operator`) and answers with the session cookie; POST /console/logout ends it.
GET /admin/console serves the same views as JSON to a bearer token, like /admin/usage.

CSRF: every page is a GET that changes nothing; the cookie is SameSite=Strict, so no other
site's page can send it; the two POSTs refuse a request that a browser says came from
another origin. Pages forbid framing and script (Content-Security-Policy).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from gateway.audit import digest_label
from gateway.auth.principal import Principal
from gateway.console.sessions import Sessions
from gateway.console.views import VIEWS, console_views
from gateway.errors import GatewayError, InvalidRequest
from gateway.operator import (
    OPERATOR_ROLE,
    OperatorDep,
    audit_operator,
    operator_for,
    operator_refusal,
    verified_on_gateway_loop,
)

COOKIE = "tenantgate_console"
PATH = "/console"
HERE = Path(__file__).parent
TITLES = {"tenants": "Tenants and decisions", "quotas": "Quota headroom", "kv": "KV cache by tenant",
          "prefix": "Prefix hits by scope", "regimes": "Regime timeline", "audit": "Audit chain",
          "policy": "Policy revision"}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}

_templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                         trim_blocks=True, lstrip_blocks=True)
pages = APIRouter(prefix=PATH)
api = APIRouter(prefix="/admin")


class ConsoleRefused(Exception):
    """A page the caller may not see: rendered as the login page (401) or an error page."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def _page(name: str, status_code: int = 200, **context) -> HTMLResponse:
    html = _templates.get_template(name).render(views=VIEWS, titles=TITLES, path=PATH, role=OPERATOR_ROLE, **context)
    headers = dict(PAGE_HEADERS)
    if status_code == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="tenantgate"'
    return HTMLResponse(html, status_code=status_code, headers=headers)


def _refused(request: Request, exc: ConsoleRefused) -> HTMLResponse:
    if exc.status_code == 401:
        return _page("login.html", 401, message=exc.message)
    return _page("refused.html", exc.status_code, message=exc.message)


async def _session_operator(request: Request) -> Principal:
    """The signed-in operator: the session's token, checked again (it may have expired since)."""
    sessions: Sessions = request.app.state.console_sessions
    token = sessions.token(request.cookies.get(COOKIE))
    if token is None:
        raise ConsoleRefused(401, "Sign in with an operator token.")
    try:
        return await operator_for(request, token, "admin.console.session")
    except GatewayError as exc:
        if exc.status_code == 401:
            sessions.close(request.cookies.get(COOKIE))
            raise ConsoleRefused(401, "The session's token is no longer accepted: sign in again.") from None
        raise ConsoleRefused(exc.status_code, exc.message) from None


def _from_this_origin(request: Request) -> bool:
    """False when the browser says another site sent this request (Sec-Fetch-Site, Origin)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.headers.get('host', '')}"


async def _form_token(request: Request) -> str | None:
    limit = request.app.state.gateway.settings.max_token_bytes + 1024
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    try:
        token = parse_qs(body.decode("ascii"), max_num_fields=4).get("token", [""])[0].strip()
    except (UnicodeDecodeError, ValueError):
        return None
    return token or None


@pages.get("/console.css", include_in_schema=False)
def stylesheet() -> Response:
    return Response((HERE / "templates" / "console.css").read_text(), media_type="text/css",
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


@pages.get("/login")
def login_page() -> HTMLResponse:
    return _page("login.html", message=None)


@pages.post("/login")
async def login(request: Request) -> Response:
    if not _from_this_origin(request):
        raise ConsoleRefused(403, "A sign-in from another site is refused.")
    token = await _form_token(request)
    if token is None:
        raise ConsoleRefused(401, "Paste an access token.")
    gateway = request.app.state.gateway
    try:
        principal = await verified_on_gateway_loop(request, token)
    except GatewayError as exc:
        if exc.status_code == 401:
            raise ConsoleRefused(401, "That token was refused: it is invalid, expired or not for this gateway."
                                 ) from None
        raise ConsoleRefused(exc.status_code, exc.message) from None
    refusal = operator_refusal(gateway, principal)
    if refusal is not None:
        audit_operator(gateway, principal, "admin.console.login", 403, refusal.code)
        if refusal.code == "operator_role_required":
            raise ConsoleRefused(403, f"That token is valid but lacks the {OPERATOR_ROLE} app role.")
        raise ConsoleRefused(403, "That token is valid but not from the platform's own tenant: operators "
                             "come only from there.")
    session_id = request.app.state.console_sessions.open(token)
    audit_operator(gateway, principal, "admin.console.login", 200, "completed")
    response = RedirectResponse(PATH, status_code=303, headers={"Cache-Control": "no-store"})
    response.set_cookie(COOKIE, session_id, max_age=int(gateway.settings.console_session_ttl_s), path=PATH,
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@pages.post("/logout")
async def logout(request: Request) -> Response:
    if not _from_this_origin(request):
        raise ConsoleRefused(403, "A sign-out from another site is refused.")
    request.app.state.console_sessions.close(request.cookies.get(COOKIE))
    response = RedirectResponse(PATH + "/login", status_code=303, headers={"Cache-Control": "no-store"})
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@pages.get("")
async def overview(request: Request) -> HTMLResponse:
    operator = await _session_operator(request)
    data = await console_views(request.app.state.gateway)
    return _page("console.html", shown=VIEWS, current="overview", data=data, operator=_who(request, operator))


@pages.get("/{view}")
async def one_view(request: Request, view: str) -> HTMLResponse:
    operator = await _session_operator(request)
    if view not in VIEWS:
        raise ConsoleRefused(404, "There is no such view.")
    data = await console_views(request.app.state.gateway, (view,))
    return _page("console.html", shown=(view,), current=view, data=data, operator=_who(request, operator))


def _who(request: Request, operator: Principal) -> str:
    return digest_label(request.app.state.gateway.audit.principal_digests(operator)["principal"])


@api.get("/console")
async def console_json(request: Request, operator: OperatorDep, view: str | None = None) -> JSONResponse:
    gateway = request.app.state.gateway
    if view is not None and view not in VIEWS:
        raise InvalidRequest(f"view must be one of {', '.join(VIEWS)}", param="view")
    data = await console_views(gateway, (view,) if view else VIEWS)
    audit_operator(gateway, operator, "admin.console", 200, "completed")
    return JSONResponse(data)


def install_console(app: FastAPI) -> None:
    app.state.console_sessions = Sessions(app.state.gateway.settings.console_session_ttl_s)
    app.add_exception_handler(ConsoleRefused, _refused)  # type: ignore[arg-type]  # Starlette types it by Exception
    app.include_router(pages)
    app.include_router(api)
