"""What the gateway itself costs: the full request path in front of a null engine, against a
bare endpoint on the same server stack that returns the same body with none of the work.

Both servers run the same way (uvicorn, one process each, FastAPI, httptools), and are
measured in the same run, alternating, from a client in this process:

- gateway: Entra token verification (RS256, JWKS from a local issuer), Rego decision
  (embedded regorus, decision cache on), clamp and envelope, GCRA limits (in-process),
  the null engine (16 fixed tokens, no model), usage, and a record in the hash-chained,
  signed audit trail (a file);
- bare: POST /v1/chat/completions reads the body and returns the gateway's response bytes.

Printed: at concurrency 1, p50/p99 latency of each and the difference (target: added
<= 1.5 ms p50, <= 5 ms p99); at concurrency 32, requests/s of each and the ratio. Two
request mixes: the same request every time (the decision cache hits), and requests whose
temperatures differ (every decision is evaluated). With --profile, the gateway server runs
under cProfile and the functions where its time goes are printed.

    .venv/bin/python bench/gateway_overhead.py              # 2,000 requests per measurement
    .venv/bin/python bench/gateway_overhead.py --n 300      # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from fastapi import Request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devkit.issuer import LocalIssuer
from devkit.server import free_port
from gateway.policy.loader import DEFAULT_POLICY_DIR

TENANT = "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"  # Northwind Labs in the example data, limits raised
AUDIENCE = "api://tenantgate"
TARGET_P50_MS, TARGET_P99_MS = 1.5, 5.0
MAX_TOKENS = 16


def bench_data(directory: Path) -> Path:
    tenants = json.loads((DEFAULT_POLICY_DIR / "data" / "tenants.example.json").read_text())
    limits = tenants["tenants"][TENANT]["limits"]
    limits.update(requests_per_minute=10**9, tokens_per_minute=10**12, max_tokens=1024, max_context_tokens=32768,
                  principal_requests_per_minute=10**9, principal_tokens_per_minute=10**12, concurrent_requests=10**6)
    (directory / "tenants.json").write_text(json.dumps(tenants))
    return directory


# -- servers (run as `python bench/gateway_overhead.py --serve gateway|bare`) -------------------


def serve_gateway(port: int, issuer_url: str, data_dir: str, audit_file: str) -> None:
    import uvicorn

    from gateway.app import create_app
    from gateway.settings import Settings

    settings = Settings(engine="null", served_model_name="demo", authority=issuer_url, v1_issuer_host=issuer_url,
                        audiences=[AUDIENCE], policy_data_dir=Path(data_dir), metrics_port=0,
                        policy_reload_interval_s=0, audit_stdout=False, audit_file=Path(audit_file),
                        audit_signing_key=Path(audit_file).with_name("audit-signing.pem"))
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_bare(port: int, body_file: str) -> None:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import Response

    body = Path(body_file).read_bytes()
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Response:
        await request.body()
        return Response(body, media_type="application/json")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start_server(args: list[str], port: int, profile: Path | None = None, script: str = __file__) -> subprocess.Popen:
    """`script --serve ARGS --port PORT` in a process of its own, once it answers."""
    command = [sys.executable]
    if profile is not None:
        command += ["-m", "cProfile", "-o", str(profile)]
    command += [str(Path(script).resolve()), "--serve", *args, "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
            return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server {args[0]} did not start")


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


# -- the client -------------------------------------------------------------------------------


def request_bodies(mix: str, n: int, offset: int = 0) -> list[bytes]:
    bodies = []
    message = " ".join(["token"] * 40)
    for i in range(offset, offset + n):
        # The temperature is part of the policy input: distinct values, distinct decisions,
        # with the same body size and the same answer.
        temperature = 1.0 if mix == "same" else round(1e-4 * (i % 20000), 4)
        bodies.append(json.dumps({"model": "demo", "max_tokens": MAX_TOKENS, "temperature": temperature,
                                  "messages": [{"role": "user", "content": message}]}).encode())
    return bodies


class Connection:
    """A minimal HTTP/1.1 keep-alive client: the load generator must cost far less than the
    servers it measures (httpx's pool costs more than the bare endpoint on this machine)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(*await asyncio.open_connection(host, port))

    async def post(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length = 0
        for line in header.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def run_load(url: str, token: str, bodies: list[bytes], concurrency: int,
                   path: str = "/v1/chat/completions") -> tuple[list[float], float]:
    target = httpx.URL(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: ").encode()
    latencies: list[float] = []
    connections = [await Connection.open(target.host, target.port) for _ in range(concurrency)]
    queue = iter(bodies)

    async def worker(connection: Connection) -> None:
        for body in queue:
            start = time.perf_counter()
            status, text = await connection.post(head, body)
            latencies.append(time.perf_counter() - start)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {text[:200]!r}")

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in connections))
        elapsed = time.perf_counter() - start
    finally:
        for connection in connections:
            connection.close()
    return latencies, elapsed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(servers: dict[str, str], token: str, mix: str, n: int, rounds: int) -> dict[str, dict[str, float]]:
    """Alternates the servers for `rounds` rounds so drift on a noisy machine hits both alike."""
    results = {name: {"lat": [], "rps": []} for name in servers}
    # Each measurement gets bodies of its own, so "distinct" never meets a cached decision.
    offset = 0
    for _ in range(rounds):
        for name, url in servers.items():
            asyncio.run(run_load(url, token, request_bodies("same", 50), 1))  # warm connections and caches
            sequential = request_bodies(mix, n // rounds, offset)
            concurrent = request_bodies(mix, n, offset + n // rounds)
            offset += n // rounds + n
            latencies, _ = asyncio.run(run_load(url, token, sequential, 1))
            results[name]["lat"].extend(latencies)
            _, elapsed = asyncio.run(run_load(url, token, concurrent, 32))
            results[name]["rps"].append(len(concurrent) / elapsed)
    summary = {}
    for name, r in results.items():
        summary[name] = {"p50": percentile(r["lat"], 0.5) * 1e3, "p99": percentile(r["lat"], 0.99) * 1e3,
                         "rps": statistics.median(r["rps"])}
    return summary


def print_profile(path: Path, limit: int = 25) -> None:
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime")
    print(f"\nWhere the gateway's time goes (cProfile, top {limit} by own time):")
    stats.print_stats(limit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per server")
    parser.add_argument("--profile", action="store_true", help="run the gateway under cProfile and print it")
    parser.add_argument("--serve", choices=["gateway", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--issuer-url", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--audit-file", help=argparse.SUPPRESS)
    parser.add_argument("--body-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "gateway":
        serve_gateway(args.port, args.issuer_url, args.data_dir, args.audit_file)
        return 0
    if args.serve == "bare":
        serve_bare(args.port, args.body_file)
        return 0

    os.environ.setdefault("TENANTGATE_CACHE_DIR", tempfile.mkdtemp(prefix="tenantgate-bench-"))
    with tempfile.TemporaryDirectory() as tmp, LocalIssuer(port=0) as issuer:
        tmp_path = Path(tmp)
        data_dir = bench_data(tmp_path)
        token = issuer.mint(TENANT, audience=AUDIENCE, lifetime_s=6 * 3600)
        profile = tmp_path / "gateway.prof" if args.profile else None
        gateway_port, bare_port = free_port(), free_port()
        gateway = start_server(["gateway", "--issuer-url", issuer.base_url, "--data-dir", str(data_dir),
                                "--audit-file", str(tmp_path / "audit.log")], gateway_port, profile)
        try:
            sample = httpx.post(f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                                content=request_bodies("same", 1)[0],
                                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            sample.raise_for_status()
            (tmp_path / "body.json").write_bytes(sample.content)
            bare = start_server(["bare", "--body-file", str(tmp_path / "body.json")], bare_port)
            servers = {"gateway": f"http://127.0.0.1:{gateway_port}", "bare": f"http://127.0.0.1:{bare_port}"}
            print(f"gateway_overhead: {args.n} requests per measurement, {args.rounds} alternating rounds, "
                  f"null engine ({MAX_TOKENS} tokens), response {len(sample.content)} bytes")
            try:
                for mix, label in (("same", "same request (decision cache hits)"),
                                   ("distinct", "distinct requests (every decision evaluated)")):
                    s = measure(servers, token, mix, args.n, args.rounds)
                    g, b = s["gateway"], s["bare"]
                    added50, added99 = g["p50"] - b["p50"], g["p99"] - b["p99"]
                    print(f"\n{label}")
                    print(f"  concurrency 1   p50 ms: gateway {g['p50']:.3f}  bare {b['p50']:.3f}  added {added50:.3f}"
                          f"  (target <= {TARGET_P50_MS}: {'met' if added50 <= TARGET_P50_MS else 'MISSED'})")
                    print(f"                  p99 ms: gateway {g['p99']:.3f}  bare {b['p99']:.3f}  added {added99:.3f}"
                          f"  (target <= {TARGET_P99_MS}: {'met' if added99 <= TARGET_P99_MS else 'MISSED'})")
                    print(f"  concurrency 32  req/s:  gateway {g['rps']:.0f}  bare {b['rps']:.0f}"
                          f"  ratio {g['rps'] / b['rps']:.2f}")
            finally:
                stop_server(bare)
        finally:
            stop_server(gateway)
        entries = [json.loads(line) for line in (tmp_path / "audit.log").open()]
        records = sum(1 for e in entries if e.get("type") == "record")
        print(f"\naudit trail written by the gateway: {records} records, {len(entries) - records} signed checkpoints")
        if profile is not None and profile.exists():
            print_profile(profile)
            if os.environ.get("KEEP_PROFILE"):
                import shutil
                shutil.copy(profile, os.environ["KEEP_PROFILE"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
