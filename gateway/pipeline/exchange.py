"""One call's HTTP side, as values: what the pipeline reads of the request and what it sets for
the response. The HTTP edge builds it (gateway/deps.py); the middleware sends what it holds
(gateway/middleware.py: headers on whichever response the call ends with, and metric labels)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.tracing import OFF, RequestTrace

DECISION_ID_HEADER = "x-tenantgate-decision-id"
MAX_TOKENS_CLAMPED_HEADER = "x-tenantgate-max-tokens-clamped"


async def _never() -> None:
    """A caller that never leaves (a call with no connection behind it)."""
    await asyncio.Event().wait()


@dataclass
class Exchange:
    data_classification: str | None = None  # the caller's x-data-classification header, if sent
    trace: RequestTrace = OFF  # the call's spans (OFF when tracing is off)
    # Returns once the caller has disconnected; the pipeline abandons work it was waiting for then.
    disconnected: Callable[[], Awaitable[None]] = _never
    # Set by the pipeline, for the response:
    request_id: str | None = None  # the response's x-request-id (the audit record's request_id)
    response_headers: dict[str, str] = field(default_factory=dict)  # on the response, success or error
    decision: str = "none"  # the request metric's decision label: allow, deny or error
    tenant_label: str = "none"  # the request metric's tenant label: a digest, or the name a policy allows

    def add_headers(self, headers: dict[str, str]) -> None:
        self.response_headers.update(headers)
