"""Signing keys and a real redis-server for the audit tests.

`redis_server` here is one per test (it overrides the session-wide one): the Redis sink
tests stop it (optionally saving its data), freeze it, and start it again on the same
port and directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from redis.backoff import NoBackoff
from redis.retry import Retry

from devkit.server import free_port, stop


@pytest.fixture(scope="session")
def signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="session")
def other_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


class RedisProcess:
    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def client(self, **kwargs: object) -> redis.Redis:
        # No client-side retries: the sink's own backoff is what the tests measure.
        options = {"host": "127.0.0.1", "port": self.port, "socket_timeout": 2.0, "socket_connect_timeout": 1.0,
                   "retry": Retry(NoBackoff(), 0)}
        return redis.Redis(**{**options, **kwargs})

    def start(self) -> None:
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", str(self.workdir), "--logfile", str(self.workdir / "redis.log")]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        with self.client() as client:
            while time.monotonic() < deadline:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if self.process.poll() is not None:
                        raise AssertionError(f"redis-server exited with {self.process.returncode}") from None
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self, *, save: bool = False) -> None:
        """Stops the server; with save, its data survives into the next start()."""
        if self.process is None:
            return
        if save:
            with self.client() as client:
                client.shutdown(save=True)
        stop(self.process, 10)
        self.process = None


@pytest.fixture
def redis_server(redis_binary: str, tmp_path: Path) -> Iterator[RedisProcess]:
    binary = redis_binary
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisProcess(binary, workdir)
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)  # in case a test left it frozen
    server.stop()
