"""A real OPA server for tests: `opa run --server` on a free loopback port; a bundle service; and
reading and rewriting a bundle tarball (to tamper with one OPA built)."""

from __future__ import annotations

import http.server
import io
import ssl
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import httpx

from devkit.server import free_port


def write_tarball(out: Path, files: dict[str, bytes]) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo("/" + name)
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    Path(out).write_bytes(buffer.getvalue())


def read_tarball(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, mode="r:gz") as tar:
        return {
            member.name.lstrip("/"): tar.extractfile(member).read()
            for member in tar.getmembers()
            if member.isfile()
        }


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
        server.process.wait()


class BundleServer:
    """Serves one bundle file at /bundles/tenantgate.tar.gz on loopback, the way a bundle service
    (Blob Storage) would: over HTTPS with tls (certificate, key), and with bearer only to a request
    that carries that access token (any other gets 401). `requests` records (method, path, status)
    of every request, uploads included (a POST gets 405)."""

    RESOURCE = "/bundles/tenantgate.tar.gz"

    def __init__(self, path: Path, *, tls: tuple[Path, Path] | None = None, bearer: str | None = None) -> None:
        self.path = path
        self.requests: list[tuple[str, str, int]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                if self.path.split("?")[0] != server.RESOURCE:
                    status = 404
                elif bearer is not None and self.headers.get("Authorization") != f"Bearer {bearer}":
                    status = 401
                else:
                    status = 200
                server.requests.append(("GET", self.path, status))
                if status != 200:
                    self.send_error(status)
                    return
                body = server.path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                server.requests.append(("POST", self.path, 405))
                self.send_error(405)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
