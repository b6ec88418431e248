from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from devkit.issuer import LocalIssuer
from gateway.auth.entra import EntraVerifier
from tests.utils.issuer import running_issuer, verifier_options


@pytest.fixture(scope="session")
def issuer() -> Iterator[LocalIssuer]:
    """One issuer for tests that only read its keys (one RSA key and one server per session)."""
    with running_issuer() as issuer:
        yield issuer


@pytest.fixture
def fresh_issuer() -> Iterator[LocalIssuer]:
    """An issuer of the test's own, for tests that count its requests, rotate keys or stop it."""
    with running_issuer() as issuer:
        yield issuer


@pytest.fixture
async def make_verifier() -> AsyncIterator[Callable[..., EntraVerifier]]:
    """Builds EntraVerifiers that trust an issuer (overrides go to the constructor); closes them."""
    verifiers: list[EntraVerifier] = []

    def make(issuer: LocalIssuer, **overrides: object) -> EntraVerifier:
        verifier = EntraVerifier(**verifier_options(issuer, **overrides))
        verifiers.append(verifier)
        return verifier

    yield make
    for verifier in verifiers:
        await verifier.aclose()
