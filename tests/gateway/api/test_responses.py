"""POST /v1/responses through the whole gateway with the official openai SDK over loopback HTTP:
on the default model (SmolLM2), answers that make sense and the Responses API's stream events in
the spec's order, function tools answered with function_call items; on the demo model, chat's
policy, budget, audit, headers and metrics, and a clear 400 for what the stateless subset does not do."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from devkit.server import serving
from engine import RequestOutput
from gateway.app import create_app
from gateway.inference import NullBackend
from tests.gateway.api.conftest import ALPHA, AUDIENCE, BETA, DEFAULT_MODEL, GAMMA, Gateway, gateway_settings
from tests.gateway.api.test_errors_headers import _rate_headers, _records_with

QUESTION = "What is the capital of France?"
OPENING = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                "parameters": WEATHER, "strict": True}
NAMED = {"type": "function", "name": "get_weather"}
# No object matches both SUMMARY and WEATHER: which one an answer matches says which constrained it.
SUMMARY = {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 24}}, "required": ["summary"],
           "additionalProperties": False}
SUMMARY_FORMAT = {"type": "json_schema", "name": "summary", "schema": SUMMARY, "strict": True}
WEATHER_QUESTION = "What is the weather in Paris?"


def post(gateway: Gateway, body: dict, tenant: str = ALPHA) -> httpx.Response:
    return httpx.post(gateway.base_url + "/v1/responses", json=body, timeout=60,
                      headers={"authorization": f"Bearer {gateway.token(tenant)}"})


def chat_text(client: openai.OpenAI, messages: list[dict], max_tokens: int) -> str:
    return client.chat.completions.create(model=DEFAULT_MODEL, messages=messages, max_tokens=max_tokens,
                                          temperature=0).choices[0].message.content


# -- the default model -----------------------------------------------------------------------


def test_sdk_response_answers_on_the_default_model(default_model_gateway: Gateway) -> None:
    raw = default_model_gateway.client().responses.with_raw_response.create(
        model=DEFAULT_MODEL, input=QUESTION, max_output_tokens=32, temperature=0)
    response = raw.parse()
    assert response.output_text == "The capital of France is Paris."
    assert response.id.startswith("resp_") and raw.headers["x-request-id"] == response.id
    assert (response.object, response.status, response.model) == ("response", "completed", DEFAULT_MODEL)
    assert response.incomplete_details is None and response.error is None
    [message] = response.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert message.id.startswith("msg_") and [part.type for part in message.content] == ["output_text"]
    usage = response.usage
    assert usage.output_tokens >= 7 and usage.input_tokens > 7
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0 and usage.output_tokens_details.reasoning_tokens == 0


def test_the_stream_sends_the_specs_events_in_its_order(default_model_gateway: Gateway) -> None:
    client = default_model_gateway.client()
    whole = client.responses.create(model=DEFAULT_MODEL, input=QUESTION, max_output_tokens=32, temperature=0)
    events = list(client.responses.create(model=DEFAULT_MODEL, input=QUESTION, max_output_tokens=32,
                                          temperature=0, stream=True))
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 2
    assert kinds == OPENING + ["response.output_text.delta"] * deltas + CLOSING + ["response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))

    created, in_progress, added, part_added = events[:4]
    assert created.response.status == in_progress.response.status == "in_progress"
    assert created.response.output == [] and created.response.usage is None
    assert created.response.id == events[-1].response.id
    item_id = added.item.id
    assert added.item.status == "in_progress" and added.item.content == []
    assert part_added.part.text == ""
    text_events = [e for e in events if e.type.startswith(("response.output_text", "response.content"))]
    assert all((e.item_id, e.output_index, e.content_index) == (item_id, 0, 0) for e in text_events)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == events[-3].part.text == whole.output_text
    assert events[-2].item.status == "completed" and events[-2].item.content[0].text == text
    final = events[-1].response
    assert final.status == "completed" and final.output_text == text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_the_sdks_stream_helper_assembles_the_same_response(default_model_gateway: Gateway) -> None:
    """responses.stream() rebuilds the response from the events: it checks their ids and indexes."""
    client = default_model_gateway.client()
    with client.responses.stream(model=DEFAULT_MODEL, input=QUESTION, max_output_tokens=32, temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "The capital of France is Paris."


def test_the_event_names_match_the_payloads(default_model_gateway: Gateway) -> None:
    body = {"model": DEFAULT_MODEL, "input": "Hi", "max_output_tokens": 4, "stream": True}
    with httpx.stream("POST", default_model_gateway.base_url + "/v1/responses", json=body, timeout=60,
                      headers={"authorization": f"Bearer {default_model_gateway.token()}"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        blocks = [block for block in response.read().decode().split("\n\n") if block]
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line == "event: " + json.loads(data_line.removeprefix("data: "))["type"]
    assert "[DONE]" not in blocks[-1]  # the Responses API ends with its last event, not chat's [DONE]


def test_instructions_are_the_system_message(default_model_gateway: Gateway) -> None:
    client = default_model_gateway.client()
    instructions = "Answer in French."
    plain = client.responses.create(model=DEFAULT_MODEL, input=QUESTION, max_output_tokens=12, temperature=0)
    told = client.responses.create(model=DEFAULT_MODEL, input=QUESTION, instructions=instructions,
                                   max_output_tokens=12, temperature=0)
    assert told.instructions == instructions
    assert plain.output_text.startswith("The capital") and not told.output_text.startswith("The capital")
    assert told.output_text == chat_text(client, [{"role": "system", "content": instructions},
                                                  {"role": "user", "content": QUESTION}], 12)


def test_input_items_carry_the_conversation(default_model_gateway: Gateway) -> None:
    """Stateless turns: the caller sends the earlier output back as input, as the SDK's docs show."""
    client = default_model_gateway.client()
    first = client.responses.create(model=DEFAULT_MODEL, input="My name is Ada. Say hello to me.",
                                    max_output_tokens=16, temperature=0)
    second = client.responses.create(model=DEFAULT_MODEL, max_output_tokens=16, temperature=0, input=[
        {"role": "developer", "content": "You are a friendly assistant."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "My name is Ada. "},
                                                        {"type": "input_text", "text": "Say hello to me."}]},
        *first.output,
        {"role": "user", "content": "What is my name?"},
    ])
    assert second.output_text == chat_text(client, [
        {"role": "system", "content": "You are a friendly assistant."},
        {"role": "user", "content": "My name is Ada. Say hello to me."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}], 16)


def test_a_named_function_tool_answers_with_a_function_call_item(default_model_gateway: Gateway) -> None:
    response = default_model_gateway.client().responses.create(
        model=DEFAULT_MODEL, input=WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice=NAMED,
        max_output_tokens=40, temperature=0)
    [call] = response.output  # the call alone: no message item
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert response.status == "completed" and response.output_text == ""
    assert response.tools[0].name == "get_weather" and response.tool_choice.name == "get_weather"


def test_a_streamed_function_call_has_the_specs_events(default_model_gateway: Gateway) -> None:
    client = default_model_gateway.client()
    fields = {"model": DEFAULT_MODEL, "input": WEATHER_QUESTION, "tools": [WEATHER_TOOL], "tool_choice": NAMED,
              "max_output_tokens": 40, "temperature": 0}
    events = list(client.responses.create(**fields, stream=True))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, delta, done, item_done, completed = events[2:]
    assert (added.item.type, added.item.arguments, added.item.status) == ("function_call", "", "in_progress")
    assert added.item.id == delta.item_id == done.item_id == item_done.item.id
    assert added.output_index == delta.output_index == done.output_index == item_done.output_index == 0
    assert delta.delta == done.arguments == item_done.item.arguments and item_done.item.status == "completed"
    jsonschema.validate(json.loads(done.arguments), WEATHER)
    assert completed.response.output == [item_done.item]
    # The SDK's stream helper builds the same call from the events.
    with client.responses.stream(**fields) as stream:
        [call] = stream.get_final_response().output
    assert (call.name, call.arguments) == ("get_weather", done.arguments)


def test_a_function_calls_output_is_answered(default_model_gateway: Gateway) -> None:
    """The stateless round trip of the SDK's docs: the call goes back as input, with its output."""
    client = default_model_gateway.client()
    first = client.responses.create(model=DEFAULT_MODEL, input=WEATHER_QUESTION, tools=[WEATHER_TOOL],
                                    tool_choice=NAMED, max_output_tokens=40, temperature=0)
    [call] = first.output
    weather = '{"temperature": 18, "sky": "sunny"}'
    second = client.responses.create(model=DEFAULT_MODEL, tools=[WEATHER_TOOL], max_output_tokens=16, temperature=0,
                                     input=[{"role": "user", "content": WEATHER_QUESTION}, *first.output,
                                            {"type": "function_call_output", "call_id": call.call_id,
                                             "output": weather}])
    assert second.output and second.status in ("completed", "incomplete")
    # It is the answer chat gives to the same history.
    message = default_model_gateway.client().chat.completions.create(
        model=DEFAULT_MODEL, max_tokens=16, temperature=0,
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}],
        messages=[{"role": "user", "content": WEATHER_QUESTION},
                  {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": weather}]).choices[0].message
    assert second.output_text == (message.content or "")
    assert [(i.name, i.arguments) for i in second.output if i.type == "function_call"] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls or []]


def test_a_named_function_beside_text_format_calls_then_answers_by_it(default_model_gateway: Gateway) -> None:
    """instructor's RESPONSES_TOOLS: a named function and text.format json_schema together. The
    protocol, not the model, decides each turn (constrained decoding): the forced call's arguments
    match the function's parameters, and the answer after its output, no longer forced, the schema."""
    client = default_model_gateway.client()
    first = client.responses.create(model=DEFAULT_MODEL, input=WEATHER_QUESTION, tools=[WEATHER_TOOL],
                                    tool_choice=NAMED, text={"format": SUMMARY_FORMAT}, max_output_tokens=40,
                                    temperature=0)
    [call] = first.output
    assert (call.type, call.name, first.status) == ("function_call", "get_weather", "completed")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    second = client.responses.create(model=DEFAULT_MODEL, tools=[WEATHER_TOOL], tool_choice="none",
                                     text={"format": SUMMARY_FORMAT}, max_output_tokens=48, temperature=0,
                                     input=[{"role": "user", "content": WEATHER_QUESTION}, *first.output,
                                            {"type": "function_call_output", "call_id": call.call_id,
                                             "output": '{"temperature": 18}'}])
    assert second.status == "completed" and [item.type for item in second.output] == ["message"]
    jsonschema.validate(json.loads(second.output_text), SUMMARY)


# -- chat's pipeline: policy, budget, audit, headers, metrics (demo model) ----------------------


def test_a_response_is_judged_budgeted_and_audited_as_chat_is(gateway: Gateway) -> None:
    raw = gateway.client(ALPHA).responses.with_raw_response.create(model="demo", input="hi", max_output_tokens=3)
    response = raw.parse()
    assert set(_rate_headers(raw.headers)) and raw.headers["x-ratelimit-limit-requests"] == "100000"
    [record] = _records_with(gateway, raw.headers["x-tenantgate-decision-id"])
    assert (record["route"], record["request_id"], record["status"], record["outcome"]) == (
        "responses", response.id, 200, "completed")
    assert record["usage"]["prompt_tokens"] == response.usage.input_tokens
    assert record["usage"]["completion_tokens"] == response.usage.output_tokens == 3
    assert record["model_fingerprint"] == gateway.engine.fingerprint
    metrics = httpx.get(gateway.metrics_url).text
    assert 'route="responses",status="200"' in metrics
    # The GenAI conventions' operation for it is chat's; "responses" is no well-known value.
    assert 'gen_ai_operation_name="chat"' in metrics and 'gen_ai_operation_name="responses"' not in metrics


def test_the_policy_refuses_as_it_does_for_chat(gateway: Gateway) -> None:
    with pytest.raises(openai.NotFoundError) as denied_model:
        gateway.client(BETA).responses.create(model="demo", input="hi")
    assert denied_model.value.code == "model_not_found"
    with pytest.raises(openai.PermissionDeniedError) as denied:
        gateway.client(ALPHA, scopes=("User.Read",)).responses.create(model="demo", input="hi")
    assert denied.value.code == "policy_denied"
    headers = denied.value.response.headers
    [record] = _records_with(gateway, headers["x-tenantgate-decision-id"])
    assert (record["route"], record["request_id"], record["status"]) == ("responses", headers["x-request-id"], 403)


def test_max_output_tokens_clamped_by_the_policy_ends_incomplete(gateway: Gateway) -> None:
    raw = gateway.client(GAMMA).responses.with_raw_response.create(model="demo", input="hi", max_output_tokens=50)
    response = raw.parse()
    assert raw.headers["x-tenantgate-max-tokens-clamped"] == "4"  # Gamma's max_tokens
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.usage.output_tokens == 4


def test_a_stream_cut_by_max_output_tokens_ends_with_response_incomplete(gateway: Gateway) -> None:
    events = list(gateway.client(ALPHA).responses.create(model="demo", input="hi", max_output_tokens=3, stream=True))
    assert [e.type for e in events[:4]] == OPENING and [e.type for e in events[-4:-1]] == CLOSING
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.usage.output_tokens == 3


# -- what the stateless subset refuses -----------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("store", True), ("previous_response_id", "resp_123")])
def test_without_a_response_store_storing_and_continuing_are_refused(gateway: Gateway, field: str, value) -> None:
    """This gateway has no Redis, so nothing can be stored, whatever the policy allows (Alpha may store)."""
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client().responses.create(model="demo", input="hi", **{field: value})
    error = caught.value.body
    assert (error["param"], error["code"], error["type"]) == (field, "invalid_value", "invalid_request_error")
    assert "responses are not stored here" in error["message"]
    assert gateway.client().responses.create(model="demo", input="hi", store=False, max_output_tokens=1).store is False


@pytest.mark.parametrize(("body", "code", "param"), [
    ({"input": []}, "invalid_value", "input"),
    ({"input": 3}, "invalid_type", "input"),
    ({}, "missing_required_parameter", "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "invalid_value", "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x"}]}]},
     "invalid_value", "input"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, "invalid_value", "input"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "missing_required_parameter", "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 1}]}, "invalid_type", "input"),
    ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": []}]}, "invalid_type",
     "tools.0.parameters"),
    ({"input": "x", "max_output_tokens": 0}, "invalid_value", "max_output_tokens"),
    ({"input": "x", "temperature": 2.5}, "invalid_value", "temperature"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "unknown_parameter", "reasoning"),
    ({"input": "x", "include": ["web_search_call.results"]}, "invalid_value", "include"),
    ({"input": "x", "include": ["anything.else"]}, "invalid_value", "include"),
    ({"input": "x", "include": [], "top_logprobs": 21}, "invalid_value", "top_logprobs"),
    ({"input": "x", "text": {"format": {"type": "text"}, "extra": 1}}, "unknown_parameter", "text.extra"),
])
def test_malformed_bodies_get_a_400(gateway: Gateway, body: dict, code: str, param: str) -> None:
    response = post(gateway, {"model": "demo"} | body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert response.headers["x-request-id"]


def test_include_is_honoured_or_refused_naming_the_value(gateway: Gateway) -> None:
    """The Agents SDK sends `include` on every call ([] by default): accepted. The output text's
    logprobs are given when asked for, streamed or not; a value naming a built-in tool's output is
    400 at `include`, naming it."""
    client = gateway.client()
    assert client.responses.create(model="demo", input="x", include=[], max_output_tokens=2).status == "incomplete"
    plain = client.responses.create(model="demo", input="x", max_output_tokens=3, temperature=0)
    assert plain.output[0].content[0].logprobs == []
    asked = client.responses.create(model="demo", input="x", max_output_tokens=3, temperature=0, top_logprobs=2,
                                    include=["message.output_text.logprobs", "reasoning.encrypted_content"])
    logprobs = asked.output[0].content[0].logprobs
    assert len(logprobs) == 3 and "".join(lp.token for lp in logprobs) == asked.output_text
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in logprobs)
    events = list(client.responses.create(model="demo", input="x", max_output_tokens=3, temperature=0, stream=True,
                                          include=["message.output_text.logprobs"]))
    assert sum(len(e.logprobs) for e in events if e.type == "response.output_text.delta") == 3
    streamed = events[-1].response  # response.incomplete: cut at max_output_tokens
    assert [lp.token for lp in streamed.output[0].content[0].logprobs] == [lp.token for lp in logprobs]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="demo", input="x", include=["file_search_call.results"])
    error = refused.value.body
    assert (error["param"], error["code"]) == ("include", "invalid_value")
    assert error["message"].startswith("include: file_search_call.results cannot be included here")


def test_builtin_tools_are_refused_and_text_format_is_enforced(gateway: Gateway) -> None:
    """Only function tools run here: a built-in tool is a 400 at tools. text.format runs as chat's
    response_format, so even the random demo model answers with the schema's JSON."""
    for tool in ({"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]}):
        with pytest.raises(openai.BadRequestError) as refused_tool:
            gateway.client().responses.create(model="demo", input="x", tools=[tool])
        error = refused_tool.value.body
        assert (error["code"], error["param"]) == ("invalid_value", "tools")
        assert "only function tools" in error["message"]
    only_empty = {"type": "object", "properties": {}, "additionalProperties": False}  # one answer: {}
    schema = {"type": "json_schema", "name": "answer", "schema": only_empty, "strict": True}
    structured = post(gateway, {"model": "demo", "input": "x", "max_output_tokens": 8, "text": {"format": schema}})
    assert structured.status_code == 200, structured.text
    assert structured.json()["output"][0]["content"][0]["text"] == "{}"
    bad = {"type": "json_schema", "name": "answer", "schema": {"type": "no-such-type"}}
    refused = post(gateway, {"model": "demo", "input": "x", "text": {"format": bad}}).json()["error"]
    assert (refused["code"], refused["param"]) == ("invalid_json_schema", "text.format")
    assert post(gateway, {"model": "demo", "input": "x", "max_output_tokens": 1,
                          "text": {"format": {"type": "text"}}}).status_code == 200


def test_a_stream_with_tools_but_no_call_sends_the_text_at_the_end(gateway: Gateway) -> None:
    """With tools (auto) the answer is read whole: the demo model's text (no call), then its events, in the
    spec's order, the whole text in one delta."""
    tool = {"type": "function", "name": "noop", "parameters": {"type": "object", "properties": {}}}
    events = list(gateway.client().responses.create(model="demo", input="hi", tools=[tool], max_output_tokens=3,
                                                    stream=True))
    assert [e.type for e in events] == OPENING + ["response.output_text.delta"] + CLOSING + ["response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = events[4].delta
    assert text and text == events[-4].text == events[-2].item.content[0].text == events[-1].response.output_text
    assert [item.type for item in events[-1].response.output] == ["message"]


class _FailsMidStream(NullBackend):
    """One delta, then an engine bug whose message quotes the request."""

    CANARY = "canary-quoted-prompt-5d1e"

    async def generate(self, token_ids, params, envelope, request_id):
        yield RequestOutput(request_id=request_id, new_token_ids=[7], new_text=self.TOKEN_TEXT,
                            num_prompt_tokens=len(token_ids), num_output_tokens=1)
        raise RuntimeError(f"the engine choked on {self.CANARY}")


def test_a_failure_mid_stream_ends_it_with_an_error_event(local_issuer, caplog) -> None:
    app = create_app(gateway_settings(local_issuer, metrics_port=0), backend=_FailsMidStream(model_name="demo"))
    with caplog.at_level("DEBUG"), serving(app) as base, openai.OpenAI(
            base_url=base + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE), max_retries=0) as client:
        events = list(client.responses.create(model="demo", input="hi", max_output_tokens=5, stream=True))
    assert [e.type for e in events] == OPENING + ["response.output_text.delta", "error"]
    assert (events[-1].code, events[-1].message) == ("internal_error", "internal error")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert _FailsMidStream.CANARY not in caplog.text
