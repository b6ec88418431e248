"""Entra ID signing keys per (tenant, token version): OpenID discovery, then the JWKS.

Key sets are cached for a TTL and refreshed in the background before they expire. A
fetch that fails keeps the last good keys. Concurrent requests for one tenant share a
single in-flight fetch, and an unknown `kid` forces a refetch at most once per window
per tenant, so a flood of forged kids costs at most one fetch per window.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey, RSAPublicNumbers

from gateway.auth.exceptions import AuthError, AuthUnavailableError

log = logging.getLogger("tenantgate.auth")

MAX_DISCOVERY_BYTES = 64 * 1024
MAX_JWKS_BYTES = 256 * 1024
MAX_KEYS = 64
MIN_RSA_BITS, MAX_RSA_BITS = 2048, 8192
REFRESH_AHEAD = 0.25  # background refresh once 75% of the TTL has passed
_B64URL = re.compile(rb"[A-Za-z0-9_-]*")


def b64url_decode(segment: bytes | str) -> bytes:
    """Strict unpadded base64url: any character outside the alphabet is an error, not skipped."""
    if isinstance(segment, str):
        segment = segment.encode("ascii")
    if not _B64URL.fullmatch(segment) or len(segment) % 4 == 1:
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(segment + b"=" * (-len(segment) % 4))
    except binascii.Error:
        raise ValueError("not base64url") from None


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str
    public_key: RSAPublicKey
    issuer: str | None  # the JWK's "issuer" member, possibly a {tenantid} template


@dataclass(frozen=True, slots=True)
class KeySet:
    issuer: str  # the discovery document's issuer, possibly a {tenantid} template
    keys: dict[str, SigningKey]


@dataclass
class _Entry:
    key_set: KeySet | None = None
    fetched_at: float = -math.inf
    expires_at: float = 0.0  # the request path refetches after this
    refresh_after: float = 0.0  # the background task refetches after this
    attempted: bool = False
    inflight: asyncio.Task | None = field(default=None, repr=False)


class _FetchError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_jwk(jwk: object) -> SigningKey | None:
    """An RS256 signing key from one JWK, or None when the JWK is not one we may use."""
    if not isinstance(jwk, dict) or jwk.get("kty") != "RSA" or jwk.get("use", "sig") != "sig":
        return None
    kid, issuer, n, e = jwk.get("kid"), jwk.get("issuer"), jwk.get("n"), jwk.get("e")
    if jwk.get("alg", "RS256") != "RS256" or not isinstance(kid, str) or not 0 < len(kid) <= 256:
        return None
    if not (issuer is None or isinstance(issuer, str)) or not isinstance(n, str) or not isinstance(e, str):
        return None
    try:
        modulus = int.from_bytes(b64url_decode(n), "big")
        exponent = int.from_bytes(b64url_decode(e), "big")
        if not MIN_RSA_BITS <= modulus.bit_length() <= MAX_RSA_BITS or not 3 <= exponent < 2**32:
            return None
        return SigningKey(kid, RSAPublicNumbers(exponent, modulus).public_key(), issuer)
    except (ValueError, UnicodeEncodeError):
        return None


def parse_jwks(document: dict) -> dict[str, SigningKey]:
    keys = document.get("keys")
    if not isinstance(keys, list) or len(keys) > MAX_KEYS:
        raise _FetchError("jwks_invalid")
    parsed: dict[str, SigningKey] = {}
    for jwk in keys:
        key = parse_jwk(jwk)
        if key is not None:
            parsed.setdefault(key.kid, key)
    return parsed


class KeyCache:
    """Signing keys per (tenant id, token version) from `{authority}/{tid}[/v2.0]` discovery."""

    def __init__(
        self,
        authority: str,
        client: httpx.AsyncClient,
        *,
        ttl_s: float,
        unknown_kid_window_s: float,
        timeout_s: float,
    ) -> None:
        self._authority = httpx.URL(authority.rstrip("/"))
        self._client = client
        self._ttl_s = ttl_s
        self._window_s = unknown_kid_window_s
        self._timeout_s = timeout_s
        self._retry_s = min(30.0, ttl_s)
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._forced_at: dict[str, float] = {}
        self._background: asyncio.Task | None = None
        self.fetch_count = 0
        self.fetches: Counter[str] = Counter()

    async def signing_key(self, tenant_id: str, version: str, kid: str) -> tuple[str, SigningKey]:
        """(the discovery issuer, the key named kid); raises AuthError when there is none."""
        started = time.monotonic()
        entry = self._entries.setdefault((tenant_id, version), _Entry())
        if entry.inflight is not None or started >= entry.expires_at:
            await self._refresh(tenant_id, version, entry)
        if entry.key_set is None:
            raise AuthUnavailableError()
        key = entry.key_set.keys.get(kid)
        # Keys fetched while this request waited are already the newest there are.
        if key is None and entry.fetched_at < started and self._may_force(tenant_id, started):
            await self._refresh(tenant_id, version, entry)
            key = entry.key_set.keys.get(kid)
        if key is None:
            raise AuthError("unknown_key")
        return entry.key_set.issuer, key

    def cached_key(self, tenant_id: str, version: str, kid: str) -> SigningKey | None:
        """The key named kid if it is in a key set that has not expired; never fetches."""
        entry = self._entries.get((tenant_id, version))
        if entry is None or entry.key_set is None or time.monotonic() >= entry.expires_at:
            return None
        return entry.key_set.keys.get(kid)

    def keys_available(self) -> bool:
        return all(entry.key_set is not None for entry in self._entries.values() if entry.attempted)

    async def start(self) -> None:
        if self._background is None or self._background.done():
            self._background = asyncio.create_task(self._refresh_loop(), name="tenantgate-jwks-refresh")

    async def aclose(self) -> None:
        tasks = [self._background] + [entry.inflight for entry in self._entries.values()]
        self._background = None
        for task in tasks:
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    def _may_force(self, tenant_id: str, now: float) -> bool:
        if now - self._forced_at.get(tenant_id, -math.inf) < self._window_s:
            return False
        self._forced_at[tenant_id] = now
        return True

    async def _refresh(self, tenant_id: str, version: str, entry: _Entry) -> None:
        task = entry.inflight
        if task is None:
            task = entry.inflight = asyncio.create_task(self._fetch(tenant_id, version, entry))
        # A cancelled request must not cancel the fetch other requests are waiting on.
        await asyncio.shield(task)

    async def _refresh_loop(self) -> None:
        tick = max(0.05, min(self._ttl_s * REFRESH_AHEAD / 2, 30.0))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for (tenant_id, version), entry in list(self._entries.items()):
                if now >= entry.refresh_after:
                    await self._refresh(tenant_id, version, entry)

    async def _fetch(self, tenant_id: str, version: str, entry: _Entry) -> None:
        """Never raises (but cancellation): a failure is logged and keeps the last good keys."""
        try:
            key_set = await self._download(tenant_id, version)
        except Exception as exc:
            reason = exc.reason if isinstance(exc, _FetchError) else type(exc).__name__
            log.warning("jwks fetch failed: tenant=%s version=%s reason=%s", tenant_id, version, reason)
            entry.expires_at = entry.refresh_after = time.monotonic() + self._retry_s
        else:
            now = time.monotonic()
            entry.key_set, entry.fetched_at = key_set, now
            entry.expires_at = now + self._ttl_s
            entry.refresh_after = now + self._ttl_s * (1 - REFRESH_AHEAD)
        finally:
            entry.inflight = None
        entry.attempted = True

    async def _download(self, tenant_id: str, version: str) -> KeySet:
        base = f"{self._authority}/{tenant_id}" + ("/v2.0" if version == "2.0" else "")
        discovery = await self._get_json(f"{base}/.well-known/openid-configuration", MAX_DISCOVERY_BYTES)
        issuer, jwks_uri = discovery.get("issuer"), discovery.get("jwks_uri")
        if not isinstance(issuer, str) or not isinstance(jwks_uri, str):
            raise _FetchError("discovery_invalid")
        url = httpx.URL(jwks_uri)
        # Keys come only from the configured authority, whatever a discovery document says.
        if (url.scheme, url.host, url.port) != (self._authority.scheme, self._authority.host, self._authority.port):
            raise _FetchError("jwks_uri_foreign")
        self.fetch_count += 1
        self.fetches[tenant_id] += 1
        keys = parse_jwks(await self._get_json(str(url), MAX_JWKS_BYTES))
        if not keys:
            raise _FetchError("jwks_no_usable_key")
        return KeySet(issuer, keys)

    async def _get_json(self, url: str, limit: int) -> dict:
        body = bytearray()
        async with asyncio.timeout(self._timeout_s):
            async with self._client.stream("GET", url, headers={"Accept": "application/json"}) as response:
                if response.status_code != 200:
                    raise _FetchError(f"http_{response.status_code}")
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise _FetchError("response_too_large")
        try:
            document = json.loads(body)
        except ValueError:
            raise _FetchError("response_not_json") from None
        if not isinstance(document, dict):
            raise _FetchError("response_not_object")
        return document
