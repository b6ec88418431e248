"""langchain-openai (tests/clients/requirements/langchain-openai.txt): tools, structured output and
embeddings as its docs show them.

Each tool call is forced and its one argument is an enum of one value; each structured answer is an
enum of two; so the schema, not the model, decides what a well-behaved gateway returns. Embeddings
(a short text and a longer one) are compared with the same strings embedded through the openai SDK."""

from __future__ import annotations

import pytest

from tests.clients.conftest import ClientGateway, result, run_flow

WEATHER_CALL = [{"name": "get_weather", "args": {"city": "Paris"}}]


@pytest.fixture(scope="module")
def report(client_gateway: ClientGateway) -> dict:
    return run_flow("langchain-openai", "langchain_flow", client_gateway)


def test_bind_tools_with_a_strict_schema_makes_the_forced_call(report: dict) -> None:
    outcome = result(report, "bind_tools_strict")
    assert outcome["tool_calls"] == WEATHER_CALL and outcome["invalid_tool_calls"] == 0


def test_bind_tools_with_langchains_default_schema_makes_the_forced_call(report: dict) -> None:
    outcome = result(report, "bind_tools_default")
    assert outcome["tool_calls"] == WEATHER_CALL and outcome["invalid_tool_calls"] == 0


def test_structured_output_by_json_schema_returns_the_model(report: dict) -> None:
    outcome = result(report, "structured_output_json_schema")
    assert outcome["type"] == "Capital" and outcome["city"] in ("Paris", "Rome")


def test_structured_output_by_function_calling_returns_the_model(report: dict) -> None:
    """The schema leaves additionalProperties unsaid; the gateway closes it (item 5), so the forced
    call's object ends after its own keys."""
    outcome = result(report, "structured_output_function_calling")
    assert outcome["type"] == "Capital" and outcome["city"] in ("Paris", "Rome")


def test_embeddings_of_text_are_the_texts_vector(report: dict) -> None:
    outcome = result(report, "embeddings_text")
    assert outcome["dimensions"] == 384 and outcome["cosine_to_the_text"] >= 0.9999


def test_embeddings_at_langchains_defaults_are_the_texts_vector(report: dict) -> None:
    """check_embedding_ctx_length=True sends cl100k_base ids, which the default model reads as the
    text they encode (issue 25, item 3)."""
    outcome = result(report, "embeddings_defaults")
    assert outcome["dimensions"] == 384 and outcome["cosine_to_the_text"] >= 0.9999
