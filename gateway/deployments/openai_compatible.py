"""The HTTP and SSE client for OpenAI-compatible upstreams (vLLM, SGLang, llama.cpp's server,
Azure OpenAI, OpenAI): it sends what dialects.py compiled, with the credential of
credentials.py, and reads the answer back as RequestOutputs (docs/upstreams.md)."""


from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator

import numpy as np

from gateway.deployments.base import (
    Embeddings,
    UpstreamCall,
    UpstreamIdle,
    UpstreamInterrupted,
    UpstreamOutput,
    UpstreamRejected,
    UpstreamUnavailable,
)
from gateway.deployments.config import Deployment
from gateway.deployments.credentials import Credentials
from gateway.deployments.dialects import UpstreamRequest, compile_request, streams
from gateway.deployments.http1 import ConnectFailed, Http1Client, HttpError, Response

logger = logging.getLogger("tenantgate.gateway.upstream")

# Statuses that are about the request itself; any other error status is the deployment's
# (401/403: the gateway's credential, 404: its URL or model name, 408/429/5xx: load or failure).
CALLER_ERRORS = frozenset({400, 413, 422})

MAX_ERROR_BODY = 64 * 1024
# After [DONE] the answer is complete; the body's end is awaited this long, so that a connection
# read to its end goes back to the pool, and no longer: one held open past it is closed.
DONE_GRACE_S = 0.5
# A pooled connection is reused only this long after its last response: under the 5 s keep-alive
# of uvicorn (vLLM, SGLang) and cpp-httplib (llama-server), so the server does not close it as the
# next request goes out (that request may have reached it, and is then not sent again).
KEEPALIVE_EXPIRY_S = 2.0
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")  # an upstream's error code passed on: OpenAI's kind only


def _error_message(raw: bytes, status: int) -> tuple[str, str | None, str | None]:
    """The upstream's own message, param and code for a refused request: OpenAI's {"error": {...}},
    or vLLM's {"object": "error", "message": ...}. A prompt over the context window gets OpenAI's
    code whichever way the server says so (OpenAI's code, llama-server's type, vLLM's message)."""
    fallback = f"the upstream refused the request with {status}"
    try:
        document = json.loads(raw)
    except ValueError:
        return fallback, None, None
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):
        error = document if isinstance(document, dict) else {}
    message, param, code = error.get("message"), error.get("param"), error.get("code")
    message = message[:1000] if isinstance(message, str) and message else fallback
    code = code if isinstance(code, str) and _CODE.fullmatch(code) else None
    if error.get("type") == "exceed_context_size_error" or "maximum context length" in message:
        code = "context_length_exceeded"
        prompt, context = error.get("n_prompt_tokens"), error.get("n_ctx")  # llama-server's counts
        if isinstance(prompt, int) and isinstance(context, int) and str(context) not in message:
            message = f"{message} (the prompt has {prompt} tokens, the context window {context})"
    return message, param if isinstance(param, str) else None, code


_decode = json.JSONDecoder().raw_decode


def _chunk(data: str) -> object:
    """json.loads(data) for a stripped `data:` payload, without loads' two whitespace scans (a
    stripped payload has no whitespace around it); ValueError for what loads refuses."""
    event, end = _decode(data)
    if end != len(data):
        raise ValueError("extra data after the chunk")
    return event


def _usage(event: dict) -> tuple[int, int, int] | None:
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = usage.get("prompt_tokens_details")  # vLLM: only with --enable-prompt-tokens-details
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return prompt, completion, cached if isinstance(cached, int) else 0


def tool_call_fields(call: object) -> dict | None:
    """An upstream's tool call (or a streamed piece of one) with only OpenAI's fields, each of its
    type; None when it is not one."""
    if not isinstance(call, dict):
        return None
    kept = {k: call[k] for k in ("id", "type") if isinstance(call.get(k), str)}
    if type(call.get("index")) is int:
        kept["index"] = call["index"]
    function = call.get("function")
    if isinstance(function, dict):
        kept["function"] = {k: function[k] for k in ("name", "arguments") if isinstance(function.get(k), str)}
    return kept


def _choice(event: dict, route: str, streamed: bool = True) -> tuple[str, str | None, list[dict]]:
    """The text, finish reason and tool calls of choice 0 in one chunk (or a whole answer when not
    streamed); ("", None, []) when it has none."""
    choices = event["choices"]
    if not isinstance(choices, list):
        raise ValueError("choices is not a list")
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        calls = []
        if route == "chat.completions":
            delta = choice.get("delta" if streamed else "message")
            if not isinstance(delta, dict):
                delta = {}
            text, listed = delta.get("content"), delta.get("tool_calls")
            if listed and isinstance(listed, list):
                calls = [c for c in map(tool_call_fields, listed) if c]
        else:
            text = choice.get("text")
        reason = choice.get("finish_reason")
        return (text if isinstance(text, str) else ""), (reason if isinstance(reason, str) else None), calls
    return "", None, []


def _input_count(value) -> int:
    """How many vectors an embeddings `input` asks for: one for a text or one list of token ids."""
    if isinstance(value, list) and not all(type(item) is int for item in value):
        return len(value)
    return 1


def _embeddings(document: dict, expected: int) -> Embeddings:
    """An OpenAI embeddings answer: `data` items by index, each a list of floats."""
    data = document["data"]
    if not isinstance(data, list) or len(data) != expected:
        raise ValueError("not one embedding per input")
    rows = sorted(data, key=lambda item: item["index"])
    if [item["index"] for item in rows] != list(range(expected)):
        raise ValueError("embedding indexes are not 0..n-1")
    vectors = np.asarray([item["embedding"] for item in rows], dtype=np.float32)
    if vectors.ndim != 2 or not np.isfinite(vectors).all():
        raise ValueError("embeddings are not finite vectors of one length")
    usage = document.get("usage")
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return Embeddings(vectors, prompt if type(prompt) is int and prompt >= 0 else 0)


class OpenAIUpstream:
    """One OpenAI-compatible deployment: streams an admitted call as engine-style deltas."""

    def __init__(self, deployment: Deployment, served_model: str, *, entra_credential=None) -> None:
        self.deployment, self.served_model = deployment, served_model
        self._credentials = Credentials(deployment, entra_credential)
        self._client = Http1Client(connect_timeout_s=deployment.connect_timeout_s, io_timeout_s=deployment.timeout_s,
                                   keepalive_expiry_s=KEEPALIVE_EXPIRY_S)

    def _unavailable(self, why: str) -> UpstreamUnavailable:
        # Logged once, where it is handled (gateway/pipeline/run.py), like a replica's.
        return UpstreamUnavailable(f"deployment {self.deployment.name} {why}")

    async def stream(self, call: UpstreamCall) -> AsyncIterator[UpstreamOutput]:
        """Deltas with new_text (new_token_ids stay empty), then a last one with finished set,
        the finish reason and the counts. Raises UpstreamUnavailable when the deployment cannot
        be reached, times out, fails or breaks the stream (UpstreamInterrupted when the connection
        ended once the request may have reached it, UpstreamIdle when it sent nothing for
        idle_timeout_s after an output); UpstreamRejected when it refuses the request itself.
        Closing the generator closes the upstream stream. [DONE] ends the answer."""
        deployment = self.deployment
        compiled = compile_request(deployment, call, self.served_model)
        started = asyncio.get_running_loop().time()
        whole = started + deployment.timeout_s
        streaming = streams(call)
        # Streamed, the first token must come within first_token_timeout_s; whole, the answer within timeout_s.
        first = min(started + deployment.first_token_timeout_s, whole) if streaming else whole
        outputs = 0
        finish_reason, usage = None, None
        response = await self._send(compiled, first, streaming)
        try:
            await self._refused(response)
            if not streaming:
                async with asyncio.timeout_at(whole):
                    document = json.loads(await response.aread())
                if not isinstance(document, dict) or "choices" not in document:
                    raise ValueError("not a completion")
                text, finish_reason, calls = _choice(document, call.route, streamed=False)
                usage = _usage(document)
                outputs = 1 if text or calls else 0
                if finish_reason is None:
                    raise self._unavailable("answered without a finish reason")
                prompt, completion, cached = usage or (0, outputs, 0)
                yield UpstreamOutput(call.request_id, [], text, prompt, completion, cached, finished=True,
                                     finish_reason=finish_reason, usage_reported=usage is not None,
                                     tool_calls=calls)
                return
            # The idle deadline is taken whenever the reader must wait for the socket, not per line;
            # the lines come in one list per read, so a fast upstream's stream costs a resumption or two.
            reads = response.aiter_line_lists(lambda: self._next_line_deadline(whole, None if outputs else first))
            done = False
            async for lines in reads:
                for line in lines:
                    if not line.startswith("data:"):
                        continue  # blank separators, comments (": ping"), event names
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    event = _chunk(data)
                    if not isinstance(event, dict) or "error" in event or event.get("object") == "error":
                        raise self._unavailable("sent an error in its stream")
                    usage = _usage(event) or usage
                    text, reason, calls = _choice(event, call.route) if "choices" in event else ("", None, [])
                    finish_reason = reason or finish_reason
                    if text or calls:
                        outputs += 1
                        yield UpstreamOutput(call.request_id, [], text, 0, outputs, tool_calls=calls)
                if done:
                    await self._drain(reads)
                    break
        except TimeoutError:
            if not outputs:
                raise self._unavailable("timed out before its first token") from None
            if asyncio.get_running_loop().time() < whole:
                raise UpstreamIdle(f"deployment {deployment.name} sent nothing for "
                                   f"{deployment.idle_timeout_s:g} s mid-stream") from None
            raise self._unavailable("timed out") from None
        except HttpError as exc:  # after its head: it had the request
            raise UpstreamInterrupted(f"deployment {deployment.name} broke its stream ({exc})") from None
        except ValueError:  # a malformed chunk or answer (json.JSONDecodeError is one)
            raise self._unavailable("sent a malformed stream" if streaming else "sent a malformed answer") from None
        finally:
            await response.aclose()
        if finish_reason is None:
            raise self._unavailable("ended its stream before finishing")
        prompt, completion, cached = usage or (0, outputs, 0)
        yield UpstreamOutput(call.request_id, [], "", prompt, completion, cached, finished=True,
                             finish_reason=finish_reason, usage_reported=usage is not None)

    def _next_line_deadline(self, whole: float, first: float | None) -> float:
        """Until the first output, `first`; after it, idle_timeout_s from now, within `whole`."""
        if first is not None:
            return first
        return min(whole, asyncio.get_running_loop().time() + self.deployment.idle_timeout_s)

    @staticmethod
    async def _drain(reads: AsyncIterator[list[str]]) -> None:
        """Reads what follows [DONE] for up to DONE_GRACE_S (a body that ends hands its connection
        back to the pool); a body held open past it is left, and closing it closes the connection."""
        try:
            async with asyncio.timeout(DONE_GRACE_S):
                async for _ in reads:
                    pass
        except (TimeoutError, HttpError):
            pass

    async def _send(self, compiled: UpstreamRequest, deadline: float, streaming: bool) -> Response:
        """The upstream's response, its body not yet read; UpstreamUnavailable when it cannot be
        had by `deadline`. Sent once: a connection lost before the request was written (refused,
        unreachable, a failed TLS handshake) is UpstreamUnavailable, which may move to another
        deployment; one lost after it may have been written is UpstreamInterrupted, which may not,
        since the server may be running it."""
        # Lower-case names, as the dialect and the credential write theirs: each is sent once.
        headers = {"user-agent": "tenantgate", **compiled.headers, **await self._credentials.headers()}
        body = json.dumps(compiled.json, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            async with asyncio.timeout_at(deadline):
                return await self._client.send(compiled.method, compiled.url, headers, body)
        except TimeoutError:
            raise self._unavailable("timed out before its first token" if streaming else "timed out") from None
        except ConnectFailed as exc:
            raise self._unavailable(f"cannot be reached ({exc})") from None
        except HttpError as exc:
            raise UpstreamInterrupted(f"deployment {self.deployment.name} closed the connection before "
                                      f"answering ({exc})") from None

    async def _refused(self, response: Response) -> None:
        """Raises for an error status: UpstreamRejected for the caller's, UpstreamUnavailable for the deployment's."""
        if response.status_code < 400:
            return
        raw = await self._read_error(response)
        if response.status_code not in CALLER_ERRORS:
            raise self._unavailable(f"answered {response.status_code}")
        logger.info("upstream %s refused a request with %d", self.deployment.name, response.status_code)
        message, param, code = _error_message(raw, response.status_code)
        raise UpstreamRejected(response.status_code, message, param=param, code=code)

    async def embed(self, call: UpstreamCall) -> Embeddings:
        """The upstream's vectors, in input order, and its token count. Raises as stream() does."""
        compiled = compile_request(self.deployment, call, self.served_model)
        deadline = asyncio.get_running_loop().time() + self.deployment.timeout_s
        response = await self._send(compiled, deadline, streaming=False)
        try:
            await self._refused(response)
            async with asyncio.timeout_at(deadline):
                document = json.loads(await response.aread())
            return _embeddings(document, _input_count(compiled.json["input"]))
        except TimeoutError:
            raise self._unavailable("timed out") from None
        except HttpError as exc:
            raise UpstreamInterrupted(f"deployment {self.deployment.name} broke its answer ({exc})") from None
        except (ValueError, TypeError, KeyError):  # a malformed answer (json.JSONDecodeError is a ValueError)
            raise self._unavailable("sent a malformed answer") from None
        finally:
            await response.aclose()

    @staticmethod
    async def _read_error(response: Response) -> bytes:
        raw = bytearray()
        async for piece in response.aiter_bytes():
            raw += piece
            if len(raw) >= MAX_ERROR_BODY:
                break
        return bytes(raw[:MAX_ERROR_BODY])

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._credentials.aclose()
