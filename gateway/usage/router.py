"""GET /admin/usage on the operator listener: the figures of `tenantgate usage report`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from gateway.audit import trail_files
from gateway.errors import GatewayError, InvalidRequest, Unavailable
from gateway.operator import OperatorDep, audit_operator
from gateway.usage.report import TrailRejected, UsageError, load_prices, parse_time, read_usage, to_csv

router = APIRouter(prefix="/admin")


class TrailFailed(GatewayError):
    status_code = 409
    type = "audit_error"
    code = "audit_verification_failed"


@router.get("/usage")
async def usage(request: Request, operator: OperatorDep, start: Annotated[str, Query(alias="from")],
                end: Annotated[str, Query(alias="to")], format: Literal["json", "csv"] = "json") -> Response:
    """Every answer past authentication leaves an audit record: who read the figures, and how it went."""
    gateway = request.app.state.gateway
    try:
        response = await _usage(gateway, start, end, format)
    except GatewayError as exc:
        audit_operator(gateway, operator, "admin.usage", exc.status_code, exc.code or exc.type)
        raise
    audit_operator(gateway, operator, "admin.usage", 200, "completed")
    return response


async def _usage(gateway, start: str, end: str, format: str) -> Response:
    settings = gateway.settings
    trail = gateway.audit.trail
    if settings.audit_file is None or trail is None:
        raise Unavailable("usage is read from the audit file: set TENANTGATE_AUDIT_FILE")
    try:
        since, until = parse_time(start, "from"), parse_time(end, "to")
    except UsageError as exc:
        raise InvalidRequest(str(exc), code="invalid_request") from None
    if not since < until:
        raise InvalidRequest("the range is empty: from must be before to", code="invalid_request")
    try:
        prices = load_prices(settings.usage_prices_file) if settings.usage_prices_file is not None else None
        report = await asyncio.to_thread(read_usage, trail_files(settings.audit_file), [trail.public_key],
                                         since, until)
    except TrailRejected as exc:
        raise TrailFailed(str(exc)) from None
    except UsageError as exc:  # the operator's files (prices, the trail), not the caller's request
        raise Unavailable(str(exc)) from None
    document = report.document(prices)
    if format == "csv":
        return Response(to_csv(document), media_type="text/csv")
    return JSONResponse(document)
