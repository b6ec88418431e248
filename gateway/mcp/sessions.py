"""Sessions of the handshake revisions (2025-06-18, 2025-11-25): each bound to the principal that
opened it and to one server. An id is 256 random bits; a session is found only by its id, its
principal and its server together, so another principal's id (guessed, leaked or replayed) is the
same 404 as an id that never existed. Bounded: sessions per principal and in all, each ending
after an idle timeout (the oldest of a principal's goes first when it opens one too many).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

MAX_SESSIONS = 10_000
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
    def __init__(self, *, max_sessions: int = MAX_SESSIONS, per_principal: int = MAX_SESSIONS_PER_PRINCIPAL,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, clock=time.monotonic) -> None:
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._max, self._per_principal, self._idle_s, self._clock = max_sessions, per_principal, idle_timeout_s, clock

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, owner: tuple[str, str], server: str, protocol_version: str) -> Session:
        now = self._clock()
        self._expire(now)
        mine = [s for s in self._sessions.values() if s.owner == owner]
        if len(mine) >= self._per_principal:
            del self._sessions[mine[0].id]  # the principal's least recently used
        if len(self._sessions) >= self._max:
            raise SessionFull()
        session = Session(secrets.token_urlsafe(32), owner, server, protocol_version, now)
        self._sessions[session.id] = session
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
        return session

    def close(self, session_id: str, owner: tuple[str, str], server: str) -> bool:
        session = self.find(session_id, owner, server)
        if session is None:
            return False
        del self._sessions[session.id]
        return True

    def _expire(self, now: float) -> None:
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.last_used <= self._idle_s:
                return
            del self._sessions[oldest.id]
