"""A real redis-server on a free loopback port (the test command installs it when absent)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devkit.server import free_port


def find_redis_server() -> str | None:
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None)


class RedisServer:
    """One redis-server process; stop() and start() keep the port, as an outage would.
    With appendonly, every write is fsynced to the AOF, so a kill() and start() bring it back."""

    def __init__(self, binary: str, directory: Path, port: int | None = None, *, appendonly: bool = False) -> None:
        self.binary, self.directory = binary, directory
        self.port = port or free_port()
        self.appendonly = appendonly
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        with (self.directory / f"redis-{self.port}.log").open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "always",
                 "--dir", str(self.directory), "--protected-mode", "yes"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    @contextmanager
    def hung(self) -> Iterator[None]:
        """SIGSTOP for the duration: connections stay open, commands queue and run at SIGCONT."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)
