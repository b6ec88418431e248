"""The gateway and two `tenantgate engine serve` replicas as real processes on loopback, called
with the openai SDK: a namespace stays on one replica (and hits its prefix cache there); when a
replica dies, requests with no output yet move to the other one, a stream in flight ends with an
error event (as it does when a stopped replica stays silent past the idle timeout), and nothing
ever answers outside OpenAI's error shape."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.server import ServeProcess, free_port, gateway_env, tenantgate_serve
from tests.gateway.api.conftest import ALPHA, AUDIENCE, THETA, serve_env
from tests.utils.signing import write_key_pair

ENGINE_FLAGS = ("--model", "demo", "--dtype", "float32", "--device", "cpu", "--kv-cache-memory", str(32 << 20),
                "--max-num-seqs", "8")
IDLE_TIMEOUT_S = 3  # the longest a replica may go silent mid-stream (the demo model is far quicker)
SYSTEM = ("You are the meeting assistant of the board. Summarise the notes you are given in three short points, "
          "keeping every figure exactly as it was written, and never add anything that is not in the notes.")


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@dataclass
class Cluster:
    gateway: ServeProcess
    replicas: list[ServeProcess]
    audit_file: Path
    issuer: object

    clients: list
    metrics_url: str

    def failures(self, target: str, when: str) -> float:
        for family in text_string_to_metric_families(httpx.get(self.metrics_url, timeout=5).text):
            for sample in family.samples:
                if sample.name == "tenantgate_deployment_failures_total" and sample.labels == {
                        "target": target, "when": when}:
                    return sample.value
        return 0.0

    def client(self, tenant: str = ALPHA) -> openai.OpenAI:
        token = self.issuer.mint(tenant, audience=AUDIENCE)
        client = openai.OpenAI(base_url=self.gateway.base_url + "/v1", api_key=token, max_retries=0, timeout=60)
        self.clients.append(client)
        return client

    def records(self, *replies) -> dict[str, dict]:
        """The audit records of these replies, once all are written (each waits for its x-record)."""
        deadline = time.monotonic() + 10
        while True:
            entries = map(json.loads, self.audit_file.read_text().splitlines())
            records = {e["request_id"]: e for e in entries if e["type"] == "record"}
            if all(r.id in records for r in replies) or time.monotonic() > deadline:
                return {r.id: records[r.id] for r in replies}
            time.sleep(0.05)

    def replica_of(self, name: str) -> ServeProcess:
        return self.replicas[int(name.rsplit("/", 1)[1])]


@contextlib.contextmanager
def cluster(root: Path, issuer, *, poll_interval_s: float = 0.2) -> Iterator[Cluster]:
    public = root / "keys" / "public"
    write_key_pair(public, root / "keys" / "private", "gateway")
    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(tenantgate_serve(root, gateway_env(), *ENGINE_FLAGS, "--envelope-public-keys",
                                                         str(public), command=("engine", "serve")))
                    for _ in range(2)]
        deployments = root / "deployments.json"
        deployments.write_text(json.dumps({"models": {"demo": [{
            "name": "engines", "kind": "tenantgate", "replicas": [r.base_url for r in replicas], "tokenizer": "demo",
            "connect_timeout_s": 1, "first_token_timeout_s": 30}]}}))
        audit_file = root / "audit.jsonl"
        metrics_port = free_port()
        env = serve_env(issuer, TENANTGATE_DEPLOYMENTS_FILE=str(deployments),
                        TENANTGATE_ENVELOPE_SIGNING_KEY=str(root / "keys" / "private" / "gateway.pem"),
                        TENANTGATE_AUDIT_FILE=str(audit_file), TENANTGATE_AUDIT_SIGNING_KEY=str(root / "audit.pem"),
                        TENANTGATE_LOAD_POLL_INTERVAL_S=str(poll_interval_s),
                        TENANTGATE_UPSTREAM_IDLE_TIMEOUT_S=str(IDLE_TIMEOUT_S),
                        TENANTGATE_METRICS_PORT=str(metrics_port))
        gateway = stack.enter_context(tenantgate_serve(root, env))
        running = Cluster(gateway, replicas, audit_file, issuer, [], f"http://127.0.0.1:{metrics_port}/metrics")
        try:
            yield running
        finally:
            for client in running.clients:
                client.close()


@pytest.fixture(scope="module")
def running(local_issuer, demo_model_dir, tmp_path_factory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("replicas"), local_issuer) as running:
        yield running


def test_a_namespace_stays_on_one_replica_and_hits_its_prefix_cache(running: Cluster) -> None:
    client = running.client(ALPHA)
    replies = [client.chat.completions.create(model="demo", messages=messages(f"Notes, item {i}."), max_tokens=2,
                                              temperature=0) for i in range(4)]
    records = running.records(*replies)
    placed = {records[r.id]["deployment"] for r in replies}
    assert len(placed) == 1 and placed <= {"engines/0", "engines/1"}
    # Each record carries the replica's own x-record, and the repeats found the shared system prompt cached.
    assert all(records[r.id]["engine"]["model_fingerprint"] == records[replies[0].id]["model_fingerprint"]
               for r in replies)
    assert all(r.usage.prompt_tokens_details.cached_tokens > 0 for r in replies[1:])
    # Another tenant's namespace is hashed on its own; the replicas it uses are its own business,
    # but whichever it is, it stays there too.
    other = running.client(THETA)
    theirs = [other.chat.completions.create(model="demo", messages=messages(f"Item {i}."), max_tokens=1,
                                            temperature=0) for i in range(3)]
    assert len({record["deployment"] for record in running.records(*theirs).values()}) == 1


def test_n_choices_pass_through_a_replica_with_its_shared_prefix_in_the_record(running: Cluster) -> None:
    client = running.client(ALPHA)
    whole = client.chat.completions.create(model="demo", messages=messages("Notes, the choices item."), n=3,
                                           max_tokens=4, temperature=1.0, seed=2)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    stream = list(client.chat.completions.create(model="demo", messages=messages("Notes, the stream item."), n=2,
                                                 max_tokens=4, temperature=1.0, seed=2, stream=True,
                                                 stream_options={"include_usage": True}))
    finished = {c.index for chunk in stream for c in chunk.choices if c.finish_reason is not None}
    assert finished == {0, 1} and stream[-1].usage is not None
    records = running.records(whole, stream[-1])
    for reply, n in ((whole, 3), (stream[-1], 2)):
        engine = records[reply.id]["engine"]  # the replica's x-record, after the last choice's delta
        assert engine["choices"] == n and engine["shared_prefix_blocks"] >= 2
        assert reply.usage.completion_tokens == engine["output_tokens"]


def test_the_models_list_shows_the_remote_model(running: Cluster) -> None:
    assert [m.id for m in running.client(ALPHA).models.list()] == ["demo"]


def test_a_stopped_replica_ends_its_stream_after_the_idle_timeout_with_an_error_the_record_names(
        running: Cluster) -> None:
    client = running.client(ALPHA)
    stream = client.chat.completions.create(model="demo", messages=messages("Stop me."), max_tokens=512,
                                            temperature=0, stream=True)
    chunks = iter(stream)
    first = next(chunks)
    # Both, as bounded load may have sent the stream to either: alive, connected, silent.
    for replica in running.replicas:
        replica.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(openai.APIError) as broken:
            for _ in chunks:
                pass
        waited = time.monotonic() - started
    finally:
        for replica in running.replicas:
            replica.process.send_signal(signal.SIGCONT)
        stream.close()
    assert IDLE_TIMEOUT_S - 1 < waited < IDLE_TIMEOUT_S + 10, waited  # not the 300 s of timeout_s
    assert broken.value.code == "upstream_idle_timeout" and "stopped sending" in str(broken.value)
    record = running.records(first)[first.id]
    assert (record["status"], record["outcome"], record["error_code"]) == (503, "error", "upstream_idle_timeout")


def test_a_dead_replica_fails_over_before_output_and_ends_streams_with_an_error(local_issuer, demo_model_dir,
                                                                                 tmp_path) -> None:
    # The router learns of the death from the requests themselves, not from a load poll.
    with cluster(tmp_path, local_issuer, poll_interval_s=60) as running:
        client = running.client(ALPHA)
        warm = client.chat.completions.create(model="demo", messages=messages("Warm up."), max_tokens=1,
                                              temperature=0)
        home = running.records(warm)[warm.id]["deployment"]
        victim = running.replica_of(home)

        stream = client.chat.completions.create(model="demo", messages=messages("A long answer, please."),
                                                max_tokens=400, temperature=0, stream=True)
        chunks = iter(stream)
        assert next(chunks).choices[0].delta.role == "assistant"
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(10)
        with pytest.raises(openai.APIError) as broken:
            for _ in chunks:
                pass
        stream.close()
        assert "incomplete" in str(broken.value)

        # Nothing had been sent for these: each moves to the surviving replica and is answered.
        survivor = next(name for name in ("engines/0", "engines/1") if name != home)
        after = [client.chat.completions.create(model="demo", messages=messages(f"After {i}."), max_tokens=2,
                                                temperature=0) for i in range(3)]
        assert {record["deployment"] for record in running.records(*after).values()} == {survivor}
        assert all(r.choices[0].message.content for r in after)
        assert running.failures(home, "after_output") == 1  # the stream
        assert running.failures(home, "before_output") >= 1  # tried first, refused the connection, moved on

        # With no replica left: a 503 in OpenAI's error shape, never a bare 5xx.
        other = running.replica_of(survivor)
        other.process.send_signal(signal.SIGKILL)
        other.process.wait(10)
        response = httpx.post(running.gateway.base_url + "/v1/chat/completions", timeout=30,
                              headers={"Authorization": f"Bearer {local_issuer.mint(ALPHA, audience=AUDIENCE)}"},
                              json={"model": "demo", "messages": messages("Anyone?"), "max_tokens": 1})
        assert response.status_code == 503
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "service_unavailable"


def test_tenants_given_a_public_segment_meet_on_one_replica_and_share_only_its_blocks(running: Cluster) -> None:
    # Alpha and Theta are given the api tests' platform segment (tests/gateway/api/data): their
    # requests are routed by the segment's namespace, so Theta reads the public blocks Alpha computed.
    from tests.gateway.api.test_cache_segments import QUESTION, SEGMENTS
    from tests.gateway.api.test_cache_segments import SYSTEM as PUBLIC_SYSTEM

    public_tokens = SEGMENTS["assistant"]["tokens"] // 16 * 16
    first = running.client(ALPHA).chat.completions.create(model="demo", messages=[PUBLIC_SYSTEM, QUESTION],
                                                          max_tokens=1, temperature=0)
    second = running.client(THETA).chat.completions.create(model="demo", messages=[PUBLIC_SYSTEM, QUESTION],
                                                           max_tokens=1, temperature=0)
    records = running.records(first, second)
    assert records[first.id]["deployment"] == records[second.id]["deployment"]
    engine = records[second.id]["engine"]  # the replica's x-record, the segment carried in the signed envelope
    assert engine["public_segment"] == SEGMENTS["assistant"]["digest"] and engine["public_tokens"] == public_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == public_tokens
