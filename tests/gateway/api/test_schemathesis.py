"""Property-based requests generated from the gateway's own OpenAPI document, with a valid
token: whatever the body, the gateway answers without a 5xx.

The operations are driven through schemathesis' strategies with hypothesis directly:
schemathesis' pytest plugin does not run under this pytest version.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.gateway.api.conftest import EMBEDDING_MODEL, GAMMA

OPERATIONS = ["POST /v1/chat/completions", "POST /v1/completions", "POST /v1/embeddings", "POST /v1/responses",
              "GET /v1/responses/{response_id}", "GET /v1/models", "GET /v1/models/{model}"]


@pytest.fixture(scope="module")
def api_schema(gateway):
    return schemathesis.openapi.from_url(gateway.base_url + "/openapi.json")


def test_the_schema_covers_every_api_operation(api_schema) -> None:
    found = sorted(f"{r.ok().method.upper()} {r.ok().path}" for r in api_schema.get_all_operations())
    assert found == sorted(OPERATIONS)


@pytest.mark.parametrize("label", OPERATIONS)
def test_no_server_errors(api_schema, gateway, label: str) -> None:
    method, path = label.split(" ")
    operation = api_schema[path][method]
    # Gamma's policy caps max_tokens at 4, so generated requests stay cheap to decode.
    served = EMBEDDING_MODEL if path == "/v1/embeddings" else "demo"
    headers = {"Authorization": f"Bearer {gateway.token(GAMMA)}"}
    seen: list[int] = []

    @given(case=operation.as_strategy())
    @settings(max_examples=75, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:
        # A random model name only ever meets the 404; most cases name the served model so the
        # generated bodies travel the whole path (policy, clamp, envelope, engine).
        if len(seen) % 4 != 3:
            if isinstance(case.body, dict):
                case.body["model"] = served
            if case.path_parameters and "model" in case.path_parameters:
                case.path_parameters["model"] = "demo"
        response = case.call(headers=headers, timeout=60)
        seen.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    run()
    assert seen and all(status < 500 for status in seen)
    if method == "POST":
        assert 200 in seen, "no generated request was served: the run proved nothing about the success path"
