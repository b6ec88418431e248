"""Schemas are closed where they leave extra keys unsaid (issue 25, item 5), and strict refuses
a schema that allows them, as OpenAI does."""

from __future__ import annotations

import pydantic
import pytest

from gateway.openai.chat.protocol import ChatCompletionRequest, schema_of
from gateway.openai.chat.tools import FunctionDefinition, NamedToolChoice, Tool, constrained_schema
from gateway.openai.closed_schemas import closed

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_objects_that_name_their_properties_are_closed_at_every_depth() -> None:
    schema = {"type": "object", "properties": {
        "where": CITY,
        "stops": {"type": "array", "items": CITY},
        "either": {"anyOf": [CITY, {"type": "string"}]},
        "ref": {"$ref": "#/$defs/place"},
        "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},  # a key named so
    }, "$defs": {"place": CITY}}
    got = closed(schema)
    assert got["additionalProperties"] is False
    props = got["properties"]
    assert props["where"]["additionalProperties"] is False
    assert props["stops"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert got["$defs"]["place"]["additionalProperties"] is False
    assert props["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in props  # the map of properties is not itself a schema
    assert "additionalProperties" not in schema  # the caller's schema is left as it was


def test_what_a_schema_says_of_more_keys_or_items_is_kept() -> None:
    open_ = {"type": "object", "properties": {"a": {}}, "additionalProperties": True}
    typed = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    patterned = {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x-": {}}}
    any_object = {"type": "object"}  # names no properties: any object, as json_object
    for schema in (open_, typed, patterned, any_object):
        assert closed(schema) == schema
    assert closed({"type": "array", "prefixItems": [{"type": "string"}]})["items"] is False
    assert closed({"type": "array", "prefixItems": [{}], "items": {"type": "integer"}})["items"] == {"type": "integer"}


def test_response_format_and_tool_parameters_are_constrained_closed() -> None:
    body = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": CITY}}})
    assert '"additionalProperties":false' in schema_of(body.response_format)
    tool = Tool(type="function", function=FunctionDefinition(name="weather", parameters=CITY))
    choice = NamedToolChoice.model_validate({"type": "function", "function": {"name": "weather"}})
    named = constrained_schema([tool], choice)
    assert named is not None and '"additionalProperties":false' in named


@pytest.mark.parametrize("more", [True, {"type": "string"}])
def test_strict_refuses_a_schema_that_allows_more_keys(more) -> None:
    schema = {"type": "object", "properties": {"inner": {**CITY, "additionalProperties": more}},
              "additionalProperties": False}
    with pytest.raises(pydantic.ValidationError, match="additionalProperties"):
        FunctionDefinition(name="weather", parameters=schema, strict=True)
    with pytest.raises(pydantic.ValidationError, match="additionalProperties"):
        ChatCompletionRequest.model_validate({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}})
    FunctionDefinition(name="weather", parameters=schema, strict=False)  # not strict: allowed, as given
    FunctionDefinition(name="weather", parameters=CITY, strict=True)  # unsaid: closed, not refused
