"""The Responses request as the chat request that runs it: the fields that chat has under other
names or shapes (tools, tool_choice, function call items, text.format's json_schema), and chat's refusals
reported at this request's field."""

from __future__ import annotations

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from gateway.openai.responses_api.protocol import ResponsesRequest
from gateway.openai.responses_api.service import _origin, chat_request

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_function_tools_take_chats_nested_shape_and_builtin_tools_are_refused() -> None:
    tool = {"type": "function", "name": "get_weather", "description": "d", "parameters": SCHEMA, "strict": True}
    body, _ = ResponsesRequest(model="m", input="weather?", tools=[tool],
                               tool_choice={"type": "function", "name": "get_weather"}).chat_body()
    assert body["tools"] == [{"type": "function", "function": {"name": "get_weather", "description": "d",
                                                               "parameters": SCHEMA, "strict": True}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert ResponsesRequest(model="m", input="x", tool_choice="required").chat_body()[0]["tool_choice"] == "required"
    with pytest.raises(ValidationError, match="only function tools"):
        ResponsesRequest(model="m", input="x", tools=[tool, {"type": "web_search"}])
    # chat's check of a function's name is reported at this request's flat field
    with pytest.raises(RequestValidationError) as refused:
        chat_request(ResponsesRequest(model="m", input="x", tools=[tool | {"name": "no spaces"}]))
    assert refused.value.errors()[0]["loc"][:4] == ("body", "tools", 0, "name")


def test_function_call_items_become_tool_calls_and_tool_messages() -> None:
    request = ResponsesRequest(model="m", input=[
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city":"Paris"}', "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    assert request.conversation() == [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    chat = chat_request(request)  # chat accepts them as its own history
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool"]
    assert chat.messages[1].tool_calls[0].id == chat.messages[2].tool_call_id == "call_1"
    with pytest.raises(ValidationError):
        ResponsesRequest(model="m", input=[{"type": "function_call", "call_id": "c", "name": "f"}])  # no arguments


def test_text_format_becomes_response_format() -> None:
    flat = {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}
    body, _ = ResponsesRequest(model="m", input="x", text={"format": flat}).chat_body()
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}
    body, _ = ResponsesRequest(model="m", input="x", text={"format": {"type": "json_object"}}).chat_body()
    assert body["response_format"] == {"type": "json_object"}


def test_instructions_come_first_and_the_rest_maps_by_name() -> None:
    body, origins = ResponsesRequest(model="m", instructions="Be brief.", max_output_tokens=7, user="u",
                                     input=[{"role": "developer", "content": "d"}, {"role": "user", "content": "q"}],
                                     ).chat_body()
    assert body == {"model": "m", "stream": False, "max_completion_tokens": 7, "user": "u", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "developer", "content": "d"},
        {"role": "user", "content": "q"}]}
    assert origins == [("instructions",), ("input", 0), ("input", 1)]


def test_chats_refusals_name_this_requests_field() -> None:
    # A message chat refuses is reported at this request's input item.
    with pytest.raises(RequestValidationError) as refused:
        chat_request(ResponsesRequest(model="m", input=[{"role": "user", "content": "x"}], temperature=1,
                                      instructions="i", max_output_tokens=1, top_p=1, user="u" * 10,
                                      text={"format": {"type": "json_schema", "name": "a b", "schema": {}}}))
    assert refused.value.errors()[0]["loc"][:2] == ("body", "text")
    origins = [("instructions",), ("input", 0), ("input", 1)]
    assert _origin(("messages", 2, "content"), origins) == ("input", 1, "content")
    assert _origin(("messages", 0, "content"), origins) == ("instructions", "content")
    assert _origin(("max_completion_tokens",), origins) == ("max_output_tokens",)
    assert _origin(("response_format", "json_schema"), origins) == ("text", "format", "json_schema")
