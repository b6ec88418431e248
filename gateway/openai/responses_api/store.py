"""Stored responses: per tenant in Redis, encrypted with AES-GCM, kept for the policy's retention.

A record is bound to its tenant and id (they are the cipher's associated data), so a value
copied under another tenant's key does not decrypt. Key names carry the tenant's keyed digest
and a digest of the id, never either in clear; values hold no plaintext.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import cast

import redis.asyncio as aioredis
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from redis.exceptions import RedisError

from gateway.errors import Unavailable

logger = logging.getLogger("tenantgate.gateway")

RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")
_NONCE_BYTES = 12


class ResponseStore:
    def __init__(self, client: aioredis.Redis, key: bytes, *, prefix: str = "tenantgate:responses:") -> None:
        self._client = client
        self._cipher = AESGCM(key)
        self._prefix = prefix

    def _name(self, tenant_digest: str, response_id: str) -> str:
        return f"{self._prefix}{tenant_digest}:{hashlib.sha256(response_id.encode()).hexdigest()[:32]}"

    async def put(self, tenant_digest: str, response_id: str, record: dict, ttl_s: int) -> None:
        """Stores `record` for `ttl_s` seconds; `tenant_digest` is the tenant's keyed digest."""
        nonce = os.urandom(_NONCE_BYTES)
        bound = f"{tenant_digest}\0{response_id}".encode()  # the cipher's associated data
        sealed = nonce + self._cipher.encrypt(nonce, json.dumps(record).encode(), bound)
        try:
            await self._client.set(self._name(tenant_digest, response_id), sealed, ex=ttl_s)
        except (RedisError, OSError) as exc:
            logger.error("the response store is unreachable: %s", type(exc).__name__)
            raise Unavailable("the response could not be stored: the response store is unreachable; retry shortly",
                              headers={"Retry-After": "2"}) from None

    async def delete(self, tenant_digest: str, response_id: str) -> None:
        """Removes what put() stored (a response whose request was then refused for want of its
        audit record must not stay retrievable); an unreachable store is logged, not raised."""
        try:
            await self._client.delete(self._name(tenant_digest, response_id))
        except (RedisError, OSError) as exc:
            logger.error("a stored response of a refused request could not be removed: %s", type(exc).__name__)

    async def get(self, tenant_digest: str, response_id: str) -> dict | None:
        """The record stored for this tenant under this id, or None (none, expired, or not this tenant's)."""
        if RESPONSE_ID.fullmatch(response_id) is None:
            return None
        try:
            # The client does not decode responses: a value is bytes.
            sealed = cast("bytes | None", await self._client.get(self._name(tenant_digest, response_id)))
        except (RedisError, OSError) as exc:
            logger.error("the response store is unreachable: %s", type(exc).__name__)
            raise Unavailable("the response store is unreachable; retry shortly",
                              headers={"Retry-After": "2"}) from None
        if sealed is None:
            return None
        try:
            bound = f"{tenant_digest}\0{response_id}".encode()
            plain = self._cipher.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], bound)
        except InvalidTag:
            logger.error("a stored response failed its integrity check (wrong key, or moved); it is ignored")
            return None
        return json.loads(plain)

    async def aclose(self) -> None:
        await self._client.aclose()
