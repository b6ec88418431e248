"""Authentication: Microsoft Entra ID access tokens in, a verified Principal out."""

from gateway.auth.exceptions import AuthError, AuthUnavailableError, TenantsUnknownError
from gateway.auth.principal import Principal

__all__ = ["AuthError", "AuthUnavailableError", "EntraVerifier", "Principal", "TenantsUnknownError"]


def __getattr__(name: str) -> object:
    # Loaded on first use so `tenantgate --help` does not pay for httpx.
    if name == "EntraVerifier":
        from gateway.auth.entra import EntraVerifier

        return EntraVerifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
