"""The exact requests the gateway sends each dialect, checked against that project's documented
request schema (each test names the page and the fields). Pure: compile_request and friends."""

from __future__ import annotations

import base64

import pytest

from gateway.deployments.config import DeploymentsError, parse_deployments
from gateway.deployments.dialects import (
    UpstreamRequest,
    cache_salt,
    compile_request,
    unmet_cache_scope,
    unsupported_fields,
)
from tests.utils.envelopes import envelope, segment
from tests.utils.upstreams import CHAT_BODY, deployment, upstream_call

MESSAGES = CHAT_BODY["messages"]
HEADERS = {"content-type": "application/json", "accept": "text/event-stream", "x-request-id": "chatcmpl-test"}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def salt_for(call, name: str) -> str:
    return cache_salt(call.envelope.cache_namespace, name)


# -- vLLM ---------------------------------------------------------------------------------------
# https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html ("Extra parameters") and the
# fields of vllm/entrypoints/openai/protocol.py ChatCompletionRequest / CompletionRequest:
#   cache_salt: "If specified, the prefix cache will be salted with the provided string ... The salt
#     should be random, protected from access by 3rd parties, and long enough to be unpredictable
#     (e.g., 43 characters base64-encoded, corresponding to 256 bit)."
#   priority: "The priority of the request (lower means earlier handling; default: 0). Any priority
#     other than 0 will raise an error if the served model does not use priority scheduling."
#   max_completion_tokens (chat; max_tokens is its deprecated alias), stream, stream_options.include_usage.

def test_vllm_chat_gets_a_derived_salt_and_its_priority_order():
    vllm = deployment("vllm", upstream_model="meta-llama/Llama-3.1-8B-Instruct", priority_scheduling="lower-first")
    call = upstream_call(max_tokens=12, priority=2)
    assert compile_request(vllm, call, "llama-3.1-8b-instruct") == UpstreamRequest(
        "POST", "http://127.0.0.1:9/v1/chat/completions", HEADERS,
        {"messages": MESSAGES, "temperature": 0, "model": "meta-llama/Llama-3.1-8B-Instruct",
         "max_completion_tokens": 12, **STREAM, "cache_salt": salt_for(call, "vllm-a"), "priority": -2})


def test_vllm_completions_send_max_tokens_and_the_served_name_by_default():
    # A caller that waits for the whole answer: the upstream call does not stream either.
    call = upstream_call({"model": "m", "prompt": "The capital of France is", "stop": ["\n"]}, route="completions")
    sent = compile_request(deployment("vllm"), call, "m")
    assert sent.json == {
        "prompt": "The capital of France is", "stop": ["\n"], "model": "m", "max_tokens": 16, "stream": False,
        "cache_salt": salt_for(call, "vllm-a")}
    assert sent.headers["accept"] == "application/json"


def test_vllm_without_priority_scheduling_gets_no_priority():
    # "Any priority other than 0 will raise an error if the served model does not use priority scheduling."
    assert "priority" not in compile_request(deployment("vllm"), upstream_call(priority=2), "m").json


def test_vllm_salt_is_the_documented_size_and_says_nothing_across_deployments():
    call = upstream_call()
    salt = salt_for(call, "vllm-a")
    assert len(salt) == 43 and len(base64.urlsafe_b64decode(salt + "=")) == 32
    assert salt_for(call, "vllm-b") != salt
    # Not the namespace digest itself, in any encoding: a salt in an upstream's log gives it away to no one.
    assert call.envelope.cache_namespace.hex() not in salt and base64.urlsafe_b64encode(
        call.envelope.cache_namespace).decode().rstrip("=") != salt


def test_vllm_salts_follow_the_namespace_not_the_caller():
    a, b = upstream_call(tenant="tenant-a"), upstream_call(tenant="tenant-b")
    shared_a = upstream_call(tenant="tenant-a", scope="shared")
    shared_b = upstream_call(tenant="tenant-b", scope="shared")
    salts = [compile_request(deployment("vllm"), c, "m").json["cache_salt"] for c in (a, b, shared_a, shared_b)]
    assert salts[0] != salts[1]  # tenant scope: one namespace per tenant
    assert salts[2] == salts[3] != salts[0]  # shared scope: one namespace for all
    assert compile_request(deployment("vllm"), a, "m").json["cache_salt"] == salts[0]  # stable: reuse works


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_a_segmented_decision_falls_back_to_the_private_scope_for_the_whole_prompt(dialect):
    # One salt per request: the public segment cannot be keyed apart from the private suffix, so the
    # salt is the request's own namespace's, as if no segment had been given (docs/upstreams.md).
    public = (segment(list(range(64))),)
    salts = [compile_request(deployment(dialect), upstream_call(tenant=t, segments=s), "m").json["cache_salt"]
             for t, s in (("tenant-a", public), ("tenant-a", ()), ("tenant-b", public))]
    assert salts[0] == salts[1] != salts[2]


def test_vllm_scope_none_gets_a_fresh_random_salt_each_request():
    # vLLM's OpenAI server has no per-request switch to skip its prefix cache; a salt no other
    # request holds means nothing is read and nothing written is ever reached.
    call = upstream_call(scope="none")
    salts = {compile_request(deployment("vllm"), call, "m").json["cache_salt"] for _ in range(3)}
    assert len(salts) == 3 and all(len(s) == 43 for s in salts)


def test_client_supplied_extension_fields_never_reach_the_upstream():
    body = CHAT_BODY | {"cache_salt": "attacker-chosen", "priority": -100, "extra_key": "x", "cache_prompt": True,
                        "max_tokens": 4096, "stream": False, "stream_options": {"include_usage": False},
                        "user": "alice@example.com", "store": True, "metadata": {"k": "v"}, "model": "other"}
    for dialect in ("vllm", "sglang", "llamacpp", "azure-openai", "openai"):
        sent = compile_request(deployment(dialect), upstream_call(body, scope="shared", priority=1), "m").json
        assert sent.get("cache_salt") != "attacker-chosen"
        assert sent.get("priority") != -100 and "extra_key" not in sent
        assert sent.get("cache_prompt") in (None, False)
        assert {"user", "store", "metadata"}.isdisjoint(sent)
        assert sent["stream"] is False and "stream_options" not in sent  # the caller's choice, the gateway's options
        assert 4096 not in (sent.get("max_tokens"), sent.get("max_completion_tokens"))
        assert sent.get("model") in (None, "m")


# -- SGLang -------------------------------------------------------------------------------------
# python/sglang/srt/entrypoints/openai/protocol.py ChatCompletionRequest: cache_salt ("Cache salt
# for request caching"), extra_key, priority, max_completion_tokens (max_tokens "deprecated in favor
# of the max_completion_tokens field"), stream_options; serving_base.py _compute_extra_key joins
# cache_salt and extra_key into the radix-cache key. Server arguments
# (https://docs.sglang.ai/advanced_features/server_arguments.html): --enable-priority-scheduling
# "Requests with higher priority integer values are scheduled first by default";
# --schedule-low-priority-values-first inverts it.

def test_sglang_chat_gets_a_derived_cache_salt():
    call = upstream_call()
    assert compile_request(deployment("sglang", url="http://sglang:30000/v1"), call, "m") == UpstreamRequest(
        "POST", "http://sglang:30000/v1/chat/completions", HEADERS,
        {"messages": MESSAGES, "temperature": 0, "model": "m", "max_completion_tokens": 16, **STREAM,
         "cache_salt": salt_for(call, "sglang-a")})


@pytest.mark.parametrize(("order", "sent"), [("higher-first", 2), ("lower-first", -2)])
def test_sglang_priority_follows_the_declared_order(order, sent):
    sglang = deployment("sglang", priority_scheduling=order)
    assert compile_request(sglang, upstream_call(priority=2), "m").json["priority"] == sent


# -- llama.cpp ----------------------------------------------------------------------------------
# tools/server/README.md (https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md):
#   cache_prompt: "Re-use KV cache from a previous request if possible. ... Default: true";
#   /v1/chat/completions and /v1/completions take OpenAI's max_tokens and stream_options.

def test_llamacpp_never_reuses_prompts_unless_the_deployment_says_so():
    call = upstream_call(scope="shared")
    assert compile_request(deployment("llamacpp", url="http://127.0.0.1:8080/v1"), call, "m") == UpstreamRequest(
        "POST", "http://127.0.0.1:8080/v1/chat/completions", HEADERS,
        {"messages": MESSAGES, "temperature": 0, "model": "m", "max_tokens": 16, **STREAM, "cache_prompt": False})


def test_llamacpp_that_caches_gets_cache_prompt_true_for_scopes_it_can_honour():
    caching = deployment("llamacpp", cache_prompt=True)
    assert compile_request(caching, upstream_call(scope="shared"), "m").json["cache_prompt"] is True
    with pytest.raises(ValueError, match="cache scope none"):
        compile_request(caching, upstream_call(scope="none"), "m")


# -- Azure OpenAI -------------------------------------------------------------------------------
# Data plane inference 2024-10-21 (azure-rest-api-specs specification/cognitiveservices/data-plane/
# AzureOpenAI/inference/stable/2024-10-21/inference.json; https://learn.microsoft.com/azure/ai-services/
# openai/reference): POST {endpoint}/openai/deployments/{deployment-id}/chat/completions?api-version=...,
# chatCompletionsRequestCommon max_completion_tokens (max_tokens "deprecated ... not compatible with o1
# series models"), no model field. stream_options.include_usage works with 2024-10-21
# (https://github.com/griptape-ai/griptape/issues/1640). Prompt caching has no request field.

def test_azure_openai_puts_the_deployment_in_the_path_and_no_model_in_the_body():
    azure = deployment("azure-openai", url="https://contoso.openai.azure.com/", azure_deployment="gpt-4o-mini",
                       api_key_env="AZURE_OPENAI_API_KEY")
    assert compile_request(azure, upstream_call(scope="shared", priority=2), "gpt-4o-mini") == UpstreamRequest(
        "POST", "https://contoso.openai.azure.com/openai/deployments/gpt-4o-mini/chat/completions"
                "?api-version=2024-10-21", HEADERS,
        {"messages": MESSAGES, "temperature": 0, "max_completion_tokens": 16, **STREAM})


def test_azure_openai_completions_path():
    azure = deployment("azure-openai", url="https://contoso.openai.azure.com", azure_api_version="2024-06-01")
    sent = compile_request(azure, upstream_call({"prompt": "Hi"}, route="completions", scope="shared"), "m")
    assert sent.url == "https://contoso.openai.azure.com/openai/deployments/gpt-4o-mini/completions?api-version=2024-06-01"
    assert sent.json == {"prompt": "Hi", "max_tokens": 16, "stream": False}


# -- OpenAI -------------------------------------------------------------------------------------
# https://platform.openai.com/docs/api-reference/chat/create: max_completion_tokens (max_tokens
# "deprecated ... not compatible with o-series models"), stream_options.include_usage.

def test_openai_chat():
    openai = deployment("openai", url="https://api.openai.com/v1", upstream_model="gpt-4o-mini")
    assert compile_request(openai, upstream_call(scope="shared"), "gpt-4o-mini") == UpstreamRequest(
        "POST", "https://api.openai.com/v1/chat/completions", HEADERS,
        {"messages": MESSAGES, "temperature": 0, "model": "gpt-4o-mini", "max_completion_tokens": 16, **STREAM})


# -- which deployments can honour a cache scope ---------------------------------------------------

@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
@pytest.mark.parametrize("scope", ["none", "principal", "tenant", "shared"])
def test_salted_servers_honour_every_scope(dialect, scope):
    assert unmet_cache_scope(deployment(dialect), envelope(scope=scope), "tenant-a") is None


@pytest.mark.parametrize("scope", ["none", "principal", "tenant", "shared"])
def test_a_llamacpp_server_that_never_caches_honours_every_scope(scope):
    assert unmet_cache_scope(deployment("llamacpp"), envelope(scope=scope), "tenant-a") is None


@pytest.mark.parametrize("shared_cache", [deployment("azure-openai"), deployment("openai"),
                                          deployment("llamacpp", cache_prompt=True)], ids=lambda d: d.dialect)
def test_one_shared_cache_honours_only_what_may_share_with_everything_else_on_it(shared_cache):
    def unmet(scope: str, dedicated: list[str]) -> str | None:
        return unmet_cache_scope(shared_cache.model_copy(update={"dedicated_tenants": dedicated}),
                                 envelope(tenant="tenant-a", scope=scope), "tenant-a")

    assert unmet("shared", []) is None
    assert unmet("shared", ["tenant-a", "tenant-b"]) is None
    assert unmet("tenant", ["tenant-a"]) is None
    assert unmet("shared", ["tenant-b"]) is not None  # would read tenant-b's own prefixes
    assert unmet("tenant", []) is not None
    assert unmet("tenant", ["tenant-a", "tenant-b"]) is not None
    for dedicated in ([], ["tenant-a"]):
        assert unmet("principal", dedicated) is not None
        assert unmet("none", dedicated) == ("cache scope none needs a server that keeps prompt caches apart, "
                                            "and this one shares one cache across its requests")


def test_unsupported_fields_are_named_for_a_400():
    assert unsupported_fields(CHAT_BODY) == []
    assert unsupported_fields(CHAT_BODY | {"logprobs": False, "n": 1}) == []
    assert unsupported_fields(CHAT_BODY | {"n": 2, "logprobs": True, "top_logprobs": 2}) == ["n", "logprobs",
                                                                                            "top_logprobs"]
    assert unsupported_fields({"prompt": "x", "logprobs": 0, "best_of": 2, "echo": True}) == [
        "logprobs", "best_of", "echo"]


# -- sampling fields ------------------------------------------------------------------------------
# OpenAI's penalties and logit_bias mean the same on every dialect and go as sent. top_k and min_p are
# extensions: vLLM's "Extra parameters" (top_k: -1 or 0 disables; min_p), SGLang's sampling params
# ("top_k: -1 means disabled"; it refuses 0), llama.cpp's server (top_k <= 0 uses the whole vocabulary,
# default 40; min_p default 0.05). OpenAI and Azure OpenAI answer an unknown field with 400.
SAMPLING = {"presence_penalty": 0.5, "frequency_penalty": -1.0, "logit_bias": {"15": -100}}


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "llamacpp"])
def test_top_k_and_min_p_go_to_the_dialects_that_document_them(dialect):
    sent = compile_request(deployment(dialect), upstream_call(CHAT_BODY | SAMPLING | {"top_k": 5, "min_p": 0.1}), "m")
    assert {name: sent.json[name] for name in (*SAMPLING, "top_k", "min_p")} == SAMPLING | {"top_k": 5, "min_p": 0.1}
    for off in (0, -1):  # off is -1 everywhere: SGLang refuses 0, and llama.cpp's default is 40
        assert compile_request(deployment(dialect), upstream_call(CHAT_BODY | {"top_k": off}), "m").json["top_k"] == -1
    assert "top_k" not in compile_request(deployment(dialect), upstream_call(), "m").json


@pytest.mark.parametrize("dialect", ["azure-openai", "openai"])
def test_openai_dialects_get_the_penalties_and_never_an_extension(dialect):
    call = upstream_call(CHAT_BODY | SAMPLING | {"top_k": 5, "min_p": 0.1}, scope="shared")
    sent = compile_request(deployment(dialect), call, "m")
    assert {name: sent.json[name] for name in SAMPLING} == SAMPLING
    assert "top_k" not in sent.json and "min_p" not in sent.json
    # ... because a model with such a deployment refuses them before anything runs.
    assert unsupported_fields(CHAT_BODY | {"min_p": 0.1, "top_k": 5}, ["vllm", dialect]) == ["min_p", "top_k"]
    assert unsupported_fields(CHAT_BODY | SAMPLING, [dialect]) == []
    assert unsupported_fields(CHAT_BODY | {"top_k": 5}, ["vllm", "llamacpp", "sglang"]) == []


# -- the deployments file fields this client adds -------------------------------------------------

def upstream_file(**fields) -> str:
    import json

    entry = {"name": "u", "kind": "openai", "url": "http://u:8000/v1"} | fields
    return json.dumps({"models": {"m": [entry]}})


def test_priority_scheduling_must_fit_the_dialect():
    assert parse_deployments(upstream_file(dialect="vllm", priority_scheduling="lower-first"))
    assert parse_deployments(upstream_file(dialect="sglang", priority_scheduling="higher-first"))
    for dialect, order in [("vllm", "higher-first"), ("llamacpp", "lower-first"), ("openai", "higher-first")]:
        with pytest.raises(DeploymentsError, match="priority_scheduling"):
            parse_deployments(upstream_file(dialect=dialect, priority_scheduling=order))


def test_cache_prompt_is_for_llamacpp_only():
    assert parse_deployments(upstream_file(dialect="llamacpp", cache_prompt=True))
    with pytest.raises(DeploymentsError, match="cache_prompt is for dialect llamacpp"):
        parse_deployments(upstream_file(dialect="vllm", cache_prompt=True))
