"""Envelope tokens: the gateway signs what its decision allows, an engine server runs only that.

A token is `base64url(claims JSON) "." base64url(Ed25519 signature over the claims JSON)`.
The claims bind one ExecutionEnvelope to one request: the request id, the SHA-256 of the
exact body bytes, an issue time and an expiry at most MAX_TTL_S later. The key id is the
first 16 hex digits of the SHA-256 of the raw public key, so no key id is configured:
rotating means mounting the new public key beside the old one on every engine server,
then switching the gateway's private key, then removing the old public key.

A verifier refuses a token for one of REJECTION_REASONS (metric labels and log words; never
token contents), and remembers each request id it accepted until its token expires, so a
captured request cannot be sent again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.envelope import ExecutionEnvelope
from engine.remote.protocol import envelope_from_json, envelope_to_json

MAX_TTL_S = 60
DEFAULT_TTL_S = 30
CLOCK_LEEWAY_S = 5  # clock skew between gateway and engine hosts that is still accepted
MAX_TOKEN_BYTES = 4096
REPLAY_CACHE_ENTRIES = 100_000  # request ids remembered at once; beyond that tokens are refused

REJECTION_REASONS = (
    "missing",  # no token (the server's check; listed so the metric has every label)
    "malformed",
    "unknown_key",
    "bad_signature",
    "ttl_too_long",
    "expired",
    "not_yet_valid",
    "body_mismatch",
    "request_id_mismatch",
    "replayed",
    "replay_cache_full",
)
_CLAIMS = {"kid", "iat", "exp", "request_id", "body_sha256", "envelope"}


class EnvelopeRejected(Exception):
    """A token the server must refuse; `reason` is one of REJECTION_REASONS."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"envelope refused: {reason}")
        self.reason = reason


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def _canonical(claims: dict) -> bytes:
    return json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """The gateway's signing key: an Ed25519 private key in PEM (PKCS#8, unencrypted)."""
    path = Path(path)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key")
    return key


def load_public_keys(path: str | Path) -> list[Ed25519PublicKey]:
    """The keys an engine server accepts: one PEM file, or every file in a directory (any
    names; names starting with '.' are skipped, as a Kubernetes secret mount's `..data` is)."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file()) if path.is_dir() else [path]
    keys = []
    for file in files:
        try:
            key = serialization.load_pem_public_key(file.read_bytes())
        except ValueError:
            raise ValueError(f"{file} is not a PEM public key") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"{file} is not an Ed25519 public key")
        keys.append(key)
    return keys


class EnvelopeSigner:
    def __init__(self, private_key: Ed25519PrivateKey, ttl_s: int = DEFAULT_TTL_S) -> None:
        if not isinstance(ttl_s, int) or not 0 < ttl_s <= MAX_TTL_S:
            raise ValueError(f"an envelope's ttl must be 1 to {MAX_TTL_S} seconds, got {ttl_s!r}")
        self._key = private_key
        self.kid = key_id(private_key.public_key())
        self.ttl_s = ttl_s

    def sign(self, envelope: ExecutionEnvelope, request_id: str, body: bytes, now: float | None = None) -> str:
        iat = int(time.time() if now is None else now)
        return self.encode({
            "kid": self.kid, "iat": iat, "exp": iat + self.ttl_s, "request_id": request_id,
            "body_sha256": body_digest(body), "envelope": envelope_to_json(envelope),
        })

    def encode(self, claims: dict) -> str:
        """Signs any claims as they are (tests use it to build tokens `sign` never makes)."""
        payload = _canonical(claims)
        return f"{_b64encode(payload)}.{_b64encode(self._key.sign(payload))}"


@dataclass(frozen=True)
class VerifiedToken:
    """A token whose signature and claims hold; what it binds the body to is checked with the body."""

    envelope: ExecutionEnvelope
    request_id: str
    body_sha256: object  # as signed; anything but the body's digest is a body_mismatch
    exp: int

    def check_unexpired(self, now: float) -> None:
        if now > self.exp + CLOCK_LEEWAY_S:
            raise EnvelopeRejected("expired")


class ReplayCache:
    """Request ids accepted and not yet expired. Full, it refuses rather than forgets."""

    def __init__(self, max_entries: int = REPLAY_CACHE_ENTRIES) -> None:
        self.max_entries = max_entries
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._expiry)

    def accepted(self, request_id: str, now: float) -> bool:
        """Whether a token for this request id was accepted and has not expired yet."""
        with self._lock:
            return self._expiry.get(request_id, now) > now

    def add(self, request_id: str, forget_after: float, now: float) -> None:
        with self._lock:
            while self._heap and self._heap[0][0] < now:
                _, old = heapq.heappop(self._heap)
                if self._expiry.get(old, now) < now:
                    del self._expiry[old]
            if request_id in self._expiry:
                raise EnvelopeRejected("replayed")
            if len(self._expiry) >= self.max_entries:
                raise EnvelopeRejected("replay_cache_full")
            self._expiry[request_id] = forget_after
            heapq.heappush(self._heap, (forget_after, request_id))


class EnvelopeVerifier:
    def __init__(self, public_keys: list[Ed25519PublicKey], *, replay_cache: ReplayCache | None = None) -> None:
        if not public_keys:
            raise ValueError("an envelope verifier needs at least one public key")
        self._keys = {key_id(k): k for k in public_keys}
        self.replays = replay_cache or ReplayCache()

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def verify(self, token: str, body: bytes, now: float | None = None) -> tuple[ExecutionEnvelope, str]:
        """The envelope and request id a valid token carries for `body`; else EnvelopeRejected."""
        return self.verify_body(self.verify_token(token, now), body, now)

    def verify_token(self, token: str, now: float | None = None) -> VerifiedToken:
        """Everything that needs no body: form, key id, signature, claims, lifetime. A server checks
        this before it reads a byte of the body, then `verify_body` once it has read it."""
        now = time.time() if now is None else now
        payload, signature, claims = self._decode(token)
        kid = claims["kid"]
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise EnvelopeRejected("unknown_key")
        try:
            key.verify(signature, payload)
        except InvalidSignature:
            raise EnvelopeRejected("bad_signature") from None
        # Signed from here on: a malformed claim is a gateway of another version, still refused.
        iat, exp, request_id = claims["iat"], claims["exp"], claims["request_id"]
        if type(iat) is not int or type(exp) is not int or not isinstance(request_id, str) or not request_id:
            raise EnvelopeRejected("malformed")
        try:
            envelope = envelope_from_json(claims["envelope"])
        except ValueError:
            raise EnvelopeRejected("malformed") from None
        if exp - iat > MAX_TTL_S:
            raise EnvelopeRejected("ttl_too_long")
        verified = VerifiedToken(envelope, request_id, claims["body_sha256"], exp)
        verified.check_unexpired(now)
        if iat > now + CLOCK_LEEWAY_S:
            raise EnvelopeRejected("not_yet_valid")
        if self.replays.accepted(request_id, now):  # refused before its body; `add` still decides
            raise EnvelopeRejected("replayed")
        return verified

    def verify_body(self, token: VerifiedToken, body: bytes, now: float | None = None) -> tuple[ExecutionEnvelope, str]:
        """The envelope and request id of a verified token, if `body` is the one it was signed for."""
        now = time.time() if now is None else now
        token.check_unexpired(now)  # again: the body took time to arrive
        if token.body_sha256 != body_digest(body):
            raise EnvelopeRejected("body_mismatch")
        if _body_request_id(body) != token.request_id:
            raise EnvelopeRejected("request_id_mismatch")
        self.replays.add(token.request_id, token.exp + CLOCK_LEEWAY_S, now)  # last: a refused token burns no id
        return token.envelope, token.request_id

    @staticmethod
    def _decode(token: object) -> tuple[bytes, bytes, dict]:
        if not isinstance(token, str) or len(token) > MAX_TOKEN_BYTES or token.count(".") != 1:
            raise EnvelopeRejected("malformed")
        head, tail = token.split(".")
        try:
            payload, signature = _b64decode(head), _b64decode(tail)
            claims = json.loads(payload)
        except (binascii.Error, ValueError, RecursionError):
            raise EnvelopeRejected("malformed") from None
        if not isinstance(claims, dict) or set(claims) != _CLAIMS:
            raise EnvelopeRejected("malformed")
        return payload, signature, claims


def _body_request_id(body: bytes) -> object:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return document.get("request_id") if isinstance(document, dict) else None
