"""A regional failover on one machine: two stamps, each a real `tenantgate serve` with its own
redis-server and audit file, behind a local HAProxy that probes them the way the landing zone's
Front Door origin group does (the settings are read from infra/, Terraform and Bicep alike), and
a steady load of chat completions through it on the official openai SDK. bench/failover.py
measures with these pieces; tests/infra/test_failover.py checks what must hold.
"""

from __future__ import annotations

import asyncio
import csv
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import openai

from devkit.redis import RedisServer
from devkit.server import TENANTGATE, free_port, gateway_env, stop, wait_ready
from gateway.audit import VerifyReport, load_or_create_signing_key, verify_files

REPO = Path(__file__).resolve().parents[1]
FRONT_DOOR_TF = REPO / "infra" / "terraform" / "main.frontdoor.tf"
FRONT_DOOR_BICEP = REPO / "infra" / "bicep" / "modules" / "front-door.bicep"
DATA_DIR = REPO / "tests" / "gateway" / "api" / "data"
TENANT = "aaaaaaaa-0000-4000-8000-00000000000a"  # Alpha in DATA_DIR: demo allowed, 100,000 requests a minute
STAMPS = {"weu": "westeurope", "neu": "northeurope"}
AUDIENCE = "api://tenantgate"
MODEL = "demo"
REQUEST_TIMEOUT_S = 30.0
SERVED_BY = "X-Served-By"


def find_haproxy() -> str | None:
    return shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)


# -- Front Door's origin group ----------------------------------------------------------------


@dataclass(frozen=True)
class OriginProbe:
    """The origin group's health probe and the load-balancing samples that judge it.

    Front Door keeps an origin in rotation while at least `successful_samples_required` of its
    last `sample_size` probes succeeded (a 200 answer; anything else, or no answer, fails).
    HAProxy counts instead: `fall` failed checks take a server out, `rise` good ones bring it
    back. For a hard loss, every probe failing from some moment on, the two agree when
      fall = sample_size - successful_samples_required + 1   (4 of 4 good, then 2 failures: 2 of 4 < 3)
      rise = successful_samples_required                      (0 of 4 good, then 3 successes: 3 of 4)
    They differ for an origin that flaps (a window of samples is not a counter), which a
    killed stamp does not.
    """

    interval_s: float
    sample_size: int
    successful_samples_required: int
    path: str
    method: str

    @property
    def fall(self) -> int:
        return self.sample_size - self.successful_samples_required + 1

    @property
    def rise(self) -> int:
        return self.successful_samples_required

    @property
    def detection_bound_s(self) -> float:
        """The longest a lost origin stays in rotation: up to one interval until the next probe,
        then fall - 1 more (plus the probe's own timeout where the loss swallows packets)."""
        return self.fall * self.interval_s

    def scaled(self, factor: float) -> OriginProbe:
        return replace(self, interval_s=self.interval_s * factor)


def _block(text: str, opening: str, source: Path) -> str:
    match = re.search(opening + r"\s*\{([^}]*)\}", text)
    if match is None:
        raise ValueError(f"no {opening} block in {source}")
    return match.group(1)


def _value(block: str, pattern: str, source: Path) -> str:
    match = re.search(pattern, block)
    if match is None:
        raise ValueError(f"{pattern!r} not found in {source}")
    return match.group(1)


# Where the origin group keeps each setting: (the block, a pattern for its value), per language.
_PROBE_SETTINGS = {
    FRONT_DOOR_TF: {
        "interval_s": ("health_probe", r"interval_in_seconds\s*=\s*(\d+)"),
        "sample_size": ("load_balancing", r"\bsample_size\s*=\s*(\d+)"),
        "successful_samples_required": ("load_balancing", r"successful_samples_required\s*=\s*(\d+)"),
        "path": ("health_probe", r'\bpath\s*=\s*"([^"]+)"'),
        "method": ("health_probe", r'request_type\s*=\s*"(\w+)"'),
    },
    FRONT_DOOR_BICEP: {
        "interval_s": ("healthProbeSettings:", r"probeIntervalInSeconds:\s*(\d+)"),
        "sample_size": ("loadBalancingSettings:", r"sampleSize:\s*(\d+)"),
        "successful_samples_required": ("loadBalancingSettings:", r"successfulSamplesRequired:\s*(\d+)"),
        "path": ("healthProbeSettings:", r"probePath:\s*'([^']+)'"),
        "method": ("healthProbeSettings:", r"probeRequestType:\s*'(\w+)'"),
    },
}


def _read_probe(source: Path) -> OriginProbe:
    text = source.read_text()
    values = {name: _value(_block(text, opening, source), pattern, source)
              for name, (opening, pattern) in _PROBE_SETTINGS[source].items()}
    return OriginProbe(interval_s=float(values["interval_s"]), sample_size=int(values["sample_size"]),
                       successful_samples_required=int(values["successful_samples_required"]),
                       path=values["path"], method=values["method"])


def front_door_probe() -> OriginProbe:
    """The origin group's probe as infra/ deploys it; a ValueError if Terraform and Bicep disagree."""
    terraform, bicep = _read_probe(FRONT_DOOR_TF), _read_probe(FRONT_DOOR_BICEP)
    if terraform != bicep:
        raise ValueError(f"Front Door's probe differs: Terraform {terraform}, Bicep {bicep}")
    return terraform


# -- the stamps -------------------------------------------------------------------------------


def policy_data(directory: Path) -> Path:
    """The test tenants, Alpha allowed in both stamps' regions: a tenant held to one region is
    refused (403) by the other, so for it a failover is a denial, as its policy wants."""
    data = json.loads((DATA_DIR / "tenants.json").read_text())
    data["tenants"][TENANT]["regions"] = sorted(STAMPS.values())
    directory.mkdir(exist_ok=True)
    (directory / "tenants.json").write_text(json.dumps(data))
    return directory


@dataclass
class Stamp:
    """One region: its own redis-server, `tenantgate serve` on the demo model, its own audit file."""

    name: str
    region: str
    directory: Path
    redis: RedisServer
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def audit_file(self) -> Path:
        return self.directory / "audit.jsonl"

    @property
    def signing_key(self) -> Path:
        return self.directory / "audit-signing.pem"

    @property
    def log(self) -> Path:
        return self.directory / "gateway.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, issuer_url: str, data_dir: Path) -> Stamp:
        """Starts Redis and the gateway; wait() waits for it to be ready (start both, then wait)."""
        load_or_create_signing_key(self.signing_key)  # here, so verify_audit knows its public half
        self.redis.start()
        env = gateway_env(**{
            "TENANTGATE_MODEL": MODEL, "TENANTGATE_KV_CACHE_MEMORY_BYTES": str(32 << 20),
            "TENANTGATE_REGION": self.region, "TENANTGATE_AUTHORITY": issuer_url,
            "TENANTGATE_V1_ISSUER_HOST": issuer_url, "TENANTGATE_AUDIENCES": AUDIENCE,
            "TENANTGATE_POLICY_DATA_DIR": str(data_dir), "TENANTGATE_REDIS_URL": self.redis.url,
            "TENANTGATE_AUDIT_FILE": str(self.audit_file),
            "TENANTGATE_AUDIT_SIGNING_KEY": str(self.signing_key),
            "TENANTGATE_AUDIT_CHAIN_ID": self.name, "TENANTGATE_AUDIT_STDOUT": "false",
            "TENANTGATE_METRICS_PORT": "0",
        })
        with self.log.open("w") as log:
            self.process = subprocess.Popen([TENANTGATE, "serve", "--port", str(self.port), "--log-level", "warning"],
                                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory)
        return self

    def wait(self, timeout_s: float = 180.0) -> None:
        assert self.process is not None
        wait_ready(self.base_url, self.process, timeout_s=timeout_s, output=self.log.read_text)

    def kill(self) -> None:
        """SIGKILL, as a region loss: no drain, no final checkpoint; the address refuses at once."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
        self.redis.stop()

    def verify_audit(self) -> VerifyReport:
        """What `tenantgate audit verify` says of the audit file. Not strict: a killed stamp's
        trail ends without its final checkpoint, by design (its unsigned tail is a warning)."""
        return verify_files([self.audit_file], load_or_create_signing_key(self.signing_key).public_key())

    def audit_request_ids(self) -> tuple[set[str], int]:
        """The request ids of the records in the audit file, and how many lines did not parse
        (a torn last line, if the kill fell inside a write)."""
        ids: set[str] = set()
        torn = 0
        if not self.audit_file.exists():
            return ids, torn
        for line in self.audit_file.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                torn += 1
                continue
            if entry.get("type") == "record":
                ids.add(entry["request_id"])
        return ids, torn


# -- HAProxy as Front Door ----------------------------------------------------------------------


def haproxy_config(probe: OriginProbe, port: int, origins: dict[str, int], stats_socket: Path,
                   response_timeout_s: int = 240) -> str:
    """HAProxy in front of `origins` (name: port), probing them as Front Door would."""
    check_timeout_ms = int(min(5.0, probe.interval_s / 2) * 1000)
    servers = "\n".join(f"    server {name} 127.0.0.1:{p}" for name, p in origins.items())
    return f"""\
global
    stats socket {stats_socket} mode 600 level admin
    maxconn 4096

defaults
    mode http
    option log-health-checks
    timeout connect 5s
    timeout client 300s
    # Front Door's response_timeout_seconds.
    timeout server {response_timeout_s}s
    # Front Door sets no probe timeout of its own; a killed stamp refuses at once either way.
    timeout check {check_timeout_ms}ms
    # Front Door does not promise to retry a request on another origin (and a chat completion
    # is a POST): none here, so a request sent to the lost stamp fails, the caller's worst case.
    retries 0

frontend front_door
    bind 127.0.0.1:{port}
    default_backend origins

backend origins
    # session_affinity_enabled = false; both stamps within additional_latency_in_milliseconds
    # (loopback), so Front Door spreads by weight, 500 and 500: round robin, equal weights.
    balance roundrobin
    option httpchk {probe.method} {probe.path}
    # Front Door counts only a 200 as a healthy probe.
    http-check expect status 200
    http-response set-header {SERVED_BY} %s
    # interval_in_seconds; fall and rise from sample_size and successful_samples_required
    # (see OriginProbe).
    default-server check inter {int(probe.interval_s * 1000)}ms fall {probe.fall} rise {probe.rise} weight 100
{servers}
"""


class HAProxy:
    """haproxy in the foreground; its health-check messages timed as they arrive."""

    def __init__(self, binary: str, directory: Path, probe: OriginProbe, origins: dict[str, int]) -> None:
        self.binary, self.directory, self.probe = binary, directory, probe
        self.port = free_port()
        self.stats_socket = directory / "haproxy.sock"
        self.config = directory / "haproxy.cfg"
        self.config.write_text(haproxy_config(probe, self.port, origins, self.stats_socket))
        self.events: list[tuple[float, str]] = []  # (time.monotonic(), line)
        self.process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> HAProxy:
        self.process = subprocess.Popen([self.binary, "-db", "-f", str(self.config)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, args=(self.process.stderr,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                if self.stats_socket.exists():
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"haproxy did not start: {self.log()}")

    def _read(self, stream) -> None:
        for line in stream:
            self.events.append((time.monotonic(), line.rstrip()))

    def log(self) -> str:
        return "\n".join(line for _, line in self.events)[-2000:]

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, 10)
            if self.process.stderr is not None:  # always a pipe
                self.process.stderr.close()
            self.process = None

    def servers(self) -> dict[str, dict[str, str]]:
        """`show stat` of the origins' servers, by name."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(str(self.stats_socket))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        rows = csv.DictReader(data.decode().lstrip("# ").splitlines())
        return {row["svname"]: row for row in rows if row["pxname"] == "origins" and row["svname"] != "BACKEND"}

    def wait_full_health(self, timeout_s: float) -> None:
        """Until every origin has passed enough probes to be at full health (rise + fall - 1),
        as a Front Door whose whole sample window is good: a server that has only just come UP
        would go DOWN at its first failed probe."""
        full = str(self.probe.rise + self.probe.fall - 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            servers = self.servers()
            if servers and all(s["status"] == "UP" and s["check_health"] == full for s in servers.values()):
                return
            time.sleep(0.1)
        states = {name: (s["status"], s["check_health"]) for name, s in self.servers().items()}
        raise RuntimeError(f"the origins did not reach full health {full}: {states}\n{self.log()}")

    def first_event(self, pattern: str, after: float) -> float | None:
        for at, line in self.events:
            if at >= after and re.search(pattern, line):
                return at
        return None


# -- the load -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: float  # time.monotonic()
    latency_s: float
    status: str  # "200", another HTTP code (with the error's code, if any), "connection" or "timeout"
    request_id: str | None = None
    served_by: str | None = None  # the stamp that answered (HAProxy's header); None: no stamp did
    message: str | None = None  # a stamp's error message (the gateway's own words, never the request's)


async def steady_load(base_url: str, token: str, rate: float, duration_s: float, *, max_retries: int = 0,
                      max_tokens: int = 4) -> list[Outcome]:
    """`rate` short chat completions a second for `duration_s`, each sent on schedule whether or
    not the ones before it have answered (an open loop, as independent callers are)."""
    outcomes: list[Outcome] = []
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=token, max_retries=max_retries,
                                  timeout=REQUEST_TIMEOUT_S) as client:

        async def one(index: int) -> None:
            sent = time.monotonic()
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL, max_tokens=max_tokens,
                    messages=[{"role": "user", "content": f"Question {index}: what does a gateway do?"}])
                outcomes.append(Outcome(sent, time.monotonic() - sent, str(raw.http_response.status_code),
                                        raw.parse().id, raw.headers.get(SERVED_BY)))
            except openai.APIStatusError as exc:
                status = f"{exc.status_code} {exc.code}" if exc.code else str(exc.status_code)
                message = exc.body.get("message") if isinstance(exc.body, dict) else None
                outcomes.append(Outcome(sent, time.monotonic() - sent, status,
                                        served_by=exc.response.headers.get(SERVED_BY), message=message))
            except openai.APITimeoutError:
                outcomes.append(Outcome(sent, time.monotonic() - sent, "timeout"))
            except openai.APIConnectionError:
                outcomes.append(Outcome(sent, time.monotonic() - sent, "connection"))

        start = time.monotonic()
        tasks = []
        for index in range(int(rate * duration_s)):
            await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one(index)))
        await asyncio.gather(*tasks)
    return outcomes


@dataclass
class Figures:
    """What a failover cost, from the callers' side and from the audit trails. Failures come in
    two kinds: lost ones, that no stamp answered (sent to the killed stamp: HAProxy's 502/503,
    a dropped connection), and refusals a live stamp answered (a 429 when the survivor, now
    taking all the load, cannot keep up)."""

    requests: int
    statuses: Counter
    refusal_messages: dict[str, str]  # one message of a stamp for each refusal status
    failed: int
    lost: int  # failures no stamp answered
    first_lost_s: float | None  # after the kill, by the request's send time
    lost_stopped_s: float | None  # the last lost request was sent this long after the kill: the RTO
    refused: int  # failures a live stamp answered
    last_refused_s: float | None
    acknowledged: int
    lost_records: list[str | None]  # request ids answered 200 with no record in the stamp that served them
    unattributed: int  # 200 answers without the proxy's served-by header
    torn_lines: int
    out_of_rotation_s: float | None  # HAProxy marked the killed stamp DOWN this long after the kill

    @property
    def failed_share(self) -> float:
        return self.failed / self.requests if self.requests else 0.0


def figures(outcomes: list[Outcome], killed_at: float, stamps: list[Stamp], proxy: HAProxy,
            killed: str) -> Figures:
    failures = [o for o in outcomes if o.status != "200"]
    lost = sorted(o.sent - killed_at for o in failures if o.served_by is None)
    refused = sorted(o.sent - killed_at for o in failures if o.served_by is not None)
    records = {stamp.name: stamp.audit_request_ids() for stamp in stamps}
    acknowledged = [o for o in outcomes if o.status == "200"]
    lost_records = [o.request_id for o in acknowledged
                    if o.served_by in records and o.request_id not in records[o.served_by][0]]
    down = proxy.first_event(rf"Server origins/{killed} is DOWN", killed_at)
    return Figures(
        requests=len(outcomes), statuses=Counter(o.status for o in outcomes),
        refusal_messages={o.status: o.message for o in failures if o.served_by is not None and o.message},
        failed=len(failures),
        lost=len(lost), first_lost_s=lost[0] if lost else None, lost_stopped_s=lost[-1] if lost else None,
        refused=len(refused), last_refused_s=refused[-1] if refused else None,
        acknowledged=len(acknowledged), lost_records=lost_records,
        unattributed=sum(o.served_by not in records for o in acknowledged),
        torn_lines=sum(torn for _, torn in records.values()),
        out_of_rotation_s=down - killed_at if down is not None else None)


@dataclass
class Run:
    probe: OriginProbe
    killed: str
    plain: Figures  # callers without retries (max_retries=0)
    retrying: Figures | None  # callers with the SDK's default retries (max_retries=2)
    detected_s: float | None  # the first failed probe of the killed stamp, after the kill
    stamp_requests: dict[str | None, int]  # 200 answers by stamp, before and after the kill
    verified: dict[str, VerifyReport]  # each stamp's audit file, verified


async def _load_and_kill(proxy: HAProxy, token: str, victim: Stamp, rate: float, retrying_rate: float,
                         before_s: float, after_s: float) -> tuple[list[Outcome], list[Outcome], float]:
    duration = before_s + after_s
    loads = [asyncio.create_task(steady_load(proxy.base_url, token, rate, duration))]
    if retrying_rate:
        loads.append(asyncio.create_task(steady_load(proxy.base_url, token, retrying_rate, duration, max_retries=2)))
    await asyncio.sleep(before_s)
    killed_at = time.monotonic()
    victim.kill()
    results = await asyncio.gather(*loads)
    return results[0], results[1] if retrying_rate else [], killed_at


def run_failover(directory: Path, issuer_url: str, token: str, probe: OriginProbe, *, redis_binary: str,
                 haproxy_binary: str, rate: float = 20.0, retrying_rate: float = 0.0, before_s: float = 10.0,
                 after_s: float | None = None) -> Run:
    """Two stamps behind HAProxy; under `rate` requests a second, the first stamp is killed
    `before_s` into the load, which runs on for `after_s` (default: the detection bound and a
    confirmation window of 10 s or 3 intervals, whichever is longer)."""
    if after_s is None:
        after_s = probe.detection_bound_s + max(10.0, 3 * probe.interval_s)
    data_dir = policy_data(directory / "policy-data")
    stamps = []
    for name, region in STAMPS.items():
        (directory / name).mkdir()
        stamps.append(Stamp(name, region, directory / name, RedisServer(redis_binary, directory / name)))
    proxy = HAProxy(haproxy_binary, directory, probe, {s.name: s.port for s in stamps})
    try:
        for stamp in stamps:
            stamp.start(issuer_url, data_dir)
        for stamp in stamps:
            stamp.wait()
        proxy.start()
        proxy.wait_full_health(timeout_s=(probe.rise + probe.fall + 1) * probe.interval_s + 10)
        victim = stamps[0]
        plain, retrying, killed_at = asyncio.run(
            _load_and_kill(proxy, token, victim, rate, retrying_rate, before_s, after_s))
        for stamp in stamps:  # the survivor drains and writes what it still holds
            stamp.stop()
        detected = proxy.first_event(rf"Health check for server origins/{victim.name} failed", killed_at)
        served = Counter(o.served_by for o in plain + retrying if o.status == "200")
        return Run(probe=probe, killed=victim.name, plain=figures(plain, killed_at, stamps, proxy, victim.name),
                   retrying=figures(retrying, killed_at, stamps, proxy, victim.name) if retrying else None,
                   detected_s=detected - killed_at if detected is not None else None,
                   stamp_requests=dict(served), verified={s.name: s.verify_audit() for s in stamps})
    finally:
        for stamp in stamps:
            stamp.stop()
        proxy.stop()
