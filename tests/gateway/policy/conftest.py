import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.policy.loader import DEFAULT_POLICY_DIR
from gateway.policy.opa import OPA_VERSION, find_opa

POLICY_DIR = DEFAULT_POLICY_DIR
SAMPLES = {
    name: sample
    for path in sorted((POLICY_DIR / "samples").glob("*.json"))
    for name, sample in json.loads(path.read_text()).items()
}


@pytest.fixture(scope="session")
def opa_bin() -> str:
    """The opa binary. Missing opa skips locally but fails in CI, where these checks must run."""
    opa = find_opa()
    if opa is None:
        message = f"opa {OPA_VERSION} not found: run scripts/install-opa.sh (make test does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return opa


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, *, timeout: float = 15.0, expect: int = 200) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == expect:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


class OpaServer:
    def __init__(self, process: subprocess.Popen, url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_opa(opa: str, args: list[str], tmp_path: Path) -> OpaServer:
    port = free_port()
    log = tmp_path / f"opa-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [opa, "run", "--server", "--addr", f"127.0.0.1:{port}", "--log-level", "info", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    server = OpaServer(process, f"http://127.0.0.1:{port}", log)
    if not wait_http(server.url + "/health"):
        process.kill()
        raise AssertionError(f"opa did not start:\n{server.log_text()}")
    return server


def stop_opa(server: OpaServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture
def opa_server_factory(opa_bin: str, tmp_path: Path) -> Iterator:
    servers: list[OpaServer] = []

    def start(args: list[str]) -> OpaServer:
        server = start_opa(opa_bin, args, tmp_path)
        servers.append(server)
        return server

    yield start
    for server in servers:
        stop_opa(server)


@pytest.fixture(scope="session")
def rsa_key_pem() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return _pems(key)


@pytest.fixture(scope="session")
def ec_key_pem() -> tuple[bytes, bytes]:
    return _pems(ec.generate_private_key(ec.SECP256R1()))


def _pems(key) -> tuple[bytes, bytes]:
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public
