"""The Responses request as the chat request that runs it: the fields that chat has under other
names or shapes (tool_choice, text.format's json_schema), and chat's refusals
reported at this request's field."""

from __future__ import annotations

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from gateway.openai.responses_api.protocol import ResponsesRequest
from gateway.openai.responses_api.service import _origin, chat_request

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_function_tools_are_refused_and_a_named_choice_takes_chats_nested_shape() -> None:
    # A response has no function_call output items yet, so tools are refused (chat then refuses a
    # tool_choice without tools, at this request's field).
    with pytest.raises(ValidationError, match="not supported on /v1/responses yet"):
        ResponsesRequest(model="m", input="weather?", tools=[{"type": "function", "name": "get_weather",
                                                              "parameters": SCHEMA}])
    body, _ = ResponsesRequest(model="m", input="x", tool_choice={"type": "function", "name": "get_weather"}).chat_body()
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert ResponsesRequest(model="m", input="x", tool_choice="required").chat_body()[0]["tool_choice"] == "required"


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
