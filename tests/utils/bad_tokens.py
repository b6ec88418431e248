"""A corpus of access tokens the gateway must refuse, built against a running LocalIssuer.

Each case breaks exactly one thing about an otherwise valid token (signed by the issuer's
real key unless the case is about the key), so a refusal proves that one check.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils

from devkit.issuer import LocalIssuer, kid_of, sign_rs256
from gateway.encoding import b64url


@functools.cache
def foreign_rsa_key() -> rsa.RSAPrivateKey:
    """A valid 2048-bit key the issuer never published."""
    return rsa.generate_private_key(65537, 2048)


def _seg(value: object) -> str:
    return b64url(value if isinstance(value, bytes) else json.dumps(value).encode())


def _uint(value: int) -> str:
    return b64url(value.to_bytes((value.bit_length() + 7) // 8, "big"))


def _now() -> int:
    return int(time.time())


class _Corpus:
    def __init__(self, issuer: LocalIssuer, tenant_id: str, audience: str, other: str, disallowed: str) -> None:
        self.issuer, self.tid, self.aud, self.other, self.disallowed = issuer, tenant_id, audience, other, disallowed
        self.kid, self.key = issuer.signing_kid, issuer.private_key()
        self.claims = issuer.claims(tenant_id, audience=audience)
        self.header = {"typ": "JWT", "alg": "RS256", "kid": self.kid}
        self.good = sign_rs256(self.header, self.claims, self.key)
        self.h, self.p, self.s = self.good.split(".")
        self.v2_iss = issuer.issuer_for(tenant_id, "2.0")

    def mint(self, **options: object) -> str:
        return self.issuer.mint(self.tid, **{"audience": self.aud, **options})

    def claim(self, **changes: object) -> str:
        return self.mint(extra_claims=changes)

    def header_with(self, key: rsa.RSAPrivateKey | None = None, **changes: object) -> str:
        return sign_rs256({**self.header, **changes}, self.claims, key or self.key)

    def alg(self, alg: str, sign: Callable[[bytes], bytes] | None = None, *, signature: str = "") -> str:
        """The baseline claims under a header naming alg, signed by sign (or with signature as given)."""
        signing_input = f"{_seg({**self.header, 'alg': alg})}.{self.p}"
        if sign is not None:
            signature = b64url(sign(signing_input.encode()))
        return f"{signing_input}.{signature}"

    def hs256_with(self, secret: bytes) -> str:
        return self.alg("HS256", lambda data: hmac.new(secret, data, hashlib.sha256).digest())

    def public_key_bytes(self, encoding: serialization.Encoding) -> bytes:
        return self.key.public_key().public_bytes(encoding, serialization.PublicFormat.SubjectPublicKeyInfo)

    def es256(self, data: bytes) -> bytes:
        r, s = utils.decode_dss_signature(ec.generate_private_key(ec.SECP256R1()).sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    def pss(self, data: bytes) -> bytes:
        return self.key.sign(data, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())

    def look_alike_host(self) -> str:
        parts = urlsplit(self.v2_iss)
        port = f":{parts.port}" if parts.port else ""
        return parts._replace(netloc=f"{parts.hostname}.attacker.example{port}").geturl()

    def oversized(self, size: int = 16384 + 512) -> str:
        """Just over the default 16 KiB cap, so HTTP servers' own header limits are not hit first."""
        return self.claim(filler="x" * max(0, (size - len(self.good)) * 3 // 4))

    def other_scheme(self) -> str:
        scheme, rest = self.v2_iss.split("://", 1)
        return ("https" if scheme == "http" else "http") + "://" + rest

    def jwk_of(self, key: rsa.RSAPrivateKey) -> dict:
        numbers = key.public_key().public_numbers()
        return {"kty": "RSA", "kid": kid_of(key), "n": _uint(numbers.n), "e": _uint(numbers.e)}

_CASES: list[tuple[str, Callable[[_Corpus], str]]] = [
    *[
        (f"alg-{alg}-{form}", lambda c, alg=alg, form=form: c.alg(alg, signature="" if form == "unsigned" else c.s))
        for alg in ("none", "None", "NONE", "nOnE")
        for form in ("unsigned", "with-signature")
    ],
    ("alg-hs256-public-key-pem", lambda c: c.hs256_with(c.public_key_bytes(serialization.Encoding.PEM))),
    ("alg-hs256-public-key-der", lambda c: c.hs256_with(c.public_key_bytes(serialization.Encoding.DER))),
    ("alg-rs384", lambda c: c.alg("RS384", lambda d: c.key.sign(d, padding.PKCS1v15(), hashes.SHA384()))),
    ("alg-ps256", lambda c: c.alg("PS256", c.pss)),
    ("alg-es256", lambda c: c.alg("ES256", c.es256)),
    ("alg-missing", lambda c: sign_rs256({"typ": "JWT", "kid": c.kid}, c.claims, c.key)),
    ("foreign-key-same-kid", lambda c: c.header_with(foreign_rsa_key())),
    ("foreign-key-own-kid", lambda c: c.header_with(foreign_rsa_key(), kid=kid_of(foreign_rsa_key()))),
    ("unknown-kid", lambda c: c.mint(kid="unknown-kid-0001")),
    ("kid-missing", lambda c: c.mint(headers={"kid": None})),
    ("kid-empty", lambda c: c.mint(headers={"kid": ""})),
    ("kid-not-a-string", lambda c: c.mint(headers={"kid": 7})),
    ("header-jku", lambda c: c.header_with(jku="https://attacker.example/keys")),
    ("header-jwk", lambda c: c.header_with(foreign_rsa_key(), jwk=c.jwk_of(foreign_rsa_key()))),
    ("header-x5u", lambda c: c.header_with(x5u="https://attacker.example/cert.pem")),
    ("header-x5c", lambda c: c.header_with(x5c=["MIIBszCCAVmgAwIBAgIUQ0VSVA=="])),
    ("header-crit", lambda c: c.header_with(crit=["exp"], exp=1)),
    ("header-b64-false", lambda c: c.header_with(b64=False)),
    ("tampered-payload", lambda c: f"{c.h}.{_seg({**c.claims, 'scp': 'Inference.Invoke Admin.All'})}.{c.s}"),
    ("signature-of-another-token", lambda c: f"{c.h}.{c.p}.{c.mint().split('.')[2]}"),
    ("signature-empty", lambda c: f"{c.h}.{c.p}."),
    ("wrong-audience", lambda c: c.mint(audience="api://someone-else")),
    ("audience-list", lambda c: c.claim(aud=[c.aud])),
    ("wrong-issuer", lambda c: c.claim(iss=f"https://evil.example/{c.tid}/v2.0")),
    ("issuer-missing", lambda c: c.claim(iss=None)),
    ("issuer-trailing-slash", lambda c: c.claim(iss=c.v2_iss + "/")),
    ("issuer-look-alike-host", lambda c: c.claim(iss=c.look_alike_host())),
    ("issuer-real-entra-host", lambda c: c.claim(iss=f"https://login.microsoftonline.com/{c.tid}/v2.0")),
    ("issuer-other-scheme", lambda c: c.claim(iss=c.other_scheme())),
    ("issuer-other-tenant", lambda c: c.claim(iss=c.issuer.issuer_for(c.other, "2.0"))),
    ("issuer-upper-case-tid", lambda c: c.claim(iss=c.issuer.issuer_for(c.tid.upper(), "2.0"))),
    ("issuer-upper-case", lambda c: c.claim(iss=c.v2_iss.upper())),
    ("issuer-v1-on-v2-token", lambda c: c.claim(iss=c.issuer.issuer_for(c.tid, "1.0"))),
    ("issuer-v2-on-v1-token", lambda c: c.mint(version="1.0", extra_claims={"iss": c.v2_iss})),
    ("tid-not-allowed", lambda c: c.issuer.mint(c.disallowed, audience=c.aud)),
    ("tid-other-tenant", lambda c: c.claim(tid=c.other)),
    ("tid-not-a-guid", lambda c: c.claim(tid="contoso.onmicrosoft.com")),
    ("tid-braced-guid", lambda c: c.claim(tid="{" + c.tid + "}")),
    ("tid-missing", lambda c: c.claim(tid=None)),
    ("ver-missing", lambda c: c.claim(ver=None)),
    ("ver-unknown", lambda c: c.claim(ver="3.0")),
    ("expired", lambda c: c.claim(iat=_now() - 7200, nbf=_now() - 7200, exp=_now() - 3600)),
    ("nbf-in-the-future", lambda c: c.claim(nbf=_now() + 3600, exp=_now() + 7200)),
    ("iat-in-the-future", lambda c: c.claim(iat=_now() + 3600, exp=_now() + 7200)),
    ("exp-missing", lambda c: c.claim(exp=None)),
    ("exp-a-string", lambda c: c.claim(exp=str(_now() + 3600))),
    ("exp-nan", lambda c: c.claim(exp=float("nan"))),
    ("iat-missing", lambda c: c.claim(iat=None)),
    ("oid-missing", lambda c: c.claim(oid=None)),
    ("oid-not-a-guid", lambda c: c.claim(oid="someone@contoso.example")),
    ("azp-missing", lambda c: c.claim(azp=None)),
    ("roles-without-idtyp-app", lambda c: c.mint(scopes=(), roles=("Inference.Invoke.All",))),
    ("roles-on-a-user-token", lambda c: c.mint(roles=("Inference.Invoke.All",))),
    ("idtyp-app-with-scp", lambda c: c.mint(app=True, extra_claims={"scp": "Inference.Invoke"})),
    ("idtyp-app-without-roles", lambda c: c.mint(app=True, extra_claims={"roles": None})),
    ("scp-and-roles-missing", lambda c: c.mint(scopes=())),
    ("duplicate-tid-member", lambda c: sign_rs256_raw(c, json.dumps(c.claims)[:-1] + f', "tid": "{c.other}"}}')),
    ("empty-string", lambda c: ""),
    ("two-segments", lambda c: f"{c.h}.{c.p}"),
    ("five-segments", lambda c: f"{c.h}.{c.p}.{c.s}.{b64url(b'iv')}.{b64url(b'tag')}"),
    ("malformed-base64", lambda c: f"{c.h}.{c.p[:10]}!{c.p[11:]}.{c.s}"),
    ("padded-base64", lambda c: f"{c.h}==.{c.p}.{c.s}"),
    ("embedded-space", lambda c: c.good[:40] + " " + c.good[40:]),
    ("non-json-header", lambda c: f"{_seg(b'not json at all')}.{c.p}.{c.s}"),
    ("header-json-array", lambda c: f"{_seg([c.header])}.{c.p}.{c.s}"),
    ("payload-json-array", lambda c: f"{c.h}.{_seg([c.claims])}.{c.s}"),
    ("payload-json-string", lambda c: f"{c.h}.{_seg('claims')}.{c.s}"),
    ("oversized", lambda c: c.oversized()),
    ("non-ascii", lambda c: c.good[:40] + "é" + c.good[40:]),
]

CASE_IDS = tuple(case_id for case_id, _ in _CASES)


def sign_rs256_raw(c: _Corpus, payload_json: str) -> str:
    """Signs payload text as it is (for JSON that json.dumps would never produce)."""
    signing_input = f"{c.h}.{_seg(payload_json.encode())}"
    return f"{signing_input}.{b64url(c.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256()))}"


def bad_token_cases(
    issuer: LocalIssuer, tenant_id: str, audience: str, *, other_tenant_id: str, disallowed_tenant_id: str
) -> list[tuple[str, str]]:
    """(case id, token) pairs, in CASE_IDS order; every token must be refused with a 401.

    tenant_id and other_tenant_id must be tenants the verifier's tenant_allowed accepts,
    disallowed_tenant_id one it refuses; audience one it accepts. The issuer must be the one
    the verifier trusts (authority and v1_issuer_host both its base_url), already started.
    """
    corpus = _Corpus(issuer, tenant_id, audience, other_tenant_id, disallowed_tenant_id)
    return [(case_id, build(corpus)) for case_id, build in _CASES]
