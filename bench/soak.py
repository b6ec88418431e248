"""A bounded soak of `tenantgate serve` on the real model, run the way a person runs the product:
a real redis-server, a local Entra-style issuer with real RSA keys, the gateway as a subprocess
(the embedded engine, Redis quotas, the audit trail in a file and a Redis Stream, signed with a
key made by `tenantgate audit keygen`), and clients on the official openai SDK (AsyncOpenAI,
max_retries=0) over 127.0.0.1 only.

For --duration seconds (default 300, at most 600), --concurrency workers send chat and
completions requests, streaming and not, short and longer English questions, max_tokens 16-64,
as two tenants (Northwind with room to spare; Fabrikam with concurrent_requests 2). A bounded
share (--abuse, default 0.2) misbehaves: streams dropped after their first token, invalid
bodies (a 4xx expected), bad tokens (401 expected), and bursts of requests from Contoso, whose
300 tokens per minute run out (429 expected once they do).

Then, with the same load running, two fault phases of --phase-s seconds each (--phases):
- disk: the audit file lives on a tmpfs of its own (mounting it needs root); the phase fills it,
  holds it full, then frees it. While it is full, requests may be refused (503 audit_unavailable,
  or a stream ended by that error), never acknowledged without their record;
- redis: redis-server is stopped, held down, and started again on its port (its AOF keeps the
  audit stream, the anchors and the leases). While it is down, admissions fail closed (429
  quota_store_unavailable); once it answers, none is refused.

What it proves (issues 11 and 24): under that load
- no request gets a 5xx, a transport error or a broken stream, and every answer is one the
  request could expect (a bad token is never served, a good one never refused but for quota);
- the server's RSS after the load is about what it was after the warm-up;
- when the load stops, every concurrency lease in Redis and every KV block is free;
- the audit trail the gateway wrote (file and stream) passes `tenantgate audit verify --strict`;
- every acknowledged request (a 200, a stream to its end) has its record in the file trail, the
  full disk included; and no request is refused for the quota store while Redis answers.

Printed: statuses by code (and the 5xx count), p50/p99 latency and TTFT per route and stream,
completion tokens/s, RSS at start/end/peak, leases and KV blocks in use at the end, the verify
verdicts, the load average at start and end. Exit status 1 if any check fails or the soak
could not run (the error is printed); everything it started is stopped and removed either way.

    .venv/bin/python bench/soak.py                                   # 300 s, 8 workers, smollm2-135m-instruct
    .venv/bin/python bench/soak.py --model demo --duration 60        # a quick smoke
    .venv/bin/python bench/soak.py --duration 120 --concurrency 4    # a loaded or small machine
    .venv/bin/python bench/soak.py --phases redis                    # no root: no full-disk phase
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devkit.disk import fill, mount_tmpfs, unmount
from devkit.issuer import LocalIssuer
from devkit.redis import RedisServer, find_redis_server
from devkit.server import TENANTGATE, free_port, gateway_env, wait_ready
from engine import served_model_name
from engine.paths import CACHE_DIR_ENV, default_cache_dir
from gateway.audit.sinks import rotated_files
from gateway.policy.loader import DEFAULT_POLICY_DIR

MAX_DURATION_S = 600
MAX_REQUESTS = 200_000  # a second bound on the load loop, beside the clock
REQUEST_TIMEOUT_S = 120.0
SETTLE_S = 2.0
AUDIENCE = "api://tenantgate"
AUDIT_STREAM = "soak:audit"
KV_USED = 'tenantgate_kv_blocks{state="used"}'
PHASES = ("disk", "redis")
AUDIT_DISK_BYTES = 64 << 20  # the audit file's own tmpfs: room for the soak's records, quick to fill
RECOVERY_TIMEOUT_S = 60.0

NORTHWIND = "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"  # steady traffic: its limits raised out of the way
FABRIKAM = "8d4e2b10-7c6f-4a91-b3d5-e6f708192a3b"  # concurrent_requests 2: some requests refused with 429
CONTOSO = "2f6c1a7e-5b3d-4e8a-9c0f-1a2b3c4d5e6f"  # 300 tokens per minute: the over-quota bursts
TENANT_NAMES = {NORTHWIND: "northwind", FABRIKAM: "fabrikam", CONTOSO: "contoso"}
ROOMY = dict(requests_per_minute=10**6, tokens_per_minute=10**9, principal_requests_per_minute=10**6,
             principal_tokens_per_minute=10**9, max_tokens=256, max_context_tokens=2048)
LIMITS = {NORTHWIND: ROOMY | {"concurrent_requests": 1000},
          FABRIKAM: ROOMY | {"concurrent_requests": 2},
          CONTOSO: ROOMY | {"tokens_per_minute": 300, "principal_tokens_per_minute": 300,
                            "concurrent_requests": 1000}}

# What a worker sends, and how often (the abuse kinds scaled to --abuse in total).
KINDS = {"northwind": 0.6, "fabrikam": 0.4}
ABUSE = {"disconnect": 0.3, "invalid": 0.25, "bad_token": 0.2, "over_quota": 0.25}
OVER_QUOTA_BURST = 4  # Contoso's requests come this many at once: together they reserve more than its minute

SHORT = [
    "What is the capital of France?",
    "How many days are there in a leap year?",
    "Why is the sky blue?",
    "What does a compiler do?",
    "Name three primary colours.",
    "What is the boiling point of water at sea level?",
    "Who wrote Pride and Prejudice?",
    "What is photosynthesis?",
    "How do I reverse a list in Python?",
    "What is the difference between weather and climate?",
]
LONG = [
    "I am planning a three-day trip to Lisbon in early spring with two children aged six and nine. "
    "We like museums, gardens and easy walks, but not long queues or late nights. We will stay near "
    "the river and use public transport. Could you suggest a simple plan for each day, with one "
    "indoor option in case it rains?",
    "Our team keeps missing deadlines because tasks are handed over between four people and nobody "
    "owns the whole feature. Meetings are long and notes are scattered across chat threads and "
    "documents. What are two or three practical changes a small team could try next week to make "
    "ownership clearer and hand-overs faster?",
    "Explain, for a curious teenager, how a refrigerator keeps food cold. Cover what the compressor "
    "does, why the back of the fridge feels warm, and why leaving the door open does not cool the "
    "kitchen. Keep it short and avoid equations.",
    "A customer writes: 'I ordered a blue jacket in size medium two weeks ago, the tracking page has "
    "not changed for six days and nobody answers the phone.' Draft a short, polite reply from the "
    "support team that apologises, explains what happens next and offers a concrete remedy.",
]


@dataclass
class Result:
    kind: str
    route: str  # chat or completions
    stream: bool
    status: str  # an HTTP code, or timeout / connection / stream-error / incomplete
    expected: bool
    latency_s: float
    ttft_s: float | None = None
    completion_tokens: int = 0
    started: float = 0.0  # time.monotonic() when it was sent
    request_id: str | None = None  # the answer's id (a 200)
    code: str | None = None  # the error's code (a refusal)

    @property
    def ended(self) -> float:
        return self.started + self.latency_s


@dataclass
class Fault:
    """A fault phase: from its start until the store took writes (answered) again; a request that
    overlaps it may be refused with `code`."""

    name: str
    code: str
    began: float
    ended: float

    def covers(self, result: Result) -> bool:
        return result.started <= self.ended and result.ended >= self.began


# -- setting up: data, keys, servers ----------------------------------------------------------


def soak_data(directory: Path, model: str) -> Path:
    """The example tenants, with limits for the soak and the served model among their models."""
    data = json.loads((DEFAULT_POLICY_DIR / "data" / "tenants.example.json").read_text())
    for tenant, limits in LIMITS.items():
        entry = data["tenants"][tenant]
        entry["limits"].update(limits)
        entry["models"] = sorted(set(entry["models"]) | {model})
    (directory / "tenants.json").write_text(json.dumps(data, indent=2))
    return directory


def audit_keygen(directory: Path) -> tuple[Path, Path]:
    subprocess.run([TENANTGATE, "audit", "keygen", "--out", str(directory)], check=True, capture_output=True,
                   timeout=60)
    return directory / "audit-signing.pem", directory / "audit-signing.pub.pem"


def start_gateway(args: argparse.Namespace, tmp: Path, issuer: LocalIssuer, redis_url: str, key: Path,
                  audit_file: Path, stack: ExitStack) -> tuple[subprocess.Popen, str, str]:
    port, metrics_port = free_port(), free_port()
    env = gateway_env(**{
        "TENANTGATE_MODEL": args.model, "TENANTGATE_KV_CACHE_MEMORY_BYTES": str(args.kv_cache_bytes),
        "TENANTGATE_AUTHORITY": issuer.base_url, "TENANTGATE_V1_ISSUER_HOST": issuer.base_url,
        "TENANTGATE_AUDIENCES": AUDIENCE, "TENANTGATE_POLICY_DATA_DIR": str(soak_data(tmp, args.model)),
        "TENANTGATE_REDIS_URL": redis_url, "TENANTGATE_AUDIT_FILE": str(audit_file),
        "TENANTGATE_AUDIT_SIGNING_KEY": str(key), "TENANTGATE_AUDIT_REDIS_STREAM": AUDIT_STREAM,
        "TENANTGATE_AUDIT_STDOUT": "false", "TENANTGATE_METRICS_PORT": str(metrics_port),
    })
    log = stack.enter_context((tmp / "gateway.log").open("w"))
    server = subprocess.Popen([TENANTGATE, "serve", "--port", str(port), "--log-level", "warning"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    stack.callback(stop, server)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, server, timeout_s=args.startup_timeout, output=(tmp / "gateway.log").read_text)
    return server, base, f"http://127.0.0.1:{metrics_port}/metrics"


def stop(process: subprocess.Popen, timeout_s: float = 60.0) -> tuple[int, bool]:
    """SIGTERM, as an orchestrator would; SIGKILL if it does not exit in time.
    Returns the exit code and whether it had to be killed."""
    if process.poll() is not None:
        return process.returncode, False
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s), False
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(10), True


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/<pid>/status")


# -- the load -----------------------------------------------------------------------------------


class Load:
    def __init__(self, base_url: str, issuer: LocalIssuer, model: str, abuse: float, seed: int) -> None:
        self.base_url, self.model, self.abuse, self.seed = base_url, model, abuse, seed
        lifetime = 2 * 3600
        self.clients = {t: self._client(issuer.mint(t, audience=AUDIENCE, lifetime_s=lifetime)) for t in LIMITS}
        stranger = LocalIssuer(base_url=issuer.base_url)  # the right issuer's name, a key it never published
        self.bad = [self._client(token) for token in (
            "not-a-token",
            issuer.mint(NORTHWIND, audience=AUDIENCE, lifetime_s=-3600),  # expired
            issuer.mint(NORTHWIND, audience="api://someone-else"),
            issuer.mint("eeeeeeee-0000-4000-8000-00000000000e", audience=AUDIENCE),  # unregistered tenant
            stranger.mint(NORTHWIND, audience=AUDIENCE),
        )]
        self.raw = httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S,
                                     headers={"Authorization": f"Bearer {self.clients[NORTHWIND].api_key}"})
        self.results: list[Result] = []

    def _client(self, token: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url + "/v1", api_key=token, max_retries=0,
                                  timeout=REQUEST_TIMEOUT_S)

    async def aclose(self) -> None:
        for client in [*self.clients.values(), *self.bad]:
            await client.close()
        await self.raw.aclose()

    def pick(self, rng: random.Random) -> str:
        kinds = ABUSE if rng.random() < self.abuse else KINDS
        return rng.choices(list(kinds), weights=list(kinds.values()))[0]

    async def run(self, concurrency: int, duration_s: float) -> float:
        deadline = time.monotonic() + duration_s
        start = time.perf_counter()

        async def worker(index: int) -> None:
            rng = random.Random(self.seed * 1000 + index)
            while time.monotonic() < deadline and len(self.results) < MAX_REQUESTS:
                self.results += await self.one(self.pick(rng), rng)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return time.perf_counter() - start

    async def one(self, kind: str, rng: random.Random) -> list[Result]:
        if kind == "invalid":
            return [await self.invalid(rng)]
        if kind == "bad_token":
            return [await self.request(kind, rng.choice(self.bad), rng, {"401"})]
        if kind == "over_quota":
            burst = [self.request(kind, self.clients[CONTOSO], rng, {"200", "429"}) for _ in range(OVER_QUOTA_BURST)]
            return list(await asyncio.gather(*burst))
        tenant = FABRIKAM if kind == "fabrikam" or (kind == "disconnect" and rng.random() < 0.3) else NORTHWIND
        expected = {"200", "429"} if tenant == FABRIKAM else {"200"}
        return [await self.request(kind, self.clients[tenant], rng, expected, disconnect=kind == "disconnect")]

    async def request(self, kind: str, client: openai.AsyncOpenAI, rng: random.Random, expected: set[str],
                      disconnect: bool = False) -> Result:
        route = rng.choice(["chat", "completions"])
        stream = disconnect or rng.random() < 0.5
        question = rng.choice(LONG) if rng.random() < 0.3 else rng.choice(SHORT)
        common = dict(model=self.model, max_tokens=64 if disconnect else rng.randint(16, 64),
                      temperature=rng.choice([0.0, 0.7]), stream=stream)
        if stream and not disconnect:
            common["stream_options"] = {"include_usage": True}
        start, started = time.perf_counter(), time.monotonic()
        ttft, tokens, finished, answer_id, code = None, 0, False, None, None
        try:
            if route == "chat":
                messages = [{"role": "user", "content": question}]
                if rng.random() < 0.5:
                    messages.insert(0, {"role": "system", "content": "You are a concise, helpful assistant."})
                response = await client.chat.completions.create(messages=messages, **common)
            else:
                response = await client.completions.create(prompt=f"Question: {question}\nAnswer:", **common)
            if not stream:
                tokens = response.usage.completion_tokens if response.usage else 0
                finished = all(c.finish_reason for c in response.choices)
                answer_id = response.id
            else:
                async with response:
                    async for chunk in response:
                        answer_id = chunk.id
                        for choice in chunk.choices:
                            text = choice.delta.content if route == "chat" else choice.text
                            if text and ttft is None:
                                ttft = time.perf_counter() - start
                            finished = finished or choice.finish_reason is not None
                        if chunk.usage:
                            tokens = chunk.usage.completion_tokens
                        if disconnect and ttft is not None:
                            break  # leaving the block closes the connection mid-stream
                    finished = finished or disconnect
            status = "200" if finished else "incomplete"
        except openai.APIError as exc:
            status, code = failure(exc), getattr(exc, "code", None)
        return Result(kind, route, stream, status, status in expected, time.perf_counter() - start, ttft, tokens,
                      started, answer_id if status == "200" and not disconnect else None, code)

    async def invalid(self, rng: random.Random) -> Result:
        """A body the gateway must refuse with a 4xx: wrong types, ranges, roles, fields, model, JSON."""
        client = self.clients[NORTHWIND]
        messages = [{"role": "user", "content": rng.choice(SHORT)}]
        cases = [
            dict(messages=messages, n=1000),  # past any tenant's max_choices and the engine's 128
            dict(messages=messages, temperature="warm"),
            dict(messages=messages, max_tokens=-5),
            dict(messages=[{"role": "wizard", "content": "hello"}]),
            dict(messages=[]),
            dict(messages=messages, extra_body={"cache_salt": "mine"}),  # clients never set cache knobs
            dict(messages=messages, model="no-such-model"),
        ]
        start, started, code = time.perf_counter(), time.monotonic(), None
        choice = rng.randrange(len(cases) + 1)
        try:
            if choice == len(cases):  # not JSON at all; the SDK cannot send this, so plain httpx does
                response = await self.raw.post("/v1/chat/completions", content=b'{"model": "x", "messages": [',
                                               headers={"Content-Type": "application/json"})
                status = str(response.status_code)
            else:
                await client.chat.completions.create(**({"model": self.model, "max_tokens": 16} | cases[choice]))
                status = "200"
        except (openai.APIError, httpx.TransportError) as exc:
            status, code = failure(exc), getattr(exc, "code", None)
        expected = status.isdigit() and 400 <= int(status) < 500
        return Result("invalid", "chat", False, status, expected, time.perf_counter() - start, started=started,
                      code=code if status != "200" else f"case {choice}")


def failure(exc: Exception) -> str:
    """The status a refused or failed request is counted under."""
    if isinstance(exc, openai.APIStatusError):
        return str(exc.status_code)
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        return "connection"
    return "stream-error"  # an error event inside a stream that had answered 200


async def sample_rss(pid: int, stop_event: asyncio.Event, samples: list[float]) -> None:
    while not stop_event.is_set():
        samples.append(rss_mib(pid))
        try:
            await asyncio.wait_for(stop_event.wait(), 2.0)
        except TimeoutError:
            pass


async def soak(load: Load, pid: int, concurrency: int, duration_s: float, samples: list[float]) -> float:
    """Runs the load; samples the server's RSS every 2 s meanwhile. Returns the seconds it took."""
    stop_event = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(pid, stop_event, samples))
    try:
        return await load.run(concurrency, duration_s)
    finally:
        stop_event.set()
        await sampler


# -- the fault phases ---------------------------------------------------------------------------


async def wait_until(condition, timeout_s: float = RECOVERY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not recovered after {timeout_s:g} s")
        await asyncio.sleep(0.1)


async def full_disk(disk: Path, metrics_url: str, hold_s: float) -> Fault:
    """Fills the audit file's disk, holds it full, frees it; ends once the trail takes records again."""
    began = time.monotonic()
    # No room left: at a low request rate, room for even a few dozen records lasted the whole hold,
    # and the phase then refused nothing (its check failed, rightly: it had tested nothing).
    await asyncio.to_thread(fill, disk / "filler")
    await asyncio.sleep(hold_s)
    (disk / "filler").unlink()
    await wait_until(lambda: scrape(metrics_url).get("tenantgate_audit_accepting") == 1.0)
    return Fault("disk", "audit_unavailable", began, time.monotonic())


async def redis_restart(redis_server: RedisServer, hold_s: float) -> Fault:
    """Stops redis-server, holds it down, starts it on its port; ends once it answers PING."""
    began = time.monotonic()
    await asyncio.to_thread(redis_server.stop)
    await asyncio.sleep(hold_s)
    await asyncio.to_thread(redis_server.start)  # returns once it answers
    return Fault("redis", "quota_store_unavailable", began, time.monotonic())


async def phase(load: Load, concurrency: int, seconds: float, fault) -> Fault:
    """The load for `seconds`, with the fault (a coroutine) starting a quarter of the way in."""
    async def inject() -> Fault:
        await asyncio.sleep(seconds / 4)
        return await fault

    _, injected = await asyncio.gather(load.run(concurrency, seconds), inject())
    return injected


def recorded_ids(audit_file: Path) -> set[str]:
    """request_id of every record in the file trail (rotated files too)."""
    ids = set()
    for path in rotated_files(audit_file):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("type") == "record" and "request_id" in entry:
                ids.add(entry["request_id"])
    return ids


async def warm_up(load: Load) -> None:
    rng = random.Random(-1)
    for _ in range(4):
        result = await load.request("warm-up", load.clients[NORTHWIND], rng, {"200"})
        if not result.expected:
            raise RuntimeError(f"a warm-up request answered {result.status}")


# -- reading the end state ----------------------------------------------------------------------


def scrape(metrics_url: str) -> dict[str, float]:
    """The samples of /metrics by name and labels, e.g. 'tenantgate_kv_blocks{state="used"}'."""
    text = httpx.get(metrics_url, timeout=10).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^(tenantgate_\w+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def kv_used(metrics_url: str) -> float:
    return scrape(metrics_url)[KV_USED]


def leases(redis_url: str) -> int:
    """Members of every tenant's in-flight set, `tg:{<tenant digest>}:c` (gateway/limits/redis.py)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        return sum(client.zcard(key) for key in client.scan_iter(match="tg:{*}:c", count=1000))
    finally:
        client.close()


def verify_command(public_key: Path, redis_url: str) -> tuple[list[str], str]:
    """`tenantgate audit verify --strict`, with the trail's anchors where the CLI knows them; a note
    when the installed CLI has no --strict, and the plain verify instead."""
    help_text = subprocess.run([TENANTGATE, "audit", "verify", "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    command = [TENANTGATE, "audit", "verify", "--public-key", str(public_key)]
    note = ""
    if "--strict" in help_text:
        command.append("--strict")
    else:
        note = "NOTE: this tenantgate audit verify has no --strict; ran the plain verify (weaker: warnings pass)"
    if "--anchors" in help_text:
        command += ["--anchors", redis_url]
    return command, note


def run_verify(command: list[str]) -> tuple[int, str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return done.returncode, (done.stdout + done.stderr).strip()


# -- the report ---------------------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timings(results: list[Result]) -> list[str]:
    lines = [f"  {'route':<12} {'stream':<6} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'TTFT p50':>9} {'TTFT p99':>9}"]
    served = [r for r in results if r.status == "200" and r.kind != "disconnect"]
    for route in ("chat", "completions"):
        for stream in (False, True):
            group = [r for r in served if r.route == route and r.stream == stream]
            if not group:
                continue
            lat = [r.latency_s * 1e3 for r in group]
            ttfts = [r.ttft_s * 1e3 for r in group if r.ttft_s is not None]
            ttft = f"{quantile(ttfts, 0.5):9.0f} {quantile(ttfts, 0.99):9.0f}" if ttfts else f"{'-':>9} {'-':>9}"
            lines.append(f"  {route:<12} {'yes' if stream else 'no':<6} {len(group):>6} {quantile(lat, 0.5):9.0f} "
                         f"{quantile(lat, 0.99):9.0f} {ttft}")
    return lines


def statuses(results: list[Result]) -> list[str]:
    by_code = Counter(r.status for r in results)
    by_class = Counter(f"{s[0]}xx" if s.isdigit() else s for s in by_code.elements())
    lines = ["  by class: " + "  ".join(f"{c} {n}" for c, n in sorted(by_class.items())),
             "  by code:  " + "  ".join(f"{c} {n}" for c, n in sorted(by_code.items()))]
    for kind in (*KINDS, *ABUSE):
        codes = Counter(r.status for r in results if r.kind == kind)
        if codes:
            lines.append(f"  {kind:<11} " + "  ".join(f"{c} {n}" for c, n in sorted(codes.items())))
    return lines


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} CPUs)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300, help=f"seconds of load (at most {MAX_DURATION_S})")
    parser.add_argument("--concurrency", type=int, default=8, help="client workers")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="TENANTGATE_MODEL (demo: a quick smoke)")
    parser.add_argument("--abuse", type=float, default=0.2, help="share of misbehaving requests (0-0.5)")
    parser.add_argument("--kv-cache-bytes", type=int, default=64 << 20, help="TENANTGATE_KV_CACHE_MEMORY_BYTES")
    parser.add_argument("--startup-timeout", type=float, default=600, help="seconds for the gateway to be ready "
                        "(the first run converts the model's GGUF into the cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phases", default=",".join(PHASES), help="fault phases after the load, under the "
                        "same load: disk (a full audit disk; needs root to mount a tmpfs), redis (a Redis restart); "
                        "'' for none")
    parser.add_argument("--phase-s", type=float, default=30, help="seconds of load in each fault phase")
    args = parser.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    if set(phases) - set(PHASES) or not 4 <= args.phase_s <= MAX_DURATION_S:
        parser.error(f"--phases takes {', '.join(PHASES)}; --phase-s must be in [4, {MAX_DURATION_S}]")
    if not 0 < args.duration <= MAX_DURATION_S or not 1 <= args.concurrency <= 256 or not 0 <= args.abuse <= 0.5:
        parser.error(f"--duration must be in (0, {MAX_DURATION_S}], --concurrency in [1, 256], --abuse in [0, 0.5]")
    binary = find_redis_server()
    if binary is None:
        print("soak: redis-server is not installed", file=sys.stderr)
        return 1
    model = served_model_name(args.model)
    os.environ.setdefault(CACHE_DIR_ENV, str(default_cache_dir()))  # the model is converted once, there
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # unwind (and clean up) as Ctrl-C does

    print(f"soak: model {model}, {args.duration:g} s, {args.concurrency} workers, abuse share {args.abuse:g}, "
          f"KV cache {args.kv_cache_bytes >> 20} MiB")
    print(f"load average at start: {loadavg()}")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tenantgate-soak-")))
        (tmp / "redis").mkdir()
        # The AOF keeps the audit stream, the anchors and the leases across the redis phase's restart.
        redis_server = RedisServer(binary, tmp / "redis", appendonly=True).start()
        stack.callback(redis_server.stop)
        disk = tmp / "audit-disk"
        if "disk" in phases:
            refused = mount_tmpfs(disk, AUDIT_DISK_BYTES)
            if refused is not None:
                print(f"soak: cannot mount a tmpfs for the full-disk phase ({refused}); run as root, or leave "
                      "the phase out with --phases redis", file=sys.stderr)
                return 1
            stack.callback(unmount, disk, check=False)
        else:
            disk.mkdir()
        audit_file = disk / "audit.jsonl"
        issuer = stack.enter_context(LocalIssuer(port=0))
        private_key, public_key = audit_keygen(tmp / "keys")
        started = time.monotonic()
        server, base, metrics_url = start_gateway(args, tmp, issuer, redis_server.url, private_key, audit_file,
                                                   stack)
        print(f"gateway ready in {time.monotonic() - started:.1f} s (pid {server.pid})")

        async def drive() -> tuple[Load, float, float, float, list[float], list[Fault]]:
            load = Load(base, issuer, model, args.abuse, args.seed)
            try:
                await warm_up(load)
                rss_start, samples = rss_mib(server.pid), []
                elapsed = await soak(load, server.pid, args.concurrency, args.duration, samples)
                rss_end = rss_mib(server.pid)  # after the steady load: the fault phases hold records in memory
                faults = []
                for name in phases:
                    hold_s = args.phase_s / 3
                    fault = (full_disk(disk, metrics_url, hold_s) if name == "disk"
                             else redis_restart(redis_server, hold_s))
                    faults.append(await phase(load, args.concurrency, args.phase_s, fault))
                await asyncio.sleep(SETTLE_S)  # the audit record waits a moment for the engine's record
                return load, elapsed, rss_start, rss_end, samples, faults
            finally:
                await load.aclose()

        load, elapsed, rss_start, rss_end, samples, faults = asyncio.run(drive())
        results = load.results
        metrics = scrape(metrics_url)
        kv_end, kv_after_tiny = metrics[KV_USED], None
        if kv_end != 0:
            # The gauge is set during each engine step, before that step's finished sequences free
            # their blocks; one tiny request shows whether the reading moves (staleness) or stays.
            with openai.OpenAI(base_url=base + "/v1", api_key=load.clients[NORTHWIND].api_key, max_retries=0,
                               timeout=REQUEST_TIMEOUT_S) as tiny:
                try:
                    tiny.chat.completions.create(model=model, max_tokens=1,
                                                 messages=[{"role": "user", "content": "Hi"}])
                except openai.APIError as exc:
                    print(f"the tiny extra request failed: {type(exc).__name__}")
            time.sleep(0.5)
            kv_after_tiny = kv_used(metrics_url)
        lease_count = leases(redis_server.url)
        exit_code, killed = stop(server)

        command, verify_note = verify_command(public_key, redis_server.url)
        file_rc, file_out = run_verify([*command, "--rotated", str(audit_file)])
        recorded = recorded_ids(audit_file)
        stream_rc, stream_out = run_verify([*command, "--redis", redis_server.url, "--stream", AUDIT_STREAM])

    # A request that overlapped a fault may have been refused for it: the answer its phase expects.
    by_fault = Counter()
    for r in results:
        fault = next((f for f in faults if f.code == r.code and f.covers(r)), None)
        if fault is not None and r.status in ("503", "429", "stream-error"):
            r.expected = True
            by_fault[fault.name] += 1
    acknowledged = [r.request_id for r in results if r.request_id is not None]
    unrecorded = [i for i in acknowledged if i not in recorded]
    refused_while_up = sum(1 for r in results if r.code == "quota_store_unavailable"
                           and not any(f.name == "redis" and f.covers(r) for f in faults))
    n_5xx = sum(1 for r in results if r.status.startswith("5") and not r.expected)
    broken = sum(1 for r in results if not r.status.isdigit())
    unexpected = sum(1 for r in results if not r.expected)
    tokens = sum(r.completion_tokens for r in results if r.status == "200")
    checks = {
        "no 5xx": n_5xx == 0,
        "no transport errors or broken streams": broken == 0,
        "every answer expected": unexpected == 0,
        "leases free at the end": lease_count == 0,
        "KV blocks free at the end": (kv_end if kv_after_tiny is None else kv_after_tiny) == 0,
        "gateway exits on SIGTERM": exit_code in (0, -signal.SIGTERM) and not killed,
        "audit file verifies": file_rc == 0,
        "audit stream verifies": stream_rc == 0,
        "every acknowledged request has its record": not unrecorded,
        "no quota-store refusal while Redis answers": refused_while_up == 0,
    }
    for fault in faults:  # a phase that refused nothing did not test anything
        checks[f"the {fault.name} phase refused requests while its store was down"] = by_fault[fault.name] > 0

    print(f"\nrequests: {len(results)} in {elapsed:.1f} s ({len(results) / elapsed:.1f}/s), "
          f"{unexpected} unexpected answers")
    print("\n".join(statuses(results)))
    print(f"  5xx: {n_5xx}   transport errors / broken streams: {broken}")
    start = results[0].started if results else 0.0
    for fault in faults:
        during = [r for r in results if fault.covers(r)]
        print(f"  {fault.name} phase: {fault.ended - fault.began:.1f} s down (from {fault.began - start:.0f} s), "
              f"{len(during)} requests overlapped it, {by_fault[fault.name]} refused for it ({fault.code})")
    for r in [r for r in results if not r.expected][:12]:
        print(f"  unexpected: {r.kind} {r.route} {'stream' if r.stream else ''} {r.status} {r.code or ''} "
              f"sent at {r.started - start:.1f} s, {r.latency_s * 1e3:.0f} ms")
    print(f"  acknowledged requests: {len(acknowledged)}, without a record in the file trail: {len(unrecorded)}; "
          f"quota-store refusals while Redis answered: {refused_while_up}")
    print("\nlatency of served requests (dropped streams left out)")
    print("\n".join(timings(results)))
    print(f"\ncompletion tokens: {tokens} ({tokens / elapsed:.1f} tokens/s)")
    print(f"server RSS MiB: start {rss_start:.0f}  end {rss_end:.0f}  delta {rss_end - rss_start:+.0f}  "
          f"peak {max([*samples, rss_end]):.0f}")
    if samples:
        spread = [samples[round(i * (len(samples) - 1) / 5)] for i in range(6)]
        print(f"  during the load (every {elapsed / 5:.0f} s): " + " ".join(f"{x:.0f}" for x in spread))
    kv = {k.split('"')[1]: v for k, v in metrics.items() if k.startswith("tenantgate_kv_blocks{")}
    print(f"at the end: leases in Redis {lease_count}; KV blocks "
          + "  ".join(f"{state} {value:g}" for state, value in sorted(kv.items()))
          + f"; audit sink errors {metrics.get('tenantgate_audit_sink_errors', 0):g}, stream dropped "
          + f"{metrics.get('tenantgate_audit_stream_dropped', 0):g}")
    if kv_after_tiny is not None:
        print(f'NOTE: tenantgate_kv_blocks{{state="used"}} read {kv_end:g} after the load and settle, and '
              f"{kv_after_tiny:g} after one tiny extra request (the gauge is set during each engine step, before "
              "that step's finished sequences free their blocks: it reads stale once the load stops)")
    print(f"gateway exit code after SIGTERM: {exit_code}"
          + (" (killed: it did not exit in 60 s)" if killed else
             " (uvicorn shuts down, then re-raises the signal)" if exit_code == -signal.SIGTERM else ""))
    if verify_note:
        print(verify_note)
    shown = " ".join("tenantgate" if c == TENANTGATE else c.replace(str(tmp), "$TMP") for c in command)
    print(f"$ {shown} --rotated $TMP/audit-disk/audit.jsonl")
    print(f"  exit {file_rc}: {file_out}")
    print(f"$ ... --redis {redis_server.url} --stream {AUDIT_STREAM}")
    print(f"  exit {stream_rc}: {stream_out}")
    print(f"load average at end: {loadavg()}")
    print("\n" + "\n".join(f"  {'ok  ' if ok else 'FAIL'} {name}" for name, ok in checks.items()))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # everything was stopped and removed on the way out
        print("soak: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
