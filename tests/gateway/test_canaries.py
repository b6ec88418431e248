"""Canaries: unique strings in prompts, headers, tokens, `user` fields and metadata, sent
under each logging mode, then searched for in every sink: the server's stdout (the audit
trail) and stderr (its logs, at debug level), the audit file, the Redis Stream, /metrics,
every error body, and the spans a real OpenTelemetry Collector received from the server.
None may appear where the policy forbids it (spans carry no content in any mode), and
redacted mode still keeps the ordinary words.

The gateway runs as `tenantgate serve` in a subprocess with the demo engine, so the logs
are the real process's logs, uvicorn's included.
"""

from __future__ import annotations

import base64
import json
import random
import re
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import redis
from stdnum import luhn
from stdnum.iso7064 import mod_97_10

from devkit.server import TENANTGATE, free_port, gateway_env, wait_ready
from gateway.redaction import fold
from tests.gateway.api.conftest import ALPHA, AUDIENCE, DATA_DIR, THETA

ORDINARY = "Please summarise the quarterly report for the board by Friday"


class Canaries:
    """One unique marker per place a request can carry text."""

    def __init__(self, label: str) -> None:
        self.tag = f"cnry{label}{uuid.uuid4().hex[:12]}"
        generator = random.Random(self.tag)
        self.card, self.card_fullwidth_digits = _luhn_card(generator), _luhn_card(generator)
        self.card_fullwidth = "".join(chr(0xFF10 + int(digit)) for digit in self.card_fullwidth_digits)
        self.iban = _german_iban(generator)

    def __getitem__(self, place: str) -> str:
        return f"{self.tag}{place}"

    def sensitive(self) -> dict[str, str]:
        """Text that looks like secrets or PII: removed in every mode."""
        jwt = ".".join(base64.urlsafe_b64encode(json.dumps({"x": self["jwt"]}).encode()).decode().rstrip("=")
                       for _ in range(2)) + "." + self["sig"]
        return {"email": f"{self['email']}@example.com", "apikey": f"sk-{self['apikey']}AbCdEf012345",
                "jwt": jwt, "password": f"password={self['password']}"}

    def spelled(self) -> dict[str, str]:
        """The same kinds spelled so that ASCII patterns would miss them; removed in every mode."""
        return {"dotted card": ".".join(self.card[i:i + 4] for i in range(0, 16, 4)),
                "fullwidth card": " ".join(self.card_fullwidth[i:i + 4] for i in range(0, 16, 4)),
                "lower-case iban": " ".join(self.iban[i:i + 4] for i in range(0, 22, 4)).lower(),
                "fullwidth at": f"{self['fwemail']}\uff20example\uff0ecom",
                "cyrillic prefix": f"\u0455k-{self['cyrkey']}AbCdEf012345"}

    def prompt(self) -> str:
        s = self.sensitive()
        spelled = ", ".join(self.spelled().values())
        return (f"{ORDINARY}. Plain marker {self['word']}. Contact {s['email']}, use {s['apikey']} "
                f"and {s['jwt']} with {s['password']}. Also {spelled}.")

    def all_markers(self) -> list[str]:
        return [self[p] for p in ("word", "email", "apikey", "jwt", "password", "user", "metadata", "header",
                                  "agent", "badtoken", "invalid", "fwemail", "cyrkey")]

    def numbers(self) -> list[str]:
        """The card and account numbers, as they read with every separator taken out."""
        return [self.card, self.card_fullwidth_digits, self.iban]


def _luhn_card(generator: random.Random) -> str:
    digits = "4" + "".join(generator.choice("0123456789") for _ in range(14))
    for check in "0123456789":
        if luhn.is_valid(digits + check):
            return digits + check
    raise AssertionError("some check digit is Luhn-valid")


def _german_iban(generator: random.Random) -> str:
    bban = "".join(generator.choice("0123456789") for _ in range(18))
    return f"DE{mod_97_10.calc_check_digits(bban + 'DE')}{bban}"


def _as_read(text: str) -> str:
    """A sink's text as the detectors read it (JSON escapes undone, folded), in upper case and
    without separators, so a number found here was in the sink in some spelling."""
    unescaped = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)
    unescaped = unescaped.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return re.sub(r"[^0-9A-Z]", "", fold(unescaped).text.upper())


def _env(issuer_url: str, redis_url: str, audit_file: Path, key: Path) -> dict[str, str]:
    return gateway_env(**{
        "TENANTGATE_MODEL": "demo", "TENANTGATE_KV_CACHE_MEMORY_BYTES": str(32 << 20),
        "TENANTGATE_AUTHORITY": issuer_url, "TENANTGATE_V1_ISSUER_HOST": issuer_url, "TENANTGATE_AUDIENCES": AUDIENCE,
        "TENANTGATE_POLICY_DATA_DIR": str(DATA_DIR), "TENANTGATE_REDIS_URL": redis_url,
        "TENANTGATE_AUDIT_FILE": str(audit_file), "TENANTGATE_AUDIT_SIGNING_KEY": str(key),
        "TENANTGATE_AUDIT_REDIS_STREAM": "canary:audit", "TENANTGATE_AUDIT_STDOUT": "true",
    })


def _send_everything(base: str, token: str, c: Canaries, bad_token: str) -> list[str]:
    """Every kind of request, each carrying the canaries; returns the error bodies."""
    headers = {"Authorization": f"Bearer {token}", "X-Canary": c["header"], "User-Agent": c["agent"]}
    chat = {"model": "demo", "max_tokens": 4, "user": c["user"], "metadata": {"note": c["metadata"]},
            "messages": [{"role": "user", "content": c.prompt()}]}
    errors = []
    with httpx.Client(base_url=base, timeout=60, headers=headers) as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        with client.stream("POST", "/v1/chat/completions", json=chat | {"stream": True}) as response:
            assert response.status_code == 200
            response.read()
        completion = {"model": "demo", "max_tokens": 4, "user": c["user"], "prompt": c.prompt()}
        assert client.post("/v1/completions", json=completion).status_code == 200
        # Refusals, each with canaries in the body: errors must not echo them.
        for body in (chat | {"n": 5}, chat | {"temperature": c["invalid"]}, chat | {"model": c["invalid"]},
                     chat | {"messages": [{"role": c["invalid"], "content": c.prompt()}]}):
            response = client.post("/v1/chat/completions", json=body)
            assert 400 <= response.status_code < 500
            errors.append(response.text)
        refused = client.post("/v1/chat/completions", json=chat,
                              headers={"Authorization": f"Bearer {bad_token}"})
        assert refused.status_code == 401
        errors.append(refused.text + json.dumps(dict(refused.headers)))
    return errors


def test_no_canary_reaches_a_sink_the_policy_forbids(local_issuer, redis_server, otel_collector, tmp_path) -> None:
    audit_file = tmp_path / "audit.jsonl"
    env = _env(local_issuer.base_url, redis_server.url, audit_file, tmp_path / "audit.pem")
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": otel_collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    port, metrics_port = free_port(), free_port()
    env["TENANTGATE_METRICS_PORT"] = str(metrics_port)
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    none_mode, redacted_mode = Canaries("none"), Canaries("redacted")
    tokens = {ALPHA: local_issuer.mint(ALPHA, audience=AUDIENCE), THETA: local_issuer.mint(THETA, audience=AUDIENCE)}
    with stdout.open("w") as out, stderr.open("w") as err:
        server = subprocess.Popen([TENANTGATE, "serve", "--port", str(port), "--log-level", "debug"],
                                  env=env, stdout=out, stderr=err)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base, server, output=stderr.read_text)
            errors, bad_tokens = [], []
            for tenant, canaries in ((ALPHA, none_mode), (THETA, redacted_mode)):
                bad = local_issuer.mint(tenant, audience=AUDIENCE, extra_claims={"name": canaries["badtoken"]},
                                        lifetime_s=-3600)
                bad_tokens.append(bad)
                errors += _send_everything(base, tokens[tenant], canaries, bad)
            time.sleep(0.5)  # the audit record waits a moment for the engine's x-record
            metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        finally:
            server.terminate()
            server.wait(30)
    client = redis.Redis.from_url(redis_server.url)
    stream = "\n".join(fields[b"entry"].decode() if b"entry" in fields else str(fields)
                       for _, fields in client.xrange("canary:audit"))
    client.close()
    # The server flushed its spans as it stopped; the collector writes them within its flush interval.
    served = otel_collector.wait_for(4, name="chat demo")
    sinks = {"stdout": stdout.read_text(), "stderr": stderr.read_text(), "audit file": audit_file.read_text(),
             "redis stream": stream, "metrics": metrics, "error bodies": "\n".join(errors),
             "spans": otel_collector.raw()}
    assert sinks["audit file"].count('"type":"record"') >= 6, "the audit trail did not record the served requests"
    assert len(served) >= 4 and len(otel_collector.spans()) > 30, "the collector did not get the spans"
    assert len(stream) > 0 and "GET /readyz" in sinks["stdout"] + sinks["stderr"]  # the logs were captured

    leaks = []
    for name, text in sinks.items():
        for token in [*tokens.values(), *bad_tokens]:
            if token in text or token[-40:] in text or token.split(".")[1][:40] in text:
                leaks.append((name, "bearer token"))
        for marker in none_mode.all_markers():
            if marker in text:
                leaks.append((name, marker))
        for marker in redacted_mode.all_markers():
            # Plain words in the prompt and metadata are content the redacted mode keeps, in the trail only.
            ordinary = marker in (redacted_mode["word"], redacted_mode["metadata"])
            allowed = ordinary and name in ("stdout", "audit file", "redis stream")
            if marker in text and not allowed:
                leaks.append((name, marker))
        read = _as_read(text)
        for canaries in (none_mode, redacted_mode):
            leaks += [(name, number) for number in canaries.numbers() if number in read]
            leaks += [(name, marker) for marker in canaries.all_markers() if marker.upper() in read
                      and marker not in text and marker not in (redacted_mode["word"], redacted_mode["metadata"])]
    assert leaks == [], "\n".join(map(str, leaks))

    # Redacted mode keeps what is not sensitive: the ordinary words and the plain marker.
    records = [json.loads(line) for line in sinks["audit file"].splitlines() if '"type":"record"' in line]
    kept = [r["content"] for r in records if "content" in r]
    assert kept and all(ORDINARY in json.dumps(content) for content in kept)
    assert any(redacted_mode["word"] in json.dumps(content) for content in kept)
    assert any("[EMAIL:" in json.dumps(content) for content in kept)
    assert len(kept) == 3  # Theta's three served requests; Alpha's policy logs no content at all
