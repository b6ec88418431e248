"""What the HTTP target sends and reads: a salt per namespace in the field the server partitions
its cache by (none without one), a bearer token per namespace, a fresh suffix per request, and the
time to the first SSE event that carries output. A local stand-in server answers (httpx's
MockTransport): the target is the thing under test, the server is not."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from gateway.cache import AuditTargetError, OpenAITarget, text_prefixes, token_prefixes
from gateway.cache.targets import WORDS


def _server(events: list[str], seen: list[httpx.Request], status: int = 200) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, text="".join(f"data: {e}\n\n" for e in events),
                              headers={"content-type": "text/event-stream"})
    return httpx.MockTransport(answer)


TEXT = json.dumps({"choices": [{"index": 0, "text": " the"}]})


async def test_a_salt_per_namespace_in_the_named_field_and_a_fresh_suffix_each_time() -> None:
    seen: list[httpx.Request] = []
    target = OpenAITarget("http://vllm/v1", "m", namespace_field="cache_salt", transport=_server([TEXT], seen))
    for namespace in ("a", "a", "b"):
        assert await target("alpha beta", namespace) > 0
    await target.aclose()
    bodies = [json.loads(r.content) for r in seen]
    assert [r.url.path for r in seen] == ["/v1/completions"] * 3
    assert bodies[0]["cache_salt"] == bodies[1]["cache_salt"] != bodies[2]["cache_salt"]
    assert all(b["max_tokens"] == 1 and b["stream"] is True and b["model"] == "m" for b in bodies)
    assert all(b["prompt"].startswith("alpha beta ") for b in bodies)
    assert len({b["prompt"] for b in bodies}) == 3  # the suffix is fresh


async def test_no_field_and_a_bearer_token_per_namespace_on_the_chat_route() -> None:
    seen: list[httpx.Request] = []
    target = OpenAITarget("http://gw/v1", "m", route="chat.completions", bearer={"a": "ta", "b": "tb"},
                          headers={"X-Data-Classification": "public"}, transport=_server([TEXT], seen))
    await target("alpha", "a")
    await target("alpha", "b")
    await target.aclose()
    assert [r.headers["authorization"] for r in seen] == ["Bearer ta", "Bearer tb"]
    assert seen[0].headers["x-data-classification"] == "public"
    body = json.loads(seen[0].content)
    assert "cache_salt" not in body and body["messages"][0]["content"].startswith("alpha ")


async def test_a_role_only_chunk_is_not_the_first_output() -> None:
    role = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    content = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    seen: list[httpx.Request] = []
    assert await OpenAITarget("http://x/v1", "m", route="chat.completions",
                              transport=_server([role, content, "[DONE]"], seen))("alpha", "a") > 0
    with pytest.raises(AuditTargetError, match="without output"):
        await OpenAITarget("http://x/v1", "m", route="chat.completions",
                           transport=_server([role, "[DONE]"], seen))("alpha", "a")


async def test_refusals_and_error_events_name_no_prompt_and_no_token() -> None:
    seen: list[httpx.Request] = []
    refused = OpenAITarget("http://x/v1", "m", bearer={"a": "secret-a", "b": "secret-b"},
                           transport=_server([], seen, status=401))
    with pytest.raises(AuditTargetError) as caught:
        await refused("confidential words", "a")
    assert str(caught.value) == "the deployment answered a probe with HTTP 401"
    failing = OpenAITarget("http://x/v1", "m", transport=_server([json.dumps({"error": {"message": "x"}})], seen))
    with pytest.raises(AuditTargetError, match="an error event"):
        await failing("confidential words", "a")


def test_prefixes_are_fresh_and_of_the_length_asked() -> None:
    rng = random.Random(0)
    words = text_prefixes(32)
    first, second = words(rng), words(rng)
    assert first != second and len(first.split()) == 32 and set(first.split()) <= set(WORDS)
    tokens = token_prefixes(64, 8192)(rng)
    assert len(tokens) == 64 and all(16 <= t < 8192 for t in tokens)
    with pytest.raises(ValueError):
        token_prefixes(0, 8192)
    with pytest.raises(ValueError):
        text_prefixes(0)
