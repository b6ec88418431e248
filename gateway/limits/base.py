"""What both limiters share: the admission they judge, the ticket they hand back, the errors.

Budgets are GCRA per key (requests and tokens per minute, for the tenant and for the
principal within it) plus a count of the tenant's requests in flight. Tokens are
reserved at admission (prompt plus max_tokens) and the unused part is returned when the
request ends. A limit of 0 admits nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.errors import NeverAdmissible, RateLimited

WINDOW_S = 60.0  # the budgets are per minute, and a whole minute's budget may be spent at once


@dataclass(frozen=True, slots=True)
class Admission:
    tenant: str  # a digest, never the raw tenant id (it becomes part of store keys)
    principal: str  # a digest of (tenant id, object id)
    request_id: str
    tokens: int  # reserved: prompt plus max_tokens
    requests_per_minute: int
    tokens_per_minute: int
    principal_requests_per_minute: int
    principal_tokens_per_minute: int
    concurrent_requests: int
    embeds: bool = False  # an embeddings call reserves its input alone: there is no max_tokens


@dataclass(slots=True, weakref_slot=True)  # the Redis limiter renews only tickets still held
class Ticket:
    admission: Admission
    accounted: bool = True  # False when admitted fail-open without the store
    settled: bool = False
    extra: dict = field(default_factory=dict)
    # x-ratelimit-*, after this admission: made when first asked for (an MCP call never asks)
    headers_from: Callable[[], dict[str, str]] | None = None
    _headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str]:
        if self._headers is None:
            self._headers = self.headers_from() if self.headers_from is not None else {}
        return self._headers


class QuotaStoreUnavailable(Exception):
    """The quota store did not answer in time; the caller decides between fail-closed and fail-open."""


class Limiter(Protocol):
    async def admit(self, admission: Admission) -> Ticket: ...
    async def settle(self, ticket: Ticket, used_tokens: int) -> None: ...
    # Settles now, without waiting on anything, and says True; False when settling needs the store
    # (then `settle` does it). Spares the request path a task where nothing has to be awaited.
    def settle_at_once(self, ticket: Ticket, used_tokens: int) -> bool: ...
    def ready(self) -> bool: ...
    async def ping(self) -> bool | None: ...  # the quota store answers; None: there is no store to ask
    async def aclose(self) -> None: ...


def check_admissible(admission: Admission) -> None:
    """Refusals that need no state: a zero limit, or a reservation no budget can ever hold."""
    a = admission
    limits = (a.requests_per_minute, a.tokens_per_minute, a.principal_requests_per_minute,
              a.principal_tokens_per_minute, a.concurrent_requests)
    if min(limits) <= 0:
        raise RateLimited("this tenant's policy allows no requests at present", WINDOW_S)
    budget = min(a.tokens_per_minute, a.principal_tokens_per_minute)
    if a.tokens > budget:
        reserved, change = (("its input", "send less input per request (fewer or shorter texts)") if a.embeds
                            else ("prompt plus max_tokens", "lower max_tokens or shorten the prompt"))
        raise NeverAdmissible(
            f"the request reserves {a.tokens} tokens ({reserved}), more than the {budget} tokens per minute "
            f"this caller may use, so it can never be admitted, however long it waits; {change}")


def rate_limit_headers(a: Admission, now_s: float, tats_s: Sequence[float]) -> dict[str, str]:
    """OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} from the four GCRA budgets'
    theoretical arrival times (tenant r, tenant t, principal r, principal t; seconds on the
    store's clock). Of the tenant's and the caller's budget of a kind, the one with less left.
    Remaining: what could still be admitted now; reset: until the budget is whole again."""
    headers = {}
    kinds = {"requests": ((a.requests_per_minute, tats_s[0]), (a.principal_requests_per_minute, tats_s[2])),
             "tokens": ((a.tokens_per_minute, tats_s[1]), (a.principal_tokens_per_minute, tats_s[3]))}
    for kind, budgets in kinds.items():
        states = []
        for limit, tat in budgets:
            spent_s = min(WINDOW_S, max(0.0, tat - now_s))
            states.append((int(limit * (WINDOW_S - spent_s) / WINDOW_S + 1e-9), -spent_s, limit))
        remaining, spent_s, limit = min(states)
        headers[f"x-ratelimit-limit-{kind}"] = str(limit)
        headers[f"x-ratelimit-remaining-{kind}"] = str(remaining)
        headers[f"x-ratelimit-reset-{kind}"] = duration(-spent_s)
    return headers


def duration(seconds: float) -> str:
    """A duration as OpenAI's headers write it (Go's format): "20ms", "1s", "1.5s", "6m0s"."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    minutes, ms = divmod(ms, 60_000)
    text = f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{minutes}m{text}" if minutes else text


# Which budget refused, by the index the limiters report, and its kind (OpenAI's error type).
KINDS = ("requests", "tokens", "requests", "tokens", "requests")
REFUSED = (
    "the tenant's requests-per-minute limit is reached",
    "the tenant's tokens-per-minute limit is reached",
    "the caller's requests-per-minute limit is reached",
    "the caller's tokens-per-minute limit is reached",
    "the tenant's limit of concurrent requests is reached",
)
