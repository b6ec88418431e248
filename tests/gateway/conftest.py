from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.issuer import LocalIssuer
from tests.utils.issuer import FaultyIssuer
from tests.utils.opa import OpaServer, start_opa, stop_opa


@pytest.fixture
def opa_server_factory(opa_bin: str, tmp_path: Path) -> Iterator:
    servers: list[OpaServer] = []

    def start(args: list[str], *, port: int | None = None) -> OpaServer:
        server = start_opa(opa_bin, args, tmp_path, port=port)
        servers.append(server)
        return server

    yield start
    for server in servers:
        stop_opa(server)


@pytest.fixture(scope="session")
def local_issuer() -> Iterator[LocalIssuer]:
    """A local Entra-style issuer with real RSA keys, serving discovery and JWKS on loopback."""
    with LocalIssuer(port=0) as issuer:
        yield issuer


@pytest.fixture
def faulty_issuer() -> Iterator[FaultyIssuer]:
    """A local issuer that can refuse a tenant as Entra does, or hang."""
    with FaultyIssuer() as issuer:
        yield issuer
