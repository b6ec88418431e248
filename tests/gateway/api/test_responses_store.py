"""Stored responses through the whole gateway, with the openai SDK over loopback HTTP and a real
Redis: store: true and previous_response_id where the policy allows them (Alpha, for 2 days),
GET /v1/responses/{id} for the same tenant only, records encrypted and bound to their tenant."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import openai
import pytest
import redis
from pydantic import ValidationError

from devkit.server import serving
from gateway.app import create_app
from gateway.audit.trail import AuditRefused
from gateway.inference import NullBackend
from gateway.settings import Settings
from tests.gateway.api.conftest import ALPHA, AUDIENCE, ETA, GAMMA, LAMBDA, THETA, gateway_settings

SECRET_INPUT = "the launch date of project kestrel"


class RecordingBackend(NullBackend):
    """The null engine, keeping each conversation it was given (to see what a continuation sends)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.conversations: list[list[dict]] = []

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        self.conversations.append(messages)
        return super().encode_chat(messages, tools)


class StoreGateway:
    def __init__(self, base_url: str, issuer, app, backend: RecordingBackend, redis_url: str) -> None:
        self.base_url, self.issuer, self.app, self.backend = base_url, issuer, app, backend
        self.redis = redis.Redis.from_url(redis_url)
        self.clients: list[openai.OpenAI] = []

    def client(self, tenant: str = ALPHA, object_id: str | None = None) -> openai.OpenAI:
        token = self.issuer.mint(tenant, audience=AUDIENCE, object_id=object_id)
        client = openai.OpenAI(base_url=self.base_url + "/v1", api_key=token, max_retries=0, timeout=30)
        self.clients.append(client)
        return client

    def stored_keys(self) -> list[bytes]:
        return list(self.redis.scan_iter(match="tenantgate:responses:*", count=1000))


@pytest.fixture(scope="module")
def store_gateway(local_issuer, redis_server) -> Iterator[StoreGateway]:
    backend = RecordingBackend(model_name="demo")
    app = create_app(gateway_settings(local_issuer, redis_url=redis_server.url, metrics_port=0), backend=backend)
    with serving(app) as base_url:
        running = StoreGateway(base_url, local_issuer, app, backend, redis_server.url)
        yield running
        for client in running.clients:
            client.close()
        running.redis.close()


def test_a_stored_response_is_retrieved_by_its_own_tenant_only(store_gateway: StoreGateway) -> None:
    created = store_gateway.client().responses.create(model="demo", input=SECRET_INPUT, store=True,
                                                      max_output_tokens=3)
    assert created.store is True and created.output_text == " ok ok ok"
    again = store_gateway.client().responses.retrieve(created.id)
    assert again.model_dump() == created.model_dump()
    for tenant, response_id in [(THETA, created.id), (ALPHA, "resp_" + "0" * 32), (ALPHA, created.id.upper())]:
        with pytest.raises(openai.NotFoundError) as missing:
            store_gateway.client(tenant).responses.retrieve(response_id)
        assert missing.value.code == "response_not_found"


def test_under_a_principal_cache_scope_a_stored_response_is_its_principals_alone(store_gateway: StoreGateway) -> None:
    """Lambda's policy keeps each principal's prompts from its colleagues' prefix caches: its
    stored conversations follow the decision, so colleague B can neither read nor continue A's."""
    a = store_gateway.client(LAMBDA, object_id="0a000000-0000-4000-8000-0000000000a1")
    b = store_gateway.client(LAMBDA, object_id="0a000000-0000-4000-8000-0000000000b2")
    created = a.responses.create(model="demo", input=SECRET_INPUT, store=True, max_output_tokens=2)
    assert a.responses.retrieve(created.id).model_dump() == created.model_dump()
    assert a.responses.create(model="demo", input="go on", previous_response_id=created.id, max_output_tokens=1)
    ran = len(store_gateway.backend.conversations)
    with pytest.raises(openai.NotFoundError) as read:
        b.responses.retrieve(created.id)
    assert read.value.code == "response_not_found"  # the same answer as an id that never existed
    with pytest.raises(openai.NotFoundError) as continued:
        b.responses.create(model="demo", input="and then?", previous_response_id=created.id, max_output_tokens=1)
    assert continued.value.code == "previous_response_not_found"
    assert len(store_gateway.backend.conversations) == ran  # B's requests never reached the engine
    # Under a tenant scope (Alpha's), colleagues share the tenant's stored conversations, as they share its cache.
    shared = store_gateway.client(ALPHA, object_id="0a000000-0000-4000-8000-0000000000a1").responses.create(
        model="demo", input="a shared thread", store=True, max_output_tokens=1)
    colleague = store_gateway.client(ALPHA, object_id="0a000000-0000-4000-8000-0000000000b2")
    assert colleague.responses.retrieve(shared.id).id == shared.id


def test_previous_response_id_continues_the_stored_conversation(store_gateway: StoreGateway) -> None:
    client = store_gateway.client()
    first = client.responses.create(model="demo", input="first question", instructions="old instructions",
                                    store=True, max_output_tokens=2)
    second = client.responses.create(model="demo", input="second question", previous_response_id=first.id,
                                     instructions="new instructions", store=True, max_output_tokens=1)
    third = client.responses.create(model="demo", input="third question", previous_response_id=second.id,
                                    max_output_tokens=1)
    assert second.previous_response_id == first.id and third.store is False
    # As OpenAI does: a continuation carries the conversation over, not the earlier instructions.
    assert store_gateway.backend.conversations[-2] == [
        {"role": "system", "content": "new instructions"}, {"role": "user", "content": "first question"},
        {"role": "assistant", "content": " ok ok"}, {"role": "user", "content": "second question"}]
    assert store_gateway.backend.conversations[-1] == [
        {"role": "user", "content": "first question"}, {"role": "assistant", "content": " ok ok"},
        {"role": "user", "content": "second question"}, {"role": "assistant", "content": " ok"},
        {"role": "user", "content": "third question"}]
    assert third.usage.input_tokens > second.usage.input_tokens  # the budget counts what runs
    with pytest.raises(openai.NotFoundError) as unstored:
        client.responses.create(model="demo", input="more", previous_response_id=third.id)
    assert (unstored.value.code, unstored.value.body["param"]) == ("previous_response_not_found",
                                                                 "previous_response_id")


@pytest.mark.parametrize("stream", [False, True])
def test_a_stored_function_call_and_its_output_are_carried_into_the_continuation(
        store_gateway: StoreGateway, stream: bool) -> None:
    """The stored conversation keeps the call (an assistant's tool_calls) and, from the next turn, its
    output (a tool message): a continuation renders both, as chat renders such a history."""
    client = store_gateway.client()
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    fields = {"model": "demo", "input": "look it up", "tools": [tool], "store": True, "max_output_tokens": 2,
              "tool_choice": {"type": "function", "name": "lookup"}}
    if stream:
        first = list(client.responses.create(**fields, stream=True))[-1].response
    else:
        first = client.responses.create(**fields)
    [call] = first.output  # the null engine's " ok ok", as the named function's arguments
    assert (call.type, call.name, call.arguments) == ("function_call", "lookup", " ok ok")
    assert client.responses.retrieve(first.id).output == first.output
    second = client.responses.create(model="demo", previous_response_id=first.id, tools=[tool], store=True,
                                     max_output_tokens=1, input=[{"type": "function_call_output",
                                                                  "call_id": call.call_id, "output": "found"}])
    client.responses.create(model="demo", previous_response_id=second.id, input="thanks", max_output_tokens=1)
    rendered_call = {"role": "assistant", "content": '<tool_call>{"name": "lookup", "arguments":  ok ok}</tool_call>'}
    answer = {"role": "tool", "content": "found", "tool_call_id": call.call_id}
    assert store_gateway.backend.conversations[-2][-3:] == [{"role": "user", "content": "look it up"},
                                                            rendered_call, answer]
    assert store_gateway.backend.conversations[-1] == [{"role": "user", "content": "look it up"}, rendered_call,
                                                       answer, {"role": "assistant", "content": " ok"},
                                                       {"role": "user", "content": "thanks"}]


def test_records_are_encrypted_bound_to_their_tenant_and_kept_for_the_policys_retention(
        store_gateway: StoreGateway) -> None:
    before = set(store_gateway.stored_keys())
    created = store_gateway.client().responses.create(model="demo", input=SECRET_INPUT + " (sealed)", store=True,
                                                      max_output_tokens=2)
    [name] = set(store_gateway.stored_keys()) - before
    value = store_gateway.redis.get(name)
    assert b"kestrel" not in value and b" ok" not in value and created.id.encode() not in value
    assert ALPHA.encode() not in name and created.id.encode() not in name
    assert 2 * 86400 - 60 <= store_gateway.redis.ttl(name) <= 2 * 86400  # Alpha keeps responses 2 days
    # The same value under the name Theta's copy would have does not decrypt for Theta.
    state = store_gateway.app.state.gateway
    theta_name = state.responses_store._name(state.audit.tenant_digest(THETA), created.id)
    store_gateway.redis.set(theta_name, value)
    with pytest.raises(openai.NotFoundError):
        store_gateway.client(THETA).responses.retrieve(created.id)
    store_gateway.redis.delete(theta_name)


def test_a_streamed_response_is_stored_before_it_completes(store_gateway: StoreGateway) -> None:
    client = store_gateway.client()
    events = list(client.responses.create(model="demo", input="stream me", store=True, max_output_tokens=2,
                                          stream=True))
    last = events[-1].response
    assert last.store is True and events[0].response.store is True
    assert client.responses.retrieve(last.id).output_text == last.output_text == " ok ok"


def test_the_policy_decides_who_may_store(store_gateway: StoreGateway) -> None:
    stored = store_gateway.client().responses.create(model="demo", input="x", store=True, max_output_tokens=1)
    refusals = [
        (store_gateway.client(GAMMA), {"store": True}, "store"),  # Gamma's policy stores nothing
        (store_gateway.client(GAMMA), {"previous_response_id": stored.id}, "previous_response_id"),
    ]
    for client, fields, param in refusals:
        with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as refused:
            client.responses.create(model="demo", input="x", max_output_tokens=1, **fields)
        assert refused.value.body["param"] == param
    # Gamma cannot even see that Alpha's response exists: the same 404 as for an id never issued.
    assert refused.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as restricted:
        store_gateway.client().responses.create(model="demo", input="x", store=True, max_output_tokens=1,
                                                extra_headers={"x-data-classification": "restricted"})
    assert "policy does not allow stored responses" in restricted.value.body["message"]


def test_the_store_key_must_be_an_aes_256_key() -> None:
    key = bytes(range(32))
    assert Settings(responses_store_key=base64.b64encode(key).decode()).responses_key == key
    assert len(Settings().responses_key) == 32  # derived from the namespace secret
    for bad in ("not base64!", base64.b64encode(b"short").decode()):
        with pytest.raises(ValidationError, match="base64 of 32 bytes"):
            Settings(responses_store_key=bad)


def test_an_unreachable_store_fails_closed(local_issuer, own_redis_server) -> None:
    """Eta is served while the quota store is down (fail-open), but a response asked to be stored
    is never answered as if it were: 503, or a stream's error event in place of response.completed."""
    app = create_app(gateway_settings(local_issuer, redis_url=own_redis_server.url, metrics_port=0),
                     backend=RecordingBackend(model_name="demo"))
    with serving(app) as base_url, openai.OpenAI(base_url=base_url + "/v1", max_retries=0, timeout=30,
                                                 api_key=local_issuer.mint(ETA, audience=AUDIENCE)) as client:
        assert client.responses.create(model="demo", input="x", store=True, max_output_tokens=1).store is True
        own_redis_server.stop()
        assert client.responses.create(model="demo", input="x", max_output_tokens=1).status == "incomplete"
        for fields in ({"store": True}, {"previous_response_id": "resp_" + "0" * 32}):
            with pytest.raises(openai.InternalServerError) as down:
                client.responses.create(model="demo", input="x", max_output_tokens=1, **fields)
            assert down.value.status_code == 503 and down.value.body["code"] == "service_unavailable"
        events = list(client.responses.create(model="demo", input="x", store=True, max_output_tokens=1, stream=True))
    assert [e.type for e in events[-4:]] == ["response.output_text.done", "response.content_part.done",
                                            "response.output_item.done", "error"]
    assert events[-1].code == "service_unavailable"


def test_a_response_whose_record_the_trail_refuses_is_not_left_stored(local_issuer, redis_server, tmp_path,
                                                                      monkeypatch) -> None:
    """A response is stored just before its audit record is written. When the trail then refuses
    the record (a full disk past its hold), the request is refused, and what it stored is removed:
    nothing of an unacknowledged request stays retrievable or continuable."""
    app = create_app(gateway_settings(local_issuer, redis_url=redis_server.url, metrics_port=0,
                                      audit_file=tmp_path / "audit.jsonl"), backend=RecordingBackend(model_name="demo"))
    store = redis.Redis.from_url(redis_server.url)
    with serving(app) as base_url:
        trail = app.state.gateway.audit.trail
        append = trail.append

        def refusing(record: dict) -> dict:
            if record.get("route") == "responses" and record.get("status") == 200:
                raise AuditRefused("the sink holds all it may")
            return append(record)

        monkeypatch.setattr(trail, "append", refusing)
        before = set(store.scan_iter(match="tenantgate:responses:*", count=1000))
        client = openai.OpenAI(base_url=base_url + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                               max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError) as refused:
            client.responses.create(model="demo", input=SECRET_INPUT, store=True, max_output_tokens=2)
        events = list(client.responses.create(model="demo", input=SECRET_INPUT, store=True, max_output_tokens=2,
                                              stream=True))
        after = set(store.scan_iter(match="tenantgate:responses:*", count=1000))
        client.close()
    store.close()
    assert (refused.value.status_code, refused.value.code) == (503, "audit_unavailable")
    assert events[-1].type == "error" and events[-1].code == "audit_unavailable"
    assert "response.completed" not in {event.type for event in events}
    assert after == before, "a refused request's response stayed stored"
