"""The verified caller: who (tenant, object), through which app, with which permissions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gateway.auth.claims import NO_SESSION_CLAIMS, SessionClaims, session_claims
from gateway.auth.exceptions import AuthError

_GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_MAX_PERMISSIONS = 256
_MAX_PERMISSION_LEN = 256


def canonical_guid(value: object) -> str | None:
    """The lower-case form of a canonical 8-4-4-4-12 GUID string, or None for anything else."""
    if isinstance(value, str) and _GUID.fullmatch(value):
        return value.lower()
    return None


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str
    object_id: str
    app_id: str
    scopes: tuple[str, ...]
    roles: tuple[str, ...]
    idtyp: Literal["user", "app"]
    token_version: Literal["1.0", "2.0"]
    # How and when the caller signed in (Conditional Access reads them; gateway/auth/claims.py).
    session: SessionClaims = NO_SESSION_CLAIMS

    def policy_input(self) -> dict:
        """The `principal` object of the Rego input document."""
        return {
            "tenant_id": self.tenant_id,
            "object_id": self.object_id,
            "app_id": self.app_id,
            "idtyp": self.idtyp,
            "scopes": list(self.scopes),
            "roles": list(self.roles),
            **self.session.policy_input(),
        }

    @classmethod
    def from_claims(cls, claims: dict) -> Principal:
        """Builds the principal from claims whose signature, issuer and lifetime are checked.

        Identity is (tid, oid), never a name, e-mail or upn. A token is either delegated
        (`scp`, no `roles`) or app-only (`idtyp` "app" with `roles`, no `scp`); anything
        in between is refused, so app roles can never ride on a user token.
        """
        version = claims.get("ver")
        if version not in ("1.0", "2.0"):
            raise AuthError("unsupported_token_version")
        tenant_id = canonical_guid(claims.get("tid"))
        if tenant_id is None:
            raise AuthError("invalid_tenant")
        object_id = _required_guid(claims, "oid")
        app_id = _required_guid(claims, "azp" if version == "2.0" else "appid")
        scopes = _scopes(claims)
        roles = _roles(claims)
        idtyp = claims.get("idtyp")
        if idtyp not in (None, "user", "app"):
            raise AuthError("invalid_claim")
        if idtyp == "app":
            if scopes or not roles:
                raise AuthError("invalid_token_type")
        elif roles or not scopes:
            raise AuthError("invalid_token_type")
        return cls(
            tenant_id=tenant_id,
            object_id=object_id,
            app_id=app_id,
            scopes=scopes,
            roles=roles,
            idtyp="app" if idtyp == "app" else "user",
            token_version=version,
            session=session_claims(claims),
        )


def _required_guid(claims: dict, name: str) -> str:
    if name not in claims:
        raise AuthError("missing_claim")
    value = canonical_guid(claims[name])
    if value is None:
        raise AuthError("invalid_claim")
    return value


def _scopes(claims: dict) -> tuple[str, ...]:
    if "scp" not in claims:
        return ()
    value = claims["scp"]
    if not isinstance(value, str) or len(value) > _MAX_PERMISSIONS * _MAX_PERMISSION_LEN:
        raise AuthError("invalid_claim")
    scopes = tuple(value.split())
    if not scopes or len(scopes) > _MAX_PERMISSIONS or any(len(s) > _MAX_PERMISSION_LEN for s in scopes):
        raise AuthError("invalid_claim")
    return scopes


def _roles(claims: dict) -> tuple[str, ...]:
    if "roles" not in claims:
        return ()
    value = claims["roles"]
    if not isinstance(value, list) or not value or len(value) > _MAX_PERMISSIONS:
        raise AuthError("invalid_claim")
    if not all(isinstance(r, str) and 0 < len(r) <= _MAX_PERMISSION_LEN for r in value):
        raise AuthError("invalid_claim")
    return tuple(value)
