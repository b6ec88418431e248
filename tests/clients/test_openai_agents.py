"""The OpenAI Agents SDK (tests/clients/requirements/openai-agents.txt), on both of its models.

The agent's one tool is forced (ModelSettings.tool_choice names it) and its argument is an enum of
one value, so the call and its argument are the protocol's doing; the run stops on the tool's
output, then the run's items go back as the next run's input, answered with an output type whose schema
allows one value."""

from __future__ import annotations

import pytest

from tests.clients.conftest import ClientGateway, result, run_flow


@pytest.fixture(scope="module")
def report(client_gateway: ClientGateway) -> dict:
    return run_flow("openai-agents", "agents_flow", client_gateway)


def _assert_round_trip(outcome: dict, path: str) -> list[dict]:
    assert outcome["tool_ran_with"] == ["Paris"] and outcome["first_output"] == "18 degrees and sunny"
    assert outcome["second_output"] == {"word": "thanks"}
    assert [s["path"] for s in outcome["sent"]] == [path, path]
    return outcome["sent"]


def test_the_chat_completions_model_round_trips_a_forced_tool_call(report: dict) -> None:
    _assert_round_trip(result(report, "chat_completions_model"), "/v1/chat/completions")


def test_the_default_responses_model_round_trips_a_forced_tool_call(report: dict) -> None:
    """Item 2: the Responses model sends `include` ([] here) on every call, and no `store` unless
    ModelSettings sets it; the second call carries the function_call and its output as input items."""
    first, second = _assert_round_trip(result(report, "responses_model"), "/v1/responses")
    assert first["include"] == [] and first["store"] == "absent"
    assert {"function_call", "function_call_output"} <= set(second["input_types"])


@pytest.mark.parametrize("stored", [False, True])
def test_the_responses_model_with_store_set_round_trips(report: dict, stored: bool) -> None:
    """ModelSettings.store goes as sent (true: stored, as Alpha's policy allows); include stays []."""
    sent = _assert_round_trip(result(report, f"responses_model_store_{str(stored).lower()}"), "/v1/responses")
    assert all(s["include"] == [] and s["store"] is stored for s in sent)
