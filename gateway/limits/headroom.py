"""Quota headroom as the quota store last answered it, per tenant (the operator console shows it).

Each admission or budget refusal carries OpenAI's x-ratelimit-* figures: what is left of the
tighter of the tenant's and the calling principal's budgets. Kept here per tenant digest, they
are exactly what that tenant's last caller was told, from whichever limiter (in-process, or
Redis across replicas) answered.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gateway.limits.base import Admission


@dataclass(frozen=True)
class Headroom:
    time: float  # when the store answered (Unix seconds)
    admitted: bool  # False: the budget refused this request
    requests_per_minute: int  # the decision's limits
    tokens_per_minute: int
    concurrent_requests: int
    remaining_requests: int | None  # from the answer's x-ratelimit-remaining-*; None: it carried none
    remaining_tokens: int | None
    reset_requests: str | None
    reset_tokens: str | None


class QuotaHeadroom:
    def __init__(self) -> None:
        self._last: dict[str, Headroom] = {}  # by tenant digest; only registered tenants get this far
        self._lock = threading.Lock()

    def observe(self, admission: Admission, headers: dict[str, str], *, admitted: bool) -> None:
        def number(name: str) -> int | None:
            value = headers.get(name)
            return int(value) if value is not None and value.isdigit() else None

        headroom = Headroom(time.time(), admitted, admission.requests_per_minute, admission.tokens_per_minute,
                            admission.concurrent_requests, number("x-ratelimit-remaining-requests"),
                            number("x-ratelimit-remaining-tokens"), headers.get("x-ratelimit-reset-requests"),
                            headers.get("x-ratelimit-reset-tokens"))
        with self._lock:
            self._last[admission.tenant] = headroom

    def snapshot(self) -> dict[str, Headroom]:
        with self._lock:
            return dict(self._last)
