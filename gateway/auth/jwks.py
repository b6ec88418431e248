"""Entra ID signing keys per (tenant, token version): OpenID discovery, then the JWKS.

Key sets are cached for a TTL and refreshed in the background before they expire. A
request that has keys never waits for a fetch: while a refresh runs, or after one failed,
it is served from the last good keys. Only a tenant with no keys yet, keys a whole TTL
old with no refresh tried, or an unknown `kid` waits, and only up to the fetch timeout.
Concurrent requests for one tenant share a single in-flight fetch. An unknown `kid`
forces a refetch at most once per window per tenant when the issuer answers, so a flood
of forged kids costs at most one fetch per window; a fetch that fails does not use up the
window, and is retried no sooner than `retry_s` later. A new key is therefore accepted within
`timeout_s + retry_s` of the issuer's recovery: a fetch that started just before it may hang
for the whole timeout, and the retry after its failure waits `retry_s`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicNumbers
from joserfc.jwk import RSAKey

from gateway.auth.exceptions import AuthError, AuthUnavailableError
from gateway.background import cancel_and_wait
from gateway.encoding import b64url_decode

log = logging.getLogger("tenantgate.auth")

MAX_DISCOVERY_BYTES = 64 * 1024
MAX_JWKS_BYTES = 256 * 1024
MAX_KEYS = 64
MIN_RSA_BITS, MAX_RSA_BITS = 2048, 8192
REFRESH_AHEAD = 0.25  # background refresh once 75% of the TTL has passed


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str
    public_key: RSAKey  # joserfc's, which its RS256 verifies with
    issuer: str | None  # the JWK's "issuer" member, possibly a {tenantid} template


@dataclass(frozen=True, slots=True)
class KeySet:
    issuer: str  # the discovery document's issuer, possibly a {tenantid} template
    keys: dict[str, SigningKey]


@dataclass
class _Entry:
    key_set: KeySet | None = None
    fetched_at: float = -math.inf
    expires_at: float = 0.0  # past this, keys are used only while a refresh runs or after one failed
    refresh_after: float = 0.0  # a refresh starts in the background after this
    retry_at: float = 0.0  # after a failed fetch, the next one starts no sooner than this
    failed: bool = False  # the last fetch failed: key_set holds the last good keys
    inflight: asyncio.Task | None = field(default=None, repr=False)

    def usable(self, now: float) -> bool:
        """Whether the keys may be used without waiting for a fetch."""
        return self.key_set is not None and (now < self.expires_at or self.failed or self.inflight is not None)


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
        # Bounded here, before joserfc sees it: it only warns about a key under 2048 bits.
        return SigningKey(kid, RSAKey.import_key(RSAPublicNumbers(exponent, modulus).public_key()), issuer)
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
        retry_s: float,
    ) -> None:
        self._authority = httpx.URL(authority.rstrip("/"))
        self._client = client
        self._ttl_s = ttl_s
        self._window_s = unknown_kid_window_s
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._forced_at: dict[str, float] = {}
        self._background: asyncio.Task | None = None
        self.fetch_count = 0
        self.fetches: Counter[str] = Counter()

    async def signing_key(self, tenant_id: str, version: str, kid: str) -> tuple[str, SigningKey]:
        """(the discovery issuer, the key named kid); raises AuthError when there is none."""
        started = time.monotonic()
        entry = self._entries.setdefault((tenant_id, version), _Entry())
        if not entry.usable(started):
            if entry.inflight is not None or started >= entry.retry_at:
                await self._refresh(tenant_id, version, entry)
            if entry.key_set is None:
                raise AuthUnavailableError()
        elif started >= entry.refresh_after:
            self._start_fetch(tenant_id, version, entry)  # not awaited: this request uses the keys it has
        key = entry.key_set.keys.get(kid)  # type: ignore[union-attr]  # usable or just fetched: it has keys
        # Keys fetched while this request waited are already the newest there are.
        if key is None and entry.fetched_at < started and started >= entry.retry_at \
                and self._may_force(tenant_id, started):
            await self._refresh(tenant_id, version, entry)
            if entry.fetched_at < started:
                self._forced_at.pop(tenant_id, None)  # it failed: the window stays open for the retry
            key = entry.key_set.keys.get(kid)  # type: ignore[union-attr]  # a refresh keeps the last good keys
        if key is None:
            raise AuthError("unknown_key")
        return entry.key_set.issuer, key  # type: ignore[union-attr]  # it had keys above

    def cached_key(self, tenant_id: str, version: str, kid: str) -> SigningKey | None:
        """The key named kid if signing_key would use it without waiting; never fetches."""
        entry = self._entries.get((tenant_id, version))
        if entry is None or not entry.usable(time.monotonic()):
            return None
        return entry.key_set.keys.get(kid)  # type: ignore[union-attr]  # usable: it has keys

    def key_sets_missing(self) -> int:
        """Key sets (tenant, token version) tried whose keys could never be fetched."""
        return sum(1 for entry in list(self._entries.values()) if entry.key_set is None and entry.failed)

    async def start(self) -> None:
        if self._background is None or self._background.done():
            self._background = asyncio.create_task(self._refresh_loop(), name="tenantgate-jwks-refresh")

    async def aclose(self) -> None:
        tasks = [self._background] + [entry.inflight for entry in self._entries.values()]
        self._background = None
        await cancel_and_wait(*tasks)

    def _may_force(self, tenant_id: str, now: float) -> bool:
        if now - self._forced_at.get(tenant_id, -math.inf) < self._window_s:
            return False
        self._forced_at[tenant_id] = now
        return True

    def _start_fetch(self, tenant_id: str, version: str, entry: _Entry) -> asyncio.Task | None:
        """The fetch in flight for this entry, or a new one if none is and no retry is pending."""
        if entry.inflight is None and time.monotonic() >= entry.retry_at:
            entry.inflight = asyncio.create_task(self._fetch(tenant_id, version, entry))
        return entry.inflight

    async def _refresh(self, tenant_id: str, version: str, entry: _Entry) -> None:
        task = self._start_fetch(tenant_id, version, entry)
        if task is not None:
            # A cancelled request must not cancel the fetch other requests are waiting on.
            await asyncio.shield(task)

    async def _refresh_loop(self) -> None:
        tick = max(0.05, min(self._ttl_s * REFRESH_AHEAD / 2, self._retry_s, 30.0))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            # Only key sets that once worked: a tenant whose discovery never answered is retried
            # when a request asks for it, not forever in the background.
            for (tenant_id, version), entry in list(self._entries.items()):
                if entry.key_set is not None and now >= entry.refresh_after:
                    self._start_fetch(tenant_id, version, entry)

    async def _fetch(self, tenant_id: str, version: str, entry: _Entry) -> None:
        """Never raises (but cancellation): a failure is logged and keeps the last good keys."""
        try:
            async with asyncio.timeout(self._timeout_s):
                key_set = await self._download(tenant_id, version)
        except Exception as exc:  # noqa: BLE001 - never raises: logged, and the last good keys stay
            reason = exc.reason if isinstance(exc, _FetchError) else type(exc).__name__
            log.warning("jwks fetch failed: tenant=%s version=%s reason=%s", tenant_id, version, reason)
            entry.failed, entry.retry_at = True, time.monotonic() + self._retry_s
        else:
            now = time.monotonic()
            entry.key_set, entry.fetched_at, entry.failed = key_set, now, False
            entry.expires_at = now + self._ttl_s
            entry.refresh_after = now + self._ttl_s * (1 - REFRESH_AHEAD)
        finally:
            entry.inflight = None

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
