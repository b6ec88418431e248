"""OpenAI-true errors and headers over real HTTP: 400 context_length_exceeded, a code on every
error, x-request-id and the decision id on every response, x-ratelimit-* across a real 429
(real Redis), and the header that says max_tokens was clamped."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from devkit.server import serving
from gateway.app import create_app
from gateway.deployments.openai_compatible import _error_message
from gateway.inference import NullBackend
from gateway.limits.base import duration
from tests.gateway.api.conftest import ALPHA, AUDIENCE, BETA, EPSILON, GAMMA, gateway_settings
from tests.gateway.api.test_errors import _BrokenBackend

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LONG = "word " * 3000  # over every test tenant's 1024-token window


def _records_with(gateway, decision_id: str, timeout_s: float = 5.0) -> list[dict]:
    """The audit records carrying `decision_id` (the trail writes a moment after a refusal)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [r for r in gateway.audit_records() if r.get("decision_id") == decision_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


# -- context_length_exceeded ------------------------------------------------------------


def test_a_prompt_over_the_tenants_window_is_400_context_length_exceeded_with_its_counts(gateway) -> None:
    client = gateway.client(ALPHA)
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": LONG}], max_tokens=2)
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(model="demo", prompt=LONG, max_tokens=2)
    for caught in (chat, completion):
        assert caught.value.code == "context_length_exceeded"
        message = caught.value.body["message"]
        # OpenAI's wording, which clients such as LiteLLM recognise, whichever window binds.
        assert message.startswith("This model's maximum context length is 1024 tokens. However, your messages "
                                  "resulted in ") and message.endswith("(the window is set by this tenant's policy).")
        prompt_tokens = int(message.split("resulted in ")[1].split(" ")[0])
        assert prompt_tokens > 1024
        # The refusal names its audit record, which says why.
        decision_id = caught.value.response.headers["x-tenantgate-decision-id"]
        [record] = _records_with(gateway, decision_id)
        assert record["status"] == 400 and record["outcome"] == "context_length_exceeded"
        assert record["usage"]["prompt_tokens"] == prompt_tokens


def test_a_prompt_over_the_models_window_is_400_context_length_exceeded(local_issuer) -> None:
    """The model's window smaller than the tenant's: the gateway's own check, same answer."""
    app = create_app(gateway_settings(local_issuer, metrics_port=0),
                     backend=NullBackend(model_name="demo", max_model_len=64))
    with serving(app) as base:
        with openai.OpenAI(base_url=base + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                           max_retries=0) as client:
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x" * 400}])
    assert caught.value.code == "context_length_exceeded"
    assert "This model's maximum context length is 64 tokens" in caught.value.body["message"]


@pytest.mark.parametrize(("body", "message"), [
    # vLLM: only its message says so.
    ({"object": "error", "message": "This model's maximum context length is 2048 tokens. However, you requested "
      "2100 tokens", "type": "BadRequestError", "param": None, "code": 400}, "maximum context length is 2048"),
    # llama-server: its type, and the counts beside the message.
    ({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}},
     "the prompt has 5000 tokens, the context window 4096"),
    # OpenAI and Azure OpenAI: the code itself.
    ({"error": {"message": "Your input exceeds the context window of this model.", "type": "invalid_request_error",
                "param": "input", "code": "context_length_exceeded"}}, "exceeds the context window"),
])
def test_an_upstreams_context_overflow_becomes_context_length_exceeded(body: dict, message: str) -> None:
    text, _, code = _error_message(json.dumps(body).encode(), 400)
    assert code == "context_length_exceeded" and message in text


# -- a code and a request id on every error -------------------------------------------


def _bad_requests(gateway) -> list[tuple[str, dict, int]]:
    token = gateway.token(ALPHA)
    auth = {"Authorization": f"Bearer {token}"}
    post = "/v1/chat/completions"
    return [
        ("no token", {"method": "POST", "url": post, "json": CHAT}, 401),
        ("a bad token", {"method": "POST", "url": post, "json": CHAT,
                         "headers": {"Authorization": "Bearer not-a-jwt"}}, 401),
        ("not a bearer", {"method": "POST", "url": post, "json": CHAT, "headers": {"Authorization": "Basic x"}}, 401),
        ("no such route", {"method": "GET", "url": "/v1/nothing", "headers": auth}, 404),
        ("wrong method", {"method": "GET", "url": post, "headers": auth}, 405),
        ("invalid JSON", {"method": "POST", "url": post, "content": b"{not json",
                          "headers": auth | {"Content-Type": "application/json"}}, 400),
        ("an unknown field", {"method": "POST", "url": post, "json": CHAT | {"extra": 1}, "headers": auth}, 400),
        ("a missing field", {"method": "POST", "url": post, "json": {"model": "demo"}, "headers": auth}, 400),
        ("a wrong type", {"method": "POST", "url": post, "json": CHAT | {"max_tokens": "many"}, "headers": auth}, 400),
        ("an out-of-range value", {"method": "POST", "url": post, "json": CHAT | {"temperature": 9},
                                   "headers": auth}, 400),
        ("a seed out of range", {"method": "POST", "url": post, "json": CHAT | {"seed": -1}, "headers": auth}, 400),
        ("an empty prompt", {"method": "POST", "url": "/v1/completions",
                             "json": {"model": "demo", "prompt": ""}, "headers": auth}, 400),
        ("an unknown model", {"method": "POST", "url": post, "json": CHAT | {"model": "nope"}, "headers": auth}, 404),
        ("a model the tenant may not use", {"method": "POST", "url": post, "json": CHAT,
                                            "headers": {"Authorization": f"Bearer {gateway.token(BETA)}"}}, 404),
        ("a policy deny", {"method": "POST", "url": post, "json": CHAT,
                           "headers": auth | {"x-data-classification": "no-such-class"}}, 403),
        ("the context window", {"method": "POST", "url": post,
                                "json": CHAT | {"messages": [{"role": "user", "content": LONG}]},
                                "headers": auth}, 400),
        ("an oversized body", {"method": "POST", "url": post, "content": b"x" * (2 << 20), "headers": auth}, 413),
        ("an unknown model's card", {"method": "GET", "url": "/v1/models/nope", "headers": auth}, 404),
    ]


def test_every_error_has_a_code_and_a_request_id(gateway) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        for name, request, status in _bad_requests(gateway):
            response = client.request(**request)
            assert response.status_code == status, (name, response.text)
            error = response.json()["error"]
            assert isinstance(error["code"], str) and error["code"], (name, error)
            assert response.headers.get("x-request-id"), name
    with pytest.raises(openai.BadRequestError) as caught:  # and the SDK sees the code
        gateway.client(ALPHA).chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=2, extra_body={"x": 1})
    assert caught.value.code == "unknown_parameter"


def test_a_429_and_a_500_carry_a_code_and_a_request_id(gateway, local_issuer) -> None:
    token = gateway.token(EPSILON)  # 2 requests a minute
    responses = [httpx.post(gateway.base_url + "/v1/chat/completions", json=CHAT, timeout=30,
                            headers={"Authorization": f"Bearer {token}"}) for _ in range(3)]
    limited = [r for r in responses if r.status_code == 429]
    assert limited and all(r.headers.get("x-request-id") for r in responses), [r.status_code for r in responses]
    assert limited[0].json()["error"]["code"] == "rate_limit_exceeded"
    assert limited[0].headers["x-ratelimit-remaining-requests"] == "0"  # the in-process limiter's state

    app = create_app(gateway_settings(local_issuer, metrics_port=0), backend=_BrokenBackend(model_name="demo"))
    with serving(app) as base:
        broken = httpx.post(base + "/v1/chat/completions", json=CHAT, timeout=30,
                            headers={"Authorization": f"Bearer {local_issuer.mint(ALPHA, audience=AUDIENCE)}"})
    assert broken.status_code == 500 and broken.json()["error"]["code"] == "internal_error"
    assert broken.headers["x-request-id"].startswith("chatcmpl-")  # the pipeline's id, answered by the outer guard


# -- the decision id -------------------------------------------------------------------


def test_the_decision_id_header_finds_the_audit_record_of_a_success_and_of_a_refusal(gateway) -> None:
    raw = gateway.client(ALPHA).chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    completion = raw.parse()
    [served] = _records_with(gateway, raw.headers["x-tenantgate-decision-id"])
    assert served["request_id"] == completion.id == raw.headers["x-request-id"] and served["status"] == 200

    with pytest.raises(openai.PermissionDeniedError) as caught:
        gateway.client(ALPHA).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_headers={"x-data-classification": "no-such-class"})
    headers = caught.value.response.headers
    [denied] = _records_with(gateway, headers["x-tenantgate-decision-id"])
    assert denied["request_id"] == headers["x-request-id"]
    assert denied["status"] == 403 and denied["decision"]["allow"] is False


def test_a_stream_carries_the_request_and_decision_ids(gateway) -> None:
    with gateway.client(ALPHA).chat.completions.with_streaming_response.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True) as response:
        ids = {chunk.id for chunk in response.parse()}
        headers = response.headers
    assert ids == {headers["x-request-id"]}
    assert _records_with(gateway, headers["x-tenantgate-decision-id"])


# -- x-ratelimit-* ---------------------------------------------------------------------------


def test_the_reset_is_written_as_openai_writes_it() -> None:
    assert [duration(s) for s in (0, 0.02, 1, 1.5, 59.9994, 60, 360, 61.25)] == [
        "0ms", "20ms", "1s", "1.5s", "59.999s", "1m0s", "6m0s", "1m1.25s"]


def _rate_headers(headers) -> dict[str, str]:
    return {name: headers[name] for name in (f"x-ratelimit-{what}-{kind}" for what in ("limit", "remaining", "reset")
                                             for kind in ("requests", "tokens"))}


def _seconds(reset: str) -> float:
    minutes, _, rest = reset.rpartition("m") if not reset.endswith("ms") else ("", "", reset)
    if rest.endswith("ms"):
        return int(rest[:-2]) / 1000
    return int(minutes or 0) * 60 + float(rest[:-1])


def test_rate_limit_headers_count_down_across_a_real_429_in_redis(local_issuer, own_redis_server) -> None:
    """Epsilon may send 2 requests a minute (and 1,000,000 tokens): the headers count the
    requests down to the 429, which carries them and Retry-After."""
    settings = gateway_settings(local_issuer, engine="null", redis_url=own_redis_server.url, metrics_port=0)
    app = create_app(settings, backend=NullBackend(model_name="demo"))
    with serving(app) as base:
        with openai.OpenAI(base_url=base + "/v1", api_key=local_issuer.mint(EPSILON, audience=AUDIENCE),
                           max_retries=0) as client:
            def ask():
                return client.chat.completions.with_raw_response.create(
                    model="demo", messages=[{"role": "user", "content": "count to three"}], max_tokens=2)

            answer = ask()
            first, second = _rate_headers(answer.headers), _rate_headers(ask().headers)
            reserved = answer.parse().usage.total_tokens  # the null engine uses all it reserves
            with pytest.raises(openai.RateLimitError) as caught:
                ask()
    limited = _rate_headers(caught.value.response.headers)
    assert caught.value.code == "rate_limit_exceeded"
    assert first["x-ratelimit-limit-requests"] == second["x-ratelimit-limit-requests"] == "2"
    assert (first["x-ratelimit-remaining-requests"], second["x-ratelimit-remaining-requests"],
            limited["x-ratelimit-remaining-requests"]) == ("1", "0", "0")
    # Each request pushes the budget's refill 30 s further out: 30 s, then 60 s, less the time between.
    assert 25 <= _seconds(first["x-ratelimit-reset-requests"]) <= 30
    assert 55 <= _seconds(second["x-ratelimit-reset-requests"]) <= 60
    assert 55 <= _seconds(limited["x-ratelimit-reset-requests"]) <= 60
    retry_after = int(caught.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 30  # until one request's worth has refilled
    # Tokens refill at 16,667 a second, so what the first request reserved is back within a millisecond.
    assert first["x-ratelimit-limit-tokens"] == limited["x-ratelimit-limit-tokens"] == "1000000"
    assert int(first["x-ratelimit-remaining-tokens"]) == 1_000_000 - reserved
    assert 1_000_000 - 2 * reserved <= int(second["x-ratelimit-remaining-tokens"]) <= 1_000_000 - reserved
    assert int(second["x-ratelimit-remaining-tokens"]) <= int(limited["x-ratelimit-remaining-tokens"]) <= 1_000_000
    assert _seconds(first["x-ratelimit-reset-tokens"]) < 0.01


def test_the_in_process_limiter_sends_the_same_headers(gateway) -> None:
    raw = gateway.client(GAMMA).chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    headers = _rate_headers(raw.headers)
    assert headers["x-ratelimit-limit-requests"] == "100000"
    assert 0 <= int(headers["x-ratelimit-remaining-requests"]) < 100000
    assert headers["x-ratelimit-limit-tokens"] == "1000000"


# -- max_tokens clamped ----------------------------------------------------------------------


def test_a_clamped_max_tokens_is_named_in_a_header(gateway) -> None:
    """Gamma's policy allows 4 tokens: asking for 50 gets 4 and says so; asking for 2 says nothing."""
    client = gateway.client(GAMMA)
    clamped = client.chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=50, temperature=0)
    assert clamped.headers["x-tenantgate-max-tokens-clamped"] == "4"
    assert clamped.parse().usage.completion_tokens <= 4
    within = client.chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "x-tenantgate-max-tokens-clamped" not in within.headers
