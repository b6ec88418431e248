"""A LocalIssuer on a free loopback port, and the example tenants tests sign tokens for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.auth.issuer import DEFAULT_AUDIENCE, DEV_CLIENT_ID, LocalIssuer

# Tenants of policies/data/tenants.example.json.
CONTOSO = "2f6c1a7e-5b3d-4e8a-9c0f-1a2b3c4d5e6f"
FABRIKAM = "8d4e2b10-7c6f-4a91-b3d5-e6f708192a3b"
NORTHWIND = "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"
TAILSPIN = "5e7f9a1b-3c5d-4e6f-8a0b-c1d2e3f4a5b6"  # disabled in the example data
ALLOWED_TENANTS = frozenset({CONTOSO, FABRIKAM, NORTHWIND})
AUDIENCES = (DEFAULT_AUDIENCE, DEV_CLIENT_ID)


@contextmanager
def running_issuer(key_dir: Path | None = None) -> Iterator[LocalIssuer]:
    """A started issuer on 127.0.0.1 and a free port; stopped on exit."""
    with LocalIssuer(port=0, key_dir=key_dir) as issuer:
        yield issuer


def verifier_options(issuer: LocalIssuer, **overrides: object) -> dict:
    """EntraVerifier keyword arguments that trust this issuer for both token versions."""
    options: dict = {
        "authority": issuer.base_url,
        "v1_issuer_host": issuer.base_url,
        "audiences": AUDIENCES,
        "tenant_allowed": ALLOWED_TENANTS.__contains__,
    }
    options.update(overrides)
    return options
