"""Traces, proven on a real OpenTelemetry Collector (otelcol-tenantgate: the OTLP receiver and the
file exporter): the gateway, configured only by OTEL_* variables, exports a server span per
request under the caller's W3C traceparent, a child span per stage, and hands its own context to
the upstream deployment in the traceparent header. The spans are read back from the collector's
file: names, parent ids, attributes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import openai
import pytest

from devkit.otelcol import Span
from devkit.server import serving
from gateway.app import create_app
from gateway.inference import NullBackend
from gateway.tracing import TracingError, tracer_provider
from tests.gateway.api.conftest import (
    ALPHA,
    AUDIENCE,
    BETA,
    EMBEDDING_MODEL,
    embedding_encoder,  # noqa: F401 - the fixture, shared with the API tests
    gateway_settings,
)
from tests.gateway.deployments.test_openai_upstream import FakeUpstream

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
UPSTREAM_MODEL = "some-other-model"  # the one model Beta's policy names
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
STAGES = {"authenticate", "policy", "quota", "engine", "audit"}
TRACESTATE_CANARY = "cnrytracestate7e21"


@contextmanager
def traced_gateway(issuer, collector, tmp_path, monkeypatch, encoder=None,
                   **otel: str) -> Iterator[tuple[str, FakeUpstream, object]]:
    """The demo model on the null engine, UPSTREAM_MODEL on a scripted vLLM (and the encoder, if
    given), exporting to the collector as the OTEL_* variables say. Leaving it stops the app,
    which flushes its spans."""
    environment = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_SERVICE_NAME": "tenantgate-test",
                   "OTEL_BSP_SCHEDULE_DELAY": "50"} | otel
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    fake = FakeUpstream()
    with serving(fake.app) as upstream_url:
        deployments = tmp_path / "deployments.json"
        deployments.write_text(json.dumps({"models": {
            "demo": [{"name": "local", "kind": "embedded"}],
            UPSTREAM_MODEL: [{"name": "vllm-a", "kind": "openai", "dialect": "vllm", "url": upstream_url + "/v1"}],
            EMBEDDING_MODEL: [{"name": "local-encoder", "kind": "embedded", "task": "embed"}]}}))
        app = create_app(gateway_settings(issuer, deployments_file=deployments, metrics_port=0),
                         backend=NullBackend(model_name="demo"), encoder=encoder)
        with serving(app) as base_url:
            yield base_url, fake, app


def client(base_url: str, issuer, tenant: str, traceparent: str | None = TRACEPARENT) -> openai.OpenAI:
    # The tracestate is the caller's free text: it must not be exported or passed on.
    headers = {"traceparent": traceparent, "tracestate": f"vendor={TRACESTATE_CANARY}"} if traceparent else {}
    return openai.OpenAI(base_url=base_url + "/v1", api_key=issuer.mint(tenant, audience=AUDIENCE), max_retries=0,
                         default_headers=headers)


def children(spans: list[Span], parent: Span) -> dict[str, Span]:
    found = {s.name: s for s in spans if s.parent_span_id == parent.span_id}
    assert all(s.trace_id == parent.trace_id for s in found.values())
    return found


def test_each_request_is_a_server_span_under_the_callers_traceparent_with_a_span_per_stage(
        local_issuer, otel_collector, embedding_encoder, tmp_path, monkeypatch) -> None:  # noqa: F811 - the fixture
    with traced_gateway(local_issuer, otel_collector, tmp_path, monkeypatch, embedding_encoder) as (base_url, fake,
                                                                                                  app):
        with client(base_url, local_issuer, ALPHA) as alpha, client(base_url, local_issuer, BETA) as beta:
            stream = alpha.chat.completions.create(model="demo", messages=CHAT, max_tokens=3, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == " ok ok ok"
            reply = beta.chat.completions.create(model=UPSTREAM_MODEL, messages=CHAT, max_tokens=5)
            assert reply.choices[0].message.content == "Paris."
            with pytest.raises(openai.NotFoundError):  # Alpha's policy does not name the upstream's model
                alpha.chat.completions.create(model=UPSTREAM_MODEL, messages=CHAT, max_tokens=2)
            assert len(alpha.embeddings.create(model=EMBEDDING_MODEL, input="Paris").data) == 1
        alpha_digest = app.state.gateway.audit.tenant_digest(ALPHA)[:12]
    servers = otel_collector.wait_for(4, kind=Span.SERVER)
    assert len(servers) == 4
    assert all((s.trace_id, s.parent_span_id) == (CALLER_TRACE, CALLER_SPAN) for s in servers)
    assert {s.resource["service.name"] for s in servers} == {"tenantgate-test"}
    everything = otel_collector.spans()
    assert ALPHA not in otel_collector.raw() and BETA not in otel_collector.raw()  # tenants only as digests

    by_status = {(s.name, s.attributes["http.response.status_code"]): s for s in servers}
    engine_request = by_status["chat demo", 200]
    upstream_request = by_status[f"chat {UPSTREAM_MODEL}", 200]
    denied = by_status[f"chat {UPSTREAM_MODEL}", 404]
    assert engine_request.name == "chat demo"
    assert engine_request.attributes == engine_request.attributes | {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "demo", "gen_ai.response.model": "demo",
        "gen_ai.request.max_tokens": 3, "gen_ai.request.stream": True, "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.finish_reasons": ["length"], "tenantgate.tenant": alpha_digest,
        "tenantgate.deployment": "local", "http.request.method": "POST", "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
    }
    assert engine_request.attributes["gen_ai.usage.input_tokens"] > 0
    assert engine_request.attributes["gen_ai.response.id"].startswith("chatcmpl-")
    assert "error.type" not in engine_request.attributes and engine_request.status != 2
    stages = children(everything, engine_request)
    assert set(stages) == STAGES
    assert stages["engine"].kind == Span.INTERNAL
    (first_token,) = stages["engine"].events
    assert first_token["name"] == "gen_ai.first_token"
    assert 0 <= first_token["attributes"]["gen_ai.server.time_to_first_token"] < 30
    policy = stages["policy"].attributes
    assert policy["tenantgate.decision.allow"] is True and policy["tenantgate.decision.isolation"] == "tenant"
    assert len(policy["tenantgate.policy.revision"]) > 0

    # The upstream's span is a client span, and the deployment got its context as the traceparent.
    assert upstream_request.name == f"chat {UPSTREAM_MODEL}"
    assert upstream_request.attributes["gen_ai.usage.input_tokens"] == 9  # the upstream's own usage
    stages = children(everything, upstream_request)
    assert set(stages) == STAGES - {"engine"} | {"upstream"}
    upstream = stages["upstream"]
    assert upstream.kind == Span.CLIENT and upstream.attributes["tenantgate.deployment"] == "vllm-a"
    assert [e["name"] for e in upstream.events] == ["gen_ai.first_token"]
    (sent,) = fake.received
    assert sent["headers"]["traceparent"] == f"00-{CALLER_TRACE}-{upstream.span_id}-01"
    assert "tracestate" not in sent["headers"] and TRACESTATE_CANARY not in otel_collector.raw()

    # A refusal: the server span says why in error.type (4xx: not a server error), no stage ran it.
    assert denied.attributes["error.type"] == "model_not_found"
    assert denied.attributes["http.response.status_code"] == 404 and denied.status != 2
    assert set(children(everything, denied)) == {"authenticate", "policy", "audit"}

    embedded = by_status[f"embeddings {EMBEDDING_MODEL}", 200]
    assert embedded.attributes["gen_ai.operation.name"] == "embeddings"
    assert embedded.attributes["gen_ai.usage.input_tokens"] > 0
    assert set(children(everything, embedded)) == STAGES


def test_a_request_without_traceparent_starts_a_trace_and_unserved_model_names_stay_out(
        local_issuer, otel_collector, tmp_path, monkeypatch) -> None:
    unserved = "model-name-cnry-7f3a91"  # the caller's own text: it must not be in any span
    with traced_gateway(local_issuer, otel_collector, tmp_path, monkeypatch) as (base_url, _, _app):
        with client(base_url, local_issuer, ALPHA, traceparent=None) as alpha:
            with pytest.raises(openai.NotFoundError):
                alpha.chat.completions.create(model=unserved, messages=CHAT, max_tokens=2)
            alpha.models.list()
    servers = otel_collector.wait_for(2, kind=Span.SERVER)
    (chat,) = [s for s in servers if s.attributes["http.request.method"] == "POST"]
    (models,) = [s for s in servers if s.attributes["http.request.method"] == "GET"]
    assert chat.parent_span_id == "" and chat.trace_id != CALLER_TRACE
    assert chat.name == "chat" and "gen_ai.request.model" not in chat.attributes
    assert models.name == "GET /v1/models" and models.attributes["http.route"] == "/v1/models"
    assert unserved not in otel_collector.raw()


@pytest.mark.parametrize("otel", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_SAMPLER": "always_off"},
                                  {"OTEL_TRACES_EXPORTER": "none"}])
def test_the_sdk_switches_and_the_sampler_are_honoured(local_issuer, otel_collector, tmp_path, monkeypatch,
                                                        otel) -> None:
    with traced_gateway(local_issuer, otel_collector, tmp_path, monkeypatch, **otel) as (base_url, _, app):
        with client(base_url, local_issuer, ALPHA) as alpha:
            alpha.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
        traced = hasattr(app.state, "tracer")
    assert traced == ("OTEL_TRACES_SAMPLER" in otel)  # a sampler that drops still has a tracer
    assert otel_collector.spans() == []


def test_a_caller_that_does_not_sample_gets_no_spans_and_the_deployment_is_told_so(
        local_issuer, otel_collector, tmp_path, monkeypatch) -> None:
    unsampled = f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"
    with traced_gateway(local_issuer, otel_collector, tmp_path, monkeypatch) as (base_url, fake, _app):
        with client(base_url, local_issuer, BETA, traceparent=unsampled) as beta:
            beta.chat.completions.create(model=UPSTREAM_MODEL, messages=CHAT, max_tokens=2)
    (sent,) = fake.received
    version, trace_id, parent, flags = sent["headers"]["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CALLER_TRACE, "00") and parent != CALLER_SPAN
    assert otel_collector.spans() == []


def test_tracing_is_off_without_an_endpoint_and_refuses_a_protocol_it_cannot_speak() -> None:
    assert tracer_provider({}) is None
    assert tracer_provider({"OTEL_SERVICE_NAME": "tenantgate"}) is None
    with pytest.raises(TracingError, match="http/protobuf"):
        tracer_provider({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
