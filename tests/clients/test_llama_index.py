"""llama-index's OpenAILike (tests/clients/requirements/llama-index.txt, which pins its own openai).
Answers are at temperature 0 and a few tokens long; the tool's one argument and the structured
answer are enums, so the schema decides their shape; the text of an answer is not checked."""

from __future__ import annotations

import pytest

from tests.clients.conftest import ClientGateway, result, run_flow


@pytest.fixture(scope="module")
def report(client_gateway: ClientGateway) -> dict:
    return run_flow("llama-index", "llamaindex_flow", client_gateway)


def test_chat_answers(report: dict) -> None:
    assert result(report, "chat") == {"role": "assistant", "content_is_text": True}


def test_a_streamed_chat_answers(report: dict) -> None:
    outcome = result(report, "stream_chat")
    assert outcome["deltas"] >= 1 and not outcome["text_is_empty"]


def test_a_completion_answers(report: dict) -> None:
    assert result(report, "complete") == {"text_is_empty": False}


def test_a_required_tool_call_has_the_schemas_arguments(report: dict) -> None:
    assert result(report, "required_tool_call") == {"calls": [{"name": "get_weather", "kwargs": {"city": "Paris"}}]}


def test_structured_predict_returns_the_model(report: dict) -> None:
    outcome = result(report, "structured_predict")
    assert outcome["type"] == "Capital" and outcome["city"] in ("Paris", "Rome")
