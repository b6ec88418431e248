"""OpenAIUpstream against a real HTTP server on loopback that speaks SSE like an OpenAI server:
usage parsing, credentials, and which failures are the deployment's and which the caller's."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator

import pytest
from azure.core.credentials import AccessToken
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from devkit.server import free_port, serving
from gateway.deployments.base import UpstreamIdle, UpstreamInterrupted, UpstreamRejected, UpstreamUnavailable
from gateway.deployments.openai_compatible import KEEPALIVE_EXPIRY_S, OpenAIUpstream
from tests.utils.upstreams import CHAT_BODY, deployment, upstream_call

USAGE = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11, "prompt_tokens_details": {"cached_tokens": 4}}
HUGE_USAGE = {"prompt_tokens": 10**9, "completion_tokens": 10**9, "total_tokens": 2 * 10**9}


def sse(event: dict | str) -> bytes:
    return f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()


TOOL_CALL = {"id": "call_up1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


def chat_chunk(content: str | None = None, finish: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class FakeUpstream:
    """One scripted OpenAI-compatible server; `mode` picks what the next request gets."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.received: list[dict] = []
        self.disconnected = threading.Event()
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["POST"])])

    async def handle(self, request: Request):
        body = await request.json()
        self.received.append({"path": request.url.path, "query": request.url.query,
                              "headers": dict(request.headers), "json": body})
        if self.mode == "503":
            return JSONResponse({"error": {"message": "overloaded", "type": "server_error"}}, status_code=503)
        if self.mode == "400":
            return JSONResponse({"object": "error", "message": "This model's maximum context length is 2048 tokens",
                                 "type": "BadRequestError", "param": "messages", "code": 400}, status_code=400)
        if self.mode == "401":
            return JSONResponse({"error": {"message": "Incorrect API key provided: sk-...", "code": 401}},
                                status_code=401)
        if body.get("stream") is False:  # a whole answer, with usage in it
            if self.mode == "slow":
                await asyncio.sleep(3)
            if self.mode == "garbage":
                return JSONResponse({"unexpected": True})
            chat = {"message": {"role": "assistant", "content": "Paris."}}
            message = {"text": "Paris."} if "prompt" in body else chat
            if self.mode == "tool_call":
                message = {"message": {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}}
                return JSONResponse({"object": "chat.completion", "usage": USAGE,
                                     "choices": [{"index": 0, "finish_reason": "tool_calls", **message}]})
            usage = HUGE_USAGE if self.mode == "huge-usage" else USAGE
            return JSONResponse({"object": "chat.completion", "usage": usage,
                                 "choices": [{"index": 0, "finish_reason": "stop", **message}]})
        return StreamingResponse(self.events(body), media_type="text/event-stream")

    async def events(self, body: dict):
        completions = "prompt" in body
        try:
            if self.mode == "slow":
                await asyncio.sleep(3)
            if self.mode == "endless":
                for _ in range(400):  # bounded: 20 s at most
                    yield sse(chat_chunk("x"))
                    await asyncio.sleep(0.05)
                return
            if self.mode == "tool_call":  # OpenAI's pieces: the call's id and name, then its arguments
                head = TOOL_CALL | {"index": 0, "function": {"name": "get_weather", "arguments": ""}}
                for piece in (head, {"index": 0, "function": {"arguments": '{"city":'}},
                              {"index": 0, "function": {"arguments": '"Paris"}'}}):
                    yield sse({"object": "chat.completion.chunk",
                               "choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]})
                yield sse(chat_chunk(finish="tool_calls"))
                yield sse({"choices": [], "usage": USAGE})
                yield sse("[DONE]")
                return
            for piece in ("Paris", "."):
                yield sse({"choices": [{"index": 0, "text": piece, "finish_reason": None}]} if completions
                          else chat_chunk(piece))
            if self.mode == "break":
                return  # the connection ends mid-answer: no finish_reason, no [DONE]
            if self.mode == "stall":
                await asyncio.sleep(3)
            yield sse({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]} if completions
                      else chat_chunk(finish="stop"))
            if self.mode != "no-usage":
                usage = HUGE_USAGE if self.mode == "huge-usage" else USAGE
                yield sse({"choices": [], "usage": usage})  # vLLM and OpenAI: a last chunk with usage only
            yield sse("[DONE]")
            if self.mode == "done-open":
                await asyncio.sleep(20)  # the body stays open after [DONE]
        finally:
            self.disconnected.set()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    server = FakeUpstream()
    with serving(server.app) as url:
        server.url = url
        yield server


@pytest.fixture(autouse=True)
def fresh(fake: FakeUpstream) -> None:
    fake.mode, fake.received[:] = "ok", []
    fake.disconnected.clear()


async def collect(upstream: OpenAIUpstream, call=None) -> list:
    return [output async for output in upstream.stream(call or upstream_call())]


async def test_chat_stream_yields_text_deltas_then_the_upstream_usage(fake):
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1"), "m")
    outputs = await collect(upstream)
    await upstream.aclose()
    assert [(o.new_text, o.new_token_ids, o.finished) for o in outputs] == [
        ("Paris", [], False), (".", [], False), ("", [], True)]
    last = outputs[-1]
    assert (last.finish_reason, last.num_prompt_tokens, last.num_output_tokens, last.num_cached_tokens,
            last.usage_reported) == ("stop", 9, 2, 4, True)
    sent = fake.received[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["json"]["stream"] is True and sent["json"]["stream_options"] == {"include_usage": True}
    assert sent["headers"]["x-request-id"] == "chatcmpl-test" and "authorization" not in sent["headers"]


async def test_completions_stream(fake):
    upstream = OpenAIUpstream(deployment("llamacpp", url=fake.url + "/v1"), "m")
    outputs = await collect(upstream, upstream_call({"prompt": "The capital of France is", "stream": True},
                                                    route="completions"))
    await upstream.aclose()
    assert "".join(o.new_text for o in outputs) == "Paris." and outputs[-1].usage_reported
    assert fake.received[0]["path"] == "/v1/completions"


async def test_without_usage_the_counts_are_the_clients_own_and_say_so(fake):
    fake.mode = "no-usage"
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1"), "m")
    last = (await collect(upstream))[-1]
    await upstream.aclose()
    assert (last.finished, last.usage_reported, last.num_output_tokens, last.num_prompt_tokens) == (True, False, 2, 0)


async def test_connection_refused_is_unavailable():
    upstream = OpenAIUpstream(deployment("vllm", url=f"http://127.0.0.1:{free_port()}/v1"), "m")
    with pytest.raises(UpstreamUnavailable, match="cannot be reached"):
        await collect(upstream)
    await upstream.aclose()


@pytest.mark.parametrize("status", ["503", "401"])
async def test_deployment_errors_before_the_first_token_are_unavailable_and_say_nothing_of_them(fake, status):
    # 401 is the gateway's own credential, not the caller's to fix: another replica may do better.
    fake.mode = status
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1"), "m")
    with pytest.raises(UpstreamUnavailable) as caught:
        await collect(upstream)
    await upstream.aclose()
    assert str(caught.value) == f"deployment vllm-a answered {status}"


async def test_a_400_is_rejected_with_the_upstreams_message_for_the_caller(fake):
    fake.mode = "400"
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1"), "m")
    with pytest.raises(UpstreamRejected) as caught:
        await collect(upstream)
    await upstream.aclose()
    rejected = caught.value
    assert (rejected.status, rejected.message, rejected.param) == (
        400, "This model's maximum context length is 2048 tokens", "messages")
    assert rejected.code == "context_length_exceeded"  # vLLM says so in its message only; OpenAI's code for it
    assert "maximum context" not in str(rejected)  # what may reach a log names the status only


async def test_no_first_token_in_time_is_unavailable(fake):
    fake.mode = "slow"
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1", first_token_timeout_s=0.3), "m")
    started = time.monotonic()
    with pytest.raises(UpstreamUnavailable, match="timed out before its first token"):
        await collect(upstream)
    await upstream.aclose()
    assert time.monotonic() - started < 2.5


@pytest.mark.parametrize(("mode", "fields", "why"), [
    ("stall", {"timeout_s": 0.8}, "timed out$"),  # the whole-request timeout, once output has begun
    ("break", {}, "ended its stream before finishing"),
])
async def test_a_stream_that_fails_after_output_is_unavailable(fake, mode, fields, why):
    fake.mode = mode
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1", **fields), "m")
    texts = []
    with pytest.raises(UpstreamUnavailable, match=why):
        async for output in upstream.stream(upstream_call()):
            texts.append(output.new_text)
    await upstream.aclose()
    assert texts == ["Paris", "."]


async def test_done_ends_the_answer_even_when_the_body_stays_open(fake):
    fake.mode = "done-open"
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1", timeout_s=10), "m")
    started = time.monotonic()
    outputs = await collect(upstream)
    elapsed = time.monotonic() - started
    await upstream.aclose()
    assert "".join(o.new_text for o in outputs) == "Paris." and outputs[-1].finish_reason == "stop"
    assert outputs[-1].usage_reported and elapsed < 3, elapsed  # not the 10 s timeout, nor the 20 s body


async def test_a_stream_silent_for_its_idle_timeout_after_output_ends_with_upstream_idle(fake):
    fake.mode = "stall"  # 3 s of silence after two chunks
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1", idle_timeout_s=0.5), "m")
    texts, started = [], time.monotonic()
    with pytest.raises(UpstreamIdle, match="sent nothing for 0.5 s mid-stream"):
        async for output in upstream.stream(upstream_call()):
            texts.append(output.new_text)
    await upstream.aclose()
    assert texts == ["Paris", "."] and time.monotonic() - started < 2.5


async def test_closing_the_generator_early_closes_the_upstream_stream(fake):
    fake.mode = "endless"
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1"), "m")
    outputs = upstream.stream(upstream_call())
    assert (await anext(outputs)).new_text == "x"
    await outputs.aclose()
    assert await asyncio.to_thread(fake.disconnected.wait, 10), "the server kept streaming to a closed client"
    await upstream.aclose()


async def test_api_key_file_is_read_again_when_it_changes(fake, tmp_path):
    key = tmp_path / "api-key"
    key.write_text("first-key\n")
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1", api_key_file=key), "m")
    await collect(upstream)
    key.write_text("second-key\n")
    os.utime(key, ns=(time.time_ns(), time.time_ns() + 10**9))  # a rotation: a new mtime
    await collect(upstream)
    await upstream.aclose()
    assert [r["headers"]["authorization"] for r in fake.received] == ["Bearer first-key", "Bearer second-key"]


async def test_azure_api_key_goes_in_the_api_key_header(fake, monkeypatch):
    # https://learn.microsoft.com/azure/ai-services/openai/reference#authentication: "api-key" header.
    monkeypatch.setenv("TEST_AZURE_OPENAI_KEY", "azure-key")
    azure = deployment("azure-openai", url=fake.url, api_key_env="TEST_AZURE_OPENAI_KEY")
    upstream = OpenAIUpstream(azure, "m")
    await collect(upstream, upstream_call(scope="shared"))
    await upstream.aclose()
    sent = fake.received[0]
    assert (sent["path"], sent["query"]) == ("/openai/deployments/gpt-4o-mini/chat/completions",
                                              "api-version=2024-10-21")
    assert sent["headers"]["api-key"] == "azure-key" and "authorization" not in sent["headers"]


def test_a_missing_key_variable_fails_at_start_naming_the_variable_only(monkeypatch):
    monkeypatch.delenv("TEST_MISSING_KEY", raising=False)
    with pytest.raises(ValueError, match="environment variable TEST_MISSING_KEY is not set"):
        OpenAIUpstream(deployment("vllm", api_key_env="TEST_MISSING_KEY"), "m")


class FakeEntraCredential:
    """azure.identity.aio's get_token contract: AccessToken(token, expires_on in epoch seconds)."""

    def __init__(self, lifetime_s: int) -> None:
        self.lifetime_s, self.scopes = lifetime_s, []

    async def get_token(self, *scopes: str) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken(f"entra-token-{len(self.scopes)}", int(time.time()) + self.lifetime_s)


@pytest.mark.parametrize(("lifetime_s", "tokens"), [(3600, ["entra-token-1", "entra-token-1"]),
                                                    (60, ["entra-token-1", "entra-token-2"])])
async def test_azure_entra_token_is_a_bearer_cached_until_near_expiry(fake, lifetime_s, tokens):
    # https://learn.microsoft.com/azure/ai-services/openai/how-to/managed-identity: Authorization: Bearer
    # with a token for https://cognitiveservices.azure.com/.default.
    scope = "https://cognitiveservices.azure.com/.default"
    credential = FakeEntraCredential(lifetime_s)
    azure = deployment("azure-openai", url=fake.url, entra_scope=scope)
    upstream = OpenAIUpstream(azure, "m", entra_credential=credential)
    for _ in range(2):
        await collect(upstream, upstream_call(scope="shared"))
    await upstream.aclose()
    assert [r["headers"]["authorization"] for r in fake.received] == [f"Bearer {t}" for t in tokens]
    assert set(credential.scopes) == {(scope,)}
    assert all("api-key" not in r["headers"] for r in fake.received)


async def test_a_connection_the_server_dropped_after_the_request_went_out_is_not_sent_again() -> None:
    # The server reads the second request on a kept-alive connection and closes it without an
    # answer: it may be generating it (and charging for it), so the request is not sent again.
    body = (sse(chat_chunk("Paris")) + sse(chat_chunk(finish="stop")) + sse({"choices": [], "usage": USAGE})
            + b"data: [DONE]\n\n")
    connections, requests, handlers = [0], [0], []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        handlers.append(asyncio.current_task())
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            requests[0] += 1
            if requests[0] > 1:
                break  # closed, unanswered
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = OpenAIUpstream(deployment(url=f"http://127.0.0.1:{port}/v1"), "served-model")
    try:
        outputs = [output async for output in upstream.stream(upstream_call())]
        assert "".join(o.new_text for o in outputs) == "Paris" and outputs[-1].usage_reported
        with pytest.raises(UpstreamInterrupted, match="closed the connection before answering"):
            await collect(upstream)
        await asyncio.sleep(0.2)
        assert (connections[0], requests[0]) == (1, 2)  # the second went out on the kept-alive one, once
    finally:
        await upstream.aclose()
        await asyncio.wait_for(asyncio.gather(*handlers), 5)
        server.close()
        await server.wait_closed()


def test_a_pooled_connection_is_reused_only_within_the_servers_keep_alive() -> None:
    # uvicorn (vLLM, SGLang) and cpp-httplib (llama-server) close a connection idle for 5 s;
    # reused at 5 s (httpx's default), the server closes it as the next request goes out. The
    # expiry itself is shown in test_http1.py.
    upstream = OpenAIUpstream(deployment(), "m")
    assert upstream._client._expiry_s == KEEPALIVE_EXPIRY_S < 5
    asyncio.run(upstream.aclose())


@pytest.mark.parametrize("route", ["chat.completions", "completions"])
async def test_a_whole_answer_for_a_caller_that_does_not_stream(fake, route):
    body = {"prompt": "The capital of France is"} if route == "completions" else CHAT_BODY | {"stream": False}
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1"), "m")
    outputs = await collect(upstream, upstream_call(body, route=route))
    await upstream.aclose()
    assert len(outputs) == 1 and outputs[0].finished and outputs[0].new_text == "Paris."
    assert (outputs[0].num_prompt_tokens, outputs[0].num_output_tokens, outputs[0].num_cached_tokens) == (9, 2, 4)
    assert outputs[0].usage_reported and outputs[0].finish_reason == "stop"
    assert fake.received[-1]["json"]["stream"] is False and "stream_options" not in fake.received[-1]["json"]


@pytest.mark.parametrize(("mode", "why"), [("503", "answered 503"), ("garbage", "malformed answer"),
                                           ("slow", "timed out")])
async def test_a_whole_answer_that_fails_is_unavailable(fake, mode, why):
    fake.mode = mode
    upstream = OpenAIUpstream(deployment("vllm", url=fake.url + "/v1", timeout_s=1), "m")
    with pytest.raises(UpstreamUnavailable, match=why):
        await collect(upstream, upstream_call(CHAT_BODY | {"stream": False}))
    await upstream.aclose()
