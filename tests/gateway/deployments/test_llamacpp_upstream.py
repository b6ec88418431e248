"""A real third-party upstream: llama.cpp's llama-server on SmolLM2, through OpenAIUpstream.

The binary comes from bench/build_llamacpp.sh (10+ minutes to build, so not in `make test`):
`make test-upstream` builds or finds it and runs these with TENANTGATE_LLAMA_SERVER set. Without
that variable they use a cached build if there is one, and skip if not.
"""

from __future__ import annotations

import pytest

from gateway.deployments.dialects import compile_request
from gateway.deployments.openai_compatible import OpenAIUpstream
from tests.utils.upstreams import deployment, upstream_call

pytestmark = pytest.mark.upstream

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def chat(question: str, **fields) -> dict:
    return {"model": "smollm2", "messages": [SYSTEM, {"role": "user", "content": question}], "temperature": 0} | fields


async def run(upstream: OpenAIUpstream, call) -> tuple[str, object]:
    outputs = [output async for output in upstream.stream(call)]
    return "".join(o.new_text for o in outputs), outputs[-1]


@pytest.mark.parametrize("caller_streams", [False, True])
async def test_llama_server_answers_paris_and_reports_usage(llama_server, caller_streams):
    # Whether the caller streams or not, the gateway streams upstream (one parser, one first-token timeout).
    upstream = OpenAIUpstream(deployment("llamacpp", url=llama_server), "smollm2-135m-instruct")
    text, last = await run(upstream, upstream_call(chat("What is the capital of France?", stream=caller_streams),
                                                   max_tokens=16, scope="shared"))
    await upstream.aclose()
    assert "Paris" in text
    assert last.finished and last.finish_reason == "stop"
    assert last.usage_reported and last.num_prompt_tokens > 10 and 0 < last.num_output_tokens <= 16


async def test_completions_route(llama_server):
    upstream = OpenAIUpstream(deployment("llamacpp", url=llama_server), "smollm2-135m-instruct")
    text, last = await run(upstream, upstream_call({"prompt": "The capital of France is", "temperature": 0},
                                                   route="completions", max_tokens=3, scope="shared"))
    await upstream.aclose()
    assert text.strip().startswith("Paris")
    assert (last.finish_reason, last.usage_reported, last.num_output_tokens) == ("length", True, 3)


async def test_shared_scope_reuses_a_repeat_and_scope_none_reuses_nothing(llama_server):
    caching = deployment("llamacpp", url=llama_server, cache_prompt=True)
    never = deployment("llamacpp", url=llama_server)
    shared = upstream_call(chat("Which river flows through Paris?"), max_tokens=4, scope="shared")
    none = upstream_call(chat("Which river flows through Paris?"), max_tokens=4, scope="none")
    assert compile_request(caching, shared, "m").json["cache_prompt"] is True
    assert compile_request(never, none, "m").json["cache_prompt"] is False

    caching_upstream, never_upstream = OpenAIUpstream(caching, "m"), OpenAIUpstream(never, "m")
    _, first = await run(caching_upstream, shared)
    _, repeat = await run(caching_upstream, shared)
    _, private = await run(never_upstream, none)  # the slot still holds this very prompt's KV
    await caching_upstream.aclose()
    await never_upstream.aclose()
    assert repeat.num_cached_tokens >= first.num_prompt_tokens - 2 > 0  # usage.prompt_tokens_details.cached_tokens
    assert private.num_cached_tokens == 0 and private.num_prompt_tokens == first.num_prompt_tokens


async def test_a_request_that_does_not_cache_still_leaves_its_kv_for_the_next_one_that_does(llama_server):
    # Why a llama.cpp deployment either never caches or only takes requests that may all share:
    # cache_prompt false stops a request reading the slot's KV, not leaving its own behind.
    question = chat("Write the word tangerine three times.")
    never = OpenAIUpstream(deployment("llamacpp", url=llama_server), "m")
    caching = OpenAIUpstream(deployment("llamacpp", url=llama_server, cache_prompt=True), "m")
    _, private = await run(never, upstream_call(question, max_tokens=2, scope="none"))
    _, reader = await run(caching, upstream_call(question, max_tokens=2, scope="shared"))
    await never.aclose()
    await caching.aclose()
    assert private.num_cached_tokens == 0
    assert reader.num_cached_tokens >= private.num_prompt_tokens - 2 > 0
