"""Console sessions. A browser cannot send a bearer header by itself, so an operator pastes a
token once; the console keeps it here and gives the browser only a random session id (an
HttpOnly, SameSite=Strict cookie). Every page checks the kept token again with the gateway's
verifier, so a session ends when its token expires or stops being accepted, and at the latest
after the TTL. Sessions live in this process: each replica has its own, and a restart ends them.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict

MAX_SESSIONS = 256  # beyond it, the oldest session ends


def _key(session_id: str) -> bytes:
    # Looked up by digest: what this table holds cannot be replayed as a cookie.
    return hashlib.sha256(session_id.encode()).digest()


class Sessions:
    def __init__(self, ttl_s: float, clock=time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._tokens: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, token: str) -> str:
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[_key(session_id)] = (token, self._clock() + self._ttl_s)
            while len(self._tokens) > MAX_SESSIONS:
                self._tokens.popitem(last=False)
        return session_id

    def token(self, session_id: str | None) -> str | None:
        """The session's token, or None for no session, an unknown one or one past its TTL."""
        if not session_id:
            return None
        key = _key(session_id)
        with self._lock:
            token, expires = self._tokens.get(key, (None, 0.0))
            if token is not None and self._clock() >= expires:
                del self._tokens[key]
                return None
            return token

    def close(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._tokens.pop(_key(session_id), None)
