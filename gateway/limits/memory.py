"""An in-process GCRA limiter: requests and tokens per minute, per tenant.

GCRA keeps one number per key, the theoretical arrival time (TAT): each admitted unit
pushes it forward by 60 s / limit, and a request is admitted while the TAT stays within
a minute of now, so a tenant may spend its whole minute's budget at once and then
refills smoothly. Tokens are reserved at admission (prompt plus max_tokens) and the
unused part is returned when the request ends. One process only; Redis holds the same
state across replicas.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gateway.errors import RateLimited

WINDOW_S = 60.0


@dataclass
class Reservation:
    key: str
    tokens: int
    token_interval_s: float
    settled: bool = False


class InProcessLimiter:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._tat: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def admit(self, key: str, *, requests_per_minute: int, tokens_per_minute: int, tokens: int) -> Reservation:
        """Admits one request costing `tokens`, or raises RateLimited with a Retry-After."""
        if requests_per_minute <= 0 or tokens_per_minute <= 0:
            raise RateLimited("this tenant's policy allows no requests at present", WINDOW_S)
        if tokens > tokens_per_minute:
            raise RateLimited(
                f"the request reserves {tokens} tokens (prompt plus max_tokens), more than the "
                f"tenant's {tokens_per_minute} tokens per minute; lower max_tokens", WINDOW_S)
        request_interval = WINDOW_S / requests_per_minute
        token_interval = WINDOW_S / tokens_per_minute
        now = self._clock()
        with self._lock:
            request_tat = max(self._tat.get((key, "r"), now), now) + request_interval
            token_tat = max(self._tat.get((key, "t"), now), now) + tokens * token_interval
            wait = max(request_tat - now - WINDOW_S, token_tat - now - WINDOW_S)
            if wait > 0:
                which = "requests" if request_tat - now - WINDOW_S >= wait else "tokens"
                raise RateLimited(f"the tenant's {which}-per-minute limit is reached", wait)
            self._tat[(key, "r")] = request_tat
            self._tat[(key, "t")] = token_tat
        return Reservation(key, tokens, token_interval)

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        """Returns the unused part of a reservation (once)."""
        if reservation.settled:
            return
        reservation.settled = True
        unused = max(0, reservation.tokens - used_tokens)
        if not unused:
            return
        with self._lock:
            slot = (reservation.key, "t")
            if slot in self._tat:
                self._tat[slot] -= unused * reservation.token_interval_s
