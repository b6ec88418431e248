"""Gateways for tests: an ASGI app under uvicorn in a background thread, or `tenantgate serve`
in a subprocess (with the environment and readiness wait those need)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn

TENANTGATE = str(Path(sys.executable).with_name("tenantgate"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serving(app, *, startup_timeout_s: float = 120.0) -> Iterator[str]:
    """Yields the base URL (http://127.0.0.1:PORT) while uvicorn serves `app`."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server exited during start-up (see the log above)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError("the server did not start in time")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def gateway_env(**settings: str) -> dict[str, str]:
    """This environment without any TENANTGATE_* setting but the test cache, plus `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENANTGATE_")}
    env["TENANTGATE_CACHE_DIR"] = os.environ["TENANTGATE_CACHE_DIR"]
    return env | settings


def wait_ready(base_url: str, process: subprocess.Popen, *, timeout_s: float = 120.0,
               output: Callable[[], str] = lambda: "") -> None:
    """Waits until a `tenantgate serve` subprocess answers /readyz with 200; fails, with its
    output, if it exits or takes longer than timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(base_url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            raise AssertionError(f"the gateway exited during start-up:\n{output()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the gateway did not become ready:\n{output()[-2000:]}")
        time.sleep(0.2)
