"""Admissions for limiter tests: generous limits unless a test names the one it binds."""

from __future__ import annotations

import itertools

from gateway.limits import Admission

_ids = itertools.count()


def admission(tenant: str, principal: str = "p1", *, tokens: int = 10, rpm: int = 100, tpm: int = 10_000,
              prpm: int | None = None, ptpm: int | None = None, concurrent: int = 100) -> Admission:
    return Admission(tenant=tenant, principal=principal, request_id=f"r{next(_ids)}", tokens=tokens,
                     requests_per_minute=rpm, tokens_per_minute=tpm,
                     principal_requests_per_minute=prpm or rpm, principal_tokens_per_minute=ptpm or tpm,
                     concurrent_requests=concurrent)
