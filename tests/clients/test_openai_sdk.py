"""The openai SDK (its own venv, tests/clients/requirements/openai.txt) in the flows its docs show.

The model decides none of these outcomes: every answer is at temperature 0 with a few tokens, a
tool's arguments are constrained by a schema that allows one value, parse()'s by an enum of two;
what is checked is whether the gateway accepts the call and what shape the SDK gets back."""

from __future__ import annotations

import pytest

from tests.clients.conftest import LAMBDA_TOKENS_PER_MINUTE, ClientGateway, result, run_flow


@pytest.fixture(scope="module")
def report(client_gateway: ClientGateway) -> dict:
    return run_flow("openai", "openai_flow", client_gateway)


def test_the_answer_appended_as_it_is_is_accepted_on_the_next_turn(report: dict) -> None:
    """Item 1: `messages.append(completion.choices[0].message)` sends `refusal: null` back."""
    outcome = result(report, "multi_turn_append")
    assert outcome["first_refusal"] is None and outcome["second_finish"] in ("stop", "length")


def test_the_answer_appended_as_model_dump_is_accepted_on_the_next_turn(report: dict) -> None:
    """Item 1: model_dump() sends every field of the SDK's message, `annotations`, `audio` and
    `function_call` among them, as null."""
    outcome = result(report, "multi_turn_model_dump")
    assert {"refusal", "annotations", "audio", "function_call"} <= set(outcome["sent_keys"])
    assert outcome["second_finish"] in ("stop", "length")


def test_a_named_tool_call_round_trips_with_its_result(report: dict) -> None:
    outcome = result(report, "tools_round_trip")
    assert (outcome["name"], outcome["arguments"]) == ("get_weather", {"city": "Paris"})
    assert outcome["second_finish"] in ("stop", "length") and outcome["second_content_is_text"]


def test_parse_returns_the_pydantic_model(report: dict) -> None:
    outcome = result(report, "parse_pydantic")
    assert outcome["parsed_type"] == "Capital" and outcome["city"] in ("Paris", "Rome")


def test_a_stream_ends_with_its_usage(report: dict) -> None:
    outcome = result(report, "stream_with_usage")
    assert outcome["last_choices"] == 0 and outcome["completion_tokens"] == 8 and outcome["prompt_tokens"] > 0
    assert outcome["content_chunks"] >= 1 and outcome["finish"] == "length"


def test_responses_round_trip_a_function_call_with_previous_response_id(report: dict) -> None:
    outcome = result(report, "responses_tools_previous_response_id")
    assert (outcome["name"], outcome["arguments"]) == ("get_weather", {"city": "Paris"})
    assert outcome["second_status"] in ("completed", "incomplete") and outcome["second_has_text"]
    assert outcome["second_previous"]


def test_a_request_over_the_whole_budget_is_refused_once_and_not_retried(report: dict) -> None:
    """Item 6: at its default max_retries (2) the SDK sends it once and raises at once, because the
    answer says x-should-retry: false; the message says why waiting cannot help."""
    outcome = result(report, "never_admissible_is_not_retried")
    assert outcome["status"] == 429 and outcome["code"] == "rate_limit_exceeded"
    assert outcome["should_retry"] == "false" and outcome["attempts"] == 1 and outcome["seconds"] < 10
    assert "can never be admitted" in outcome["message"] and str(LAMBDA_TOKENS_PER_MINUTE) in outcome["message"]
    assert outcome["type"] == "tokens"


def test_an_embeddings_input_over_the_whole_budget_names_what_to_change(report: dict) -> None:
    """Item 6: embeddings have no max_tokens; the refusal tells the caller to send less input."""
    outcome = result(report, "embeddings_over_budget")
    assert outcome["status"] == 429 and outcome["should_retry"] == "false"
    assert "max_tokens" not in outcome["message"] and "input" in outcome["message"]


def test_each_refusal_carries_openais_error_type(report: dict) -> None:
    """Item 6: the types OpenAI's API gives these refusals (docs/api.md lists each status's)."""
    assert result(report, "error_types") == {
        "400": {"status": 400, "type": "invalid_request_error", "code": "invalid_value"},
        "401": {"status": 401, "type": "invalid_request_error", "code": "invalid_token"},
        "404": {"status": 404, "type": "invalid_request_error", "code": "model_not_found"},
        "429": {"status": 429, "type": "tokens", "code": "rate_limit_exceeded"},
    }
