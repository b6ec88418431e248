"""Sessions of the handshake revisions (2025-06-18, 2025-11-25): each bound to the principal that
opened it and to one server. An id is 256 random bits; a session is found only by its id, its
principal and its server together, so another principal's id (guessed, leaked or replayed) is the
same 404 as an id that never existed.

Bounded, and so that no tenant can spend another's: a principal keeps at most
MAX_SESSIONS_PER_PRINCIPAL and a tenant MAX_SESSIONS_PER_TENANT (opening one more ends its own
least recently used); each ends after IDLE_TIMEOUT_S without use; all tenants together hold at
most MAX_SESSIONS, which takes more tenants at their bound than are registered in practice. Every
operation costs the same whatever the number of sessions.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

MAX_SESSIONS = 100_000
MAX_SESSIONS_PER_TENANT = 1_000
MAX_SESSIONS_PER_PRINCIPAL = 16
IDLE_TIMEOUT_S = 3600.0
MAX_SESSION_ID_CHARS = 128


@dataclass(slots=True)
class Session:
    id: str
    owner: tuple[str, str]  # (tenant id, object id)
    server: str
    protocol_version: str
    last_used: float


class SessionFull(Exception):
    """Every session slot is taken by sessions still in use."""


class Sessions:
    def __init__(self, *, max_sessions: int = MAX_SESSIONS, per_tenant: int = MAX_SESSIONS_PER_TENANT,
                 per_principal: int = MAX_SESSIONS_PER_PRINCIPAL, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 clock=time.monotonic) -> None:
        # Each least recently used first: all, and per tenant and per principal.
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        self._by_owner: dict[tuple[str, str], OrderedDict[str, None]] = {}
        self._max, self._per_tenant, self._per_principal = max_sessions, per_tenant, per_principal
        self._idle_s, self._clock = idle_timeout_s, clock

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, owner: tuple[str, str], server: str, protocol_version: str) -> Session:
        now = self._clock()
        self._expire(now)
        mine = self._by_owner.get(owner)
        if mine is not None and len(mine) >= self._per_principal:
            self._remove(next(iter(mine)))
        tenants = self._by_tenant.get(owner[0])
        if tenants is not None and len(tenants) >= self._per_tenant:
            self._remove(next(iter(tenants)))
        if len(self._sessions) >= self._max:
            raise SessionFull()
        session = Session(secrets.token_urlsafe(32), owner, server, protocol_version, now)
        self._sessions[session.id] = session
        self._by_tenant.setdefault(owner[0], OrderedDict())[session.id] = None
        self._by_owner.setdefault(owner, OrderedDict())[session.id] = None
        return session

    def find(self, session_id: str, owner: tuple[str, str], server: str) -> Session | None:
        if len(session_id) > MAX_SESSION_ID_CHARS:
            return None
        now = self._clock()
        session = self._sessions.get(session_id)
        if session is None or now - session.last_used > self._idle_s:
            return None
        # Compared in constant time: the owner check must not tell how much of an id matched.
        if not (secrets.compare_digest(session.owner[0], owner[0]) & secrets.compare_digest(session.owner[1], owner[1])
                & (session.server == server)):
            return None
        session.last_used = now
        self._sessions.move_to_end(session_id)
        self._by_tenant[owner[0]].move_to_end(session_id)
        self._by_owner[owner].move_to_end(session_id)
        return session

    def close(self, session_id: str, owner: tuple[str, str], server: str) -> bool:
        session = self.find(session_id, owner, server)
        if session is None:
            return False
        self._remove(session.id)
        return True

    def _remove(self, session_id: str) -> None:
        session = self._sessions.pop(session_id)
        tenants, mine = self._by_tenant[session.owner[0]], self._by_owner[session.owner]
        del tenants[session_id], mine[session_id]
        if not tenants:
            del self._by_tenant[session.owner[0]]
        if not mine:
            del self._by_owner[session.owner]

    def _expire(self, now: float) -> None:
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.last_used <= self._idle_s:
                return
            self._remove(oldest.id)
