"""The gateway end to end: uvicorn on a loopback port, the official openai SDK as the client,
tokens from a local Entra-style issuer, the repository's Rego with test tenants, the demo engine."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.api.conftest import ALPHA, BETA, DELTA, GAMMA

CHAT = [{"role": "user", "content": "Explain what a gateway checks before it runs a request."}]


def test_chat_completion_returns_text_and_usage(gateway) -> None:
    completion = gateway.client(ALPHA).chat.completions.create(model="demo", messages=CHAT, max_tokens=12,
                                                               temperature=0, seed=1)
    choice = completion.choices[0]
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert 1 <= completion.usage.completion_tokens <= 12
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert completion.system_fingerprint.startswith("fp_")


def test_an_answer_sent_back_as_the_sdk_returned_it_continues_the_conversation(gateway) -> None:
    """The SDK docs' loop: the answer object, or its model_dump() (refusal, annotations, audio and
    function_call as null), goes back into messages. A non-null audio or function_call still has
    no meaning here, and a refusal only an assistant's."""
    client = gateway.client(ALPHA)
    first = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=3)
    message = first.choices[0].message
    for sent in (message, message.model_dump(), message.model_dump() | {"annotations": [], "refusal": "no"}):
        again = client.chat.completions.create(model="demo", max_tokens=3,
                                               messages=[*CHAT, sent, {"role": "user", "content": "More."}])
        assert again.choices[0].message.content
    for field, value, role in [("audio", {"id": "audio_1"}, "assistant"), ("function_call", {"name": "f",
                               "arguments": "{}"}, "assistant"), ("refusal", "no", "user")]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="demo", max_tokens=1,
                                           messages=[*CHAT, {"role": role, "content": "x", field: value}])
        assert caught.value.body["param"] in (f"messages.1.{field}", "messages.1"), caught.value.body


def test_chat_stream_matches_non_streaming_and_reports_usage(gateway) -> None:
    client = gateway.client(ALPHA)
    whole = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model="demo", messages=CHAT, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream_and_non_stream_agree(gateway) -> None:
    client = gateway.client(ALPHA)
    prompt = "The policy decides whether"
    whole = client.completions.create(model="demo", prompt=prompt, max_tokens=8, temperature=0, logprobs=2)
    streamed = list(client.completions.create(model="demo", prompt=prompt, max_tokens=8, temperature=0,
                                              stream=True))
    assert whole.object == "text_completion"
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text
    logprobs = whole.choices[0].logprobs
    assert len(logprobs.tokens) == whole.usage.completion_tokens
    assert all(len(top) <= 3 and lp <= 0 for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs))


def test_chat_logprobs_carry_top_alternatives(gateway) -> None:
    completion = gateway.client(ALPHA).chat.completions.create(
        model="demo", messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = completion.choices[0].logprobs.content
    assert len(content) == completion.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy picks the best


def test_a_model_the_tenant_may_not_use_gets_the_same_404_as_a_name_not_served(gateway) -> None:
    """Beta may not use demo, which is served here; gpt-9 is served nowhere; Beta's own
    some-other-model is not served here. A tenant must not be able to tell them apart (which
    names are served for other tenants)."""
    answers = []
    for tenant, model in ((BETA, "demo"), (BETA, "gpt-9"), (ALPHA, "gpt-9"), (BETA, "some-other-model")):
        with pytest.raises(openai.NotFoundError) as caught:
            gateway.client(tenant).chat.completions.create(model=model, messages=CHAT, max_tokens=4)
        answers.append(caught.value.body)
    assert all(answer == answers[0] for answer in answers)
    assert answers[0]["code"] == "model_not_found" and answers[0]["param"] == "model"
    assert "gpt-9" not in answers[0]["message"] and "demo" not in answers[0]["message"]
    with pytest.raises(openai.NotFoundError) as caught:
        gateway.client(BETA).models.retrieve("demo")
    assert caught.value.body == answers[0]


def test_another_deny_is_the_same_403_whether_or_not_the_model_is_served(gateway) -> None:
    """A token without the Inference.Invoke scope, for a model its tenant may use: the same 403
    whether the name is served here (Alpha's demo) or not (Beta's some-other-model)."""
    answers = []
    for tenant, model in ((ALPHA, "demo"), (BETA, "some-other-model")):
        with pytest.raises(openai.PermissionDeniedError) as caught:
            gateway.client(tenant, scopes=("Models.Read",)).chat.completions.create(model=model, messages=CHAT)
        answers.append(caught.value.body)
    assert answers[0] == answers[1] and answers[0]["code"] == "policy_denied"
    assert "Inference.Invoke scope" in answers[0]["message"]


def test_tenant_with_smaller_max_tokens_is_clamped(gateway) -> None:
    big = gateway.client(ALPHA).completions.create(model="demo", prompt="Once", max_tokens=20, temperature=0)
    small = gateway.client(GAMMA).completions.create(model="demo", prompt="Once", max_tokens=20, temperature=0)
    assert big.usage.completion_tokens > 4
    assert small.usage.completion_tokens == 4 and small.choices[0].finish_reason == "length"


def test_models_lists_only_what_the_tenant_may_use(gateway) -> None:
    assert [m.id for m in gateway.client(ALPHA).models.list()] == ["demo", "all-minilm-l6-v2"]
    assert [m.id for m in gateway.client(BETA).models.list()] == []
    with pytest.raises(openai.NotFoundError):
        gateway.client(BETA).models.retrieve("demo")
    assert gateway.client(ALPHA).models.retrieve("demo").id == "demo"


def test_missing_and_invalid_tokens_are_401_with_a_challenge(gateway) -> None:
    import httpx

    anonymous = httpx.post(gateway.base_url + "/v1/chat/completions", json={"model": "demo", "messages": CHAT})
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert anonymous.json()["error"]["type"] == "invalid_request_error"
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="not-a-token", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def test_unknown_model_is_404(gateway) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        gateway.client(ALPHA).chat.completions.create(model="gpt-9", messages=CHAT)
    assert caught.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 5}, "n"),  # over the policy's max_choices
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"seed": -1}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_unsupported_or_out_of_range_fields_are_400(gateway, extra, param) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client(ALPHA).chat.completions.create(model="demo", messages=CHAT, **extra)
    assert caught.value.body["param"] == param


@pytest.mark.parametrize(
    ("tenant", "classification", "expected"),
    [
        (ALPHA, "internal", ("tenant", "tenant", False)),
        (GAMMA, "public", ("shared", "shared", False)),
        (GAMMA, "internal", ("tenant", "shared", False)),  # policy narrows a shared cache for non-public data
        (DELTA, "internal", ("none", "exclusive", True)),
    ],
)
def test_the_decision_becomes_the_engines_envelope(gateway, tenant, classification, expected) -> None:
    """What the tenant's decision says about cache scope, isolation and determinism is what the engine ran."""
    completion = gateway.client(tenant).chat.completions.create(
        model="demo", messages=CHAT, max_tokens=3, extra_headers={"X-Data-Classification": classification})
    (record,) = [r for r in gateway.sink.requests if r.request_id == completion.id]
    assert (record.cache_scope, record.isolation, record.deterministic) == expected
