"""Reading tool calls out of an answer (issue 25, item 7): under `auto`, content streams until the
first <tool_call> marker and each call is made when its tag closes, split anywhere; the whole-answer
reading agrees with the streamed one; `required` reads an array of calls (one object when parallel
tool calls are off), and its schema says so."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gateway.openai.chat.tools import AutoCalls, FunctionDefinition, Tool, constrained_schema, parse_calls

TOOLS = [Tool(type="function", function=FunctionDefinition(name=name, parameters={
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})) for name in ("one", "two")]
ANSWER = ('Let me look.\n<tool_call>{"name": "one", "arguments": {"x": 1}}</tool_call>\n'
          '<tool_call>{"name": "two", "arguments": {"x": 2}}</tool_call>')


def streamed(text: str, pieces: int, parallel: bool = True) -> tuple[list[str], list[dict]]:
    """What an AutoCalls reader sends for text fed in pieces of `pieces` characters."""
    reader, sent = AutoCalls(TOOLS, parallel), []
    calls = []
    for start in range(0, len(text), pieces):
        content, made = reader.feed(text[start:start + pieces])
        sent.append(content)
        calls.extend(made)
    sent.append(reader.finish())
    return sent, calls


@pytest.mark.parametrize("pieces", [1, 2, 3, 7, 1000])
def test_content_streams_until_the_marker_and_each_call_is_made_as_its_tag_closes(pieces: int) -> None:
    sent, calls = streamed(ANSWER, pieces)
    assert "".join(sent) == "Let me look."  # no piece of the marker, nor the whitespace before it
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("one", {"x": 1}), ("two", {"x": 2})]
    assert len({c["id"] for c in calls}) == 2
    if pieces == 1:  # content went out before the first call was complete, character by character
        assert sum(1 for piece in sent if piece) > 5


def test_without_a_call_every_character_is_content_even_a_near_marker() -> None:
    text = "A <tool is not a <tool_call, and spaces stay   "
    for pieces in (1, 4, 100):
        sent, calls = streamed(text, pieces)
        assert "".join(sent) == text and calls == []


def test_a_tag_that_is_not_a_call_of_a_shown_tool_is_no_call() -> None:
    text = 'Hi <tool_call>{"name": "three", "arguments": {}}</tool_call> <tool_call>not json</tool_call>'
    sent, calls = streamed(text, 5)
    assert calls == [] and "".join(sent) == text
    assert parse_calls(text, TOOLS, "auto") == (None, text)


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    _, calls = streamed(ANSWER, 3, parallel=False)
    assert [c["function"]["name"] for c in calls] == ["one"]
    got, content = parse_calls(ANSWER, TOOLS, "auto", parallel=False)
    assert [c["function"]["name"] for c in got] == ["one"] and content == "Let me look."


def test_the_whole_answer_reads_as_the_stream_does() -> None:
    calls, content = parse_calls(ANSWER, TOOLS, "auto")
    assert content == "Let me look." and [c["function"]["name"] for c in calls] == ["one", "two"]
    calls, content = parse_calls(ANSWER[ANSWER.index("<"):], TOOLS, None)
    assert content is None and len(calls) == 2


def test_required_reads_an_array_of_calls_and_its_schema_asks_for_one() -> None:
    answer = '[{"name": "two", "arguments": {"x": 2}}, {"name": "one", "arguments": {"x": 1}}]'
    schema = json.loads(constrained_schema(TOOLS, "required"))
    jsonschema.validate(json.loads(answer), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], schema)  # at least one call
    calls, content = parse_calls(answer, TOOLS, "required")
    assert content is None and [c["function"]["name"] for c in calls] == ["two", "one"]


def test_required_without_parallel_calls_is_one_object() -> None:
    one = '{"name": "one", "arguments": {"x": 1}}'
    schema = json.loads(constrained_schema(TOOLS, "required", parallel=False))
    jsonschema.validate(json.loads(one), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([json.loads(one)], schema)
    calls, content = parse_calls(one, TOOLS, "required", parallel=False)
    assert content is None and [c["function"]["name"] for c in calls] == ["one"]
    assert parse_calls('[{"name"', TOOLS, "required") == (None, '[{"name"')  # cut short: content, no call
