"""The sampling fields through an OpenAI-compatible deployment, end to end: the openai SDK over
real HTTP to the gateway, the gateway over real HTTP to a scripted upstream that records what it
got. Penalties, logit_bias, response_format and tools reach every dialect as sent (and the
upstream's tool calls come back); top_k and min_p reach vLLM and are refused with a 400 naming
the field for a model served by Azure OpenAI (which has neither); n > 1 is refused for every
dialect."""

from __future__ import annotations

import json

import openai
import pytest

from devkit.server import serving
from gateway.app import create_app
from tests.gateway.api.conftest import AUDIENCE, BETA, gateway_settings
from tests.gateway.deployments.test_openai_upstream import TOOL_CALL, FakeUpstream

MODEL = "some-other-model"  # the one model Beta's policy names
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
SAMPLING = {"presence_penalty": 0.5, "frequency_penalty": -1.5, "logit_bias": {"15": -100, "7": 3}}


@pytest.fixture(scope="module", params=["vllm", "azure-openai"])
def upstream(request, local_issuer, tmp_path_factory):
    fake = FakeUpstream()
    with serving(fake.app) as upstream_url:
        entry = {"name": "u", "kind": "openai", "dialect": request.param, "url": upstream_url + "/v1"}
        if request.param == "azure-openai":
            # One cache for the whole resource: only a deployment dedicated to Beta honours its tenant scope.
            entry |= {"azure_deployment": "gpt-4o-mini", "dedicated_tenants": [BETA]}
        deployments = tmp_path_factory.mktemp("upstream") / "deployments.json"
        deployments.write_text(json.dumps({"models": {MODEL: [entry]}}))
        app = create_app(gateway_settings(local_issuer, deployments_file=deployments, metrics_port=0))
        with serving(app) as base_url, openai.OpenAI(base_url=base_url + "/v1", max_retries=0,
                                                     api_key=local_issuer.mint(BETA, audience=AUDIENCE)) as client:
            yield request.param, fake, client


def test_penalties_and_logit_bias_reach_the_upstream_as_sent(upstream) -> None:
    dialect, fake, client = upstream
    fake.received.clear()
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, **SAMPLING)
    assert reply.choices[0].message.content == "Paris."
    (sent,) = [r["json"] for r in fake.received]
    assert {name: sent[name] for name in SAMPLING} == SAMPLING


def test_top_k_and_min_p_reach_vllm_and_are_refused_for_azure(upstream) -> None:
    dialect, fake, client = upstream
    fake.received.clear()
    extensions = {"top_k": 0, "min_p": 0.1}
    if dialect == "vllm":
        client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, extra_body=extensions)
        (sent,) = [r["json"] for r in fake.received]
        assert (sent["top_k"], sent["min_p"]) == (-1, 0.1)  # top_k off, as vLLM, SGLang and llama.cpp read it
        return
    for field in extensions:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5,
                                           extra_body={field: extensions[field]})
        assert refused.value.body["param"] == field and field in refused.value.body["message"]
    assert fake.received == []  # refused before anything was sent


def test_a_response_reaches_the_upstream_as_the_chat_request_it_runs_as(upstream) -> None:
    """/v1/responses has no upstream twin here: the deployment gets chat's request, and the
    answer comes back as a response object (and as the Responses API's events)."""
    dialect, fake, client = upstream
    fake.received.clear()
    response = client.responses.create(model=MODEL, input=CHAT[0]["content"], instructions="Be brief.",
                                       max_output_tokens=5, temperature=0)
    events = list(client.responses.create(model=MODEL, input=CHAT, max_output_tokens=5, stream=True))
    assert response.output_text == "Paris." and response.usage.total_tokens > 0
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Paris."
    assert events[-1].type == "response.completed"
    whole, streamed = fake.received
    assert all(r["path"].endswith("/chat/completions") for r in fake.received)
    assert whole["json"]["messages"] == [{"role": "system", "content": "Be brief."}, *CHAT]
    assert streamed["json"]["messages"] == CHAT and streamed["json"]["stream"] is True
    assert "input" not in whole["json"] and "instructions" not in whole["json"]


def test_n_over_one_is_refused_for_an_upstream_naming_n(upstream) -> None:
    # The upstream client reads one choice back; several would be merged or lost, so they are refused.
    dialect, fake, client = upstream
    fake.received.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, n=2)
    assert refused.value.body["param"] == "n" and "upstream" in refused.value.body["message"]
    assert fake.received == []


@pytest.mark.parametrize("response_format", [
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
])
def test_response_format_reaches_the_upstream_as_sent(upstream, response_format) -> None:
    """The upstream enforces it (vLLM, llama-server and OpenAI all take json_schema); the schema
    travels under its own key, `schema`, as the caller wrote it."""
    dialect, fake, client = upstream
    fake.received.clear()
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, response_format=response_format)
    (sent,) = [r["json"] for r in fake.received]
    assert sent["response_format"] == response_format


@pytest.mark.parametrize("stream", [False, True])
def test_tools_reach_the_upstream_and_its_tool_calls_come_back(upstream, stream) -> None:
    dialect, fake, client = upstream
    fake.received.clear()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    fake.mode = "tool_call"
    try:
        reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, tools=tools,
                                               tool_choice="auto", stream=stream)
        if stream:
            chunks = [c for c in reply if c.choices]
            pieces = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
            assert pieces[0].id == TOOL_CALL["id"] and pieces[0].function.name == "get_weather"
            assert "".join(p.function.arguments or "" for p in pieces) == TOOL_CALL["function"]["arguments"]
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
        else:
            (call,) = reply.choices[0].message.tool_calls
            assert (call.id, call.function.name, call.function.arguments) == (
                TOOL_CALL["id"], "get_weather", TOOL_CALL["function"]["arguments"])
            assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
    finally:
        fake.mode = "ok"
    (sent,) = [r["json"] for r in fake.received]
    assert (sent["tools"], sent["tool_choice"]) == (tools, "auto")


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_function_tool_reaches_the_upstream_and_its_call_is_a_function_call_item(upstream, stream) -> None:
    """The flat function tool reaches the upstream in chat's shape; its call (whole, or streamed in
    pieces) comes back as one function_call output item."""
    dialect, fake, client = upstream
    fake.received.clear()
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    fake.mode = "tool_call"
    try:
        if stream:
            events = list(client.responses.create(model=MODEL, input=CHAT, tools=[tool], max_output_tokens=5,
                                                  stream=True))
            assert [e.type for e in events][2:] == [
                "response.output_item.added", "response.function_call_arguments.delta",
                "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
            output = events[-1].response.output
        else:
            output = client.responses.create(model=MODEL, input=CHAT, tools=[tool], max_output_tokens=5).output
    finally:
        fake.mode = "ok"
    [call] = output
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call", TOOL_CALL["id"], "get_weather", TOOL_CALL["function"]["arguments"])
    (sent,) = [r["json"] for r in fake.received]
    assert sent["tools"] == [{"type": "function", "function": {"name": "get_weather",
                                                               "parameters": {"type": "object"}}}]
