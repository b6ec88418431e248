"""The audit record the gateway writes for every judged request.

It holds what an auditor needs to say who asked for what under which policy and what
ran: digests of the principal and tenant (keyed, so they cannot be reversed by
guessing), the policy revision and decision summary, the model fingerprint, usage,
latency and outcome. No prompt, completion, token or `user` text, whatever the policy.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time

logger = logging.getLogger("tenantgate.audit")


class AuditLog:
    def __init__(self, key: bytes, *, enabled: bool = True) -> None:
        self._key = key
        self.enabled = enabled

    def digest(self, value: str) -> str:
        return hmac.new(self._key, b"audit:" + value.encode(), hashlib.sha256).hexdigest()[:32]

    def record(self, **fields: object) -> dict:
        record = {"time": round(time.time(), 3), **fields}
        if self.enabled:
            logger.info(json.dumps(record, separators=(",", ":"), sort_keys=True, default=str))
        return record
