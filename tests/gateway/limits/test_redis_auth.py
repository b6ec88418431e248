"""The Redis limiter authenticates with a password and talks TLS, as configured by the URL;
a wrong password fails closed like an outage (the request is refused, never a 5xx)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from devkit.server import free_port
from gateway.limits import Admission, QuotaStoreUnavailable
from gateway.limits.redis import RedisLimiter, redis_client
from tests.utils.tls import write_certificates

ADMISSION = Admission(tenant="auth-test", principal="p", request_id="r1", tokens=10, requests_per_minute=100,
                      tokens_per_minute=10_000, principal_requests_per_minute=100, principal_tokens_per_minute=10_000,
                      concurrent_requests=10)


def _start(redis_binary: str, directory: Path, *args: str) -> subprocess.Popen:
    process = subprocess.Popen([redis_binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", str(directory), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    assert process.poll() is None, "redis-server refused the configuration"
    return process


async def _admits(url: str, **options) -> bool:
    limiter = RedisLimiter(redis_client(url, timeout_s=1.0, **options))
    try:
        for _ in range(50):  # the server may still be starting
            try:
                await limiter.admit(ADMISSION)
                return True
            except QuotaStoreUnavailable:
                limiter._down_until = 0.0
                time.sleep(0.05)
        return False
    finally:
        await limiter.aclose()


async def test_password_from_the_url_is_used_and_a_wrong_one_fails_closed(redis_binary, tmp_path) -> None:
    port = free_port()
    process = _start(redis_binary, tmp_path, "--port", str(port), "--requirepass", "s3cret-pass")
    try:
        assert await _admits(f"redis://:s3cret-pass@127.0.0.1:{port}/0")
        limiter = RedisLimiter(redis_client(f"redis://:wrong@127.0.0.1:{port}/0", timeout_s=1.0))
        with pytest.raises(QuotaStoreUnavailable):
            await limiter.admit(ADMISSION)
        await limiter.aclose()
    finally:
        process.terminate()
        process.wait(10)


async def test_tls_with_a_verified_server_certificate(redis_binary, tmp_path) -> None:
    ca, cert, key = write_certificates(tmp_path)
    port = free_port()
    process = _start(redis_binary, tmp_path, "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                     "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
                     "--requirepass", "tls-pass")
    try:
        assert await _admits(f"rediss://:tls-pass@127.0.0.1:{port}/0?ssl_ca_certs={ca}")
        # Without the CA the server's certificate does not verify: refused, fail closed.
        limiter = RedisLimiter(redis_client(f"rediss://:tls-pass@127.0.0.1:{port}/0", timeout_s=1.0))
        with pytest.raises(QuotaStoreUnavailable):
            await limiter.admit(ADMISSION)
        await limiter.aclose()
    finally:
        process.terminate()
        process.wait(10)


def test_entra_authentication_uses_a_credential_provider() -> None:
    """Entra ID for Azure Managed Redis: the client gets redis-entraid's provider (no Azure here to log in to)."""
    client = redis_client("rediss://example.redis.azure.net:10000/0", timeout_s=1.0, entra=True)
    provider = client.connection_pool.connection_kwargs["credential_provider"]
    assert type(provider).__name__ == "EntraIdCredentialsProvider"
