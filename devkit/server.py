"""Gateways for tests: an ASGI app under uvicorn in a background thread, or `tenantgate serve`
in a subprocess (with the environment and readiness wait those need, and what a test measures
of the process: its memory and its open sockets)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

TENANTGATE = str(Path(sys.executable).with_name("tenantgate"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerStartError(RuntimeError):
    """The server exited during start-up; the message carries what uvicorn logged, traceback included."""

    @property
    def address_in_use(self) -> bool:
        return "[Errno 98]" in str(self) or "address already in use" in str(self).lower()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def serving(app, *, startup_timeout_s: float = 120.0) -> Iterator[str]:
    """Yields the base URL (http://127.0.0.1:PORT) while uvicorn serves `app`. The listening
    socket is bound here and handed to uvicorn, so no other process can take the port between
    choosing it and serving on it. A start-up failure raises ServerStartError with uvicorn's log
    of it (a session fixture's error is all that the tests after it show)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    records = _Records()
    uvicorn_log = logging.getLogger("uvicorn.error")  # after Config: its dictConfig resets this logger
    uvicorn_log.addHandler(records)

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except SystemExit:  # uvicorn's way out of a failed start-up; the log says why
            pass

    thread = threading.Thread(target=run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive():
                sock.close()
                raise ServerStartError("the server exited during start-up:\n" + "\n".join(records.lines))
            if time.monotonic() > deadline:
                server.should_exit = True
                raise TimeoutError("the server did not start in time:\n" + "\n".join(records.lines))
            time.sleep(0.02)
    finally:
        uvicorn_log.removeHandler(records)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def gateway_env(**settings: str) -> dict[str, str]:
    """This environment without any TENANTGATE_* setting but the test cache, plus `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENANTGATE_")}
    env["TENANTGATE_CACHE_DIR"] = os.environ["TENANTGATE_CACHE_DIR"]
    return env | settings


def wait_ready(base_url: str, process: subprocess.Popen, *, timeout_s: float = 120.0,
               output: Callable[[], str] = lambda: "") -> None:
    """Waits until a `tenantgate serve` (or `engine serve`) subprocess answers /readyz with 200; fails, with its
    output, if it exits or takes longer than timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(base_url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            raise AssertionError(f"the server exited during start-up:\n{output()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not become ready:\n{output()[-2000:]}")
        time.sleep(0.2)


@dataclass
class ServeProcess:
    process: subprocess.Popen
    port: int
    stdout: Path
    stderr: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/PID/status")

    def open_sockets(self) -> int:
        fds = Path(f"/proc/{self.process.pid}/fd")
        count = 0
        for fd in fds.iterdir():
            try:
                count += os.readlink(fd).startswith("socket:")
            except FileNotFoundError:  # closed while we looked
                pass
        return count


@contextmanager
def tenantgate_serve(directory: Path, env: dict[str, str], *args: str,
                     command: tuple[str, ...] = ("serve",)) -> Iterator[ServeProcess]:
    """`tenantgate serve` (or another serving `command`, such as ("engine", "serve")) on a free
    loopback port, its stdout and stderr in files under `directory`; yields once it is ready, and
    stops it (SIGTERM, then SIGKILL after 30 s) when the block ends."""
    port = free_port()
    stdout, stderr = directory / f"serve-{port}.stdout", directory / f"serve-{port}.stderr"
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen([TENANTGATE, *command, "--port", str(port), *args], env=env, stdout=out, stderr=err)
    try:
        wait_ready(f"http://127.0.0.1:{port}", process, output=stderr.read_text)
        yield ServeProcess(process, port, stdout, stderr)
    finally:
        stop(process)


def stop(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited after timeout_s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
