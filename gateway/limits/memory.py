"""The in-process limiter (the embedded default): GCRA budgets and a concurrency count in
this process's memory, with the same semantics as the Redis limiter. One replica only."""

from __future__ import annotations

import threading
import time
from functools import partial

from gateway.errors import RateLimited
from gateway.limits.base import KINDS, REFUSED, WINDOW_S, Admission, Ticket, check_admissible, rate_limit_headers


class InProcessLimiter:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._tat: dict[str, float] = {}  # theoretical arrival time per budget key
        self._in_flight: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def _budgets(self, a: Admission) -> list[tuple[str, float]]:
        """(key, seconds the request pushes that budget's TAT forward), in REFUSED order."""
        return [
            (f"{a.tenant}:r", WINDOW_S / a.requests_per_minute),
            (f"{a.tenant}:t", a.tokens * WINDOW_S / a.tokens_per_minute),
            (f"{a.tenant}:{a.principal}:r", WINDOW_S / a.principal_requests_per_minute),
            (f"{a.tenant}:{a.principal}:t", a.tokens * WINDOW_S / a.principal_tokens_per_minute),
        ]

    async def admit(self, admission: Admission) -> Ticket:
        check_admissible(admission)
        now = self._clock()
        budgets = self._budgets(admission)
        with self._lock:
            tats = [max(self._tat.get(key, now), now) for key, _ in budgets]
            new_tats = [tat + cost for tat, (_, cost) in zip(tats, budgets)]
            waits = [tat - now - WINDOW_S for tat in new_tats]
            worst = max(range(len(waits)), key=waits.__getitem__)
            if waits[worst] > 0:
                raise RateLimited(REFUSED[worst], waits[worst], kind=KINDS[worst],
                                  headers=rate_limit_headers(admission, now, tats))
            in_flight = self._in_flight.setdefault(admission.tenant, set())
            if len(in_flight) >= admission.concurrent_requests:
                raise RateLimited(REFUSED[4], 1.0, headers=rate_limit_headers(admission, now, tats))
            in_flight.add(admission.request_id)
            for (key, _), tat in zip(budgets, new_tats):
                self._tat[key] = tat
        return Ticket(admission, headers_from=partial(rate_limit_headers, admission, now, new_tats))

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        self.settle_at_once(ticket, used_tokens)

    def settle_at_once(self, ticket: Ticket, used_tokens: int) -> bool:
        if ticket.settled or not ticket.accounted:
            return True
        ticket.settled = True
        a = ticket.admission
        unused = max(0, a.tokens - used_tokens)
        with self._lock:
            self._in_flight.get(a.tenant, set()).discard(a.request_id)
            for key, limit in ((f"{a.tenant}:t", a.tokens_per_minute),
                               (f"{a.tenant}:{a.principal}:t", a.principal_tokens_per_minute)):
                if unused and key in self._tat:
                    self._tat[key] -= unused * WINDOW_S / limit
        return True

    def ready(self) -> bool:
        return True

    async def ping(self) -> None:
        return None  # no quota store: nothing to ask

    async def aclose(self) -> None:
        pass
