"""The execution envelope: what the policy decision allows a request to share.

The gateway builds one per request from the Rego decision; the engine refuses a request
without one. Every field is already in engine terms: the cache namespace is a keyed
digest (HMAC with a deployment secret) so it cannot be guessed or forged, and the
isolation key is a digest of the tenant, never the tenant id itself.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from engine.errors import EnvelopeError

KEY_CACHE_SIZE = 16384  # keyed digests remembered: tenants, principals, namespaces (a few hundred bytes each)


class Isolation(str, enum.Enum):  # noqa: UP042 - StrEnum changes str() and f-strings of a member
    SHARED = "shared"  # may share a step with any other shared request
    TENANT = "tenant"  # only with requests of the same tenant
    EXCLUSIVE = "exclusive"  # alone in its step


class CacheScope(str, enum.Enum):  # noqa: UP042 - StrEnum changes str() and f-strings of a member
    """Which class of namespace the digest stands for; only used to label telemetry."""

    NONE = "none"
    PRINCIPAL = "principal"
    TENANT = "tenant"
    SHARED = "shared"


DIGEST_SIZE = 32
SEGMENT_DIGEST_VERSION = b"tenantgate-segment/1\0"
MAX_PUBLIC_SEGMENTS = 16  # a request's matching work at admission is one digest of its prefix per segment
TENANT_DIGEST_CHARS = 32  # 128 bits: no two tenants' digests meet, in records or in keys built from them


@dataclass(frozen=True)
class PublicSegment:
    """A prompt prefix the policy made public: its blocks are shared by everyone the policy gives it to.

    digest: segment_digest of the exact token ids; num_tokens: how many. namespace: the keyed
    digest of the segment's namespace (HMAC under the deployment secret, like cache_namespace).
    A prompt that starts with exactly these tokens keys the blocks wholly inside them in this
    namespace; every later block, and every block of a prompt that does not match, stays in
    the request's own namespace (docs/engine.md, "Public prefix segments").
    """

    digest: bytes
    num_tokens: int
    namespace: bytes

    def __post_init__(self) -> None:
        for name in ("digest", "namespace"):
            value = getattr(self, name)
            if not isinstance(value, bytes) or len(value) != DIGEST_SIZE:
                raise EnvelopeError(f"public segment {name} must be a {DIGEST_SIZE}-byte digest")
        if type(self.num_tokens) is not int or self.num_tokens <= 0:
            raise EnvelopeError(f"public segment num_tokens must be a positive integer, got {self.num_tokens!r}")


def segment_digest(token_ids: Iterable[int]) -> bytes:
    """The digest that names a public segment: SHA-256 of its token ids (64-bit little-endian),
    versioned. Not keyed: a segment's tokens are public by definition, and the platform or a
    tenant publishes the digest in policy data (`tenantgate cache segment` prints it)."""
    ids = array("q", token_ids)
    if sys.byteorder == "big":
        ids.byteswap()
    return hashlib.sha256(SEGMENT_DIGEST_VERSION + ids.tobytes()).digest()


@dataclass(frozen=True)
class ExecutionEnvelope:
    cache_namespace: bytes | None  # None: scope none, the prefix cache is neither read nor written
    cache_scope: CacheScope
    isolation: Isolation
    isolation_key: bytes  # digest of the tenant: fairness, quota and isolation are keyed on it
    deterministic: bool = False
    kv_block_quota: int = 1 << 30
    priority: int = 0
    public_segments: tuple[PublicSegment, ...] = ()  # needs a namespace: scope none shares nothing
    # The engine may draft tokens from the request's own context and verify them in one step
    # (engine/speculation.py); never in the deterministic lane, whatever this says.
    speculative: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.isolation, Isolation):
            raise EnvelopeError(f"isolation must be an Isolation, got {self.isolation!r}")
        if not isinstance(self.cache_scope, CacheScope):
            raise EnvelopeError(f"cache_scope must be a CacheScope, got {self.cache_scope!r}")
        if (self.cache_namespace is None) != (self.cache_scope is CacheScope.NONE):
            raise EnvelopeError("cache_namespace must be None exactly when cache_scope is none")
        if self.cache_namespace is not None and (
            not isinstance(self.cache_namespace, bytes) or len(self.cache_namespace) != DIGEST_SIZE
        ):
            raise EnvelopeError(f"cache_namespace must be a {DIGEST_SIZE}-byte digest")
        if not isinstance(self.isolation_key, bytes) or len(self.isolation_key) != DIGEST_SIZE:
            raise EnvelopeError(f"isolation_key must be a {DIGEST_SIZE}-byte digest")
        if not isinstance(self.kv_block_quota, int) or self.kv_block_quota <= 0:
            raise EnvelopeError(f"kv_block_quota must be a positive integer, got {self.kv_block_quota!r}")
        if not isinstance(self.priority, int):
            raise EnvelopeError(f"priority must be an integer, got {self.priority!r}")
        if not isinstance(self.public_segments, tuple) or not all(
                isinstance(s, PublicSegment) for s in self.public_segments):
            raise EnvelopeError("public_segments must be a tuple of PublicSegment")
        if self.public_segments and self.cache_namespace is None:
            raise EnvelopeError("public segments need a cache namespace (scope none shares nothing)")
        if len(self.public_segments) > MAX_PUBLIC_SEGMENTS:
            raise EnvelopeError(f"at most {MAX_PUBLIC_SEGMENTS} public segments per request")
        if not isinstance(self.speculative, bool):
            raise EnvelopeError(f"speculative must be a boolean, got {self.speculative!r}")

    @property
    def tenant_digest(self) -> str:
        return tenant_digest(self.isolation_key)


def tenant_digest(key: bytes) -> str:
    """The tenant's digest wherever a tenant is shown: the engine's step records, the audit
    trail's records and quota keys, and (its first 12 characters) metric labels and spans, so they
    all join. Keyed (see isolation_key), so a tenant id cannot be found by hashing candidates."""
    return key.hex()[:TENANT_DIGEST_CHARS]


def isolation_key(secret: bytes, tenant_id: str) -> bytes:
    """The engine's key for a tenant (fairness, KV quota, isolation), whose tenant_digest is the
    tenant's digest everywhere. The "audit:" prefix is the one the audit trail's tenant digests
    always had, so trails, dashboards and stored keys written before the digests were one still
    name the same tenant."""
    return keyed_digest(secret, "audit:tenant:" + tenant_id)


@functools.lru_cache(maxsize=KEY_CACHE_SIZE)
def keyed_digest(secret: bytes, value: str) -> bytes:
    """HMAC-SHA256 of a namespace or tenant name under the deployment secret. Remembered: a
    request asks for its tenant's key and namespace several times (the envelope, its audit
    records' digests, its quota keys, its metric label)."""
    return hmac.new(secret, value.encode(), hashlib.sha256).digest()


def local_envelope(secret: bytes = b"tenantgate-local") -> ExecutionEnvelope:
    """The envelope for a single local user (the CLI): one tenant, its own cache namespace."""
    return ExecutionEnvelope(
        cache_namespace=keyed_digest(secret, "namespace:local"),
        cache_scope=CacheScope.TENANT,
        isolation=Isolation.SHARED,
        isolation_key=isolation_key(secret, "local"),
    )
