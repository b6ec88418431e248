"""Tool calling through the openai SDK over real HTTP, on the default model (SmolLM2-135M-Instruct,
whose chat template has no tools section: the tools go in a system message). A named function's
arguments validate against its schema (constrained decoding), whole and streamed; `required` picks
one of the tools; beside a response_format, a forced call is held to the tool's parameters and the
answer after the tool's result to the response_format; a history with an assistant's tool_calls and
the tool's answer is accepted; and the refusals are 400s naming the field."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.gateway.api.conftest import SMOLLM2

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a zone.",
                                           "parameters": TIME}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# No object matches both SUMMARY and WEATHER (or TIME): which one an answer matches says which constrained it.
SUMMARY = {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 24}}, "required": ["summary"],
           "additionalProperties": False}
SUMMARY_FORMAT = {"type": "json_schema", "json_schema": {"name": "summary", "schema": SUMMARY, "strict": True}}
AFTER_THE_CALL = QUESTION + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'},
]


def call(client: openai.OpenAI, **fields):
    return client.chat.completions.create(**({"model": SMOLLM2, "messages": QUESTION, "tools": TOOLS,
                                              "max_tokens": 40, "temperature": 0} | fields))


def test_a_named_function_call_has_arguments_that_validate(smollm2_client) -> None:
    completion = call(smollm2_client, tool_choice=NAMED)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"  # OpenAI's, for a function the caller named
    assert choice.message.content is None
    (tool_call,) = choice.message.tool_calls
    assert tool_call.type == "function" and tool_call.function.name == "get_weather"
    assert tool_call.id.startswith("call_")
    jsonschema.validate(json.loads(tool_call.function.arguments), WEATHER)


def test_a_streamed_named_call_arrives_as_tool_call_deltas(smollm2_client) -> None:
    deltas, reasons = [], []
    for chunk in call(smollm2_client, tool_choice=NAMED, stream=True):
        for choice in chunk.choices:
            deltas.extend(choice.delta.tool_calls or [])
            reasons.append(choice.finish_reason)
            assert not choice.delta.content
    assert reasons[-1] == "stop"
    assert deltas[0].index == 0 and deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert len(deltas) > 2 and all(d.index == 0 and d.id is None for d in deltas[1:])  # the arguments, as they come
    arguments = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(arguments), WEATHER)


def test_required_calls_one_of_the_tools(smollm2_client) -> None:
    choice = call(smollm2_client, tool_choice="required").choices[0]
    assert choice.finish_reason == "tool_calls"
    (tool_call,) = choice.message.tool_calls
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    jsonschema.validate(json.loads(tool_call.function.arguments), schemas[tool_call.function.name])


def test_a_named_call_beside_a_json_schema_is_held_to_the_tools_parameters(smollm2_client) -> None:
    """What instructor's RESPONSES_TOOLS sends, on chat: the forced call's arguments match the tool's
    parameters, not the response_format. The protocol decides this, not the model: constrained
    decoding holds the answer to the tool's schema, whole and streamed."""
    choice = call(smollm2_client, tool_choice=NAMED, response_format=SUMMARY_FORMAT).choices[0]
    assert choice.finish_reason == "stop"
    (tool_call,) = choice.message.tool_calls
    arguments = json.loads(tool_call.function.arguments)
    jsonschema.validate(arguments, WEATHER)
    streamed = call(smollm2_client, tool_choice=NAMED, response_format=SUMMARY_FORMAT, stream=True)
    deltas = [d for chunk in streamed for c in chunk.choices for d in c.delta.tool_calls or []]
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == arguments


@pytest.mark.parametrize("response_format", [SUMMARY_FORMAT, {"type": "json_object"}], ids=["json_schema",
                                                                                           "json_object"])
def test_required_beside_a_response_format_calls_one_of_the_tools(smollm2_client, response_format) -> None:
    """The protocol, not the model, decides it: under `required` constrained decoding holds the
    answer to calls of the tools, whatever the response_format."""
    choice = call(smollm2_client, tool_choice="required", response_format=response_format).choices[0]
    assert choice.finish_reason == "tool_calls"
    (tool_call,) = choice.message.tool_calls
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    jsonschema.validate(json.loads(tool_call.function.arguments), schemas[tool_call.function.name])


@pytest.mark.parametrize("tool_choice", ["none", "auto"])
def test_the_answer_after_the_tools_result_matches_the_json_schema(smollm2_client, tool_choice) -> None:
    """The turn after the call, no longer forced: the response_format holds the answer. The protocol,
    not the model, decides it (constrained decoding)."""
    choice = call(smollm2_client, messages=AFTER_THE_CALL, tool_choice=tool_choice, response_format=SUMMARY_FORMAT,
                  max_tokens=48).choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    jsonschema.validate(json.loads(choice.message.content), SUMMARY)


def test_a_history_with_tool_calls_and_tool_answers_is_accepted(smollm2_client) -> None:
    for choice in ("auto", "none"):
        completion = call(smollm2_client, messages=AFTER_THE_CALL, tool_choice=choice, max_tokens=8)
        assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")
        message = completion.choices[0].message
        assert (message.content is not None) or (choice == "auto" and message.tool_calls)


@pytest.mark.parametrize(("fields", "param"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, None),
    ({"tools": openai.NOT_GIVEN, "tool_choice": "required"}, None),
    ({"tools": [TOOLS[0], TOOLS[0]]}, None),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [{"id": "c", "type": "function",
                                                                     "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages"),
])
def test_inconsistent_tool_fields_are_400(smollm2_client, fields, param) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        call(smollm2_client, **fields)
    assert caught.value.body["code"] is not None
    if param is not None:
        assert caught.value.body["param"].startswith(param)


def test_a_parameters_schema_that_cannot_be_enforced_is_400_on_tools(smollm2_client) -> None:
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}]
    with pytest.raises(openai.BadRequestError) as caught:
        call(smollm2_client, tools=bad, tool_choice={"type": "function", "function": {"name": "f"}})
    error = caught.value.body
    assert error["param"] == "tools" and error["code"] == "invalid_json_schema"
    assert error["message"].startswith("tools: the JSON schema cannot be enforced")
