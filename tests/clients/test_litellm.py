"""LiteLLM as a client (tests/clients/requirements/litellm.txt). Answers are at temperature 0 with
few tokens, the tool call is forced with an argument the schema allows one value for, and the
overflow is a prompt twice the context window: the gateway's answers, not the model's, decide."""

from __future__ import annotations

import pytest

from tests.clients.conftest import ClientGateway, result, run_flow


@pytest.fixture(scope="module")
def report(client_gateway: ClientGateway) -> dict:
    return run_flow("litellm", "litellm_flow", client_gateway)


def test_completion_answers(report: dict) -> None:
    outcome = result(report, "completion")
    assert outcome["content_is_text"] and outcome["finish_reason"] in ("stop", "length")
    assert 1 <= outcome["completion_tokens"] <= 8


def test_streaming_answers(report: dict) -> None:
    outcome = result(report, "streaming")
    assert outcome["chunks"] >= 2 and not outcome["text_is_empty"] and outcome["finish_reason"] in ("stop", "length")


def test_a_forced_tool_call_has_the_schemas_arguments(report: dict) -> None:
    assert result(report, "tools") == {"name": "get_weather", "arguments": {"city": "Paris"}}


def test_the_answer_appended_as_it_is_is_accepted_on_the_next_turn(report: dict) -> None:
    """Item 1, through LiteLLM's own Message object."""
    assert result(report, "multi_turn_append")["second_finish"] in ("stop", "length")


def test_a_prompt_over_the_context_window_raises_context_window_exceeded(report: dict) -> None:
    """Item 6: LiteLLM recognises OpenAI's wording only; then its context-window fallbacks fire."""
    assert result(report, "context_window_exceeded") == {"raised": "ContextWindowExceededError", "status": 400}
