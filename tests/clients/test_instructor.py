"""instructor (tests/clients/requirements/instructor.txt, which pins its own openai) in its three
OpenAI modes. The response model's one field is an enum of two values and every call is at
temperature 0, so the schema decides the answer's shape; which city is not checked."""

from __future__ import annotations

import pytest

from tests.clients.conftest import ClientGateway, result, run_flow


@pytest.fixture(scope="module")
def report(client_gateway: ClientGateway) -> dict:
    return run_flow("instructor", "instructor_flow", client_gateway)


def _assert_extracted(outcome: dict) -> None:
    assert outcome["type"] == "Capital" and outcome["city"] in ("Paris", "Rome")


def test_json_schema_mode_extracts_the_model(report: dict) -> None:
    _assert_extracted(result(report, "json_schema"))


def test_tools_mode_extracts_the_model(report: dict) -> None:
    _assert_extracted(result(report, "tools"))


def test_responses_tools_mode_extracts_the_model(report: dict) -> None:
    _assert_extracted(result(report, "responses_tools"))
