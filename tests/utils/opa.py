"""A real OPA server for tests: `opa run --server` on a free loopback port."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from tests.utils.server import free_port


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


def start_opa(opa: str, args: list[str], tmp_path: Path, *, port: int | None = None) -> OpaServer:
    port = port or free_port()
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
