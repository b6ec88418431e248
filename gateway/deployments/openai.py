"""The client for OpenAI-compatible upstreams, with the decision compiled into each dialect's knobs.

docs/upstreams.md has the table and the documentation behind every field. In short:

- Cache scope. vLLM and SGLang partition their prefix caches by `cache_salt`: the gateway sends a
  salt derived per deployment from the keyed namespace digest, and for scope none a fresh random
  one (vLLM's OpenAI server has no per-request switch to skip its cache; a salt nobody else holds
  means nothing is read and what is written is never reached). llama.cpp's server has one cache
  for all its requests, and `cache_prompt: false` stops a request reading it but not leaving its
  KV behind for the next `cache_prompt: true` one; so the gateway sends `cache_prompt: false`
  to every request unless the deployment declares `cache_prompt`, and then routes there only
  requests that may all share. Azure OpenAI and OpenAI always cache, across the subscription or
  organisation, with no switch: the same rule as a caching llama.cpp server.
- Priority: `priority` for vLLM and SGLang, in the order the deployment declares.
- Usage: a streamed call asks for it with `stream_options.include_usage`; a whole answer has
  it in its body. The upstream call streams exactly when the caller's does.
- Sampling extensions: `top_k` and `min_p` go to vLLM, SGLang and llama.cpp's server, with
  top_k off sent as -1 (what all three read as off; SGLang refuses 0, llama.cpp defaults to 40).
  OpenAI and Azure OpenAI have neither: a model with such a deployment refuses them with a 400
  naming the field (dropping them would change the answer without a word).
- Embeddings go to the upstream's /embeddings with the same cache and priority fields, asking
  for floats whatever the caller asked: the gateway renders the caller's encoding itself.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast
from urllib.parse import quote

import httpx
import numpy as np

from engine import CacheScope, ExecutionEnvelope, RequestOutput
from gateway.deployments.base import (
    Embeddings,
    UpstreamCall,
    UpstreamIdle,
    UpstreamInterrupted,
    UpstreamRejected,
    UpstreamUnavailable,
)
from gateway.deployments.config import Deployment

if TYPE_CHECKING:
    from azure.core.credentials import AccessToken

logger = logging.getLogger("tenantgate.gateway.upstream")

PATHS = {"chat.completions": "chat/completions", "completions": "completions", "embeddings": "embeddings"}

# The caller's fields that mean the same upstream and go as they are. The rest are the gateway's
# (model, max_tokens, max_completion_tokens, stream, stream_options), an extension a client may
# not set (cache_salt, priority, cache_prompt, extra_key, ...), or dropped: user and metadata
# (who calls stays inside the gateway), store (a caller never opts into storage upstream), n,
# logprobs, top_logprobs, best_of and echo (see unsupported_fields).
FORWARDED = frozenset({"messages", "prompt", "suffix", "temperature", "top_p", "stop", "seed",
                       "presence_penalty", "frequency_penalty", "logit_bias", "response_format",
                       "tools", "tool_choice", "parallel_tool_calls"})
# Sampling extensions, forwarded only to the dialects that document them.
EXTENSIONS = frozenset({"top_k", "min_p"})
EXTENSION_DIALECTS = frozenset({"vllm", "sglang", "llamacpp"})
# An embeddings call's: input (texts or token ids) and dimensions; user is dropped as above, and
# encoding_format is the gateway's (always float upstream).
EMBEDDING_FORWARDED = frozenset({"input", "dimensions"})

# Statuses that are about the request itself; any other error status is the deployment's
# (401/403: the gateway's credential, 404: its URL or model name, 408/429/5xx: load or failure).
CALLER_ERRORS = frozenset({400, 413, 422})

SHARED_CACHE_REASON = ("cache scope {scope} needs a server that keeps prompt caches apart, "
                       "and this one shares one cache across its requests")
TOKEN_REFRESH_MARGIN_S = 300  # an Entra token is renewed this long before it expires
MAX_ERROR_BODY = 64 * 1024
# After [DONE] the answer is complete; the body's end is awaited this long, so that a connection
# read to its end goes back to the pool, and no longer: one held open past it is closed.
DONE_GRACE_S = 0.5
# A pooled connection is reused only this long after its last response: under the 5 s keep-alive
# of uvicorn (vLLM, SGLang) and cpp-httplib (llama-server), so the server does not close it as the
# next request goes out (that request may have reached it, and is then not sent again).
KEEPALIVE_EXPIRY_S = 2.0
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")  # an upstream's error code passed on: OpenAI's kind only


@dataclass(frozen=True)
class UpstreamRequest:
    """What the gateway sends, less the credential (added when sending, never logged)."""

    method: str
    url: str
    headers: dict[str, str]
    json: dict


@dataclass
class UpstreamOutput(RequestOutput):
    # True on the last delta when its counts are the upstream's `usage`; otherwise the counts are
    # the client's own (output: content deltas seen; prompt: 0) and the caller settles on its own.
    usage_reported: bool = False
    # The upstream's tool calls in this delta, as OpenAI writes them (streamed: pieces with an index;
    # a whole answer: whole calls), held to their strings (tool_call_fields).
    tool_calls: list[dict] = field(default_factory=list)


def cache_salt(namespace: bytes, deployment_name: str) -> str:
    """The salt for one namespace on one deployment: a keyed digest, so one upstream's salt says
    nothing about another's, and 43 base64url characters (256 bits), as vLLM's docs ask."""
    digest = hmac.new(namespace, f"cache_salt:{deployment_name}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _partitions_cache(deployment: Deployment) -> bool:
    return deployment.dialect in ("vllm", "sglang")


def _caches_always(deployment: Deployment) -> bool:
    """One cache for every request it runs, with no per-request partition."""
    return deployment.dialect in ("azure-openai", "openai") or (
        deployment.dialect == "llamacpp" and deployment.cache_prompt)


def unmet_cache_scope(deployment: Deployment, envelope: ExecutionEnvelope, tenant_id: str) -> str | None:
    """None when this deployment can honour the decision's cache scope; else why not (safe to show).

    A server that partitions by salt honours every scope, and one that never caches honours
    every scope by not caching. One shared cache honours a scope only when everything else it
    runs may share with the request: scope shared on a deployment that is not dedicated (all it
    runs is then shared too) or dedicated to this tenant among others; scope tenant on one
    dedicated to this tenant alone. Principal and none never: their own tenant shares it."""
    if not _caches_always(deployment):
        return None
    scope, dedicated = envelope.cache_scope, deployment.dedicated_tenants
    if scope is CacheScope.SHARED and (not dedicated or tenant_id in dedicated):
        return None
    if scope is CacheScope.TENANT and dedicated == [tenant_id]:
        return None
    return SHARED_CACHE_REASON.format(scope=scope.value)


def _cache_fields(deployment: Deployment, envelope: ExecutionEnvelope) -> dict:
    if _partitions_cache(deployment):
        # vLLM ChatCompletionRequest.cache_salt; SGLang's cache_salt, folded into its radix-cache extra_key.
        if envelope.cache_namespace is None:
            return {"cache_salt": secrets.token_urlsafe(32)}
        return {"cache_salt": cache_salt(envelope.cache_namespace, deployment.name)}
    if deployment.dialect == "llamacpp":
        return {"cache_prompt": deployment.cache_prompt}
    return {}  # azure-openai, openai: no per-request knob


def _priority_fields(deployment: Deployment, envelope: ExecutionEnvelope) -> dict:
    # Our priority: higher is served first. vLLM: "lower means earlier handling".
    if deployment.priority_scheduling == "off":
        return {}
    sign = -1 if deployment.priority_scheduling == "lower-first" else 1
    return {"priority": sign * envelope.priority}


def _max_tokens_field(deployment: Deployment, route: str) -> str:
    # Chat: max_tokens is deprecated for max_completion_tokens (OpenAI, Azure, vLLM, SGLang), and
    # refused by OpenAI's reasoning models; llama.cpp's server documents max_tokens.
    if route == "chat.completions" and deployment.dialect != "llamacpp":
        return "max_completion_tokens"
    return "max_tokens"


def unsupported_fields(body: dict, dialects: Iterable[str] = ()) -> list[str]:
    """The caller's fields an upstream cannot honour through this client (refuse them with 400):
    one choice per request, no logprobs (the engine's token-id logprobs have no upstream twin), and
    no sampling extension when any of the model's deployments (`dialects`) lacks it."""
    names = []
    if not EXTENSION_DIALECTS.issuperset(dialects):
        names += sorted(EXTENSIONS.intersection(body))
    if body.get("n", 1) != 1:
        names.append("n")
    if body.get("logprobs") is not None and body.get("logprobs") is not False:  # completions' 0 asks for some
        names.append("logprobs")
    if body.get("top_logprobs") is not None:
        names.append("top_logprobs")
    if body.get("best_of") not in (None, 1):
        names.append("best_of")
    if body.get("echo"):
        names.append("echo")
    return names


def streams(call: UpstreamCall) -> bool:
    """Whether the upstream call streams: as the caller's does. A caller that waits for the whole
    answer gets one from the upstream too (one body to read, usage in it, and nothing sent
    before it completes, so any failure may move to another deployment)."""
    return call.body.get("stream") is True


def compile_request(deployment: Deployment, call: UpstreamCall, served_model: str) -> UpstreamRequest:
    """The exact request for this deployment. Raises ValueError for a deployment that cannot
    honour the call's cache scope: routing asks unmet_cache_scope first and never picks one."""
    if deployment.kind != "openai" or deployment.url is None:
        raise ValueError(f"deployment {deployment.name} is not an OpenAI-compatible upstream")
    if call.route not in PATHS:
        raise ValueError(f"no upstream route for {call.route!r}")
    reason = unmet_cache_scope(deployment, call.envelope, call.tenant_id)
    if reason is not None:
        raise ValueError(f"deployment {deployment.name}: {reason}")
    base = deployment.url.rstrip("/")
    embeds = call.route == "embeddings"
    forwarded = EMBEDDING_FORWARDED if embeds else FORWARDED
    body = {name: value for name, value in call.body.items() if name in forwarded}
    if deployment.dialect in EXTENSION_DIALECTS and not embeds:
        body |= {name: value for name, value in call.body.items() if name in EXTENSIONS}
        if body.get("top_k", 1) <= 0:
            body["top_k"] = -1
    if deployment.dialect == "azure-openai":
        # The deployment is in the path; the 2024-10-21 request schema has no model field.
        azure_name = cast(str, deployment.azure_deployment)  # the dialect requires it (config.py)
        url = (f"{base}/openai/deployments/{quote(azure_name, safe='')}/{PATHS[call.route]}"
               f"?api-version={quote(deployment.azure_api_version, safe='')}")
    else:
        url = f"{base}/{PATHS[call.route]}"
        body["model"] = deployment.upstream_model or served_model
    if embeds:
        body["encoding_format"] = "float"
        streaming = False
    else:
        body[_max_tokens_field(deployment, call.route)] = call.max_tokens
        streaming = streams(call)
        body["stream"] = streaming
        if streaming:
            body["stream_options"] = {"include_usage": True}  # usage arrives in a last chunk
    body |= _cache_fields(deployment, call.envelope)
    body |= _priority_fields(deployment, call.envelope)
    accept = "text/event-stream" if streaming else "application/json"
    headers = call.headers | {"content-type": "application/json", "accept": accept, "x-request-id": call.request_id}
    return UpstreamRequest("POST", url, headers, body)


class _KeyFile:
    """A mounted secret, read again when its modification time changes (rotation)."""

    def __init__(self, deployment: Deployment) -> None:
        # Made only for a deployment with an api_key_file.
        self.path, self.name = cast(Path, deployment.api_key_file), deployment.name
        self._stamp: int | None = None
        self._key = ""
        self.read()

    def read(self) -> str:
        try:
            stamp = self.path.stat().st_mtime_ns
            if stamp != self._stamp:
                self._key, self._stamp = self.path.read_text().strip(), stamp
        except OSError:
            raise UpstreamUnavailable(f"deployment {self.name}: its API key file cannot be read") from None
        if not self._key:
            raise UpstreamUnavailable(f"deployment {self.name}: its API key file is empty")
        return self._key


class _Credentials:
    """The deployment's credential as request headers. Values are never logged or put in errors."""

    def __init__(self, deployment: Deployment, entra_credential=None) -> None:
        self.deployment = deployment
        self._key_file = _KeyFile(deployment) if deployment.api_key_file is not None else None
        self._env_key = None
        if deployment.api_key_env is not None:
            self._env_key = os.environ.get(deployment.api_key_env, "").strip()
            if not self._env_key:
                raise ValueError(f"deployment {deployment.name}: environment variable "
                                 f"{deployment.api_key_env} is not set")
        self._entra = entra_credential
        self._owns_entra = False
        self._token: AccessToken | None = None
        self._token_lock = asyncio.Lock()

    async def headers(self) -> dict[str, str]:
        deployment = self.deployment
        if deployment.entra_scope is not None:
            return {"authorization": f"Bearer {await self._entra_token()}"}
        key = self._key_file.read() if self._key_file is not None else self._env_key
        if key is None:
            return {}
        if deployment.dialect == "azure-openai":
            return {"api-key": key}
        return {"authorization": f"Bearer {key}"}

    async def _entra_token(self) -> str:
        async with self._token_lock:
            if self._token is None or self._token.expires_on - TOKEN_REFRESH_MARGIN_S <= time.time():
                if self._entra is None:
                    from azure.identity.aio import DefaultAzureCredential  # workload or managed identity

                    self._entra, self._owns_entra = DefaultAzureCredential(), True
                try:
                    self._token = await self._entra.get_token(self.deployment.entra_scope)
                except Exception:  # noqa: BLE001 - azure-identity raises many kinds; none is the caller's
                    raise UpstreamUnavailable(f"deployment {self.deployment.name}: no Entra token") from None
            return self._token.token

    async def aclose(self) -> None:
        if self._owns_entra:
            await self._entra.close()


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
            text = delta.get("content") if isinstance(delta, dict) else None
            listed = delta.get("tool_calls") if isinstance(delta, dict) else None
            calls = [c for c in map(tool_call_fields, listed if isinstance(listed, list) else []) if c]
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

    def __init__(self, deployment: Deployment, served_model: str, *, entra_credential=None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.deployment, self.served_model = deployment, served_model
        self._credentials = _Credentials(deployment, entra_credential)
        timeout = httpx.Timeout(deployment.timeout_s, connect=deployment.connect_timeout_s)
        self._client = httpx.AsyncClient(timeout=timeout, transport=transport, follow_redirects=False,
                                         limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))

    def _unavailable(self, why: str) -> UpstreamUnavailable:
        # Logged once, where it is handled (gateway/pipeline/execution.py), like a replica's.
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
            lines = response.aiter_lines()
            while True:
                try:
                    async with asyncio.timeout_at(self._next_line_deadline(whole, None if outputs else first)):
                        line = await anext(lines)
                except StopAsyncIteration:
                    break
                if not line.startswith("data:"):
                    continue  # blank separators, comments (": ping"), event names
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    await self._drain(lines)
                    break
                event = json.loads(data)
                if not isinstance(event, dict) or "error" in event or event.get("object") == "error":
                    raise self._unavailable("sent an error in its stream")
                usage = _usage(event) or usage
                text, reason, calls = _choice(event, call.route) if "choices" in event else ("", None, [])
                finish_reason = reason or finish_reason
                if text or calls:
                    outputs += 1
                    yield UpstreamOutput(call.request_id, [], text, 0, outputs, tool_calls=calls)
        except TimeoutError:
            if not outputs:
                raise self._unavailable("timed out before its first token") from None
            if asyncio.get_running_loop().time() < whole:
                raise UpstreamIdle(f"deployment {deployment.name} sent nothing for "
                                   f"{deployment.idle_timeout_s:g} s mid-stream") from None
            raise self._unavailable("timed out") from None
        except httpx.TransportError as exc:  # after its head: it had the request
            raise UpstreamInterrupted(f"deployment {deployment.name} broke its stream ({type(exc).__name__})") from None
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
    async def _drain(lines: AsyncIterator[str]) -> None:
        """Reads what follows [DONE] for up to DONE_GRACE_S (a body that ends hands its connection
        back to the pool); a body held open past it is left, and closing it closes the connection."""
        try:
            async with asyncio.timeout(DONE_GRACE_S):
                async for _ in lines:
                    pass
        except (TimeoutError, httpx.TransportError):
            pass

    async def _send(self, compiled: UpstreamRequest, deadline: float, streaming: bool) -> httpx.Response:
        """The upstream's response, its body not yet read; UpstreamUnavailable when it cannot be
        had by `deadline`. Sent once: a connection lost before the request was written (refused,
        unreachable, a failed TLS handshake) is UpstreamUnavailable, which may move to another
        deployment; one lost after it may have been written is UpstreamInterrupted, which may not,
        since the server may be running it."""
        headers = compiled.headers | await self._credentials.headers()
        request = self._client.build_request(compiled.method, compiled.url, headers=headers, json=compiled.json)
        try:
            async with asyncio.timeout_at(deadline):
                return await self._client.send(request, stream=True)
        except TimeoutError:
            raise self._unavailable("timed out before its first token" if streaming else "timed out") from None
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise self._unavailable(f"cannot be reached ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise UpstreamInterrupted(f"deployment {self.deployment.name} closed the connection before "
                                      f"answering ({type(exc).__name__})") from None

    async def _refused(self, response: httpx.Response) -> None:
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
        except httpx.TransportError as exc:
            raise UpstreamInterrupted(f"deployment {self.deployment.name} broke its answer "
                                      f"({type(exc).__name__})") from None
        except (ValueError, TypeError, KeyError):  # a malformed answer (json.JSONDecodeError is a ValueError)
            raise self._unavailable("sent a malformed answer") from None
        finally:
            await response.aclose()

    @staticmethod
    async def _read_error(response: httpx.Response) -> bytes:
        raw = bytearray()
        async for piece in response.aiter_bytes():
            raw += piece
            if len(raw) >= MAX_ERROR_BODY:
                break
        return bytes(raw[:MAX_ERROR_BODY])

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._credentials.aclose()
