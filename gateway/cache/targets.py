"""The deployments an audit can send to, each a `send(prompt, namespace) -> seconds` (audit.py):

- TokenTarget: token ids with an execution envelope per namespace, to the embedded engine
  (AsyncLLMEngine.generate) or a replica (`tenantgate engine serve`, ReplicaClient.generate).
- OpenAITarget: text to an OpenAI-compatible /completions or /chat/completions, streamed; the
  namespace is a body field the server partitions its cache by (vLLM's and SGLang's cache_salt),
  nothing (llama.cpp's server, which has one cache), or a bearer token per namespace (the gateway
  itself, where each token's tenant gets its own scope from the policy).

Every request appends a fresh random suffix to the prefix, as a real prompt after a shared prefix
would, and asks for one token. The time is to the first streamed output. Errors name the status
or the kind of failure, never a prompt, a token or a body.
"""

from __future__ import annotations

import json
import random
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import httpx

from engine import CacheScope, ExecutionEnvelope, Isolation, SamplingParams, isolation_key, keyed_digest
from gateway.cache.audit import ATTACKER, VICTIM, FreshPrefix

PROBE_PARAMS = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
MIN_TOKEN_ID = 16  # clear of the ids a model reserves for special tokens at the low end
# Common one-token English words (with their leading space) for text prefixes: a random sequence
# of them tokenizes to about one token a word in any BPE vocabulary, and is never seen twice.
WORDS = tuple("""
time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government number
night point home water room mother area money story fact month lot right study book eye job word
business issue side kind head house service friend father power hour game line end member law car
city community name president team minute idea body information back parent face others level
office door health person art war history party result change morning reason research girl guy
moment air teacher force education foot boy age policy music market sense nation plan college
interest death experience effect use class control care field development role effort rate heart
drug show leader light voice wife police mind price report decision son view relationship town
road arm difference value building action model season society tax director position player record
paper space ground form event official matter center couple site project activity star table need
court oil situation cost industry figure street image phone data picture practice piece land
product doctor wall patient worker news test movie north love support technology step baby computer
""".split())


class AuditTargetError(Exception):
    """The deployment did not answer a probe (its message names no prompt, token or body)."""


def token_prefixes(length: int, vocab_size: int) -> FreshPrefix:
    """Fresh prefixes of `length` random token ids."""
    if length < 1 or vocab_size <= MIN_TOKEN_ID + 1:
        raise ValueError("a token prefix needs a length of 1 or more and a vocabulary of more than 17 ids")
    return lambda rng: [rng.randrange(MIN_TOKEN_ID, vocab_size) for _ in range(length)]


def text_prefixes(words: int) -> FreshPrefix:
    """Fresh prefixes of `words` random common words (about as many tokens)."""
    if words < 1:
        raise ValueError("a text prefix needs at least one word")
    return lambda rng: " ".join(rng.choice(WORDS) for _ in range(words))


def audit_envelopes(*, shared: bool, secret: bytes | None = None) -> dict[str, ExecutionEnvelope]:
    """Envelopes for the two namespaces, as the gateway would build them for two tenants with cache
    scope tenant; `shared`: one shared namespace for both (the configuration that must leak). The
    secret is random per run unless given, so an audit's namespaces are nobody else's."""
    secret = secret if secret is not None else secrets.token_bytes(32)
    envelopes = {}
    for name in (VICTIM, ATTACKER):
        namespace = keyed_digest(secret, "cache-audit:shared" if shared else f"cache-audit:tenant:{name}")
        envelopes[name] = ExecutionEnvelope(
            cache_namespace=namespace, cache_scope=CacheScope.SHARED if shared else CacheScope.TENANT,
            isolation=Isolation.SHARED, isolation_key=isolation_key(secret, f"cache-audit-{name}"))
    return envelopes


Generate = Callable[[Sequence[int], SamplingParams, ExecutionEnvelope, str], AsyncIterator]


class TokenTarget:
    """Token ids under an execution envelope per namespace. `generate(token_ids, params, envelope,
    request_id)` streams outputs: AsyncLLMEngine.generate or ReplicaClient.generate."""

    def __init__(self, generate: Generate, envelopes: Mapping[str, ExecutionEnvelope], *, vocab_size: int,
                 suffix_tokens: int = 4, seed: int | None = None) -> None:
        if set(envelopes) != {VICTIM, ATTACKER}:
            raise ValueError(f"envelopes for exactly the namespaces {VICTIM!r} and {ATTACKER!r} are needed")
        self._generate = generate
        self._envelopes = dict(envelopes)
        self._vocab_size = vocab_size
        self._suffix_tokens = suffix_tokens
        self._rng = random.Random(seed)

    async def __call__(self, prompt: Sequence[int], namespace: str) -> float:
        suffix = [self._rng.randrange(MIN_TOKEN_ID, self._vocab_size) for _ in range(self._suffix_tokens)]
        request_id = f"cache-audit-{uuid.uuid4().hex}"
        start = time.perf_counter()
        stream = self._generate([*prompt, *suffix], PROBE_PARAMS, self._envelopes[namespace], request_id)
        try:
            async for _ in stream:
                return time.perf_counter() - start
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        raise AuditTargetError("the deployment ended a probe without output")


class OpenAITarget:
    """Text to an OpenAI-compatible server, streamed, one token asked for.

    `route`: "completions" (the prompt is the prefix, exactly) or "chat.completions" (the prefix is
    the first user message; the chat template puts the same tokens before it every time).
    `namespace_field`: the body field whose value stands for the namespace ("cache_salt"), or None
    when the server has none. `bearer`: a token per namespace (the gateway), or one for both
    (an upstream's API key), or None. `headers`: more request headers (the gateway's
    X-Data-Classification, say)."""

    def __init__(self, base_url: str, model: str, *, route: str = "completions",
                 namespace_field: str | None = None, bearer: Mapping[str, str] | None = None,
                 extra_body: Mapping[str, object] | None = None, headers: Mapping[str, str] | None = None,
                 suffix_words: int = 4,
                 timeout_s: float = 60.0, seed: int | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if route not in ("completions", "chat.completions"):
            raise ValueError("route must be completions or chat.completions")
        if bearer is not None and set(bearer) != {VICTIM, ATTACKER}:
            raise ValueError(f"bearer tokens for exactly the namespaces {VICTIM!r} and {ATTACKER!r} are needed")
        self._path = "chat/completions" if route == "chat.completions" else "completions"
        self._route = route
        self._model = model
        self._namespace_field = namespace_field
        # Salts fresh per run: nobody else's requests carry them.
        self._salts = {name: secrets.token_hex(16) for name in (VICTIM, ATTACKER)}
        self._bearer = dict(bearer) if bearer is not None else None
        self._extra = dict(extra_body or {})
        self._headers = dict(headers or {})
        self._suffix_words = suffix_words
        self._rng = random.Random(seed)
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/") + "/", transport=transport, trust_env=False,
                                         timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)))

    def body(self, prompt: str, namespace: str) -> dict:
        text = " ".join([prompt, *(self._rng.choice(WORDS) for _ in range(self._suffix_words))])
        body: dict[str, object] = {"model": self._model, "max_tokens": 1, "temperature": 0, "stream": True,
                                   **self._extra}
        if self._route == "chat.completions":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if self._namespace_field is not None:
            body[self._namespace_field] = self._salts[namespace]
        return body

    async def __call__(self, prompt: str, namespace: str) -> float:
        headers = {**self._headers, "accept": "text/event-stream"}
        if self._bearer is not None:
            headers["authorization"] = f"Bearer {self._bearer[namespace]}"
        body = self.body(prompt, namespace)
        start = time.perf_counter()
        try:
            async with self._client.stream("POST", self._path, json=body, headers=headers) as response:
                if response.status_code != 200:
                    raise AuditTargetError(f"the deployment answered a probe with HTTP {response.status_code}")
                async for line in response.aiter_lines():
                    if _first_output(line):
                        return time.perf_counter() - start
        except httpx.HTTPError as exc:
            raise AuditTargetError(f"the deployment failed a probe: {type(exc).__name__}") from None
        raise AuditTargetError("the deployment ended a probe's stream without output")

    async def aclose(self) -> None:
        await self._client.aclose()


def _first_output(line: str) -> bool:
    """Whether an SSE line carries output: a choice with text or content, or one that finished."""
    if not line.startswith("data:"):
        return False
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return False
    try:
        event = json.loads(data)
    except ValueError:
        raise AuditTargetError("the deployment sent a stream event that is not JSON") from None
    if not isinstance(event, dict):
        return False
    if "error" in event:
        raise AuditTargetError("the deployment sent an error event")
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if choice.get("text") or delta.get("content") or delta.get("reasoning_content") or choice.get("finish_reason"):
            return True
    return False
