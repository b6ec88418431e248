"""A policy decision compiled into each OpenAI-compatible dialect's knobs (the client that sends
the result is openai_compatible.py).

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

import base64
import hashlib
import hmac
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote

from engine import CacheScope, ExecutionEnvelope
from gateway.deployments.base import (
    UpstreamCall,
)
from gateway.deployments.config import Deployment

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

SHARED_CACHE_REASON = ("cache scope {scope} needs a server that keeps prompt caches apart, "
                       "and this one shares one cache across its requests")

@dataclass(frozen=True)
class UpstreamRequest:
    """What the gateway sends, less the credential (added when sending, never logged)."""

    method: str
    url: str
    headers: dict[str, str]
    json: dict


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


