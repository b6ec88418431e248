"""Verifies Microsoft Entra ID access tokens (v1 and v2) into a Principal.

Everything about a token that can be checked without keys is checked first, on the
unverified claims, so a token for a tenant policy does not know never makes the gateway
fetch anything. After the signature is verified the signed claims are checked again.

The generic JWS part is joserfc's: splitting the compact token and decoding its base64url
parts, the registered header members' types, the algorithm (pinned to RS256: `none`, HS*
and every other name are refused by the registry), and the RSASSA-PKCS1-v1_5 verification.
The rest is ours: the size cap, strict JSON (joserfc's json.loads keeps the last of duplicate
members and reads NaN), the header members that are never honoured, the kid, and every
Entra rule about the claims.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Literal, overload

import httpx
from joserfc import jws
from joserfc.errors import JoseError

from gateway.auth.exceptions import AuthError, TenantsUnknownError
from gateway.auth.jwks import KeyCache
from gateway.auth.principal import Principal, canonical_guid
from gateway.encoding import b64url_decode

log = logging.getLogger("tenantgate.auth")

# Headers that point at or carry a key (or change how the payload is read): never honoured.
FORBIDDEN_HEADERS = frozenset({"jku", "jwk", "x5u", "x5c", "crit", "b64", "enc", "zip"})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_MAX_DATE = 1e13  # far beyond any real exp, but small enough that arithmetic stays exact
VERIFIED_CACHE_SIZE = 4096


def _safe_base_url(url: str, what: str) -> str:
    parsed = httpx.URL(url)
    if parsed.host and (parsed.scheme == "https" or (parsed.scheme == "http" and parsed.host in _LOOPBACK)):
        return url.rstrip("/")
    raise ValueError(f"{what} must be an https URL (http is allowed on loopback only)")


def _unique_members(pairs: list[tuple[str, object]]) -> dict:
    # Duplicate members are parsed differently by different libraries; refuse them.
    document: dict = {}
    for name, value in pairs:
        if name in document:
            raise ValueError("duplicate member")
        document[name] = value
    return document


def _reject_constant(name: str) -> None:
    raise ValueError("NaN and Infinity are not JSON")


def _json_object(segment: bytes) -> dict:
    try:
        value = json.loads(
            b64url_decode(segment), object_pairs_hook=_unique_members, parse_constant=_reject_constant
        )
    except (ValueError, RecursionError):
        raise AuthError("malformed_token") from None
    if not isinstance(value, dict):
        raise AuthError("malformed_token")
    return value


def _jws_registry(max_token_bytes: int) -> jws.JWSRegistry:
    """joserfc's JWS rules with RS256 the only algorithm. Header members it has no entry for
    are allowed (Entra's own, such as x5t or nonce); the ones we refuse are refused by name."""
    registry = jws.JWSRegistry(algorithms=["RS256"], strict_check_header=False)
    # max_token_bytes bounds the whole token; joserfc's own per-part defaults (a 512-byte header,
    # a 1024-byte signature) would refuse the signature of an 8192-bit key, which JWKS may publish.
    registry.max_header_length = registry.max_payload_length = registry.max_signature_length = max_token_bytes
    return registry


@overload
def _numeric_date(claims: dict, name: str, *, required: Literal[True]) -> float: ...
@overload
def _numeric_date(claims: dict, name: str, *, required: Literal[False]) -> float | None: ...
def _numeric_date(claims: dict, name: str, *, required: bool) -> float | None:
    if name not in claims:
        if required:
            raise AuthError("missing_claim")
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < _MAX_DATE:
        raise AuthError("invalid_claim")
    return float(value)


class EntraVerifier:
    def __init__(
        self,
        *,
        authority: str,
        audiences: Sequence[str],
        tenant_allowed: Callable[[str], bool | None],
        v1_issuer_host: str = "https://sts.windows.net",
        leeway_s: float = 60.0,
        jwks_ttl_s: float = 3600.0,
        unknown_kid_window_s: float = 300.0,
        max_token_bytes: int = 16384,
        http_timeout_s: float = 5.0,
        http_connect_timeout_s: float = 2.0,
        jwks_retry_s: float = 5.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if isinstance(audiences, str) or not audiences or not all(isinstance(a, str) and a for a in audiences):
            raise ValueError("audiences must be a non-empty sequence of strings")
        if not 0 <= leeway_s <= 600 or jwks_ttl_s <= 0 or unknown_kid_window_s < 0:
            raise ValueError("leeway_s must be 0..600 s, jwks_ttl_s > 0 and unknown_kid_window_s >= 0")
        if max_token_bytes <= 0 or http_timeout_s <= 0 or http_connect_timeout_s <= 0 or jwks_retry_s <= 0:
            raise ValueError("max_token_bytes, the HTTP timeouts and jwks_retry_s must be positive")
        self._authority = _safe_base_url(authority, "authority")
        self._v1_issuer_host = _safe_base_url(v1_issuer_host, "v1_issuer_host")
        self._audiences = frozenset(audiences)
        self._tenant_allowed = tenant_allowed
        self._leeway_s = leeway_s
        self._max_token_bytes = max_token_bytes
        self._jws = _jws_registry(max_token_bytes)
        self._owns_client = http_client is None
        timeout = httpx.Timeout(http_timeout_s, connect=min(http_connect_timeout_s, http_timeout_s))
        self._client = http_client or httpx.AsyncClient(timeout=timeout, follow_redirects=False)
        # Tokens already verified, by SHA-256 of the token: a client reuses its token for up to
        # an hour, and parsing plus an RSA verification per request is most of auth's cost.
        self._verified: OrderedDict[bytes, tuple[Principal, float, str, object]] = OrderedDict()
        self._keys = KeyCache(
            self._authority,
            self._client,
            ttl_s=jwks_ttl_s,
            unknown_kid_window_s=unknown_kid_window_s,
            timeout_s=http_timeout_s,
            retry_s=jwks_retry_s,
        )

    @property
    def authority(self) -> str:
        """The sign-in authority tokens come from (a claims challenge sends clients back to it)."""
        return self._authority

    @property
    def jwks_fetch_count(self) -> int:
        """JWKS documents requested over HTTP, all tenants together."""
        return self._keys.fetch_count

    @property
    def jwks_fetches(self) -> Counter[str]:
        """JWKS documents requested over HTTP, by tenant id."""
        return self._keys.fetches

    def key_sets_missing(self) -> int:
        """Tenant key sets tried whose keys could never be fetched (a metric, never readiness:
        any caller can make the gateway try a registered tenant's keys)."""
        return self._keys.key_sets_missing()

    async def start(self) -> None:
        await self._keys.start()

    async def aclose(self) -> None:
        await self._keys.aclose()
        if self._owns_client:
            await self._client.aclose()

    def issuer_for(self, tenant_id: str, version: str) -> str:
        """The exact `iss` of a token of this version from this tenant."""
        if version == "2.0":
            return f"{self._authority}/{tenant_id}/v2.0"
        return f"{self._v1_issuer_host}/{tenant_id}/"

    async def verify(self, token: str) -> Principal:
        """The principal of a valid access token; AuthError otherwise, or TenantsUnknownError
        while the policy cannot yet say which tenants are registered."""
        digest = None
        if isinstance(token, str) and len(token) <= self._max_token_bytes:
            digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
            principal = self._cached(digest)
            if principal is not None:
                return principal
        try:
            principal, expires, kid, key = await self._verify(token)
        except AuthError as exc:
            log.info("token refused: code=%s", exc.code)
            raise
        except TenantsUnknownError:
            log.info("token not checked: the tenant list is not known yet")
            raise
        except Exception as exc:  # noqa: BLE001 - any failure refuses the token (fail closed)
            # Fail closed. The cause is dropped: its text might quote the token.
            log.warning("token refused: code=invalid_token error=%s", type(exc).__name__)
            raise AuthError("invalid_token") from None
        if digest is not None:
            self._verified[digest] = (principal, expires, kid, key)
            if len(self._verified) > VERIFIED_CACHE_SIZE:
                self._verified.popitem(last=False)
        return principal

    def _cached(self, digest: bytes) -> Principal | None:
        """A verified token's principal while everything it was verified against still holds:
        not expired, its key still in an unexpired key set, its tenant still allowed."""
        hit = self._verified.get(digest)
        if hit is None:
            return None
        principal, expires, kid, key = hit
        if (time.time() <= expires + self._leeway_s
                and self._keys.cached_key(principal.tenant_id, principal.token_version, kid) is key
                and self._tenant_allowed(principal.tenant_id) is True):
            return principal
        del self._verified[digest]
        return None

    async def _verify(self, token: str) -> tuple[Principal, float, str, object]:
        if not isinstance(token, str):
            raise AuthError("malformed_token")
        if len(token) > self._max_token_bytes:
            raise AuthError("token_too_large")
        try:
            raw = token.encode("ascii")
        except UnicodeEncodeError:
            raise AuthError("malformed_token") from None
        # The header is checked before joserfc reads the token: a member such as b64 would change how
        # it reads the payload, and a header we refuse is refused with its own code.
        kid = self._check_header(_json_object(raw.split(b".", 1)[0]))
        token_jws = self._extract(raw)
        claims = _json_object(token_jws.segments["payload"])
        try:
            signature = b64url_decode(token_jws.segments["signature"])
        except ValueError:
            raise AuthError("malformed_token") from None
        unverified = self._check_claims(claims)
        if not signature:
            raise AuthError("invalid_signature")

        version, tenant_id, issuer = unverified.token_version, unverified.tenant_id, claims["iss"]
        discovery_issuer, key = await self._keys.signing_key(tenant_id, version, kid)
        if discovery_issuer.replace("{tenantid}", tenant_id) != issuer:
            raise AuthError("invalid_issuer")
        if key.issuer is not None and not self._key_issuer_matches(key.issuer, tenant_id, version, issuer):
            raise AuthError("invalid_issuer")
        # The bytes verified are exactly the bytes parsed above, against the one key the tenant's
        # JWKS names by kid: never a key the header carries or points at, never another algorithm.
        if not jws.validate_compact(token_jws, key.public_key, registry=self._jws):
            raise AuthError("invalid_signature")
        return self._check_claims(claims), float(claims["exp"]), kid, key

    def _extract(self, raw: bytes) -> jws.CompactSignature:
        """The three parts of a compact JWS, as joserfc splits and decodes them."""
        try:
            return jws.extract_compact(raw, registry=self._jws)
        except JoseError:
            raise AuthError("malformed_token") from None

    def _check_header(self, header: dict) -> str:
        alg = header.get("alg")
        try:
            self._jws.get_alg(alg if isinstance(alg, str) else "")
        except JoseError:
            raise AuthError("unsupported_algorithm") from None
        if FORBIDDEN_HEADERS.intersection(header):
            raise AuthError("forbidden_header")
        kid = header.get("kid")
        if not isinstance(kid, str) or not 0 < len(kid) <= 256:
            raise AuthError("missing_kid")
        try:
            self._jws.check_header(header)  # the registered members' types (typ, cty, x5t, ...)
        except JoseError:
            raise AuthError("malformed_token") from None
        return kid

    def _check_claims(self, claims: dict) -> Principal:
        version = claims.get("ver")
        if version not in ("1.0", "2.0"):
            raise AuthError("unsupported_token_version")
        tenant_id = canonical_guid(claims.get("tid"))
        if tenant_id is None:
            raise AuthError("invalid_tenant")
        allowed = self._tenant_allowed(tenant_id)
        if allowed is None:
            raise TenantsUnknownError()
        if allowed is not True:
            raise AuthError("tenant_not_allowed")
        if claims.get("iss") != self.issuer_for(tenant_id, version):
            raise AuthError("invalid_issuer")
        audience = claims.get("aud")
        if not isinstance(audience, str) or audience not in self._audiences:
            raise AuthError("invalid_audience")
        now = time.time()
        expires = _numeric_date(claims, "exp", required=True)
        not_before = _numeric_date(claims, "nbf", required=False)
        issued = _numeric_date(claims, "iat", required=True)
        if now > expires + self._leeway_s:
            raise AuthError("token_expired")
        if (not_before is not None and now + self._leeway_s < not_before) or now + self._leeway_s < issued:
            raise AuthError("token_not_yet_valid")
        return Principal.from_claims(claims)

    def _key_issuer_matches(self, key_issuer: str, tenant_id: str, version: str, issuer: str) -> bool:
        effective = key_issuer.replace("{tenantid}", tenant_id)
        # Entra tags its keys with the v2 issuer; v1 tokens signed by them carry the v1 form.
        return effective == issuer or (version == "1.0" and effective == self.issuer_for(tenant_id, "2.0"))
