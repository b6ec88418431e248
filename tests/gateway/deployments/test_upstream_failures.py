"""What a caller and the audit trail see when an OpenAI-compatible deployment misbehaves, end to
end: the openai SDK over real HTTP to the gateway, the gateway over real HTTP to scripted
upstreams. [DONE] ends an answer whose body stays open; a connection closed once the request
went out is not sent again (to that deployment or another); a stream silent for the idle timeout
ends with an error event; usage beyond what the request could use is not charged."""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from devkit.server import serving
from gateway.app import create_app
from gateway.metrics import GatewayMetrics
from tests.gateway.api.conftest import AUDIENCE, BETA, gateway_settings
from tests.gateway.deployments.test_openai_upstream import FakeUpstream

MODEL = "some-other-model"  # the one model Beta's policy names
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def records(audit_file: Path) -> dict[str, dict]:
    entries = map(json.loads, audit_file.read_text().splitlines())
    return {e["request_id"]: e for e in entries if e["type"] == "record"}


def record_of(audit_file: Path, request_id: str) -> dict:
    deadline = time.monotonic() + 10
    while request_id not in records(audit_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    return records(audit_file)[request_id]


def gateway(local_issuer, root: Path, entries: list[dict], **settings) -> Iterator[tuple[openai.OpenAI, Path, object]]:
    deployments = root / "deployments.json"
    deployments.write_text(json.dumps({"models": {MODEL: entries}}))
    audit_file = root / "audit.jsonl"
    metrics = GatewayMetrics()
    app = create_app(gateway_settings(local_issuer, deployments_file=deployments, metrics_port=0,
                                      audit_file=audit_file, audit_signing_key=root / "audit.pem", **settings),
                     metrics=metrics)
    with serving(app) as base_url, openai.OpenAI(base_url=base_url + "/v1", max_retries=0, timeout=30,
                                                 api_key=local_issuer.mint(BETA, audience=AUDIENCE)) as client:
        yield client, audit_file, metrics


@pytest.fixture(scope="module")
def scripted(local_issuer, tmp_path_factory):
    fake = FakeUpstream()
    with serving(fake.app) as url:
        entry = {"name": "u", "kind": "openai", "dialect": "vllm", "url": url + "/v1", "timeout_s": 20}
        for client, audit_file, metrics in gateway(local_issuer, tmp_path_factory.mktemp("scripted"), [entry],
                                                   upstream_idle_timeout_s=0.5):
            yield fake, client, audit_file, metrics


@pytest.fixture(autouse=True)
def fresh(request) -> None:
    if "scripted" in request.fixturenames:
        fake = request.getfixturevalue("scripted")[0]
        fake.mode, fake.received[:] = "ok", []


def test_done_ends_the_answer_though_the_upstream_keeps_its_body_open(scripted) -> None:
    fake, client, audit_file, _ = scripted
    fake.mode = "done-open"  # [DONE], then the body stays open for 20 s
    started = time.monotonic()
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, stream=True))
    assert time.monotonic() - started < 5
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Paris."
    record = record_of(audit_file, chunks[0].id)
    assert (record["status"], record["outcome"]) == (200, "completed")


def test_a_stream_silent_past_the_idle_timeout_ends_with_an_error_the_record_names(scripted) -> None:
    fake, client, audit_file, _ = scripted
    fake.mode = "stall"  # two chunks, then 3 s of silence
    texts, started = [], time.monotonic()
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, stream=True)
    with pytest.raises(openai.APIError) as broken:
        for chunk in stream:
            texts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert time.monotonic() - started < 2.5 and "".join(texts) == "Paris."
    assert "stopped sending" in str(broken.value) and broken.value.code == "upstream_idle_timeout"
    record = record_of(audit_file, chunk.id)
    assert (record["status"], record["outcome"], record["error_code"]) == (503, "error", "upstream_idle_timeout")


@pytest.mark.parametrize("stream", [True, False])
def test_usage_beyond_what_the_request_could_use_is_not_charged_and_is_recorded(scripted, stream) -> None:
    fake, client, audit_file, metrics = scripted
    fake.mode = "huge-usage"  # the upstream claims 10^9 prompt and 10^9 completion tokens
    options = {"stream_options": {"include_usage": True}} if stream else {}
    answer = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, stream=stream, **options)
    if stream:
        chunks = list(answer)
        request_id, usage = chunks[0].id, chunks[-1].usage
    else:
        request_id, usage = answer.id, answer.usage
    # At most max_tokens, and at most the request body's bytes (a few hundred here).
    assert usage.completion_tokens == 5 and 0 < usage.prompt_tokens < 400
    record = record_of(audit_file, request_id)
    assert record["usage"]["completion_tokens"] == 5 and record["usage"]["prompt_tokens"] == usage.prompt_tokens
    assert record["usage_excess"] == {"completion_tokens": 10**9 - 5, "prompt_tokens": 10**9 - usage.prompt_tokens}
    excess = metrics.registry.get_sample_value("tenantgate_deployment_usage_excess_tokens_total",
                                               {"target": "u", "type": "completion_tokens"})
    assert excess is not None and excess >= 10**9 - 5


class _Dropping(socketserver.BaseRequestHandler):
    """Reads one HTTP request whole, counts it, and closes the connection without an answer."""

    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.request.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            body += self.request.recv(65536)
        with self.server.lock:
            self.server.received.append(body)


@pytest.fixture
def dropping() -> Iterator[list[str]]:
    servers = []
    received, lock = [], threading.Lock()
    for _ in range(2):
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Dropping)
        server.daemon_threads, server.received, server.lock = True, received, lock
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield [f"http://127.0.0.1:{s.server_address[1]}/v1" for s in servers], received
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_connection_closed_once_the_request_went_out_is_not_sent_again_anywhere(local_issuer, tmp_path,
                                                                                 dropping) -> None:
    urls, received = dropping
    entries = [{"name": f"u{i}", "kind": "openai", "dialect": "vllm", "url": url} for i, url in enumerate(urls)]
    for client, audit_file, _ in gateway(local_issuer, tmp_path, entries):
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=5)
        assert failed.value.status_code == 503 and failed.value.code == "upstream_interrupted"
        assert "not sent again" in failed.value.message
        assert len(received) == 1  # to neither the same deployment nor the other one
        record = record_of(audit_file, failed.value.response.headers["x-request-id"])
        assert (record["status"], record["error_code"]) == (503, "upstream_interrupted")
