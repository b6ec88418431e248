"""Structured outputs through the openai SDK over real HTTP, on the default model (SmolLM2-135M-Instruct):
twenty json_schema answers that parse and validate with jsonschema, json_object while streaming, and
the 400s for a schema the engine cannot enforce, one beyond the policy's bounds on size and nesting,
and a response_format OpenAI does not have."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from devkit.schemas import SCHEMAS
from tests.gateway.api.conftest import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, SMOLLM2

MODEL = SMOLLM2


@pytest.fixture(scope="module")
def client(smollm2_client) -> openai.OpenAI:
    return smollm2_client


def ask(client: openai.OpenAI, name: str, response_format: dict, **extra):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Give me a {name.replace('_', ' ')} as JSON."}],
        response_format=response_format, max_tokens=48, temperature=0, **extra)


def test_twenty_json_schema_answers_parse_and_validate(client) -> None:
    def one(name: str):
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}
        return name, ask(client, name, fmt)

    with ThreadPoolExecutor(len(SCHEMAS)) as pool:  # at once: they share the engine's steps
        answers = list(pool.map(one, SCHEMAS))
    assert len(answers) == 20
    for name, completion in answers:
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", name
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


def test_json_object_streams_an_object(client) -> None:
    stream = ask(client, "shopping list", {"type": "json_object"}, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    if text.endswith("}"):
        assert isinstance(json.loads(text), dict)
    else:  # cut off at max_tokens: still an object's beginning
        assert text.startswith("{")


@pytest.mark.parametrize("schema", [{"type": "bogus"}, {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}])
def test_a_schema_that_cannot_be_enforced_is_400_on_response_format(client, schema) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "thing", {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}})
    error = caught.value.body
    assert error["param"] == "response_format" and error["code"] == "invalid_json_schema"
    assert error["message"].startswith("response_format: the JSON schema cannot be enforced")


def nested(depth: int) -> dict:
    schema: dict = {"type": "boolean"}
    while depth > 1:  # each wrapper adds two levels: the object and its properties
        schema, depth = {"type": "object", "properties": {"a": schema}}, depth - 2
    return schema


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(100)}},
     f"bytes (as compact JSON); this tenant's limit is {MAX_SCHEMA_BYTES}"),
    (nested(MAX_SCHEMA_DEPTH + 2), f"levels deep; this tenant's limit is {MAX_SCHEMA_DEPTH}"),
])
def test_a_schema_beyond_the_policy_bounds_is_400_on_response_format(client, schema, message) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "thing", {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}})
    error = caught.value.body
    assert error["param"] == "response_format" and error["code"] == "invalid_json_schema"
    assert message in error["message"]


def test_a_schema_at_the_policy_bounds_runs(client) -> None:
    completion = ask(client, "flag", {"type": "json_schema", "json_schema": {"name": "deep",
                                                                             "schema": nested(MAX_SCHEMA_DEPTH - 1)}})
    assert completion.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("fmt", [{"type": "xml"}, {"type": "json_schema"},
                                 {"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}}])
def test_a_response_format_openai_does_not_have_is_400(client, fmt) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "thing", fmt)
    assert caught.value.body["code"] is not None
    assert caught.value.body["param"].startswith("response_format")
