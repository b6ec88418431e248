"""`tenantgate engine serve` as a real process on loopback: it streams what the in-process engine
computes, only for envelopes a gateway signed; anything else is a 403 and the engine runs nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from devkit.server import TENANTGATE, ServeProcess, gateway_env, tenantgate_serve
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.remote import ENVELOPE_HEADER, EnvelopeSigner
from engine.remote.protocol import envelope_to_json
from engine.remote.signing import body_digest
from engine.sampling_params import SamplingParams
from gateway.deployments.base import EnvelopeRefused, ReplicaLoad, UpstreamRejected
from gateway.deployments.replica_client import ReplicaClient
from tests.utils.envelopes import envelope
from tests.utils.signing import write_key_pair

ENV = envelope(tenant="northwind")
PROMPT = [5, 17, 300, 42, 7, 99]
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
ENGINE_FLAGS = ("--model", "demo", "--dtype", "float32", "--device", "cpu", "--kv-cache-memory", str(32 << 20),
                "--max-num-seqs", "4")


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, EnvelopeSigner]:
    root = tmp_path_factory.mktemp("envelope-keys")
    signer = write_key_pair(root / "public", root / "private", "gateway")
    return root / "public", signer


@pytest.fixture(scope="module")
def server(demo_model_dir, keys, tmp_path_factory):
    public, _ = keys
    with tenantgate_serve(tmp_path_factory.mktemp("engine-serve"), gateway_env(), *ENGINE_FLAGS,
                          "--envelope-public-keys", str(public), command=("engine", "serve")) as process:
        yield process


@pytest.fixture
def signer(keys) -> EnvelopeSigner:
    return keys[1]


def metrics(server: ServeProcess) -> dict[str, float]:
    """Every sample on /metrics, keyed by name and labels (`name{label="value"}`)."""
    text = httpx.get(server.base_url + "/metrics", timeout=5).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def engine_work(samples: dict[str, float]) -> dict[str, float]:
    """What moves when the engine runs anything: its steps, the requests it ended, their latencies."""
    prefixes = ("tenantgate_steps_total", "tenantgate_engine_requests_total",
                "tenantgate_engine_request_duration_seconds_count")
    return {k: v for k, v in samples.items() if k.startswith(prefixes)}


def generate_body(request_id: str, token_ids=PROMPT, max_tokens: int = 2) -> bytes:
    params = {"max_tokens": max_tokens, "temperature": 0.0}
    return json.dumps({"request_id": request_id, "token_ids": token_ids, "params": params}).encode()


def post(server: ServeProcess, body: bytes, token: str | None) -> httpx.Response:
    headers = {"content-type": "application/json"} | ({ENVELOPE_HEADER: token} if token is not None else {})
    return httpx.post(server.base_url + "/v1/engine/generate", content=body, headers=headers, timeout=30)


def test_a_signed_request_streams_the_in_process_engines_greedy_tokens(server, signer, demo_model_dir) -> None:
    local = LLMEngine(EngineConfig(model="demo", dtype="float32", device="cpu", kv_cache_memory_bytes=32 << 20))
    expected = local.generate([PROMPT], GREEDY, ENV)[0]

    async def run():
        replica = ReplicaClient(server.base_url, signer)
        try:
            outputs = [o async for o in replica.generate(PROMPT, GREEDY, ENV, "same-as-local")]
            return outputs, replica.engine_record("same-as-local"), await replica.info()
        finally:
            await replica.aclose()

    outputs, record, info = asyncio.run(run())
    assert [t for o in outputs for t in o.new_token_ids] == expected.token_ids
    assert "".join(o.new_text for o in outputs) == expected.text
    assert outputs[-1].finished and outputs[-1].finish_reason == "length"
    assert outputs[-1].num_prompt_tokens == len(PROMPT) and outputs[-1].num_output_tokens == GREEDY.max_tokens
    # The x-record came with the stream, once, for the audit; the same model ran it.
    assert record.request_id == "same-as-local" and record.output_tokens == GREEDY.max_tokens
    assert record.model_fingerprint == info["fingerprint"] == local.fingerprint
    assert record.cache_scope == "tenant" and record.isolation == "shared"


def test_forged_expired_replayed_rebound_missing_and_long_lived_envelopes_get_403_and_run_nothing(
        server, signer) -> None:
    stranger = EnvelopeSigner(Ed25519PrivateKey.generate())
    now = time.time()

    # Replay needs one accepted request first: it runs, and its token is captured.
    captured_body = generate_body("captured")
    captured = signer.sign(ENV, "captured", captured_body)
    assert post(server, captured_body, captured).status_code == 200

    def claims(request_id: str, body: bytes, **changes) -> dict:
        return {"kid": signer.kid, "iat": int(now), "exp": int(now) + 30, "request_id": request_id,
                "body_sha256": body_digest(body), "envelope": envelope_to_json(ENV)} | changes

    body = generate_body("fresh")
    cases = {
        "unknown_key": (body, stranger.sign(ENV, "fresh", body)),
        "bad_signature": (body, stranger.encode(claims("fresh", body))),  # names the gateway's key id
        "expired": (body, signer.sign(ENV, "fresh", body, now=now - 120)),
        "replayed": (captured_body, captured),
        "body_mismatch": (generate_body("fresh", token_ids=[1, 2, 3]), signer.sign(ENV, "fresh", body)),
        "missing": (body, None),
        "ttl_too_long": (body, signer.encode(claims("fresh", body, exp=int(now) + 61))),
        "malformed": (body, "not-a-token"),
    }
    before = metrics(server)
    for reason, (sent, token) in cases.items():
        response = post(server, sent, token)
        assert response.status_code == 403, reason
        assert response.json() == {"error": {"message": "the execution envelope was refused", "type": "forbidden",
                                             "param": None, "code": reason}}
    after = metrics(server)
    assert engine_work(after) == engine_work(before)  # the engine stepped and ended nothing
    for reason in cases:
        key = f'tenantgate_envelope_rejections_total{{reason="{reason}"}}'
        assert after[key] == before[key] + 1, reason
    assert httpx.get(server.base_url + "/v1/engine/load", timeout=5).json()["queue_depth"] == 0
    # The refusals are logged by reason; no token, and no prompt, ever reaches the log.
    log = server.stderr.read_text()
    assert "envelope refused: replayed" in log and "envelope refused: bad_signature" in log
    for _, token in cases.values():
        assert token is None or token not in log
    assert str(PROMPT)[1:-1] not in log and "token_ids" not in log


def test_the_client_maps_a_403_to_envelope_refused_and_a_400_to_upstream_rejected(server, signer) -> None:
    stranger = EnvelopeSigner(Ed25519PrivateKey.generate())

    async def run():
        refused = ReplicaClient(server.base_url, stranger, name="engine-0")
        trusted = ReplicaClient(server.base_url, signer)
        try:
            with pytest.raises(EnvelopeRefused) as caught:
                await anext(refused.generate(PROMPT, GREEDY, ENV, "from-a-stranger"))
            assert caught.value.reason == "unknown_key" and "engine-0" in str(caught.value)
            with pytest.raises(UpstreamRejected) as rejected:  # a token id beyond the demo vocabulary
                await anext(trusted.generate([10**9], GREEDY, ENV, "out-of-vocabulary"))
            assert rejected.value.status == 400 and rejected.value.param == "prompt"
            with pytest.raises(UpstreamRejected) as overflow:  # a prompt over the replica's context window
                await anext(trusted.generate([5] * 100_000, GREEDY, ENV, "over-the-context"))
            assert overflow.value.code == "context_length_exceeded" and "100000 tokens" in overflow.value.message
        finally:
            await refused.aclose()
            await trusted.aclose()

    asyncio.run(run())


def test_a_schema_the_replica_cannot_enforce_is_refused_naming_response_format(server, signer) -> None:
    """The engine gives the reason alone; the replica's answer reads as the embedded engine's does."""
    bogus = SamplingParams(max_tokens=2, json_schema='{"type": "bogus"}')

    async def run():
        replica = ReplicaClient(server.base_url, signer)
        try:
            with pytest.raises(UpstreamRejected) as rejected:
                await anext(replica.generate(PROMPT, bogus, ENV, "bogus-schema"))
        finally:
            await replica.aclose()
        return rejected.value

    rejected = asyncio.run(run())
    assert (rejected.status, rejected.param, rejected.code) == (400, "response_format", "invalid_json_schema")
    assert rejected.message.startswith("response_format: the JSON schema cannot be enforced: ")


def test_closing_the_clients_stream_early_aborts_the_request_on_the_server(server, signer) -> None:
    long = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
    aborted = 'tenantgate_engine_requests_total{finish_reason="abort"}'
    before = metrics(server).get(aborted, 0.0)

    async def run() -> list[ReplicaLoad]:
        replica = ReplicaClient(server.base_url, signer)
        try:
            stream = replica.generate(PROMPT, long, ENV, "left-early")
            await anext(stream)
            await anext(stream)
            running = await replica.load()
            await stream.aclose()
            loads = [running]
            for _ in range(100):  # up to 10 s
                loads.append(await replica.load())
                if loads[-1].queue_depth == 0:
                    break
                await asyncio.sleep(0.1)
            return loads
        finally:
            await replica.aclose()

    loads = asyncio.run(run())
    assert loads[0].queue_depth == 1 and loads[0].kv_usage > 0
    assert loads[-1] == ReplicaLoad(queue_depth=0, kv_usage=0.0)
    assert metrics(server)[aborted] == before + 1  # the engine recorded an abort, not a finish


def test_health_readiness_metrics_load_and_info_answer(server) -> None:
    base = server.base_url
    assert httpx.get(base + "/healthz", timeout=5).json() == {"status": "ok"}
    assert httpx.get(base + "/readyz", timeout=5).json() == {"status": "ready"}
    samples = metrics(server)
    assert "tenantgate_kv_blocks" in {k.split("{")[0] for k in samples}
    assert 'tenantgate_envelope_rejections_total{reason="replay_cache_full"}' in samples
    load = httpx.get(base + "/v1/engine/load", timeout=5).json()
    assert set(load) == {"queue_depth", "kv_usage"} and load["queue_depth"] == 0
    info = httpx.get(base + "/v1/engine/info", timeout=5).json()
    assert set(info) == {"model", "fingerprint", "max_model_len"} and info["model"] == "demo"


def test_a_bad_body_with_a_valid_envelope_is_a_400(server, signer) -> None:
    body = json.dumps({"request_id": "bad-params", "token_ids": PROMPT, "params": {"top_p": 7}}).encode()
    response = post(server, body, signer.sign(ENV, "bad-params", body))
    assert response.status_code == 400 and "top_p" in response.json()["error"]["message"]


def test_start_up_refuses_to_run_without_a_public_key(tmp_path) -> None:
    for extra in ([], ["--envelope-public-keys", str(tmp_path)]):
        result = subprocess.run([TENANTGATE, "engine", "serve", "--model", "demo", *extra], env=gateway_env(),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert "public key" in result.stderr and "Traceback" not in result.stderr


def test_sigterm_lets_a_running_stream_finish_and_refuses_new_connections(demo_model_dir, keys, tmp_path) -> None:
    public, signer = keys
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    with tenantgate_serve(tmp_path, gateway_env(), *ENGINE_FLAGS, "--envelope-public-keys", str(public),
                          command=("engine", "serve")) as process:

        async def run():
            replica = ReplicaClient(process.base_url, signer)
            try:
                stream = replica.generate(PROMPT, params, ENV, "draining")
                outputs = [await anext(stream)]
                process.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)
                with pytest.raises(httpx.ConnectError):
                    await asyncio.to_thread(httpx.get, process.base_url + "/healthz", timeout=2)
                outputs += [o async for o in stream]
                return outputs, replica.engine_record("draining")
            finally:
                await replica.aclose()

        outputs, record = asyncio.run(run())
        assert process.process.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it caught
    assert outputs[-1].finished and outputs[-1].num_output_tokens == params.max_tokens
    assert record is not None and record.finish_reason == "length"
